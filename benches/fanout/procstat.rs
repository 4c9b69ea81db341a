//! Process facts from `/proc` and a few libc calls: a process's CPU time (utime+stime),
//! its memory (PSS and RSS from `smaps_rollup`), children of a pid, disk usage of a
//! directory, and the bench's own set-up (fd limit, CPU pinning).

use std::path::Path;

#[derive(Clone, Copy, Debug, Default)]
pub struct Sample {
    pub cpu_secs: f64,
    pub pss_bytes: u64,
    pub rss_bytes: u64,
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// CPU seconds (user + system, all threads) the process has used so far.
pub fn cpu_secs(pid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?; // field 14
    let stime: f64 = f.get(12)?.parse().ok()?; // field 15
    Some((utime + stime) / clock_ticks())
}

fn ppid(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// (PSS, RSS) in bytes.
pub fn memory(pid: i32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        Some(line[name.len()..].trim().trim_end_matches("kB").trim().parse::<u64>().ok()? * 1024)
    };
    Some((field("Pss:")?, field("Rss:")?))
}

/// CPU seconds all CPUs of the machine have been busy (not idle or iowait) so far.
pub fn machine_busy_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else { return 0.0 };
    let f: Vec<f64> =
        line.split_ascii_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal
    let busy: f64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| f.get(i)).sum();
    busy / clock_ticks()
}

pub fn sample(pid: i32) -> Sample {
    let (pss_bytes, rss_bytes) = memory(pid).unwrap_or((0, 0));
    Sample { cpu_secs: cpu_secs(pid).unwrap_or(0.0), pss_bytes, rss_bytes }
}

pub fn children_of(parent: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) {
                if ppid(pid) == Some(parent) {
                    out.push(pid);
                }
            }
        }
    }
    out
}

/// Bytes the files under `path` occupy on disk (like `du -s --block-size=1`).
pub fn du_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else { return 0 };
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        if let Ok(dir) = std::fs::read_dir(path) {
            for e in dir.flatten() {
                total += du_bytes(&e.path());
            }
        }
    }
    total
}

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns the new soft limit.
pub fn raise_nofile() -> u64 {
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur
    }
}

/// Pins the calling thread (and every thread it starts later) to one CPU.
pub fn pin_self(cpu: usize) -> bool {
    // SAFETY: the set is a zeroed local cpu_set_t.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

pub fn cpu_count() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
