//! The NATS facts cells rely on (issue 47), pinned on the current nats-server
//! ([`current_nats_server`](common::nats::current_nats_server)): two servers, JetStream
//! domains `a` and `b`, server b a leaf node of server a through a cuttable proxy
//! (`common::link`), each started as a cell's server
//! ([`NatsServer::start_cell`]: a low `ping_interval`, the remote ignoring discovered
//! servers). No livegate runs here: each test names a fact of nats-server the cells'
//! design depends on, so that a nats-server that changes it fails here first, and prints
//! the figures it measured (the book's failure table quotes them).
//!
//! - KV buckets of one name are separate per domain, and `$KV.>` does not cross the leaf;
//!   a client reaches the other cell's bucket only through its domain.
//! - Ordinary subjects do cross, a stream's subjects included: a stream on the same
//!   subjects in both cells stores every publish twice.
//! - A republished room event reaches a core subscriber in the other cell.
//! - A request across the leaf times out during a silent cut until the leaf's pings
//!   close it, then finds no responders at once; a killed server finds none at once.
//! - A client of one cell reads the other cell's stream through its domain.
//! - A mirror across the leaf keeps the origin's sequence numbers (gaps too), cannot
//!   tell how far behind it is during a cut, catches up after a heal within a bound,
//!   and a promoted mirror goes on from the next seq; it keeps serving what it has while
//!   its origin's server is dead and resumes after the restart.

use super::*;
use async_nats::jetstream::{self, kv, stream};
use async_nats::{Client, Request, RequestErrorKind};
use common::link::{Condition, Link};
use common::nats::{CellNatsConfig, NatsServer, CELL_PING_INTERVAL, CELL_PING_MAX};
use tempfile::TempDir;

/// Servers `a` (domain `a`) and `b` (domain `b`), b leaf-connected to a through `link`.
struct TwoDomains {
    a: NatsServer,
    b: NatsServer,
    link: Link,
    root: Option<TempDir>,
}

/// How long a leaf connection may take to come up (b solicits it about once a second).
const LEAF_UP: Duration = Duration::from_secs(15);
/// How long after a silent cut the leaf may stay open: measured 3.5 s with the cells'
/// ping interval (1 s, 2 pings outstanding); nats-server's default would keep it minutes.
const CUT_NOTICED: Duration = Duration::from_secs(10);
/// How long the long cut of the mirror test lasts (the mirror inactive this long).
const MIRROR_CUT: Duration = Duration::from_secs(20);
/// How long after the heal a mirror may take to catch up: measured 36 s after a 20 s cut
/// and 46 s after a 60 s one (a stalled mirror is retried with a back-off of up to 2 min).
const MIRROR_CATCH_UP: Duration = Duration::from_secs(150);

impl TwoDomains {
    fn start() -> TwoDomains {
        let root =
            tempfile::Builder::new().prefix("livegate-cell-nats-").tempdir().expect("tempdir");
        let a =
            NatsServer::start_cell(&root.path().join("a"), "a", None, &CellNatsConfig::default());
        let link = Link::start();
        let proxy = link.proxy(a.leaf_addr());
        let b = NatsServer::start_cell(
            &root.path().join("b"),
            "b",
            Some(&format!("nats-leaf://{proxy}")),
            &CellNatsConfig::default(),
        );
        let two = TwoDomains { a, b, link, root: Some(root) };
        two.wait_leaf_up(LEAF_UP);
        two
    }

    fn leaf_up(&self) -> bool {
        self.a.leaf_connections() == 1 && self.b.leaf_connections() == 1
    }

    fn wait_leaf_up(&self, within: Duration) {
        let up = wait_until_every(within, Duration::from_millis(20), || self.leaf_up());
        assert!(
            up,
            "no leaf connection between a and b within {within:?}; logs:\n{}\n{}",
            self.a.log_text(),
            self.b.log_text()
        );
    }

    fn wait_leaf_down(&self, within: Duration) {
        let down =
            wait_until_every(within, Duration::from_millis(20), || self.b.leaf_connections() == 0);
        assert!(down, "b still has its leaf connection {within:?} later");
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
                eprintln!(
                    "cell NATS test failed: the servers' logs and stores kept in {}",
                    root.keep().display()
                );
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
async fn ask(
    client: &Client,
    subject: &str,
    timeout: Duration,
) -> Result<String, RequestErrorKind> {
    let request = Request::new().payload("ping".into()).timeout(Some(timeout));
    match client.send_request(subject.to_string(), request).await {
        Ok(msg) => Ok(String::from_utf8_lossy(&msg.payload).into_owned()),
        Err(e) => Err(e.kind()),
    }
}

/// Waits until a request from `client` on `subject` is answered: the interest of the
/// subscriber has reached `client`'s server (over the leaf, when across).
async fn wait_answered(client: &Client, subject: &str, within: Duration) -> bool {
    wait_until_every_async(within, Duration::from_millis(20), || async {
        ask(client, subject, Duration::from_millis(500)).await.is_ok()
    })
    .await
}

/// Makes sure every subscription `b` made before this call is known to server a:
/// interest travels in order over the one leaf connection, so once a later subscription
/// of `b` answers a request from `a`, the earlier ones have arrived too.
async fn interest_reached(a: &Client, b: &Client, probe: &'static str) {
    serve(b, probe, "b").await;
    assert!(
        wait_answered(a, probe, Duration::from_secs(10)).await,
        "b's interest in {probe} never reached a"
    );
}

/// The room stream of cell a as the design has it: origin subjects of its own
/// (`lg.a.room.>`), republished to `lg.live.>` for the live fan-out, direct gets allowed.
fn rooms_of_a() -> stream::Config {
    stream::Config {
        name: "ROOMS_A".into(),
        subjects: vec!["lg.a.room.>".into()],
        allow_direct: true,
        republish: Some(stream::Republish {
            source: "lg.a.room.>".into(),
            destination: "lg.live.>".into(),
            headers_only: false,
        }),
        ..Default::default()
    }
}

async fn publish_acked(js: &jetstream::Context, subject: &str, payload: &str) -> u64 {
    let ack = js
        .publish(subject.to_string(), payload.to_string().into())
        .await
        .expect("publish")
        .await
        .expect("publish ack");
    ack.sequence
}

async fn messages(js: &jetstream::Context, stream: &str) -> u64 {
    let mut s = js.get_stream(stream).await.unwrap_or_else(|e| panic!("stream {stream}: {e}"));
    s.info().await.unwrap_or_else(|e| panic!("info of {stream}: {e}")).state.messages
}

async fn last_seq(s: &stream::Stream) -> u64 {
    s.clone().info().await.map(|i| i.state.last_sequence).unwrap_or(0)
}

#[test]
fn kv_buckets_of_one_name_stay_in_their_domain_and_kv_subjects_do_not_cross_the_leaf() {
    let _gate = crate::common::gate!();
    let two = TwoDomains::start();
    runtime().block_on(async {
        let (ca, cb) = two.clients().await;
        let (js_a, js_b) = (jetstream::new(ca.clone()), jetstream::new(cb.clone()));
        let config = kv::Config { bucket: "CELLKV".into(), history: 1, ..Default::default() };
        let kv_a = js_a.create_key_value(config.clone()).await.expect("bucket in a");
        let kv_b = js_b.create_key_value(config).await.expect("bucket in b");
        // Everything of $KV.CELLKV and a marker, on b; the marker published on a after
        // the put travels the same connections, so it comes after the put if the put
        // crossed at all.
        let mut kv_on_b = cb.subscribe("$KV.CELLKV.>").await.expect("subscribe $KV on b");
        let mut marker_on_b = cb.subscribe("marker.kv").await.expect("subscribe marker on b");
        interest_reached(&ca, &cb, "probe.kv").await;
        kv_a.put("from-a", "1".into()).await.expect("put on a");
        ca.publish("marker.kv", "after the put".into()).await.expect("marker");
        let marker = tokio::time::timeout(Duration::from_secs(5), marker_on_b.next()).await;
        assert!(
            matches!(marker, Ok(Some(_))),
            "the marker published on a after the put never reached b: {marker:?}"
        );
        let crossed = tokio::time::timeout(Duration::from_millis(1), kv_on_b.next()).await;
        assert!(crossed.is_err(), "a's KV put crossed the leaf to a subscriber on b: {crossed:?}");
        kv_b.put("from-b", "2".into()).await.expect("put on b");
        assert_eq!(kv_b.get("from-a").await.expect("get on b"), None, "a's key in b's bucket");
        assert_eq!(kv_a.get("from-b").await.expect("get on a"), None, "b's key in a's bucket");
        // A put into a's bucket from a client of b, addressed to domain a: stored in a.
        let kv_ba = jetstream::with_domain(cb.clone(), "a")
            .get_key_value("CELLKV")
            .await
            .expect("a's bucket through domain a");
        kv_ba.put("from-b-to-a", "3".into()).await.expect("put through domain a");
        assert_eq!(
            kv_ba.get("from-a").await.expect("get through domain a").as_deref(),
            Some(&b"1"[..]),
            "a's value read from b"
        );
        assert_eq!(
            kv_a.get("from-b-to-a").await.expect("get on a").as_deref(),
            Some(&b"3"[..]),
            "the put through domain a"
        );
        // A raw $KV publish from b's client lands in b's own bucket.
        let raw =
            js_b.publish("$KV.CELLKV.raw", "4".into()).await.expect("publish").await.expect("ack");
        assert_eq!(raw.domain, "b", "a raw $KV put from b is acknowledged by {raw:?}");
        // Long after the put on a, b's bucket still holds only b's own two keys.
        assert_eq!(
            (messages(&js_a, "KV_CELLKV").await, messages(&js_b, "KV_CELLKV").await),
            (2, 2),
            "messages in a's and b's bucket"
        );
    });
}

#[test]
fn ordinary_subjects_cross_the_leaf_so_a_stream_in_both_domains_stores_each_publish_twice() {
    let _gate = crate::common::gate!();
    let two = TwoDomains::start();
    runtime().block_on(async {
        let (ca, cb) = two.clients().await;
        let (js_a, js_b) = (jetstream::new(ca.clone()), jetstream::new(cb.clone()));
        let both = stream::Config {
            name: "BOTH".into(),
            subjects: vec!["both.>".into()],
            ..Default::default()
        };
        js_a.create_stream(both.clone()).await.expect("BOTH in a");
        js_b.create_stream(both).await.expect("BOTH in b");
        // No core subscriber anywhere: b's stream's own interest crosses the leaf.
        interest_reached(&ca, &cb, "probe.both").await;
        let ack = js_a.publish("both.x", "one".into()).await.expect("publish").await.expect("ack");
        assert_eq!(
            ack.domain, "a",
            "the publisher on a is acknowledged by its own domain: {ack:?}"
        );
        let twice =
            wait_until_every_async(Duration::from_secs(5), Duration::from_millis(20), || async {
                messages(&js_a, "BOTH").await == 1 && messages(&js_b, "BOTH").await == 1
            })
            .await;
        assert!(
            twice,
            "a publish on a stored in a and b: a has {}, b has {}",
            messages(&js_a, "BOTH").await,
            messages(&js_b, "BOTH").await
        );
        let ack = js_b.publish("both.y", "two".into()).await.expect("publish").await.expect("ack");
        assert_eq!(
            ack.domain, "b",
            "the publisher on b is acknowledged by its own domain: {ack:?}"
        );
        let twice =
            wait_until_every_async(Duration::from_secs(5), Duration::from_millis(20), || async {
                messages(&js_a, "BOTH").await == 2 && messages(&js_b, "BOTH").await == 2
            })
            .await;
        assert!(
            twice,
            "a publish on b stored in a and b: a has {}, b has {}",
            messages(&js_a, "BOTH").await,
            messages(&js_b, "BOTH").await
        );
    });
}

#[test]
fn a_republished_room_event_reaches_a_core_subscriber_in_the_other_cell() {
    let _gate = crate::common::gate!();
    let two = TwoDomains::start();
    runtime().block_on(async {
        let (ca, cb) = two.clients().await;
        let js_a = jetstream::new(ca.clone());
        js_a.create_stream(rooms_of_a()).await.expect("a's room stream");
        let mut live = cb.subscribe("lg.live.>").await.expect("subscribe on b");
        interest_reached(&ca, &cb, "probe.live").await;
        for i in 1..=5 {
            assert_eq!(
                publish_acked(&js_a, "lg.a.room.r1", &format!("e{i}")).await,
                i,
                "origin seq"
            );
        }
        for i in 1..=5u64 {
            let msg = match tokio::time::timeout(Duration::from_secs(5), live.next()).await {
                Ok(Some(msg)) => msg,
                other => panic!("event {i} of 5 not republished to b within 5 s: {other:?}"),
            };
            let header = |name: &str| {
                msg.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str().to_string())
            };
            assert_eq!(msg.subject.as_str(), "lg.live.r1", "republished subject");
            assert_eq!(&msg.payload[..], format!("e{i}").as_bytes(), "payload, in order");
            assert_eq!(
                header("Nats-Stream").as_deref(),
                Some("ROOMS_A"),
                "Nats-Stream of event {i}"
            );
            assert_eq!(header("Nats-Sequence"), Some(i.to_string()), "Nats-Sequence of event {i}");
            assert_eq!(
                header("Nats-Subject").as_deref(),
                Some("lg.a.room.r1"),
                "Nats-Subject of event {i}"
            );
        }
    });
}

#[test]
fn a_request_across_the_leaf_times_out_during_a_silent_cut_then_finds_no_responders() {
    let _gate = crate::common::gate!();
    let mut two = TwoDomains::start();
    let rt = runtime();
    let (ca, cb) = rt.block_on(two.clients());
    rt.block_on(serve(&ca, "svc.a", "a"));
    assert!(
        rt.block_on(wait_answered(&cb, "svc.a", Duration::from_secs(10))),
        "a's service never answered a client of b"
    );

    // A silent cut: b's requests go into the dead leaf and time out (the caller's own
    // timeout), until the leaf's pings close it; then no responders, at once.
    two.link.set(Condition::Cut);
    let cut = Instant::now();
    let mut outcomes = Vec::new();
    let no_responders_at = loop {
        let asked = Instant::now();
        let outcome = rt.block_on(ask(&cb, "svc.a", Duration::from_millis(500)));
        outcomes.push(format!("{:?}: {outcome:?} in {:?}", asked - cut, asked.elapsed()));
        match outcome {
            Err(RequestErrorKind::NoResponders) => break cut.elapsed(),
            Err(RequestErrorKind::TimedOut) => {}
            other => {
                panic!("a request during the cut: {other:?}; so far:\n  {}", outcomes.join("\n  "))
            }
        }
        assert!(
            cut.elapsed() < CUT_NOTICED,
            "the leaf still open {CUT_NOTICED:?} after a silent cut:\n  {}",
            outcomes.join("\n  ")
        );
    };
    assert!(
        outcomes.len() > 1,
        "no responders at once after a silent cut (the cut was not silent?):\n  {}",
        outcomes.join("\n  ")
    );
    assert_eq!(two.b.leaf_connections(), 0, "b answers no responders but still has its leaf");
    let fast = Instant::now();
    assert_eq!(
        rt.block_on(ask(&cb, "svc.a", Duration::from_millis(500))),
        Err(RequestErrorKind::NoResponders),
        "after the leaf closed"
    );
    let no_responders_in = fast.elapsed();
    assert!(
        no_responders_in < Duration::from_millis(100),
        "no responders took {no_responders_in:?}"
    );
    eprintln!(
        "silent cut (ping_interval {CELL_PING_INTERVAL}, ping_max {CELL_PING_MAX}): requests timed out until {no_responders_at:?}, \
         then no responders in {no_responders_in:?}"
    );

    two.link.set(Condition::Up);
    let healed = Instant::now();
    assert!(
        rt.block_on(wait_answered(&cb, "svc.a", Duration::from_secs(10))),
        "not answered again within 10 s of the heal"
    );
    let answered_again = healed.elapsed();

    // kill -9 of a: its socket closes, the proxy passes the close on, no wait at all.
    two.a.kill9();
    let killed = Instant::now();
    let outcome = rt.block_on(wait_for_every_async(
        Duration::from_secs(5),
        Duration::from_millis(1),
        || async {
            match ask(&cb, "svc.a", Duration::from_millis(500)).await {
                Err(RequestErrorKind::NoResponders) => Some(killed.elapsed()),
                _ => None,
            }
        },
    ));
    let after_kill = outcome.expect("no responders within 5 s of kill -9 of a");
    assert!(
        after_kill < Duration::from_secs(1),
        "no responders {after_kill:?} after kill -9 of a: more than 1 s"
    );
    two.a.restart();
    let restarted = Instant::now();
    two.wait_leaf_up(LEAF_UP);
    rt.block_on(serve(&ca, "svc.a2", "a"));
    assert!(
        rt.block_on(wait_answered(&cb, "svc.a2", Duration::from_secs(10))),
        "a's new service never answered after the restart"
    );
    eprintln!(
        "heal: answered again in {answered_again:?}; kill -9 of a: no responders in {after_kill:?}; restart of a: leaf up and \
         answering in {:?}",
        restarted.elapsed()
    );
}

#[test]
fn a_client_of_one_cell_reads_the_other_cells_stream_through_its_domain() {
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
        assert!(local.is_err(), "a's stream found through b's own domain");
        let js_ba = jetstream::with_domain(cb.clone(), "a");
        let mut s = js_ba.get_stream("ROOMS_A").await.expect("ROOMS_A through domain a");
        assert_eq!(
            s.info().await.expect("info").state.last_sequence,
            5,
            "a's stream's info read from b"
        );
        let got = |m: async_nats::jetstream::message::StreamMessage| {
            (m.sequence, String::from_utf8_lossy(&m.payload).into_owned())
        };
        assert_eq!(s.direct_get(2).await.map(got).expect("direct get 2"), (2, "r1-1".to_string()));
        assert_eq!(
            s.direct_get_last_for_subject("lg.a.room.r1")
                .await
                .map(got)
                .expect("direct get last r1"),
            (3, "r1-2".to_string())
        );
        assert_eq!(
            s.get_raw_message(4).await.map(got).expect("STREAM.MSG.GET 4"),
            (4, "r2-0".to_string())
        );
        assert_eq!(
            s.get_last_raw_message_by_subject("lg.a.room.r2")
                .await
                .map(got)
                .expect("STREAM.MSG.GET last r2"),
            (5, "r2-1".to_string())
        );
    });
}

#[test]
fn a_mirror_across_the_leaf_keeps_the_origin_seqs_and_catches_up_after_a_heal() {
    let _gate = crate::common::gate!();
    let two = TwoDomains::start();
    runtime().block_on(async {
        let (ca, cb) = two.clients().await;
        let (js_a, js_b) = (jetstream::new(ca.clone()), jetstream::new(cb.clone()));
        let origin = js_a.create_stream(rooms_of_a()).await.expect("a's room stream");
        for i in 0..5 {
            publish_acked(&js_a, "lg.a.room.r1", &format!("r1-{i}")).await;
        }
        origin.delete_message(3).await.expect("delete seq 3: a gap");
        for i in 0..2 {
            publish_acked(&js_a, "lg.a.room.r2", &format!("r2-{i}")).await;
        }
        let mirror = |name: &str, filter: Option<&str>| stream::Config {
            name: name.into(),
            mirror: Some(stream::Source {
                name: "ROOMS_A".into(),
                external: Some(stream::External { api_prefix: "$JS.a.API".into(), delivery_prefix: None }),
                filter_subject: filter.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        let made = Instant::now();
        let m = js_b.create_stream(mirror("MIRROR_A", None)).await.expect("mirror in b");
        let f = js_b.create_stream(mirror("MIRROR_A_R1", Some("lg.a.room.r1"))).await.expect("filtered mirror in b");
        let caught = wait_until_every_async(Duration::from_secs(30), Duration::from_millis(20), || async {
            last_seq(&m).await == 7 && last_seq(&f).await == 5
        })
        .await;
        assert!(caught, "mirrors not caught up within 30 s: {} of 7, filtered {} of 5", last_seq(&m).await, last_seq(&f).await);
        let first_catch_up = made.elapsed();
        // The origin's seqs, its gap included; the filtered mirror has only r1's seqs.
        let at = |s: &stream::Stream, seq: u64| {
            let s = s.clone();
            async move { s.get_raw_message(seq).await.ok().map(|m| String::from_utf8_lossy(&m.payload).into_owned()) }
        };
        let expected = [Some("r1-0"), Some("r1-1"), None, Some("r1-3"), Some("r1-4"), Some("r2-0"), Some("r2-1")];
        for (seq, want) in (1..=7).zip(expected) {
            assert_eq!(at(&m, seq).await.as_deref(), want, "mirror at origin seq {seq}");
            let want_r1 = want.filter(|p| p.starts_with("r1"));
            assert_eq!(at(&f, seq).await.as_deref(), want_r1, "filtered mirror at origin seq {seq}");
        }

        // A cut long enough for the mirror to stall; a publishes 10 events meanwhile.
        two.link.set(Condition::Cut);
        let cut = Instant::now();
        for i in 0..10 {
            publish_acked(&js_a, "lg.a.room.r1", &format!("cut-{i}")).await;
        }
        let mirror_info = || {
            let mut m = m.clone();
            async move { m.info().await.expect("mirror info").mirror.clone().expect("mirror's source info") }
        };
        let stalled = wait_until_every_async(MIRROR_CUT + Duration::from_secs(30), Duration::from_millis(200), || async {
            mirror_info().await.active.is_some_and(|a| a >= MIRROR_CUT)
        })
        .await;
        let during = mirror_info().await;
        assert!(stalled, "the mirror still active {:?} into the cut: {during:?}", cut.elapsed());
        // It cannot tell how far behind it is: lag 0 while 10 behind.
        assert_eq!((last_seq(&m).await, during.lag), (7, 0), "mirror head and lag during the cut (origin at 17): {during:?}");
        two.link.set(Condition::Up);
        let healed = Instant::now();
        let caught = wait_until_every_async(MIRROR_CATCH_UP, Duration::from_millis(100), || async { last_seq(&m).await == 17 }).await;
        let catch_up = healed.elapsed();
        assert!(caught, "the mirror at {} of 17, {catch_up:?} after the heal", last_seq(&m).await);
        for seq in 8..=17 {
            assert_eq!(at(&m, seq).await, Some(format!("cut-{}", seq - 8)), "mirror at origin seq {seq} after the heal");
        }
        eprintln!(
            "mirror: caught up 7 origin seqs {first_catch_up:?} after its creation; after a {:?} cut, caught up {catch_up:?} after the heal",
            healed - cut
        );

        // Promotion: the mirror setting removed in place, subjects of its own; the next
        // event follows the origin's last seq.
        let mut promoted = m.clone().info().await.expect("mirror info").config.clone();
        promoted.mirror = None;
        promoted.subjects = vec!["lg.b.promoted.>".into()];
        js_b.update_stream(&promoted).await.expect("promote the mirror in place");
        let next = js_b.publish("lg.b.promoted.r1", "after".into()).await.expect("publish").await.expect("ack").sequence;
        assert_eq!(next, 18, "the promoted mirror's first own seq");
    });
}

#[test]
fn a_mirror_resumes_after_its_origins_server_is_killed_and_restarted() {
    let _gate = crate::common::gate!();
    let mut two = TwoDomains::start();
    let rt = runtime();
    let (ca, cb) = rt.block_on(two.clients());
    let _entered = rt.enter();
    let (js_a, js_b) = (jetstream::new(ca), jetstream::new(cb));
    let m = rt.block_on(async {
        js_a.create_stream(rooms_of_a()).await.expect("a's room stream");
        for i in 0..5 {
            publish_acked(&js_a, "lg.a.room.r1", &format!("before-{i}")).await;
        }
        let config = stream::Config {
            name: "MIRROR_A".into(),
            mirror: Some(stream::Source {
                name: "ROOMS_A".into(),
                external: Some(stream::External {
                    api_prefix: "$JS.a.API".into(),
                    delivery_prefix: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let m = js_b.create_stream(config).await.expect("mirror in b");
        let caught =
            wait_until_every_async(Duration::from_secs(30), Duration::from_millis(20), || async {
                last_seq(&m).await == 5
            })
            .await;
        assert!(caught, "the mirror at {} of 5", last_seq(&m).await);
        m
    });
    // kill -9 of a (the cell's whole NATS): the mirror keeps what it had and answers.
    two.a.kill9();
    let killed = Instant::now();
    two.wait_leaf_down(Duration::from_secs(10));
    assert_eq!(rt.block_on(last_seq(&m)), 5, "the mirror's head with its origin dead");
    let read =
        rt.block_on(m.get_raw_message(5)).map(|x| String::from_utf8_lossy(&x.payload).into_owned());
    assert_eq!(read.ok().as_deref(), Some("before-4"), "the mirror read with its origin dead");
    two.a.restart();
    let restarted = Instant::now();
    two.wait_leaf_up(LEAF_UP);
    let leaf_back = restarted.elapsed();
    // a's client reconnects by itself; a new event in a reaches the mirror.
    rt.block_on(async {
        let published = wait_for_every_async(Duration::from_secs(20), Duration::from_millis(100), || async {
            let ack = js_a.publish("lg.a.room.r1", "after".into()).await.ok()?;
            ack.await.ok().map(|a| a.sequence)
        })
        .await;
        assert_eq!(published, Some(6), "the first event after a's restart (its store kept 5)");
        let published_at = restarted.elapsed();
        let caught = wait_until_every_async(MIRROR_CATCH_UP, Duration::from_millis(100), || async { last_seq(&m).await == 6 }).await;
        let catch_up = restarted.elapsed();
        assert!(caught, "the mirror at {} of 6, {catch_up:?} after a's restart", last_seq(&m).await);
        eprintln!(
            "origin's server killed and restarted ({:?} down): leaf back {leaf_back:?}, first publish acknowledged {published_at:?} \
             and mirror caught up {catch_up:?} after the restart",
            restarted - killed
        );
    });
}
