//! Failures under load: a publisher and subscribers that reconnect with `since` while a
//! node is killed, nats-server restarts, or every node restarts in turn; nothing
//! acknowledged is lost or delivered twice.

use super::*;

// ---------------------------------------------------------------------------------------
// Load: a publisher and subscribers that reconnect with `since`
// ---------------------------------------------------------------------------------------

/// Where each node takes clients and publishes now (`None`: killed, draining, restarting).
pub(super) type Addrs = Arc<Mutex<Vec<Option<SocketAddr>>>>;

/// How the load's clients and publishers reach the nodes, and when they give up on one.
#[derive(Clone, Debug)]
pub(super) struct Reach {
    /// Where node `i` takes clients and publishes: its own address, or a link's proxy in
    /// front of it (`common::link`).
    pub(super) addrs: Vec<SocketAddr>,
    /// How long a publish or a token request may go unanswered before it is retried on
    /// another node.
    pub(super) answer_within: Duration,
    /// A connection nothing came from (not even a ping) for this long is given up, and
    /// its client reconnects elsewhere, as livegate.js does after 2.5 ping intervals.
    /// `None`: only a close or an end ends a connection.
    pub(super) silence_limit: Option<Duration>,
}

impl Reach {
    /// Every node at its own address, answers awaited 20 s, connections never given up.
    pub(super) fn direct<N: Nats>(cluster: &Cluster<N>) -> Reach {
        Reach {
            addrs: (0..cluster.len()).map(|i| cluster.addr(i)).collect(),
            answer_within: Duration::from_secs(20),
            silence_limit: None,
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Ack {
    room: String,
    id: String,
    seq: u64,
    epoch: Value,
    node: usize,
    duplicate: bool,
}

#[derive(Default, Debug)]
pub(super) struct PublisherReport {
    pub(super) acks: Vec<Ack>,
    /// Failed attempts by "node status" (status 0: transport error).
    pub(super) refusals: BTreeMap<String, usize>,
    /// Publishes attempted (each id once, however often it was retried).
    pub(super) published: usize,
    pub(super) errors: Vec<String>,
    /// How long it was before an attempt got an ack again, per outage (longest first).
    pub(super) stalls: Vec<Duration>,
}

impl PublisherReport {
    /// Several publishers' reports as one.
    fn merge(reports: Vec<PublisherReport>) -> PublisherReport {
        let mut all = PublisherReport::default();
        for report in reports {
            all.acks.extend(report.acks);
            for (key, n) in report.refusals {
                *all.refusals.entry(key).or_default() += n;
            }
            all.published += report.published;
            all.errors.extend(report.errors);
            all.stalls.extend(report.stalls);
        }
        all.stalls.sort_unstable_by(|a, b| b.cmp(a));
        all
    }
}

struct Publisher {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<PublisherReport>,
}

impl Publisher {
    /// Publishes `{"n": n}` with id `PREFIX-n` to `rooms[n % len]` every `every`, on the
    /// nodes of `addrs` in turn from node `first`; a failed attempt (an error status or no
    /// answer) is retried (same id) on the next node, as the book tells users to
    /// (docs/src/troubleshooting.md).
    fn start(
        addrs: Addrs,
        answer_within: Duration,
        rooms: Vec<String>,
        every: Duration,
        prefix: String,
        first: usize,
    ) -> Publisher {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut report = PublisherReport::default();
            let mut https: HashMap<SocketAddr, Http> = HashMap::new();
            let mut cursor = first;
            let mut pacer = Pacer::new(every);
            let mut n = 0usize;
            while !s.load(Ordering::SeqCst) {
                pacer.wait();
                let room = rooms[n % rooms.len()].clone();
                let id = format!("{prefix}-{n}");
                report.published += 1;
                let body = json!({"id": id, "data": {"n": n}});
                let path = format!("/v1/rooms/{room}/events");
                let first_try = Instant::now();
                loop {
                    let target = {
                        let addrs = addrs.lock().unwrap();
                        let len = addrs.len();
                        (0..len).map(|k| (cursor + k) % len).find_map(|i| addrs[i].map(|a| (i, a)))
                    };
                    if let Some((node, addr)) = target {
                        let http = https
                            .entry(addr)
                            .or_insert_with(|| Http::with_timeout(addr, answer_within));
                        match http.try_request("POST", &path, Auth::Key, Body::Json(body.clone())) {
                            Ok((status @ (200 | 201), reply)) => {
                                let seq = reply["seq"].as_u64().unwrap_or(0);
                                if seq == 0 || (status == 200) != (reply["duplicate"] == true) {
                                    report.errors.push(format!(
                                        "{id} on {}: {status} {reply}",
                                        Cluster::name(node)
                                    ));
                                }
                                report.acks.push(Ack {
                                    room: room.clone(),
                                    id: id.clone(),
                                    seq,
                                    epoch: reply["epoch"].clone(),
                                    node,
                                    duplicate: reply["duplicate"] == true,
                                });
                                let stalled = first_try.elapsed();
                                if stalled > Duration::from_millis(500) {
                                    report.stalls.push(stalled);
                                }
                                cursor = node + 1;
                                break;
                            }
                            Ok((status, reply)) => {
                                *report
                                    .refusals
                                    .entry(format!("{} {status}", Cluster::name(node)))
                                    .or_default() += 1;
                                if ![429, 503].contains(&status) && report.errors.len() < 20 {
                                    report.errors.push(format!(
                                        "{id} on {}: {status} {reply}",
                                        Cluster::name(node)
                                    ));
                                }
                            }
                            Err(_) => {
                                *report
                                    .refusals
                                    .entry(format!("{} 0", Cluster::name(node)))
                                    .or_default() += 1
                            }
                        }
                        cursor = node + 1;
                    }
                    if first_try.elapsed() > Duration::from_secs(30) {
                        report
                            .errors
                            .push(format!("{id} not acknowledged by any node within 30 s"));
                        break;
                    }
                    common::pace(Duration::from_millis(20), "a refused publish is retried at 50/s");
                }
                n += 1;
            }
            report.stalls.sort_unstable_by(|a, b| b.cmp(a));
            report
        });
        Publisher { stop, thread }
    }

    fn stop(self) -> PublisherReport {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("publisher thread")
    }
}

struct LoadShared {
    addrs: Addrs,
    answer_within: Duration,
    silence_limit: Option<Duration>,
    ready: AtomicUsize,
    /// Every room's final head, once the publisher has stopped.
    targets: watch::Receiver<Option<HashMap<String, u64>>>,
}

#[derive(Debug, Clone)]
#[allow(dead_code)] // the fields are for the failure messages
pub(super) enum Ending {
    Close(Option<u16>, String),
    /// The stream ended or failed without a Close frame (1006 to a client).
    Abnormal(String),
    /// Nothing came for this long ([`Reach::silence_limit`]): the client gave up on it.
    Silent(Duration),
}

#[derive(Debug)]
pub(super) struct ClientReport {
    pub(super) id: usize,
    pub(super) room: String,
    pub(super) home: usize,
    /// (seq, id) of every event of the room, in arrival order.
    pub(super) got: Vec<(u64, String)>,
    /// When each of `got` arrived.
    pub(super) arrivals: Vec<Instant>,
    /// How each connection ended, with the node it was on.
    pub(super) endings: Vec<(usize, Ending)>,
    /// When each of `endings` happened.
    pub(super) ended_at: Vec<Instant>,
    /// The nodes connected to, in order.
    pub(super) nodes: Vec<usize>,
    pub(super) errors: Vec<String>,
}

const LOAD_CLIENT_LIMIT: Duration = Duration::from_secs(90);
/// How long [`Load::finish`] waits for the reader's copies of the rooms to reach every
/// acknowledged seq (milliseconds when the cluster is well; the bound for a loaded machine).
const COPIES_CATCH_UP: Duration = Duration::from_secs(10);

/// Handshake on `node` (a fresh token minted there), then subscribe to `room` (with
/// `since` and `epoch` after the first time). Returns the socket, the `subscribed` reply
/// and the frames that came before it.
async fn attach(
    addr: SocketAddr,
    answer_within: Duration,
    user: &str,
    room: &str,
    since: Option<(u64, Value)>,
) -> Result<(WsClient, Value, Vec<Value>), String> {
    let token = {
        let user = user.to_string();
        tokio::task::spawn_blocking(move || try_mint_within(addr, &user, "web", answer_within))
            .await
            .map_err(|e| e.to_string())??
    };
    let mut ws = try_ws(addr, token, None).await?;
    let mut req = json!({"op": "subscribe", "room": room, "ref": 1});
    if let Some((s, epoch)) = &since {
        req["since"] = json!(s);
        if !epoch.is_null() {
            req["epoch"] = epoch.clone();
        }
    }
    match tokio::time::timeout(WAIT, ws.ws.send(Message::Text(req.to_string()))).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(format!("send {req}: {e}")),
        Err(_) => return Err(format!("send {req}: timed out")),
    }
    let mut before = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match ws.next_incoming(left).await {
            Incoming::Json(v) if v["ref"] == 1 => return Ok((ws, v, before)),
            Incoming::Json(v) => before.push(v),
            Incoming::Timeout => return Err(format!("no reply to {req} within {WAIT:?}")),
            other => return Err(format!("connection ended before the reply to {req}: {other:?}")),
        }
    }
}

/// A subscriber of `room` that starts on node `home` and, whenever its connection ends
/// (or stays silent past [`Reach::silence_limit`]), reconnects to another node taking
/// clients and resubscribes with `since` + epoch, until it holds the room's final head.
async fn load_client(
    id: usize,
    user: String,
    room: String,
    home: usize,
    shared: Arc<LoadShared>,
) -> ClientReport {
    let mut report = ClientReport {
        id,
        room: room.clone(),
        home,
        got: Vec::new(),
        arrivals: Vec::new(),
        endings: Vec::new(),
        ended_at: Vec::new(),
        nodes: Vec::new(),
        errors: Vec::new(),
    };
    let deadline = Instant::now() + LOAD_CLIENT_LIMIT;
    let mut last = 0u64;
    let mut epoch = Value::Null;
    let mut node = home;
    let mut first = true;
    'connections: loop {
        // Connect: the home node first, then any other node taking clients.
        let mut attempt = 0usize;
        let (mut ws, reply, before) = loop {
            let candidate = {
                let addrs = shared.addrs.lock().unwrap();
                let len = addrs.len();
                let start = if first { node } else { node + 1 + attempt };
                (0..len)
                    .map(|k| (start + k) % len)
                    .find(|&i| (first || i != node || len == 1) && addrs[i].is_some())
                    .map(|i| (i, addrs[i].unwrap()))
            };
            attempt += 1;
            if let Some((i, addr)) = candidate {
                let since = if first { None } else { Some((last, epoch.clone())) };
                match attach(addr, shared.answer_within, &user, &room, since).await {
                    Ok(ok) => {
                        node = i;
                        break ok;
                    }
                    Err(e) if first => {
                        report
                            .errors
                            .push(format!("first connection on {}: {e}", Cluster::name(i)));
                        return report;
                    }
                    Err(_) => {}
                }
            }
            if Instant::now() > deadline {
                report.errors.push(format!(
                    "could not reconnect within {LOAD_CLIENT_LIMIT:?} (last seq {last})"
                ));
                return report;
            }
            common::pace_async(
                Duration::from_millis(100),
                "a client that found no node retries at 10/s",
            )
            .await;
        };
        report.nodes.push(node);
        if reply["op"] != "subscribed" {
            report.errors.push(format!("subscribe on {}: {reply}", Cluster::name(node)));
            return report;
        }
        if first {
            epoch = reply["epoch"].clone();
            last = reply["seq"].as_u64().unwrap_or(0);
            if last != 0 {
                report.errors.push(format!("first subscribe: head {last}, expected a fresh room"));
            }
            first = false;
            shared.ready.fetch_add(1, Ordering::SeqCst);
        } else {
            if reply["recovered"] != true {
                report
                    .errors
                    .push(format!("resubscribe on {} since {last}: {reply}", Cluster::name(node)));
            }
            if !epoch.is_null() && reply["epoch"] != epoch {
                report.errors.push(format!(
                    "epoch changed from {epoch} to {} on {}",
                    reply["epoch"],
                    Cluster::name(node)
                ));
            }
            if epoch.is_null() {
                epoch = reply["epoch"].clone();
            }
        }
        for frame in before {
            if frame["op"] == "events" {
                report.take(&frame, &mut last);
            }
        }
        let mut targets = shared.targets.clone();
        loop {
            let target = targets.borrow_and_update().as_ref().and_then(|t| t.get(&room).copied());
            if target.is_some_and(|t| last >= t) {
                ws.close().await;
                return report;
            }
            if Instant::now() > deadline {
                report.errors.push(format!(
                    "after {LOAD_CLIENT_LIMIT:?}: last seq {last}, target {target:?}"
                ));
                return report;
            }
            match ws.next_incoming(Duration::from_millis(200)).await {
                Incoming::Json(frame) => report.take(&frame, &mut last),
                Incoming::Timeout => {
                    let silent = ws.last_heard.elapsed();
                    if shared.silence_limit.is_some_and(|limit| silent > limit) {
                        // Dropped, not closed: a close handshake would wait on the dead link.
                        report.ended(node, Ending::Silent(silent));
                        continue 'connections;
                    }
                }
                Incoming::Close(code, reason) => {
                    report.ended(node, Ending::Close(code, reason));
                    // Let tungstenite answer the Close, then leave.
                    let _ = tokio::time::timeout(Duration::from_secs(1), async {
                        while ws.ws.next().await.is_some() {}
                    })
                    .await;
                    continue 'connections;
                }
                Incoming::Ended(e) => {
                    report.ended(node, Ending::Abnormal(e));
                    continue 'connections;
                }
            }
        }
    }
}

impl ClientReport {
    /// The events of the room in `frame`, checked to follow `last`, stamped with now.
    fn take(&mut self, frame: &Value, last: &mut u64) {
        let before = self.got.len();
        take_events(frame, &self.room, last, &mut self.got, &mut self.errors);
        self.arrivals.resize(self.got.len().max(before), Instant::now());
    }

    fn ended(&mut self, node: usize, how: Ending) {
        self.endings.push((node, how));
        self.ended_at.push(Instant::now());
    }

    /// When this client was receiving again after `since`: its first event after `since`
    /// and after the last of its connections that ended before `until`.
    pub(super) fn back_at(&self, since: Instant, until: Instant) -> Option<Instant> {
        let lost = self
            .ended_at
            .iter()
            .copied()
            .filter(|&t| t >= since && t < until)
            .max()
            .unwrap_or(since);
        self.arrivals.iter().copied().find(|&t| t > lost)
    }
}

/// What a load run ends with: the final histories (read on `reader`), the publisher's
/// report and every client's report, checked against each other.
pub(super) struct LoadOutcome {
    pub(super) histories: HashMap<String, (Vec<Value>, Value, u64)>,
    pub(super) published: PublisherReport,
    pub(super) clients: Vec<ClientReport>,
}

pub(super) struct Load {
    rooms: Vec<String>,
    addrs: Addrs,
    shared: Arc<LoadShared>,
    targets_tx: watch::Sender<Option<HashMap<String, u64>>>,
    clients: Vec<tokio::task::JoinHandle<ClientReport>>,
    publishers: Vec<Publisher>,
}

impl Load {
    /// `clients` subscribers spread over the nodes and rooms, all subscribed before the
    /// publisher starts.
    pub(super) fn start<N: Nats>(
        rt: &tokio::runtime::Runtime,
        cluster: &Cluster<N>,
        prefix: &str,
        rooms: usize,
        clients: usize,
        every: Duration,
    ) -> Load {
        let reach = Reach::direct(cluster);
        let mut load = Load::subscribed(rt, cluster, &reach, prefix, rooms, clients);
        load.publishers.push(Publisher::start(
            load.addrs.clone(),
            reach.answer_within,
            load.rooms.clone(),
            every,
            "p".into(),
            0,
        ));
        load
    }

    /// [`Load::start`] with one publisher per node (ids `p<node>-n`), each starting on
    /// its node, every `every`.
    pub(super) fn start_everywhere<N: Nats>(
        rt: &tokio::runtime::Runtime,
        cluster: &Cluster<N>,
        prefix: &str,
        rooms: usize,
        clients: usize,
        every: Duration,
    ) -> Load {
        Load::start_everywhere_via(
            rt,
            cluster,
            &Reach::direct(cluster),
            prefix,
            rooms,
            clients,
            every,
        )
    }

    /// [`Load::start_everywhere`] with the nodes reached as `reach` says.
    pub(super) fn start_everywhere_via<N: Nats>(
        rt: &tokio::runtime::Runtime,
        cluster: &Cluster<N>,
        reach: &Reach,
        prefix: &str,
        rooms: usize,
        clients: usize,
        every: Duration,
    ) -> Load {
        let mut load = Load::subscribed(rt, cluster, reach, prefix, rooms, clients);
        for i in 0..cluster.len() {
            load.publishers.push(Publisher::start(
                load.addrs.clone(),
                reach.answer_within,
                load.rooms.clone(),
                every,
                format!("p{i}"),
                i,
            ));
        }
        load
    }

    fn subscribed<N: Nats>(
        rt: &tokio::runtime::Runtime,
        cluster: &Cluster<N>,
        reach: &Reach,
        prefix: &str,
        rooms: usize,
        clients: usize,
    ) -> Load {
        let rooms: Vec<String> = (0..rooms).map(|r| format!("{prefix}:{r}")).collect();
        let addrs: Addrs = Arc::new(Mutex::new(reach.addrs.iter().copied().map(Some).collect()));
        let (targets_tx, targets_rx) = watch::channel(None);
        let shared = Arc::new(LoadShared {
            addrs: addrs.clone(),
            answer_within: reach.answer_within,
            silence_limit: reach.silence_limit,
            ready: AtomicUsize::new(0),
            targets: targets_rx,
        });
        let handles: Vec<_> = (0..clients)
            .map(|i| {
                let (user, room, home) =
                    (format!("{prefix}-u{i}"), rooms[i % rooms.len()].clone(), i % cluster.len());
                rt.spawn(load_client(i, user, room, home, shared.clone()))
            })
            .collect();
        let all = wait_until(Duration::from_secs(30), || {
            shared.ready.load(Ordering::SeqCst) == clients
                || handles.iter().any(|h| h.is_finished())
        });
        if !all || shared.ready.load(Ordering::SeqCst) != clients {
            let finished: Vec<ClientReport> = handles
                .into_iter()
                .filter(|h| h.is_finished())
                .filter_map(|h| rt.block_on(h).ok())
                .collect();
            panic!(
                "only {} of {clients} load clients subscribed; finished early: {:?}; logs:\n{}",
                shared.ready.load(Ordering::SeqCst),
                finished.iter().map(|r| (r.id, &r.errors)).collect::<Vec<_>>(),
                cluster.logs()
            );
        }
        Load { rooms, addrs, shared, targets_tx, clients: handles, publishers: Vec::new() }
    }

    /// Node `i` takes no clients and publishes (set before killing or draining it).
    pub(super) fn node_down(&self, i: usize) {
        self.addrs.lock().unwrap()[i] = None;
    }

    pub(super) fn node_up(&self, i: usize, addr: SocketAddr) {
        self.addrs.lock().unwrap()[i] = Some(addr);
    }

    /// Stops the publisher, reads the final histories on `reader`, lets the clients catch
    /// up to them and collects everything.
    ///
    /// `reader` answers from its own copy of each room, which may be a moment behind a
    /// publish another node acknowledged just before the publishers stopped (the book's
    /// cluster chapter says so): the histories are read once each copy's head has reached
    /// the room's highest acknowledged seq, or after [`COPIES_CATCH_UP`] (and then an
    /// acknowledged event still missing is reported lost by `check`).
    pub(super) fn finish(mut self, rt: &tokio::runtime::Runtime, reader: &Http) -> LoadOutcome {
        let published = PublisherReport::merge(
            std::mem::take(&mut self.publishers).into_iter().map(Publisher::stop).collect(),
        );
        let mut acked: HashMap<&str, u64> = HashMap::new();
        for a in &published.acks {
            let top = acked.entry(a.room.as_str()).or_default();
            *top = (*top).max(a.seq);
        }
        let caught_up = wait_until(COPIES_CATCH_UP, || {
            acked.iter().all(|(room, &seq)| {
                let page = reader.history_ok(room, Some(seq - 1), Some(1));
                page["head"].as_u64() >= Some(seq)
            })
        });
        if !caught_up {
            eprintln!("the reader's copies did not reach every acknowledged seq within {COPIES_CATCH_UP:?}");
        }
        let histories: HashMap<String, (Vec<Value>, Value, u64)> =
            self.rooms.iter().map(|r| (r.clone(), full_history(reader, r, 0))).collect();
        let targets = histories.iter().map(|(r, h)| (r.clone(), h.2)).collect();
        self.targets_tx.send(Some(targets)).expect("clients listen");
        let clients = rt.block_on(async {
            let mut out = Vec::new();
            for (i, c) in std::mem::take(&mut self.clients).into_iter().enumerate() {
                match tokio::time::timeout(LOAD_CLIENT_LIMIT + Duration::from_secs(10), c).await {
                    Ok(Ok(r)) => out.push(r),
                    Ok(Err(e)) => panic!("load client {i} failed: {e}"),
                    Err(_) => panic!("load client {i} did not finish"),
                }
            }
            out
        });
        let _ = &self.shared;
        LoadOutcome { histories, published, clients }
    }
}

impl LoadOutcome {
    /// Nothing acknowledged lost, histories contiguous without a repeated id, every
    /// client holding exactly 1..=head of its room with the history's ids, in order.
    pub(super) fn check(&self, failures: &mut Vec<String>) {
        let mut lost = 0usize;
        let mut acked: HashMap<&str, u64> = HashMap::new();
        for a in &self.published.acks {
            if let Some(prev) = acked.insert(&a.id, a.seq) {
                if prev != a.seq {
                    failures.push(format!(
                        "{} acknowledged twice with different seqs {prev} and {}",
                        a.id, a.seq
                    ));
                }
            }
            let (events, epoch, _) = &self.histories[&a.room];
            if &a.epoch != epoch {
                failures.push(format!(
                    "{} acknowledged in epoch {}, the history has {epoch}",
                    a.id, a.epoch
                ));
            }
            match events.get((a.seq as usize).wrapping_sub(1)) {
                Some(e) if e["id"] == a.id.as_str() && seq_of(e) == a.seq => {}
                other => {
                    lost += 1;
                    if lost <= 10 {
                        failures.push(format!(
                            "acknowledged {} ({} seq {}, by {}) not in history: {other:?}",
                            a.id,
                            a.room,
                            a.seq,
                            Cluster::name(a.node)
                        ));
                    }
                }
            }
        }
        if lost > 0 {
            failures.push(format!("{lost} acknowledged events lost"));
        }
        for (room, (events, _, head)) in &self.histories {
            if seqs(events) != (1..=*head).collect::<Vec<_>>() {
                failures.push(format!(
                    "history of {room} is not 1..={head} without holes ({} events)",
                    events.len()
                ));
            }
            let ids: HashSet<&str> = events.iter().filter_map(|e| e["id"].as_str()).collect();
            if ids.len() != events.len() {
                failures.push(format!("history of {room} holds an id twice"));
            }
        }
        if !self.published.errors.is_empty() {
            failures.push(format!("publisher errors: {:?}", self.published.errors));
        }
        let (mut missing, mut duplicated) = (0usize, 0usize);
        for c in &self.clients {
            let who = format!(
                "client {} ({} from {}, via {:?})",
                c.id,
                c.room,
                Cluster::name(c.home),
                c.nodes.iter().map(|&n| Cluster::name(n)).collect::<Vec<_>>()
            );
            for e in c.errors.iter().take(5) {
                failures.push(format!("{who}: {e}"));
            }
            let (events, _, head) = &self.histories[&c.room];
            let got: Vec<u64> = c.got.iter().map(|g| g.0).collect();
            let distinct: HashSet<u64> = got.iter().copied().collect();
            duplicated += got.len() - distinct.len();
            missing += (1..=*head).filter(|s| !distinct.contains(s)).count();
            if got != (1..=*head).collect::<Vec<_>>() {
                failures.push(format!(
                    "{who}: received {} events ({} distinct), expected exactly 1..={head} in order",
                    got.len(),
                    distinct.len()
                ));
            }
            for (seq, id) in &c.got {
                if let Some(e) = events.get((*seq as usize).wrapping_sub(1)) {
                    if e["id"] != id.as_str() {
                        failures.push(format!(
                            "{who}: seq {seq} delivered with id {id}, history has {}",
                            e["id"]
                        ));
                        break;
                    }
                }
            }
        }
        if missing + duplicated > 0 {
            failures.push(format!(
                "over all clients: {missing} events missing, {duplicated} delivered twice"
            ));
        }
    }

    /// How long after `since` every client was connected and receiving again
    /// ([`ClientReport::back_at`], endings before `until`), or the clients that never were.
    pub(super) fn every_client_back(
        &self,
        since: Instant,
        until: Instant,
    ) -> Result<Duration, Vec<usize>> {
        let backs: Vec<(usize, Option<Instant>)> =
            self.clients.iter().map(|c| (c.id, c.back_at(since, until))).collect();
        let never: Vec<usize> =
            backs.iter().filter(|(_, b)| b.is_none()).map(|(id, _)| *id).collect();
        if !never.is_empty() {
            return Err(never);
        }
        Ok(backs.iter().filter_map(|(_, b)| *b).max().map_or(Duration::ZERO, |last| last - since))
    }

    /// Events delivered to all clients together (each client's copy counts).
    pub(super) fn delivered(&self) -> usize {
        self.clients.iter().map(|c| c.got.len()).sum()
    }

    pub(super) fn summary(&self) -> String {
        let heads: BTreeMap<&String, u64> = self.histories.iter().map(|(r, h)| (r, h.2)).collect();
        let reconnects: usize = self.clients.iter().map(|c| c.endings.len()).sum();
        format!(
            "{} acks ({} duplicate replies), heads {heads:?}, refusals {:?}, longest stalls {:?}, {} clients, {reconnects} reconnects",
            self.published.acks.len(),
            self.published.acks.iter().filter(|a| a.duplicate).count(),
            self.published.refusals,
            &self.published.stalls[..self.published.stalls.len().min(3)],
            self.clients.len()
        )
    }
}

// ---------------------------------------------------------------------------------------
// (e) kill -9 of a node under load
// ---------------------------------------------------------------------------------------

#[test]
fn kill_9_of_a_node_under_load_loses_nothing_acknowledged() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let mut cluster = Cluster::start(3, &SHORT_DRAIN);
    let rt = runtime();
    let load = Load::start(&rt, &cluster, "kill", 3, 30, Duration::from_millis(10));
    common::pace(Duration::from_millis(1500), "load runs on all three nodes");
    // Killed with publishes in flight on it; then no client or publisher picks it again.
    let killed_at = Instant::now();
    cluster.take_node(0).kill9();
    load.node_down(0);
    common::pace(Duration::from_secs(4), "load goes on without a, across its detection");
    let outcome = load.finish(&rt, &cluster.http(1));
    let mut failures = Vec::new();
    outcome.check(&mut failures);
    for c in &outcome.clients {
        let on_killed = c.home == 0;
        match (on_killed, c.endings.as_slice()) {
            (true, [(0, _)]) | (false, []) => {}
            (_, endings) => failures.push(format!(
                "client {} from {}: connection endings {endings:?} (expected {})",
                c.id,
                Cluster::name(c.home),
                if on_killed { "exactly one, on a" } else { "none" }
            )),
        }
    }
    let acked_after_kill = outcome.published.acks.iter().filter(|a| a.node != 0).count();
    eprintln!(
        "kill -9 of a under load: {}; {acked_after_kill} acks by b/c; kill {:.1} s into the test; test took {:.1} s",
        outcome.summary(),
        (killed_at - started).as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "kill -9 under load", &failures, &LOG_NEEDLES);
}

// ---------------------------------------------------------------------------------------
// (f) nats-server restarted under load
// ---------------------------------------------------------------------------------------

#[test]
fn nats_server_restarted_under_load_loses_nothing_and_queued_directory_writes_replay() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    // New sessions are accepted for 1 s of outage (writes queued), refused after that.
    let mut flags = SHORT_DRAIN.to_vec();
    flags.extend(["--directory-outage-secs", "1"]);
    let mut cluster = Cluster::start(3, &flags);
    let rt = runtime();
    let load = Load::start(&rt, &cluster, "natsdown", 3, 9, Duration::from_millis(10));
    common::pace(Duration::from_millis(1500), "load with NATS up");
    let mut failures = Vec::new();

    let down_at = Instant::now();
    cluster.nats.kill9();

    // A new session on b while NATS is down: the handshake works, its directory write waits.
    let b = cluster.addr(1);
    // No node tells whether it has noticed (its /readyz stays 200): nothing to poll.
    common::let_time_pass(Duration::from_millis(300), "b notices the lost NATS connection");
    let outage_client = match try_mint(b, "outage-user", "web") {
        Ok(token) => match rt.block_on(try_ws(b, token, None)) {
            Ok(mut ws) => {
                rt.block_on(ws.assert_alive());
                Some(ws)
            }
            Err(e) => {
                failures.push(format!("handshake on b during the NATS outage: {e}"));
                None
            }
        },
        Err(e) => {
            failures.push(format!("token on b during the NATS outage: {e}"));
            None
        }
    };
    let outage_session = outage_client.as_ref().map(|ws| ws.session().to_string());
    // Publishing is refused while NATS is down (nothing is acknowledged that is not stored).
    match cluster.http(2).try_request(
        "POST",
        "/v1/rooms/natsdown:probe/events",
        Auth::Key,
        Body::Json(json!({"data": 1})),
    ) {
        Ok((503, _)) => {}
        other => failures.push(format!("publish on c with NATS down: expected 503, got {other:?}")),
    }
    // Past directory_outage_secs, a new session is refused instead of guessed.
    common::let_time_pass_until(
        down_at + Duration::from_millis(2500),
        "past directory_outage_secs (1 s)",
    );
    match try_mint(b, "late-outage-user", "web") {
        Ok(token) => match rt.block_on(try_ws(b, token, None)) {
            Ok(ws) => failures.push(format!(
                "a new session on b {:?} into the NATS outage (directory_outage_secs 1) was accepted: {}",
                down_at.elapsed(),
                ws.welcome
            )),
            Err(e) if e.contains(" 503 ") && e.contains("directory_unavailable") => {}
            Err(e) => failures.push(format!("new session on b after directory_outage_secs: expected 503 directory_unavailable, got {e}")),
        },
        Err(e) => failures.push(format!("token on b during the NATS outage: {e}")),
    }
    common::pace(
        Duration::from_secs(3).saturating_sub(down_at.elapsed()),
        "the outage lasts 3 s under load",
    );
    cluster.nats.restart();
    let up_at = Instant::now();

    // Every node publishes again by itself.
    let mut back_after = Vec::new();
    for i in 0..3 {
        let http = cluster.http(i);
        let room = format!("natsdown:probe-{i}");
        let ok = wait_until(Duration::from_secs(20), || {
            matches!(
                http.try_request(
                    "POST",
                    &format!("/v1/rooms/{room}/events"),
                    Auth::Key,
                    Body::Json(json!({"data": 1}))
                ),
                Ok((201 | 200, _))
            )
        });
        if !ok {
            failures.push(format!(
                "node {} did not publish again within 20 s of the NATS restart",
                Cluster::name(i)
            ));
        }
        back_after.push(up_at.elapsed());
    }
    common::pace(Duration::from_secs(2), "load with NATS back");
    let outcome = load.finish(&rt, &cluster.http(0));
    outcome.check(&mut failures);
    for c in &outcome.clients {
        if !c.endings.is_empty() {
            failures.push(format!(
                "client {} on {}: its connection ended although only NATS restarted: {:?}",
                c.id,
                Cluster::name(c.home),
                c.endings
            ));
        }
    }

    // The outage session: its queued directory write reached the directory ...
    if let (Some(mut ws), Some(session)) = (outage_client, outage_session) {
        let url = cluster.nats.url();
        let recorded = rt.block_on(async {
            let probe = livegate::cluster::Cluster::connect(&url, "probe")
                .await
                .map_err(|e| format!("connect: {e:?}"))?;
            let kv = KvSessions::open(&probe).await.map_err(|e| format!("open kv: {e:?}"))?;
            let (kv, session) = (&kv, &session);
            common::wait_for_every_async(
                Duration::from_secs(15),
                Duration::from_millis(100),
                || async move {
                    match kv.entry(session).await {
                        Ok(Some((record, _))) => Some(Ok(record)),
                        Ok(None) => None,
                        Err(e) => Some(Err(format!("read {session}: {e:?}"))),
                    }
                },
            )
            .await
            .unwrap_or_else(|| {
                Err(format!("no directory record for {session} 15 s after NATS came back"))
            })
        });
        match recorded {
            Ok(record) if record.owner == "b" && record.user == "outage-user" => {}
            Ok(record) => failures.push(format!(
                "directory record of the outage session: {record:?}, expected owner b"
            )),
            Err(e) => failures.push(format!("queued directory write not replayed: {e}")),
        }
        // ... routing knows it (once c counts b up again: heartbeats in a row after NATS
        // came back) ...
        let query = format!("session={session}");
        if !wait_until(Duration::from_secs(10), || {
            route(&cluster.http(2), &query).as_deref() == Ok("b")
        }) {
            failures.push(format!(
                "/v1/route?{query} on c: {:?}, expected b",
                route(&cluster.http(2), &query)
            ));
        }
        // ... and the connection made during the outage is usable: its inbox ...
        let inbox = "user:outage-user";
        let body = json!({"id": "inbox-after-1", "data": {"after": true}});
        let (status, reply) = cluster.http(0).request(
            "POST",
            "/v1/users/outage-user/messages",
            Auth::Key,
            Body::Json(body),
        );
        if status != 201 {
            failures.push(format!(
                "message to outage-user on a after NATS came back: {status} {reply}"
            ));
        } else {
            let (got, other) = rt.block_on(collect_events(&mut ws, inbox, 1, WAIT));
            failures.extend(other.into_iter().map(|o| format!("outage connection, inbox: {o}")));
            if got.first().map(|e| &e["id"]) != Some(&json!("inbox-after-1")) {
                failures.push(format!(
                    "the connection opened during the outage did not get its inbox message after NATS came back \
                     (got {got:?}); inbox notice: {:?}",
                    ws.inbox_subscribed
                ));
            }
        }
        // ... and a room.
        let room = "natsdown:after";
        let sub = rt.block_on(ws.subscribe(room));
        if sub["op"] != "subscribed" {
            failures.push(format!("subscribe on the outage connection: {sub}"));
        } else {
            let reply = cluster.http(0).publish_ok(room, Some("after-1"), json!({"after": true}));
            let (got, other) = rt.block_on(collect_events(&mut ws, room, 1, WAIT));
            failures.extend(other.into_iter().map(|o| format!("outage connection: {o}")));
            if got.first().map(|e| (&e["id"], &e["seq"]))
                != Some((&json!("after-1"), &reply["seq"]))
            {
                failures
                    .push(format!("outage connection received {got:?} after publishing {reply}"));
            }
        }
    }
    eprintln!(
        "nats-server kill -9 + restart under load: {}; outage {:.1} s; nodes publishing again {:?} after the restart; test took {:.1} s",
        outcome.summary(),
        (up_at - down_at).as_secs_f64(),
        back_after,
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "nats-server restart under load", &failures, &LOG_NEEDLES);
}

/// A move charged to a user's migration budget while NATS is down is not dropped: the
/// node that made it keeps the charge in its store, writes it to the directory when NATS
/// is back, and from then on every node refuses the user's next unchosen move inside the
/// window (4029). Heartbeats every 2 s keep the peers alive through the 3 s outage, so the
/// move is one the route did not choose (its owner alive and ready), not a forced one.
#[test]
fn a_move_charged_during_a_nats_outage_reaches_the_directory_and_every_node_refuses_the_next() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let mut flags = SHORT_DRAIN.to_vec();
    flags.extend(["--cluster-heartbeat-ms", "2000", "--probe-up-after", "1"]);
    let mut cluster = Cluster::start(3, &flags);
    let cluster_ready = Instant::now();
    let rt = runtime();
    let mut failures = Vec::new();

    let token = cluster.http(0).mint_token("outage-mover", "web");
    let ws = rt.block_on(WsClient::connect(cluster.addr(0), &token, None));
    let session = ws.session().to_string();
    rt.block_on(ws.close());
    // b and c read the session's record (and so can route it from their cache while NATS
    // is down): each sends the client to a, spending nothing.
    for i in [1, 2] {
        let token = cluster.http(i).mint_token("outage-mover", "web");
        if let Ok(ws) =
            rt.block_on(WsClient::try_connect(cluster.addr(i), Some(&token), Some(&session)))
        {
            panic!(
                "{} accepted a session owned by a, which is alive: {}",
                Cluster::name(i),
                ws.welcome
            );
        }
    }
    // Past the restart grace: an avoid= of a is charged, not believed as a restart.
    common::let_time_pass_until(
        cluster_ready + Duration::from_millis(RESTART_GRACE_MS + 500),
        "the nodes outlive the restart grace",
    );

    let token = cluster.http(1).mint_token("outage-mover", "web");
    cluster.nats.kill9();
    // No node tells whether it has noticed (its /readyz stays 200): nothing to poll.
    common::let_time_pass(Duration::from_millis(300), "the nodes notice the lost NATS connection");
    let here = match rt.block_on(connect_avoiding(cluster.addr(1), &token, &session, "a")) {
        Ok(ws) => {
            let here = ws.welcome["node"].as_str().unwrap_or_default().to_string();
            if ws.session() != session || !["b", "c"].contains(&here.as_str()) {
                failures.push(format!("avoiding a during the outage, the session must move to b or c: {}", ws.welcome));
            }
            rt.block_on(ws.close());
            here
        }
        Err(r) => panic!("an avoided move during the NATS outage (the first inside the window) was refused: {} {}", r.status, r.body),
    };
    cluster.nats.restart();
    // The node that made the move writes its charge when NATS is back.
    if !common::wait_until_every(Duration::from_secs(20), Duration::from_millis(100), || {
        !cluster.log_lines(&["charges=1"]).is_empty()
    }) {
        fail_with_logs(
            &cluster,
            "charge during outage",
            &["the charge was not replayed within 20 s".into()],
            &LOG_NEEDLES,
        );
    }
    cluster.wait_peers(Duration::from_secs(20));

    // Away from its new node, through a: a second unchosen move inside the window,
    // refused wherever it is decided, with the credential unspent.
    let token = cluster.http(0).mint_token("outage-mover", "web");
    match rt.block_on(connect_avoiding(cluster.addr(0), &token, &session, &here)) {
        Err(r) if r.status == 429 && r.header("close-code") == Some("4029") => {}
        Err(r) => failures.push(format!(
            "second avoided move after the outage: expected close 4029, got {} {}",
            r.status, r.body
        )),
        Ok(ws) => failures.push(format!(
            "the charge made during the outage was lost: a second avoided move was allowed: {}",
            ws.welcome
        )),
    }
    eprintln!(
        "charge during outage: moved to {here}; test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "charge during outage", &failures, &LOG_NEEDLES);
}

// ---------------------------------------------------------------------------------------
// (g) rolling restart of all three nodes under load
// ---------------------------------------------------------------------------------------

#[test]
fn rolling_restart_of_all_nodes_under_load_has_no_abnormal_close_no_loss_no_duplicate() {
    let _gate = crate::common::gate!();
    let started = Instant::now();
    let mut cluster = Cluster::start(3, &SHORT_DRAIN);
    let rt = runtime();
    let load = Load::start(&rt, &cluster, "roll", 3, 30, Duration::from_millis(10));
    common::pace(Duration::from_secs(1), "load on the whole cluster");
    let mut failures = Vec::new();
    let mut drains = Vec::new();
    for i in 0..3 {
        load.node_down(i);
        let signal_at = Instant::now();
        let drained = cluster.drain_node(i, &mut failures) - signal_at;
        cluster.start_node(i);
        load.node_up(i, cluster.addr(i));
        cluster.wait_peers(Duration::from_secs(20));
        drains.push((Cluster::name(i), drained, signal_at.elapsed()));
        common::pace(Duration::from_secs(1), "load on the whole cluster again");
    }
    let outcome = load.finish(&rt, &cluster.http(0));
    outcome.check(&mut failures);
    let mut closes: BTreeMap<String, usize> = BTreeMap::new();
    for c in &outcome.clients {
        for (node, ending) in &c.endings {
            let key = match ending {
                Ending::Close(Some(1012), _) => "1012".to_string(),
                other => {
                    failures.push(format!(
                        "client {} on {}: abnormal ending {other:?}",
                        c.id,
                        Cluster::name(*node)
                    ));
                    format!("{other:?}")
                }
            };
            *closes.entry(key).or_default() += 1;
        }
    }
    eprintln!(
        "rolling restart under load: {}; closes {closes:?}; (node, SIGTERM->exit, SIGTERM->rejoined) {drains:?}; test took {:.1} s",
        outcome.summary(),
        started.elapsed().as_secs_f64()
    );
    fail_with_logs(&cluster, "rolling restart under load", &failures, &LOG_NEEDLES);
}

/// A node started while its NATS server is not up yet (pods started together) keeps
/// trying to join, says so in its log, and becomes ready once NATS is there, instead of
/// exiting at once.
#[test]
fn a_node_started_before_its_nats_server_waits_and_joins() {
    let _gate = crate::common::gate!();
    let root = tempfile::Builder::new().prefix("livegate-join-").tempdir().expect("tempdir");
    let mut nats = NatsServer::start_in(root.path());
    nats.kill9();
    let (url, data, log) = (nats.url(), root.path().join("data-a"), root.path().join("node-a.log"));
    std::fs::create_dir_all(&data).expect("data dir");
    let starting = {
        let (data, log) = (data.clone(), log.clone());
        std::thread::spawn(move || {
            common::process::ServeProcess::start_named(
                &data,
                &log,
                "a",
                &["--cluster-nats-url", &url],
            )
        })
    };
    common::pace(Duration::from_secs(2), "the node starts while NATS is down");
    nats.restart();
    let node = starting.join().expect("the node became ready once NATS was up");
    let reply = node.http().publish_ok("join:1", Some("join-1"), json!({ "n": 1 }));
    assert_eq!(reply["seq"], 1, "{reply}");
    let text = node.log_text();
    assert!(
        text.contains("could not join the cluster through NATS yet"),
        "the node says it is waiting for NATS:\n{text}"
    );
}
