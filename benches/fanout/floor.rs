//! The machine's floor for a fan-out (issue 32): one `write()` of a frame-sized buffer per
//! subscriber per round over loopback TCP and nothing else, the least CPU a server that
//! writes each subscriber its frame can spend. The project's own equivalent of the
//! workplace's `floor.c`: the writer thread is pinned to CPU 0 (where the servers run), a
//! reader thread pinned to CPU 1 drains every socket with epoll, source addresses spread
//! from 127.0.0.2 (at most 20,000 sockets each). The CPU counted is the writer thread's
//! alone (`getrusage(RUSAGE_THREAD)`); on loopback that includes the receiving side's TCP
//! work done on the sender's behalf, as it does in the servers' figures.

use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use socket2::{Domain, Socket, Type};

use crate::procstat;

/// Sockets per source address, as in `floor.c`.
const PER_SOURCE: usize = 20_000;
/// Descriptors kept free for the rest of the bench beside the floor's two per subscriber.
const SPARE_FDS: usize = 64;

/// One floor measurement: `writes` full writes of `frame_bytes` in `secs`, costing the
/// writer `cpu_secs`.
#[derive(Clone, Debug)]
pub struct Floor {
    pub writes: u64,
    pub secs: f64,
    pub cpu_secs: f64,
}

impl Floor {
    pub fn us_per_write(&self) -> f64 {
        if self.writes > 0 {
            self.cpu_secs * 1e6 / self.writes as f64
        } else {
            f64::NAN
        }
    }

    pub fn writes_per_cpu_s(&self) -> f64 {
        if self.cpu_secs > 0.0 {
            self.writes as f64 / self.cpu_secs
        } else {
            f64::NAN
        }
    }

    /// The writer's CPU as a share of one core.
    pub fn cpu_util(&self) -> f64 {
        self.cpu_secs / self.secs
    }
}

/// Connects `subscribers` loopback TCP pairs, then writes one `frame_bytes` frame to each
/// per round, `rounds_per_s` rounds a second (as many as it can if that is too many) for
/// `secs` after one unmeasured round.
pub fn measure(
    subscribers: usize,
    rounds_per_s: f64,
    frame_bytes: usize,
    secs: f64,
) -> Result<Floor, String> {
    if subscribers == 0 || frame_bytes == 0 || !(rounds_per_s > 0.0 && rounds_per_s.is_finite()) {
        return Err(format!("nothing to measure: {subscribers} subscribers, {rounds_per_s} rounds/s, {frame_bytes}-byte frames"));
    }
    let limit = procstat::raise_nofile() as usize;
    let open = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
    if open + 2 * subscribers + SPARE_FDS > limit {
        return Err(format!("needs {} descriptors (both ends of {subscribers} sockets) beside the {open} open; the limit is {limit}", 2 * subscribers));
    }
    let (readers, mut writers) = connect_pairs(subscribers)?;
    let frame = vec![b'x'; frame_bytes];
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (ready_tx, ready_rx) = mpsc::channel();
        let reader = scope.spawn(|| drain(&readers, &stop, ready_tx));
        // No writes without a reader: they would fill the buffers and block.
        let result = match ready_rx.recv() {
            Ok(Ok(())) => scope
                .spawn(|| write_rounds(&mut writers, &frame, rounds_per_s, secs))
                .join()
                .unwrap_or_else(|_| Err("the writer thread panicked".into())),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the reader thread ended before it was ready".into()),
        };
        stop.store(true, Ordering::Relaxed);
        match reader.join() {
            Ok(()) => result,
            Err(_) => Err("the reader thread panicked".into()),
        }
    })
}

/// `n` connected pairs (reading end, writing end) on a fresh listener on 127.0.0.1.
fn connect_pairs(n: usize) -> Result<(Vec<TcpStream>, Vec<TcpStream>), String> {
    let listener =
        Socket::new(Domain::IPV4, Type::STREAM, None).map_err(|e| format!("socket: {e}"))?;
    listener
        .bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())
        .map_err(|e| format!("bind the listener: {e}"))?;
    listener.listen(4096).map_err(|e| format!("listen: {e}"))?;
    let listener: TcpListener = listener.into();
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let (mut readers, mut writers) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        let src = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2 + (i / PER_SOURCE) as u8), 0);
        let sock = Socket::new(Domain::IPV4, Type::STREAM, None)
            .map_err(|e| format!("socket {i}: {e}"))?;
        bind_address_no_port(&sock).map_err(|e| format!("IP_BIND_ADDRESS_NO_PORT: {e}"))?;
        sock.bind(&src.into()).map_err(|e| format!("bind {src}: {e}"))?;
        sock.connect(&addr.into()).map_err(|e| format!("connect {i} of {n}: {e}"))?;
        sock.set_nonblocking(true).map_err(|e| e.to_string())?;
        let (writer, _) = listener.accept().map_err(|e| format!("accept {i} of {n}: {e}"))?;
        writer.set_nodelay(true).map_err(|e| e.to_string())?;
        // A reader that stopped draining must not hang the bench.
        writer.set_write_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
        readers.push(sock.into());
        writers.push(writer);
    }
    Ok((readers, writers))
}

/// The port is chosen at connect time for the whole address pair, so the TIME_WAITs of
/// earlier scenarios from the same source address cannot exhaust it.
fn bind_address_no_port(sock: &Socket) -> std::io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: a valid socket and a c_int option of the right size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// CPU seconds (user + system) the calling thread has used.
fn thread_cpu_secs() -> f64 {
    // SAFETY: getrusage fills the zeroed local struct.
    let r = unsafe {
        let mut r: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut r);
        r
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(r.ru_utime) + tv(r.ru_stime)
}

/// The writer, on CPU 0: one write of `frame` per socket per round, paced like `floor.c`
/// (the next round is due a period after the previous one was due).
fn write_rounds(
    sockets: &mut [TcpStream],
    frame: &[u8],
    rounds_per_s: f64,
    secs: f64,
) -> Result<Floor, String> {
    if !procstat::pin_self(0) {
        return Err("could not pin the writer to CPU 0".into());
    }
    let mut short = 0u64;
    let mut first_error = None;
    let mut round = |writes: &mut u64| {
        for s in sockets.iter_mut() {
            match s.write(frame) {
                Ok(n) if n == frame.len() => *writes += 1,
                Ok(n) => {
                    short += 1;
                    first_error.get_or_insert_with(|| {
                        format!("a write took {n} of {} bytes", frame.len())
                    });
                }
                Err(e) => {
                    short += 1;
                    first_error.get_or_insert_with(|| e.to_string());
                }
            }
        }
    };
    round(&mut 0); // warm-up, not measured
    let period = Duration::from_secs_f64(1.0 / rounds_per_s);
    let (t0, c0) = (Instant::now(), thread_cpu_secs());
    let (mut writes, mut due) = (0u64, t0);
    while t0.elapsed().as_secs_f64() < secs {
        round(&mut writes);
        due += period;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    let (cpu_secs, secs) = (thread_cpu_secs() - c0, t0.elapsed().as_secs_f64());
    if short > 0 {
        return Err(format!(
            "{short} writes failed or were short (the reader fell behind?): {}",
            first_error.unwrap_or_default()
        ));
    }
    Ok(Floor { writes, secs, cpu_secs })
}

/// The reader, on CPU 1: once every socket is in its epoll set (or that failed, said on
/// `ready`), drains every socket epoll reports readable until `stop`.
fn drain(sockets: &[TcpStream], stop: &AtomicBool, ready: mpsc::Sender<Result<(), String>>) {
    if !procstat::pin_self(1) {
        let _ = ready.send(Err("could not pin the reader to CPU 1".into()));
        return;
    }
    // SAFETY: epoll on descriptors that outlive this function; the event buffers are locals.
    unsafe {
        let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
        if ep < 0 {
            let _ = ready.send(Err(format!("epoll_create1: {}", std::io::Error::last_os_error())));
            return;
        }
        for s in sockets {
            let mut ev =
                libc::epoll_event { events: libc::EPOLLIN as u32, u64: s.as_raw_fd() as u64 };
            if libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s.as_raw_fd(), &mut ev) != 0 {
                let _ = ready.send(Err(format!("epoll_ctl: {}", std::io::Error::last_os_error())));
                libc::close(ep);
                return;
            }
        }
        let _ = ready.send(Ok(()));
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 512];
        let mut buf = vec![0u8; 65536];
        while !stop.load(Ordering::Relaxed) {
            let k = libc::epoll_wait(ep, events.as_mut_ptr(), events.len() as libc::c_int, 100);
            for ev in &events[..k.max(0) as usize] {
                let fd = ev.u64 as libc::c_int;
                while libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) == buf.len() as isize {}
            }
        }
        libc::close(ep);
    }
}
