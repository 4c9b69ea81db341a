//! What a connection shares with the rooms it subscribes to ([`ConnectionLink`], the
//! rooms' [`Outlet`]): its machine (`core::delivery::connection`) behind a lock, its backlog, and on
//! a plain-TCP WebSocket the socket's write side ([`Outgoing`]).
//!
//! A room's window is decided and written on the room's own thread when the machine says
//! so ([`Connection::route_window`]: the socket may be written from there and nothing a
//! room posted is still waiting in the connection's mailbox): the machine says what to write
//! (the shared frame, a frame of the connection's own, or nothing) and the frame goes
//! straight to the socket, with no mailbox message and no wake-up unless the socket is
//! full. Otherwise it is posted behind what waits, and the connection decides it when it
//! takes it off its mailbox. Either way the decision is the machine's, made under its lock
//! with the write, so ordering, filtering, the outbox bound and the close rules are the
//! same on both paths.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use parking_lot::{Mutex, MutexGuard};

use super::messages::{Outlet, RoomUpdate, Window};
use super::rooms::RoomAddr;
use super::wsio::Outgoing;
use crate::core::delivery::backlog::Backlog;
use crate::core::delivery::connection::{Connection, Route};
use crate::metrics::Metrics;

pub type Machine = Connection<RoomAddr>;

pub struct ConnectionLink {
    machine: Mutex<Machine>,
    backlog: Arc<Backlog>,
    /// The socket's write side when rooms may write to it (a WebSocket on plain TCP).
    out: Option<Arc<Outgoing>>,
    /// Updates rooms posted that the connection has not handled yet: while there is
    /// one, windows are posted behind it, so nothing overtakes it.
    in_flight: AtomicUsize,
    to: Recipient<RoomUpdate>,
    metrics: Arc<Metrics>,
}

impl ConnectionLink {
    pub fn new(
        machine: Machine,
        backlog: Arc<Backlog>,
        out: Option<Arc<Outgoing>>,
        to: Recipient<RoomUpdate>,
        metrics: Arc<Metrics>,
    ) -> Self {
        ConnectionLink {
            machine: Mutex::new(machine),
            backlog,
            out,
            in_flight: AtomicUsize::new(0),
            to,
            metrics,
        }
    }

    /// The connection's machine, locked: hold it only for one step of the machine
    /// (rooms wait on it to write).
    pub fn machine(&self) -> MutexGuard<'_, Machine> {
        self.machine.lock()
    }

    pub fn backlog(&self) -> &Arc<Backlog> {
        &self.backlog
    }

    /// The connection took one posted update off its mailbox and handled it.
    pub fn handled(&self) {
        let _ = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| Some(n.saturating_sub(1)));
    }
}

impl Outlet for ConnectionLink {
    fn backlog(&self) -> &Backlog {
        &self.backlog
    }

    fn post(&self, update: RoomUpdate) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.to.do_send(update);
    }

    fn window(&self, room: &Arc<str>, window: &Arc<Window>) {
        {
            // Held across the writes: the decision and the write are one step.
            let mut machine = self.machine.lock();
            let waiting = self.in_flight.load(Ordering::Acquire);
            let route =
                machine.route_window(waiting, room, &window.epoch, &window.events, window.targeted);
            let (Route::Write(plan), Some(out)) = (route, &self.out) else {
                drop(machine);
                return self
                    .post(RoomUpdate::Events { room: room.clone(), window: window.clone() });
            };
            self.metrics.outbox_seen(self.backlog.held());
            window.frames_for(plan, |frame| {
                self.metrics.frame_written(frame.events.len());
                let _ = out.write_shared(&frame.frame);
            });
        }
        self.backlog.release(window.frame.len());
    }

    fn connected(&self) -> bool {
        self.to.connected()
    }
}
