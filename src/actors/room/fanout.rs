//! One frame's fan-out over the machine's cores. A room hands every subscriber the same
//! window ([`Outlet::window`]: the connection's decision under its lock and, for a socket
//! with room, the write itself). A big room's hand-out is cut in pieces that the room's
//! thread and the writer threads (one per other core the process may run on) take in
//! turn; the room's thread returns when every piece is written. So a connection's windows
//! from one room stay in order (the room's next frame starts after this one is handed
//! out), the room's batching window opens after the last write, and a core busy with
//! other work slows the hand-out by one piece at most. A small room's frame, or a process
//! on one core, is handed out on the room's own thread.
//!
//! Bounds: the writer threads are one per core but one, started once; a hand-out holds
//! one entry per subscriber of the frame, freed when the last thread that took part in it
//! lets go.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::{Condvar, Mutex};

use crate::actors::messages::{Outlet, Window};

/// Below this many subscribers a frame is handed out on the room's own thread: waking
/// the writers costs more than it saves.
const SPLIT_FROM: usize = 1024;
/// Subscribers a thread takes at a time: small enough that a writer thread the
/// scheduler leaves waiting holds the room back by one piece at most.
const PIECE: usize = 128;

/// The windows of one frame, gathered to be handed out together.
#[derive(Default)]
pub(super) struct FanOut {
    windows: Vec<(Arc<dyn Outlet>, Arc<Window>)>,
}

impl FanOut {
    pub(super) fn add(&mut self, to: Arc<dyn Outlet>, window: Arc<Window>) {
        self.windows.push((to, window));
    }

    /// Hand out every window gathered; when there are many, the writer threads take
    /// pieces of them beside the room's thread, which returns once every piece is done.
    pub(super) fn hand_out(&mut self, room: &Arc<str>) {
        if self.windows.is_empty() {
            return;
        }
        let windows = std::mem::take(&mut self.windows);
        let Some(writers) = writers().filter(|_| windows.len() >= SPLIT_FROM) else {
            return windows.iter().for_each(|(to, window)| to.window(room, window));
        };
        let job = Arc::new(Job::new(room.clone(), windows));
        for _ in 0..writers.current_num_threads() {
            let job = job.clone();
            writers.spawn(move || job.take_pieces());
        }
        job.take_pieces();
        job.wait();
    }
}

/// One frame's hand-out shared by the threads writing it: pieces taken in turn, so a
/// thread that starts late finds fewer (or none) and none waits for it.
struct Job {
    room: Arc<str>,
    windows: Vec<(Arc<dyn Outlet>, Arc<Window>)>,
    pieces: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    finished: Mutex<bool>,
    all_done: Condvar,
}

impl Job {
    fn new(room: Arc<str>, windows: Vec<(Arc<dyn Outlet>, Arc<Window>)>) -> Job {
        let pieces = windows.len().div_ceil(PIECE);
        Job {
            room,
            windows,
            pieces,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            finished: Mutex::new(false),
            all_done: Condvar::new(),
        }
    }

    /// Hand out pieces until none is left to take.
    fn take_pieces(&self) {
        loop {
            let piece = self.next.fetch_add(1, Ordering::Relaxed);
            if piece >= self.pieces {
                return;
            }
            let slice = &self.windows[piece * PIECE..self.windows.len().min((piece + 1) * PIECE)];
            slice.iter().for_each(|(to, window)| to.window(&self.room, window));
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.pieces {
                *self.finished.lock() = true;
                self.all_done.notify_all();
            }
        }
    }

    /// Until every piece is handed out (the pieces left are being written right now).
    fn wait(&self) {
        let mut finished = self.finished.lock();
        while !*finished {
            self.all_done.wait(&mut finished);
        }
    }
}

/// Threads that hand out a big room's frame, the room's own included (`fanout_threads`;
/// 0: one per core the process may run on).
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// Set how many threads hand out a big room's frame, the room's own included (0: one per
/// core; 1: the room's thread alone). Before the first big frame: the writer threads start
/// then, once.
pub fn set_threads(threads: usize) {
    THREADS.store(threads, Ordering::Relaxed);
}

/// The writer threads: one fewer than the threads handing a frame out; none for one.
fn writers() -> Option<&'static rayon::ThreadPool> {
    static WRITERS: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    WRITERS
        .get_or_init(|| {
            let threads = match THREADS.load(Ordering::Relaxed) {
                0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
                n => n,
            };
            if threads < 2 {
                return None;
            }
            let built = rayon::ThreadPoolBuilder::new()
                .num_threads(threads - 1)
                .thread_name(|n| format!("livegate-fanout-{n}"))
                .build();
            match built {
                Ok(pool) => Some(pool),
                Err(error) => {
                    tracing::warn!(%error, "fan-out writer threads not started: frames are handed out on the rooms' threads");
                    None
                }
            }
        })
        .as_ref()
}
