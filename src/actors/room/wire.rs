//! The room machine's world as the actor makes it (`core::delivery::room::Wire`): a subscriber is
//! a connection's outlet, a window is rendered once and shared by every subscriber.

use std::sync::Arc;

use super::Pending;
use crate::actors::messages::*;
use crate::core::delivery::backlog::Backlog;
use crate::core::delivery::room::Wire;

/// Where a subscriber's updates go (the machine's sink).
#[derive(Clone)]
pub struct Subscriber {
    pub(super) to: Arc<dyn Outlet>,
    /// Wants the room's presence frames.
    pub(super) presence: bool,
}

/// What a subscribe's answer carries back from the machine.
pub struct Ticket {
    pub(super) reference: Option<i64>,
    pub(super) member: Option<crate::core::delivery::presence::Member>,
}

/// The room machine's world as the actor makes it: windows rendered once and shared.
pub struct Frames;

impl Wire for Frames {
    type Event = Arc<Delivery>;
    type Window = Arc<Window>;
    type Sink = Subscriber;
    type Ticket = Ticket;
    type Reply = Pending;
    type Error = RoomLogError;
    type Failed = PublishFailed;

    fn cut(&self, epoch: &Arc<str>, events: Vec<Arc<Delivery>>) -> Vec<Arc<Window>> {
        Window::cut(epoch, events)
    }
    fn bytes(window: &Arc<Window>) -> usize {
        window.frame.len()
    }
    fn backlog(sink: &Subscriber) -> &Backlog {
        sink.to.backlog()
    }
    fn not_loaded() -> RoomLogError {
        RoomLogError::NotLoaded
    }
}
