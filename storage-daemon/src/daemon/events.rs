//! [`EventQueue`]: QEMU's asynchronous events (`BLOCK_EXPORT_DELETED`, the jobs'
//! `JOB_STATUS_CHANGE`), sent by whatever module sees them happen, from
//! any thread, and delivered on the control loop to every listener (the QMP monitor's
//! connected clients).
//!
//! - [`EventQueue::send`] takes the time at once (QEMU's `timestamp` is when the event
//!   happened, not when it was delivered) and never blocks on a client.
//! - Events are delivered in the order they were sent, by a bottom half of the control loop,
//!   after the command or callback that sent them has returned: a QMP reply goes out before
//!   the events its command raised, as QEMU sends them.
//! - Before a listener is attached (and once the daemon has stopped) events are dropped, as
//!   QEMU drops the events of a monitor nobody is connected to.
//!
//! This module owns the queue and its delivery; an event's wire form is the monitor's
//! ([`Event::to_json`] gives QEMU's), the listeners are whoever attaches.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use aio_core::EventLoop;
use aio_loop::{AioContext, BottomHalf};
use serde_json::{json, Value};

/// One event: QEMU's name, its `data`, and when it happened.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    name: String,
    data: Value,
    timestamp: SystemTime,
}

impl Event {
    /// Event `name` (QEMU's, e.g. `BLOCK_EXPORT_DELETED`) with `data` (a JSON object), now.
    pub fn new(name: impl Into<String>, data: Value) -> Self {
        Event {
            name: name.into(),
            data,
            timestamp: SystemTime::now(),
        }
    }

    /// QEMU's name of the event.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The event's `data`.
    pub fn data(&self) -> &Value {
        &self.data
    }

    /// QMP's form: `{"event", "data", "timestamp": {"seconds", "microseconds"}}`.
    pub fn to_json(&self) -> Value {
        let since = self
            .timestamp
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        json!({
            "event": self.name,
            "data": self.data,
            "timestamp": {
                "seconds": since.as_secs(),
                "microseconds": since.subsec_micros(),
            },
        })
    }
}

/// What the queue holds: the events not yet delivered, and the bottom half that delivers.
#[derive(Default)]
struct Shared {
    pending: Vec<Event>,
    deliver: Option<BottomHalf>,
}

/// Where any module sends events: `Send + Sync + Clone`, cheap to clone.
#[derive(Clone, Default)]
pub struct EventQueue(Arc<Mutex<Shared>>);

impl std::fmt::Debug for EventQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shared = self.lock();
        f.debug_struct("EventQueue")
            .field("pending", &shared.pending.len())
            .field("attached", &shared.deliver.is_some())
            .finish()
    }
}

impl EventQueue {
    /// A queue with no listener yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `event` to the listener, from any thread; dropped when none is attached.
    pub fn send(&self, event: Event) {
        let mut shared = self.lock();
        let Some(deliver) = shared.deliver.clone() else {
            return;
        };
        shared.pending.push(event);
        drop(shared);
        deliver.schedule();
    }

    /// Delivers every event sent from now on to `listener`, in order, on `ctx`'s loop (the
    /// control loop). A second attach replaces the first.
    pub fn attach<L: EventLoop + 'static>(
        &self,
        ctx: &AioContext<L>,
        listener: impl Fn(&Event) + 'static,
    ) {
        let queue = self.clone();
        let deliver = ctx.bh_new(move |_| {
            let events = std::mem::take(&mut queue.lock().pending);
            for event in &events {
                listener(event);
            }
        });
        let old = self.lock().deliver.replace(deliver);
        if let Some(old) = old {
            let _ = ctx.bh_delete(&old);
        }
    }

    /// QEMU's `BLOCK_EXPORT_DELETED` for export `id`, sent once the export has ended (its
    /// clients gone, its image closed); an export without an id is not QEMU's: nothing.
    pub fn export_deleted(&self, id: Option<String>) {
        if let Some(id) = id {
            self.send(Event::new("BLOCK_EXPORT_DELETED", json!({ "id": id })));
        }
    }

    /// Stops delivering (the daemon stops): what is pending is dropped with the listener.
    pub fn detach<L: EventLoop + 'static>(&self, ctx: &AioContext<L>) {
        let mut shared = self.lock();
        shared.pending.clear();
        if let Some(old) = shared.deliver.take() {
            drop(shared);
            let _ = ctx.bh_delete(&old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    #[test]
    fn events_sent_from_any_thread_reach_the_listener_in_order_on_the_loop() {
        let monitor = aio::Choice::<aio::MonitorKind>::Auto.build().unwrap().built;
        let ctx = AioContext::new(monitor).unwrap();
        let queue = EventQueue::new();
        queue.send(Event::new("BEFORE", json!({})));
        let got = Rc::new(RefCell::new(Vec::new()));
        let seen = got.clone();
        queue.attach(&ctx, move |e| seen.borrow_mut().push(e.to_json()));
        let sender = queue.clone();
        std::thread::spawn(move || {
            for i in 0..3 {
                sender.send(Event::new("TICK", json!({ "n": i })));
            }
        })
        .join()
        .unwrap();
        while got.borrow().len() < 3 {
            ctx.poll(true);
        }
        let got = got.borrow().clone();
        let names: Vec<_> = got.iter().map(|e| e["event"].clone()).collect();
        assert_eq!(
            names,
            ["TICK", "TICK", "TICK"],
            "dropped before attach: {got:?}"
        );
        let ns: Vec<_> = got.iter().map(|e| e["data"]["n"].clone()).collect();
        assert_eq!(ns, [0, 1, 2]);
        let ts = &got[0]["timestamp"];
        assert!(ts["seconds"].as_u64().unwrap() > 1_600_000_000, "{ts}");
        assert!(ts["microseconds"].as_u64().unwrap() < 1_000_000, "{ts}");
        queue.detach(&ctx);
        queue.send(Event::new("AFTER", json!({})));
        ctx.poll(false);
        assert_eq!(
            queue.lock().pending.len(),
            0,
            "nothing is kept once detached"
        );
    }
}
