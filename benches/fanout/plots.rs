//! PNG plots with plotters' bitmap backend: latency CDF (fanout at the reference rate),
//! deliveries vs publish rate (fanout and rooms), bytes per idle connection. Text goes
//! through ab_glyph with DejaVu Sans registered from its file, so no fontconfig or
//! freetype is needed.

use std::error::Error;
use std::path::Path;
use std::sync::OnceLock;

use hdrhistogram::Histogram;
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::report::{median, servers_in, step_rates, step_values};
use crate::scenarios::{Case, Record, Sizes};
use crate::servers::Kind;

const FONT_FILE: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const FONT: &str = "sans-serif";

type Res<T> = Result<T, Box<dyn Error>>;

fn font_ready() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| match std::fs::read(FONT_FILE) {
        Ok(bytes) => plotters::style::register_font(
            FONT,
            FontStyle::Normal,
            Box::leak(bytes.into_boxed_slice()),
        )
        .is_ok(),
        Err(_) => false,
    })
}

fn color(k: Kind) -> RGBColor {
    match k {
        Kind::Livegate => RGBColor(0x1f, 0x77, 0xb4),
        Kind::LivegateBase => RGBColor(0x94, 0x67, 0xbd),
        Kind::Nchan => RGBColor(0x2c, 0xa0, 0x2c),
        Kind::SocketIo => RGBColor(0xd6, 0x27, 0x28),
    }
}

/// Draws every plot it has data for; returns (file name, description) of each.
pub fn draw_all(dir: &Path, records: &[Record], sizes: &Sizes) -> Vec<(String, String)> {
    if !font_ready() {
        eprintln!("plots skipped: {FONT_FILE} not found (apt-get install fonts-dejavu-core)");
        return Vec::new();
    }
    let mut out = Vec::new();
    let plots: [(&str, &dyn Fn(&Path) -> Res<bool>, String); 3] = [
        (
            "latency_cdf.png",
            &|p| latency_cdf(p, records, sizes),
            "Delivery latency CDF, fanout at the highest rate every server ran".into(),
        ),
        (
            "deliveries_vs_rate.png",
            &|p| deliveries_vs_rate(p, records, sizes),
            "Deliveries per second vs publish rate".into(),
        ),
        (
            "bytes_per_idle_connection.png",
            &|p| bytes_per_conn(p, records, sizes),
            "Server memory per idle subscribed connection".into(),
        ),
    ];
    for (file, draw, alt) in plots {
        match draw(&dir.join(file)) {
            Ok(true) => out.push((file.to_string(), alt)),
            Ok(false) => {}
            Err(e) => eprintln!("plot {file} failed: {e}"),
        }
    }
    out
}

/// The reference rate if every server ran it in fanout, else the highest rate all ran.
pub fn cdf_rate(records: &[Record], sizes: &Sizes) -> Option<f64> {
    let kinds: Vec<Kind> = servers_in(records)
        .into_iter()
        .filter(|k| records.iter().any(|r| r.server == *k && r.case == Case::Fanout))
        .collect();
    let ran = |k: Kind, rate: f64| {
        records.iter().any(|r| {
            r.server == k
                && r.case == Case::Fanout
                && r.cdfs.iter().any(|c| c.0 == rate && !c.1.is_empty())
        })
    };
    let all = |rate: f64| !kinds.is_empty() && kinds.iter().all(|&k| ran(k, rate));
    if all(sizes.fanout_ref_rate) {
        return Some(sizes.fanout_ref_rate);
    }
    step_rates(records, Case::Fanout).into_iter().rev().find(|&r| all(r))
}

fn latency_cdf(path: &Path, records: &[Record], sizes: &Sizes) -> Res<bool> {
    let Some(rate) = cdf_rate(records, sizes) else { return Ok(false) };
    let mut series = Vec::new();
    for k in servers_in(records) {
        let mut merged: Option<Histogram<u64>> = None;
        for r in records.iter().filter(|r| r.server == k && r.case == Case::Fanout) {
            if let Some((_, h)) = r.cdfs.iter().find(|c| c.0 == rate) {
                match &mut merged {
                    Some(m) => m.add(h)?,
                    None => merged = Some(h.clone()),
                }
            }
        }
        let Some(h) = merged.filter(|h| !h.is_empty()) else { continue };
        let pts: Vec<(f64, f64)> = (0..=1000)
            .map(|i| i as f64 / 1000.0)
            .chain([0.9995, 0.9999])
            .map(|q| ((h.value_at_quantile(q) as f64 / 1000.0).max(0.01), q * 100.0))
            .collect();
        series.push((k, pts));
    }
    if series.is_empty() {
        return Ok(false);
    }
    let lo = series.iter().flat_map(|(_, p)| p.iter().map(|x| x.0)).fold(f64::MAX, f64::min) / 1.5;
    let hi =
        series.iter().flat_map(|(_, p)| p.iter().map(|x| x.0)).fold(0.0, f64::max).max(130.0) * 1.5;
    let root = BitMapBackend::new(path, (1000, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "Delivery latency CDF: 1 room × {} subscribers, {rate} publishes/s (all runs)",
                sizes.fanout_subs
            ),
            (FONT, 22),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..100f64)?;
    chart
        .configure_mesh()
        .x_desc("publish → receive latency, ms (log scale)")
        .x_labels(12)
        .x_label_formatter(&|v| if *v >= 1.0 { format!("{v:.0}") } else { format!("{v:.2}") })
        .y_desc("% of deliveries ≤ x")
        .label_style((FONT, 15))
        .axis_desc_style((FONT, 17))
        .draw()?;
    chart
        .draw_series(LineSeries::new(vec![(120.0, 0.0), (120.0, 100.0)], BLACK.stroke_width(2)))?
        .label("target: p99 ≤ 120 ms (window 100 + 20)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    chart.draw_series(LineSeries::new(
        vec![(lo, 99.0), (hi, 99.0)],
        BLACK.mix(0.5).stroke_width(1),
    ))?;
    for (k, pts) in series {
        let c = color(k);
        chart
            .draw_series(LineSeries::new(pts, c.stroke_width(3)))?
            .label(k.title())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font((FONT, 16))
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(true)
}

fn deliveries_vs_rate(path: &Path, records: &[Record], sizes: &Sizes) -> Res<bool> {
    let panels = [
        (Case::Fanout, format!("fanout: 1 room × {}", sizes.fanout_subs), sizes.fanout_subs as f64),
        (
            Case::Rooms,
            format!("rooms: {} × {}", sizes.rooms, sizes.per_room),
            sizes.per_room as f64,
        ),
    ];
    if panels.iter().all(|(c, _, _)| step_rates(records, *c).is_empty()) {
        return Ok(false);
    }
    let root = BitMapBackend::new(path, (1300, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((1, 2));
    for ((case, title, fan), area) in panels.iter().zip(areas.iter()) {
        let rates = step_rates(records, *case);
        if rates.is_empty() {
            continue;
        }
        let mut series = Vec::new();
        for k in servers_in(records) {
            let pts: Vec<(f64, f64)> = rates
                .iter()
                .filter_map(|&r| {
                    let v = step_values(records, k, *case, r);
                    (!v.is_empty()).then(|| {
                        (
                            r,
                            median(&v.iter().map(|s| s.delivered_per_s).collect::<Vec<_>>())
                                .max(1.0),
                        )
                    })
                })
                .collect();
            if !pts.is_empty() {
                series.push((k, pts));
            }
        }
        let (xlo, xhi) = (rates[0] / 1.3, rates[rates.len() - 1] * 1.3);
        let ymax = rates[rates.len() - 1] * fan * 2.0;
        let ymin =
            series.iter().flat_map(|(_, p)| p.iter().map(|x| x.1)).fold(rates[0] * fan, f64::min)
                / 2.0;
        let mut chart = ChartBuilder::on(area)
            .caption(title.as_str(), (FONT, 20))
            .margin(20)
            .x_label_area_size(50)
            .y_label_area_size(80)
            .build_cartesian_2d((xlo..xhi).log_scale(), (ymin.max(1.0)..ymax).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("publishes/s (log)")
            .x_label_formatter(&|v| crate::report::fmt(*v))
            .y_desc("deliveries/s (log, median of runs)")
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 16))
            .y_label_formatter(&|v| crate::report::fmt(*v))
            .draw()?;
        let ideal: Vec<(f64, f64)> = rates.iter().map(|&r| (r, r * fan)).collect();
        chart
            .draw_series(LineSeries::new(ideal, BLACK.mix(0.35).stroke_width(1)))?
            .label("every subscriber gets every event")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.35)));
        for (k, pts) in series {
            let c = color(k);
            chart
                .draw_series(LineSeries::new(pts.clone(), c.stroke_width(3)))?
                .label(k.title())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(3))
                });
            chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 4, c.filled())))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font((FONT, 15))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
    }
    root.present()?;
    Ok(true)
}

fn bytes_per_conn(path: &Path, records: &[Record], sizes: &Sizes) -> Res<bool> {
    let kinds: Vec<Kind> = servers_in(records)
        .into_iter()
        .filter(|k| records.iter().any(|r| r.server == *k && r.case == Case::Idle))
        .collect();
    if kinds.is_empty() {
        return Ok(false);
    }
    let names: Vec<String> = sizes.idle.iter().map(|&n| crate::scenarios::idle_metric(n)).collect();
    let mut bars = Vec::new(); // (x, KiB, label)
    for (i, k) in kinds.iter().enumerate() {
        for (j, name) in names.iter().enumerate() {
            let v: Vec<f64> = records
                .iter()
                .filter(|r| r.server == *k && r.case == Case::Idle)
                .filter_map(|r| r.metric(name))
                .collect();
            let kib = median(&v) / 1024.0;
            if kib.is_finite() {
                bars.push((*k, i as f64 + (j as f64 - 0.5) * 0.38, kib, sizes.idle[j]));
            }
        }
    }
    let ymax = bars.iter().map(|b| b.2).fold(8.0, f64::max) * 1.6;
    let n = kinds.len() as f64;
    let root = BitMapBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Server memory (PSS) per idle subscribed connection", (FONT, 22))
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.6f64..n - 0.4, 0f64..ymax)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .x_desc(format!(
            "lighter bar: {} connections, darker: {} (no bar: the server could not hold them)",
            sizes.idle[0], sizes.idle[1]
        ))
        .y_desc("KiB per connection (median of runs)")
        .label_style((FONT, 16))
        .axis_desc_style((FONT, 17))
        .draw()?;
    chart
        .draw_series(LineSeries::new(
            vec![(-0.6, 8.0), (n - 0.4, 8.0)],
            BLACK.mix(0.5).stroke_width(1),
        ))?
        .label("target ≤ 8 KiB")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.5)));
    for k in &kinds {
        let c = color(*k);
        chart
            .draw_series(std::iter::empty::<Rectangle<(f64, f64)>>())?
            .label(k.title())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], c.filled()));
    }
    for (k, x, kib, conns) in bars {
        let c = color(k);
        let shade = if conns == sizes.idle[0] { c.mix(0.55) } else { c.mix(1.0) };
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x - 0.17, 0.0), (x + 0.17, kib)],
            shade.filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("{kib:.1}"),
            (x - 0.08, kib + ymax * 0.02),
            (FONT, 14),
        )))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font((FONT, 15))
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(true)
}
