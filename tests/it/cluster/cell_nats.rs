//! The NATS facts cells rely on (issue 47), pinned on the current nats-server
//! ([`current_nats_server`](common::nats::current_nats_server)): two servers, JetStream
//! domains `a` and `b`, server b a leaf node of server a through a cuttable proxy
//! (`common::link`). No livegate runs here: each test names one fact of nats-server
//! that the cells' design depends on, so that an upgrade that changes it fails here
//! first, and prints the figures it measured.

use super::*;
use async_nats::jetstream::{self, kv, stream};
use async_nats::{Client, Request, RequestErrorKind};
use common::link::{Condition, Link};
use common::nats::{CellNatsConfig, NatsServer};
use tempfile::TempDir;

/// Servers `a` (domain `a`) and `b` (domain `b`), b leaf-connected to a through `link`.
struct TwoDomains {
    a: NatsServer,
    b: NatsServer,
    link: Link,
    root: Option<TempDir>,
}

/// How long a leaf connection may take to come up (b solicits it once a second).
const LEAF_UP: Duration = Duration::from_secs(15);

impl TwoDomains {
    fn start() -> TwoDomains {
        let root = tempfile::Builder::new().prefix("livegate-cell-nats-").tempdir().expect("tempdir");
        let a = NatsServer::start_cell(&root.path().join("a"), "a", None, &CellNatsConfig::default());
        let link = Link::start();
        let proxy = link.proxy(a.leaf_addr());
        let b = NatsServer::start_cell(&root.path().join("b"), "b", Some(&format!("nats-leaf://{proxy}")), &CellNatsConfig::default());
        let two = TwoDomains { a, b, link, root: Some(root) };
        two.wait_leaf_up(LEAF_UP);
        two
    }

    fn leaf_up(&self) -> bool {
        self.a.leaf_connections() == 1 && self.b.leaf_connections() == 1
    }

    fn wait_leaf_up(&self, within: Duration) {
        let up = wait_until_every(within, Duration::from_millis(20), || self.leaf_up());
        assert!(up, "no leaf connection between a and b within {within:?}; logs:\n{}\n{}", self.a.log_text(), self.b.log_text());
    }

    async fn clients(&self) -> (Client, Client) {
        let a = async_nats::connect(self.a.url()).await.expect("connect to a");
        let b = async_nats::connect(self.b.url()).await.expect("connect to b");
        (a, b)
    }
}

impl Drop for TwoDomains {
    fn drop(&mut self) {
        self.a.kill9();
        self.b.kill9();
        if std::thread::panicking() {
            if let Some(root) = self.root.take() {
                eprintln!("cell NATS test failed: servers' logs and stores kept in {}", root.keep().display());
            }
        }
    }
}

/// Answers every request on `subject` through `client` with `answer`, until the client
/// goes; returns once the subscription is registered with the server (flushed).
async fn serve(client: &Client, subject: &str, answer: &'static str) {
    let mut sub = client.subscribe(subject.to_string()).await.expect("subscribe");
    client.flush().await.expect("flush");
    let client = client.clone();
    tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            if let Some(reply) = msg.reply {
                let _ = client.publish(reply, answer.into()).await;
            }
        }
    });
}

/// A request on `subject` through `client` answered within `timeout`: the answer, or the
/// kind of failure.
async fn ask(client: &Client, subject: &str, timeout: Duration) -> Result<String, RequestErrorKind> {
    let request = Request::new().payload("ping".into()).timeout(Some(timeout));
    match client.send_request(subject.to_string(), request).await {
        Ok(msg) => Ok(String::from_utf8_lossy(&msg.payload).into_owned()),
        Err(e) => Err(e.kind()),
    }
}

/// Waits until a request from `client` on `subject` is answered: the interest of the
/// server's subscriber has reached `client`'s server (over the leaf, when across).
async fn wait_answered(client: &Client, subject: &str, within: Duration) -> bool {
    wait_until_every_async(within, Duration::from_millis(20), || async { ask(client, subject, Duration::from_millis(500)).await.is_ok() }).await
}

/// The room stream of cell a as the design has it: origin subjects of its own
/// (`lg.a.room.>`), republished to `lg.live.>` for the live fan-out, direct gets allowed.
fn rooms_of_a() -> stream::Config {
    stream::Config {
        name: "ROOMS_A".into(),
        subjects: vec!["lg.a.room.>".into()],
        allow_direct: true,
        republish: Some(stream::Republish { source: "lg.a.room.>".into(), destination: "lg.live.>".into(), headers_only: false }),
        ..Default::default()
    }
}

async fn publish_acked(js: &jetstream::Context, subject: &str, payload: &str) -> u64 {
    let ack = js.publish(subject.to_string(), payload.to_string().into()).await.expect("publish").await.expect("publish ack");
    ack.sequence
}

#[test]
fn fact_kv_buckets_of_one_name_in_two_domains() {
    let _gate = crate::common::gate!();
    let two = TwoDomains::start();
    runtime().block_on(async {
        let (ca, cb) = two.clients().await;
        let (js_a, js_b) = (jetstream::new(ca.clone()), jetstream::new(cb.clone()));
        let config = kv::Config { bucket: "CELLKV".into(), history: 1, ..Default::default() };
        let kv_a = js_a.create_key_value(config.clone()).await.expect("bucket in a");
        let kv_b = js_b.create_key_value(config).await.expect("bucket in b");
        let put = kv_a.put("from-a", "1".into()).await;
        eprintln!("FACT1 put on a through a: {put:?}");
        let put_b = kv_b.put("from-b", "2".into()).await;
        eprintln!("FACT1 put on b through b: {put_b:?}");
        let seen_in_b = wait_until_every_async(Duration::from_secs(3), Duration::from_millis(20), || async {
            kv_b.get("from-a").await.ok().flatten().is_some()
        })
        .await;
        let seen_in_a = kv_a.get("from-b").await.ok().flatten().is_some();
        let a_count = js_a.get_stream("KV_CELLKV").await.expect("a's stream").info().await.expect("info").state.messages;
        let b_count = js_b.get_stream("KV_CELLKV").await.expect("b's stream").info().await.expect("info").state.messages;
        eprintln!("FACT1 a's key in b's bucket: {seen_in_b}; b's key in a's bucket: {seen_in_a}; messages a={a_count} b={b_count}");
        // A put into a's bucket through a client of b, addressed to domain a.
        let kv_ba = jetstream::with_domain(cb.clone(), "a").get_key_value("CELLKV").await;
        match kv_ba {
            Ok(kv_ba) => {
                let put = kv_ba.put("from-b-to-a", "3".into()).await;
                eprintln!("FACT1 put through b into domain a: {put:?}");
                let got = kv_ba.get("from-a").await;
                eprintln!("FACT1 get through b from domain a: {got:?}");
            }
            Err(e) => eprintln!("FACT1 get_key_value through b in domain a: {e:?}"),
        }
        let a_count = js_a.get_stream("KV_CELLKV").await.expect("a's stream").info().await.expect("info").state.messages;
        let b_count = js_b.get_stream("KV_CELLKV").await.expect("b's stream").info().await.expect("info").state.messages;
        eprintln!("FACT1 after: messages a={a_count} b={b_count}");
        eprintln!("FACT1 a's leafz subs: {}", two.a.monitor("leafz?subs=1").map(|v| v.to_string()).unwrap_or_default());
        eprintln!("FACT1 b's leafz subs: {}", two.b.monitor("leafz?subs=1").map(|v| v.to_string()).unwrap_or_default());
        // Plain streams on the same subjects in both domains.
        let shared = stream::Config { name: "SHARED".into(), subjects: vec!["shared.>".into()], ..Default::default() };
        js_a.create_stream(shared.clone()).await.expect("SHARED in a");
        js_b.create_stream(shared).await.expect("SHARED in b");
        let mut sub_b = cb.subscribe("shared.>").await.expect("sub shared on b");
        serve(&cb, "probe.shared", "b").await;
        assert!(wait_answered(&ca, "probe.shared", Duration::from_secs(10)).await, "b's interest never reached a");
        let ack = js_a.publish("shared.x", "one".into()).await.expect("publish").await;
        eprintln!("FACT1b publish shared.x on a: {ack:?}");
        let got = tokio::time::timeout(Duration::from_secs(3), sub_b.next()).await;
        eprintln!("FACT1b core subscriber on b got: {:?}", got.map(|m| m.map(|m| m.subject)));
        let counted = wait_until_every_async(Duration::from_secs(3), Duration::from_millis(20), || async {
            let mut b = js_b.get_stream("SHARED").await.expect("b's SHARED");
            b.info().await.map(|i| i.state.messages).unwrap_or(0) > 0
        })
        .await;
        let mut sa = js_a.get_stream("SHARED").await.expect("a's SHARED");
        let mut sb = js_b.get_stream("SHARED").await.expect("b's SHARED");
        eprintln!(
            "FACT1b stored in b: {counted}; counts a={:?} b={:?}",
            sa.info().await.map(|i| i.state.messages),
            sb.info().await.map(|i| i.state.messages)
        );
        // A stream on the same subjects in b and no core subscriber there.
        let alone = stream::Config { name: "ALONE".into(), subjects: vec!["alone.>".into()], ..Default::default() };
        js_a.create_stream(alone.clone()).await.expect("ALONE in a");
        js_b.create_stream(alone).await.expect("ALONE in b");
        serve(&cb, "probe.alone", "b").await;
        assert!(wait_answered(&ca, "probe.alone", Duration::from_secs(10)).await, "b's interest never reached a");
        let ack = js_a.publish("alone.x", "one".into()).await.expect("publish").await;
        eprintln!("FACT1e publish alone.x on a: {ack:?}");
        let counted = wait_until_every_async(Duration::from_secs(3), Duration::from_millis(20), || async {
            let mut b = js_b.get_stream("ALONE").await.expect("b's ALONE");
            b.info().await.map(|i| i.state.messages).unwrap_or(0) > 0
        })
        .await;
        eprintln!("FACT1e stored in b without a core subscriber: {counted}");
        let ack = js_b.publish("alone.y", "two".into()).await.expect("publish").await;
        let mut sa = js_a.get_stream("ALONE").await.expect("a's ALONE");
        let mut sb = js_b.get_stream("ALONE").await.expect("b's ALONE");
        eprintln!(
            "FACT1e publish alone.y on b: {ack:?}; counts a={:?} b={:?}",
            sa.info().await.map(|i| i.state.messages),
            sb.info().await.map(|i| i.state.messages)
        );
        eprintln!("FACT1e a's leafz subs: {}", two.a.monitor("leafz?subs=1").map(|v| v["leafs"][0]["subscriptions_list"].to_string()).unwrap_or_default());
        // A raw $KV put from b's client, on the subject of a's bucket (no domain prefix).
        let raw = js_b.publish("$KV.CELLKV.raw-from-b", "4".into()).await.expect("publish").await;
        eprintln!("FACT1c raw $KV put from b: {raw:?}");
        let a_count = js_a.get_stream("KV_CELLKV").await.expect("a's stream").info().await.expect("info").state.messages;
        let b_count = js_b.get_stream("KV_CELLKV").await.expect("b's stream").info().await.expect("info").state.messages;
        eprintln!("FACT1c after: messages a={a_count} b={b_count}");
        let mut sub_kv = cb.subscribe("$KV.CELLKV.>").await.expect("sub $KV on b");
        serve(&cb, "probe.kv", "b").await;
        assert!(wait_answered(&ca, "probe.kv", Duration::from_secs(10)).await, "b's interest never reached a");
        let put = kv_a.put("from-a-2", "5".into()).await;
        let got = tokio::time::timeout(Duration::from_secs(3), sub_kv.next()).await;
        eprintln!("FACT1d put on a {put:?}; core subscriber on b to $KV.CELLKV.> got: {:?}", got.map(|m| m.map(|m| m.subject)));
        let a_count = js_a.get_stream("KV_CELLKV").await.expect("a's stream").info().await.expect("info").state.messages;
        let b_count = js_b.get_stream("KV_CELLKV").await.expect("b's stream").info().await.expect("info").state.messages;
        eprintln!("FACT1d after: messages a={a_count} b={b_count}");
    });
}

#[test]
fn fact_republished_room_events_cross_the_leaf() {
    let _gate = crate::common::gate!();
    let two = TwoDomains::start();
    runtime().block_on(async {
        let (ca, cb) = two.clients().await;
        let js_a = jetstream::new(ca.clone());
        js_a.create_stream(rooms_of_a()).await.expect("a's room stream");
        let mut live = cb.subscribe("lg.live.>").await.expect("subscribe on b");
        serve(&cb, "probe.b", "b").await;
        assert!(wait_answered(&ca, "probe.b", Duration::from_secs(10)).await, "b's interest never reached a");
        let mut seqs = Vec::new();
        for i in 0..5 {
            seqs.push(publish_acked(&js_a, "lg.a.room.r1", &format!("e{i}")).await);
        }
        for i in 0..5 {
            let msg = tokio::time::timeout(Duration::from_secs(5), live.next()).await;
            match msg {
                Ok(Some(msg)) => eprintln!("FACT2 b got {} {:?} headers={:?}", msg.subject, msg.payload, msg.headers),
                other => panic!("FACT2 event {i}: {other:?}"),
            }
        }
    });
}

#[test]
fn fact_request_reply_across_the_leaf_and_a_cut() {
    let _gate = crate::common::gate!();
    let mut two = TwoDomains::start();
    let rt = runtime();
    let (ca, cb) = rt.block_on(two.clients());
    rt.block_on(serve(&ca, "svc.a", "a"));
    assert!(rt.block_on(wait_answered(&cb, "svc.a", Duration::from_secs(10))), "a's service never answered b");
    two.link.set(Condition::Cut);
    let cut = Instant::now();
    let mut outcomes = Vec::new();
    let mut leaf_down_at = None;
    while cut.elapsed() < Duration::from_secs(30) {
        let asked = Instant::now();
        let outcome = rt.block_on(ask(&cb, "svc.a", Duration::from_millis(500)));
        let took = asked.elapsed();
        if leaf_down_at.is_none() && two.b.leaf_connections() == 0 {
            leaf_down_at = Some(cut.elapsed());
        }
        outcomes.push(format!("{:?} {outcome:?} in {took:?}", cut.elapsed()));
        if matches!(outcome, Err(RequestErrorKind::NoResponders)) {
            break;
        }
    }
    eprintln!("FACT3 cut: leaf down at {leaf_down_at:?}; outcomes:\n  {}", outcomes.join("\n  "));
    two.link.set(Condition::Up);
    let healed = Instant::now();
    let back = rt.block_on(wait_answered(&cb, "svc.a", Duration::from_secs(30)));
    eprintln!("FACT3 heal: answered again {back} after {:?}", healed.elapsed());
    // kill -9 of a: the proxy passes the close on.
    two.a.kill9();
    let killed = Instant::now();
    let mut outcomes = Vec::new();
    while killed.elapsed() < Duration::from_secs(30) {
        let asked = Instant::now();
        let outcome = rt.block_on(ask(&cb, "svc.a", Duration::from_millis(500)));
        outcomes.push(format!("{:?} {outcome:?} in {:?}", killed.elapsed(), asked.elapsed()));
        if matches!(outcome, Err(RequestErrorKind::NoResponders)) {
            break;
        }
    }
    eprintln!("FACT3 kill: outcomes:\n  {}", outcomes.join("\n  "));
    two.a.restart();
    let restarted = Instant::now();
    two.wait_leaf_up(Duration::from_secs(30));
    eprintln!("FACT3 restart: leaf up after {:?}", restarted.elapsed());
}

#[test]
fn fact_a_client_of_b_reads_as_stream_through_its_domain() {
    let _gate = crate::common::gate!();
    let two = TwoDomains::start();
    runtime().block_on(async {
        let (ca, cb) = two.clients().await;
        let js_a = jetstream::new(ca.clone());
        js_a.create_stream(rooms_of_a()).await.expect("a's room stream");
        for i in 0..3 {
            publish_acked(&js_a, "lg.a.room.r1", &format!("r1-{i}")).await;
        }
        for i in 0..2 {
            publish_acked(&js_a, "lg.a.room.r2", &format!("r2-{i}")).await;
        }
        let local = jetstream::new(cb.clone()).get_stream("ROOMS_A").await;
        eprintln!("FACT4 b's own domain: get_stream ROOMS_A = {:?}", local.as_ref().map(|_| "found").map_err(|e| e.to_string()));
        let js_ba = jetstream::with_domain(cb.clone(), "a");
        let mut s = js_ba.get_stream("ROOMS_A").await.expect("ROOMS_A through domain a");
        eprintln!("FACT4 info: {:?}", s.info().await.map(|i| i.state.clone()));
        let d = s.direct_get(2).await.map(|m| (m.sequence, m.payload));
        eprintln!("FACT4 direct get 2: {d:?}");
        let d = s.direct_get_last_for_subject("lg.a.room.r1").await.map(|m| (m.sequence, m.payload));
        eprintln!("FACT4 direct get last r1: {d:?}");
        let d = s.get_raw_message(4).await.map(|m| (m.sequence, m.payload));
        eprintln!("FACT4 msg get 4: {d:?}");
        let d = s.get_last_raw_message_by_subject("lg.a.room.r2").await.map(|m| (m.sequence, m.payload));
        eprintln!("FACT4 msg get last r2: {d:?}");
    });
}

#[test]
fn fact_a_mirror_across_the_leaf_keeps_the_origin_sequence() {
    let _gate = crate::common::gate!();
    let two = TwoDomains::start();
    runtime().block_on(async {
        let (ca, cb) = two.clients().await;
        let (js_a, js_b) = (jetstream::new(ca.clone()), jetstream::new(cb.clone()));
        let origin = js_a.create_stream(rooms_of_a()).await.expect("a's room stream");
        for i in 0..5 {
            publish_acked(&js_a, "lg.a.room.r1", &format!("r1-{i}")).await;
        }
        origin.delete_message(3).await.expect("delete seq 3");
        for i in 0..2 {
            publish_acked(&js_a, "lg.a.room.r2", &format!("r2-{i}")).await;
        }
        let external = Some(stream::External { api_prefix: "$JS.a.API".into(), delivery_prefix: None });
        let mirror = |name: &str, filter: Option<&str>| stream::Config {
            name: name.into(),
            mirror: Some(stream::Source {
                name: "ROOMS_A".into(),
                external: external.clone(),
                filter_subject: filter.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        let made = Instant::now();
        let mut m = js_b.create_stream(mirror("MIRROR_A", None)).await.expect("mirror in b");
        let mut f = js_b.create_stream(mirror("MIRROR_A_R1", Some("lg.a.room.r1"))).await.expect("filtered mirror in b");
        let caught = wait_until_every_async(Duration::from_secs(30), Duration::from_millis(50), || {
            let (mut m, mut f) = (m.clone(), f.clone());
            async move {
                let m = m.info().await.map(|i| i.state.last_sequence).unwrap_or(0);
                let f = f.info().await.map(|i| i.state.last_sequence).unwrap_or(0);
                m == 7 && f == 5
            }
        })
        .await;
        eprintln!("FACT5 mirrors caught up {caught} after {:?}", made.elapsed());
        eprintln!("FACT5 mirror state {:?}", m.info().await.map(|i| (i.state.clone(), i.mirror.clone())));
        eprintln!("FACT5 filtered state {:?}", f.info().await.map(|i| (i.state.clone(), i.mirror.clone())));
        for seq in 1..=7 {
            eprintln!(
                "FACT5 seq {seq}: mirror {:?} filtered {:?}",
                m.get_raw_message(seq).await.map(|x| (x.subject, x.payload)).map_err(|e| e.to_string()),
                f.get_raw_message(seq).await.map(|x| (x.subject, x.payload)).map_err(|e| e.to_string())
            );
        }
        // A cut: a publishes 10 more; the mirror's view; the heal and the catch-up.
        two.link.set(Condition::Cut);
        let cut = Instant::now();
        let down = wait_until_every(Duration::from_secs(30), Duration::from_millis(50), || two.b.leaf_connections() == 0);
        eprintln!("FACT5 leaf down {down} after {:?}", cut.elapsed());
        for i in 0..10 {
            publish_acked(&js_a, "lg.a.room.r1", &format!("cut-{i}")).await;
        }
        eprintln!("FACT5 during cut mirror {:?}", m.info().await.map(|i| (i.state.clone(), i.mirror.clone())));
        two.link.set(Condition::Up);
        let healed = Instant::now();
        let up = wait_until_every(Duration::from_secs(30), Duration::from_millis(50), || two.leaf_up());
        eprintln!("FACT5 leaf up {up} after {:?}", healed.elapsed());
        let caught = wait_until_every_async(Duration::from_secs(180), Duration::from_millis(100), || {
            let mut m = m.clone();
            async move { m.info().await.map(|i| i.state.last_sequence).unwrap_or(0) == 17 }
        })
        .await;
        eprintln!("FACT5 mirror caught up after heal {caught} in {:?}", healed.elapsed());
        eprintln!("FACT5 mirror state {:?}", m.info().await.map(|i| (i.state.clone(), i.mirror.clone())));
        // A long cut: the mirror inactive for CUT_SECS before the heal.
        let cut_secs: u64 = std::env::var("FACT5_CUT_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
        two.link.set(Condition::Cut);
        let cut = Instant::now();
        for i in 0..10 {
            publish_acked(&js_a, "lg.a.room.r1", &format!("cut2-{i}")).await;
        }
        let seen = Mutex::new(Vec::new());
        let stalled = wait_until_every_async(Duration::from_secs(cut_secs + 60), Duration::from_millis(500), || {
            let mut m = m.clone();
            let seen = &seen;
            async move {
                let info = m.info().await.ok().and_then(|i| i.mirror.clone());
                seen.lock().unwrap().push(format!("{:?}: {:?}", cut.elapsed(), info.as_ref().map(|i| (i.lag, i.active))));
                info.and_then(|i| i.active).is_some_and(|a| a >= Duration::from_secs(cut_secs))
            }
        })
        .await;
        eprintln!("FACT5b mirror inactive {cut_secs}s: {stalled} after {:?}; seen:\n  {}", cut.elapsed(), seen.lock().unwrap().join("\n  "));
        two.link.set(Condition::Up);
        let healed = Instant::now();
        let up = wait_until_every(Duration::from_secs(30), Duration::from_millis(50), || two.leaf_up());
        eprintln!("FACT5b leaf up {up} after {:?}", healed.elapsed());
        let caught = wait_until_every_async(Duration::from_secs(300), Duration::from_millis(100), || {
            let mut m = m.clone();
            async move { m.info().await.map(|i| i.state.last_sequence).unwrap_or(0) == 27 }
        })
        .await;
        eprintln!("FACT5b mirror caught up after heal {caught} in {:?} (cut lasted {:?})", healed.elapsed(), healed - cut);
        // Promotion: the mirror setting removed in place, subjects of its own.
        let mut m = js_b.get_stream("MIRROR_A").await.expect("the mirror");
        let mut promoted = m.info().await.expect("info").config.clone();
        promoted.mirror = None;
        promoted.subjects = vec!["lg.b.promoted.>".into()];
        let updated = js_b.update_stream(&promoted).await.map(|i| i.state.clone());
        eprintln!("FACT5 promote: {updated:?}");
        if updated.is_ok() {
            let seq = js_b.publish("lg.b.promoted.r1", "after".into()).await.expect("publish").await.map(|a| a.sequence);
            eprintln!("FACT5 promoted publish seq {seq:?} (origin's last was 27)");
        }
    });
}
