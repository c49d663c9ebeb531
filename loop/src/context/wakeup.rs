//! The notify_me handshake (QEMU's `aio_notify` / `aio_notify_accept`): how another thread
//! wakes the loop without writing the notifier when the loop is not about to sleep.
//!
//! This module owns the two flags of the handshake and the order of their accesses. It does not
//! own the notifier: [`Wakeup::notify`] says whether the caller must write it, and the loop
//! drains it after [`Wakeup::accept`].
//!
//! The argument, with both sides fenced (`SeqCst`):
//!
//! * notifier side: set `notified`, fence, read `notify_me`;
//! * loop side: add 2 to `notify_me`, fence, read `notified` (and the bottom-half queue).
//!
//! Of the two fences one comes first; the side after it sees the other side's write. So either
//! the loop sees `notified` (or the queued work) and does not sleep, or the notifier sees
//! `notify_me` and writes the fd the loop sleeps on: no wake-up is lost. The loom model in this
//! file checks exactly that, over every interleaving.

use std::sync::atomic::Ordering;

use crate::sync::{fence, AtomicBool, AtomicU32};

/// The handshake's flags.
#[derive(Debug)]
pub(crate) struct Wakeup {
    /// Non-zero while the loop is (about to be) blocked in the monitor: only then must a
    /// notification write the notifier (QEMU's `notify_me`; +2 per blocking level).
    notify_me: AtomicU32,
    /// Set by a notification, cleared by the loop when it accepts it.
    notified: AtomicBool,
}

impl Wakeup {
    pub(crate) fn new() -> Wakeup {
        Wakeup {
            notify_me: AtomicU32::new(0),
            notified: AtomicBool::new(false),
        }
    }

    /// Another thread's notification (after it queued its work): returns whether the loop may
    /// be asleep, in which case the caller must write the notifier.
    pub(crate) fn notify(&self) -> bool {
        self.notified.store(true, Ordering::Release);
        fence(Ordering::SeqCst);
        self.notify_me.load(Ordering::Relaxed) != 0
    }

    /// Another thread's notification that must not stop the loop from waiting (an idle bottom
    /// half): the loop is woken only if it is (about to be) blocked, and otherwise finds the
    /// queued work when it recomputes its timeout after [`Wakeup::block_begin`]'s fence.
    /// Returns whether the caller must write the notifier.
    pub(crate) fn notify_if_blocked(&self) -> bool {
        fence(Ordering::SeqCst);
        if self.notify_me.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.notified.store(true, Ordering::Release);
        true
    }

    /// The loop, about to block: from here on notifications write the notifier. Returns
    /// whether a notification already arrived (then the loop must not sleep). The caller
    /// re-checks its queues after this too: anything queued before a notification's fence is
    /// visible now.
    pub(crate) fn block_begin(&self) -> bool {
        self.notify_me.fetch_add(2, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        self.notified.load(Ordering::Acquire)
    }

    /// The loop, back from its wait.
    pub(crate) fn block_end(&self) {
        self.notify_me.fetch_sub(2, Ordering::Release);
    }

    /// The loop accepts pending notifications; returns whether there was one (then the caller
    /// drains the notifier, which may have been written).
    pub(crate) fn accept(&self) -> bool {
        self.notified.swap(false, Ordering::AcqRel)
    }

    /// Whether a notification is pending (busy polling stops for it).
    pub(crate) fn is_notified(&self) -> bool {
        self.notified.load(Ordering::Acquire)
    }
}

// The unit tests run without loom; the loom models below replace them under it.
#[cfg(not(aio_loom))]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handshake_asks_for_a_write_only_while_the_loop_is_blocked() {
        let w = Wakeup::new();
        // Not blocked: an idle notification leaves nothing; a plain one is pending.
        assert!(!w.notify_if_blocked());
        assert!(!w.is_notified());
        assert!(!w.accept());
        assert!(!w.notify(), "not blocked: no write");
        assert!(w.is_notified());
        assert!(
            w.block_begin(),
            "a pending notification keeps the loop awake"
        );
        w.block_end();
        assert!(w.accept());
        assert!(!w.accept(), "accepted once");
        assert!(!w.is_notified());
        // Blocked: both kinds ask for a write and leave a notification to accept.
        assert!(!w.block_begin());
        assert!(w.notify_if_blocked());
        assert!(w.is_notified());
        assert!(w.notify());
        w.block_end();
        assert!(w.accept());
        assert!(!w.notify_if_blocked(), "no longer blocked");
    }
}

#[cfg(all(test, aio_loom))]
mod loom_models {
    use super::super::bh_table::BhState;
    use super::*;
    use loom::sync::atomic::AtomicBool as LoomBool;
    use loom::sync::{Arc, Mutex};
    use loom::thread;

    /// One bottom half scheduled from another thread while the loop goes to sleep: either the
    /// loop sees the work before it sleeps, or the notifier is written. And the bottom half
    /// then runs exactly once.
    #[test]
    fn schedule_from_another_thread_is_never_a_lost_wakeup() {
        loom::model(|| {
            let wake = Arc::new(Wakeup::new());
            let bh = Arc::new(BhState::default());
            let queue = Arc::new(Mutex::new(Vec::<u64>::new()));
            let eventfd = Arc::new(LoomBool::new(false));
            let scheduler = {
                let (wake, bh, queue, eventfd) =
                    (wake.clone(), bh.clone(), queue.clone(), eventfd.clone());
                thread::spawn(move || {
                    if let Ok(Some(ticket)) = bh.try_schedule() {
                        queue.lock().unwrap().push(ticket);
                        if wake.notify() {
                            eventfd.store(true, Ordering::Release);
                        }
                    }
                })
            };
            // The loop: one blocking iteration.
            let notified = wake.block_begin();
            let work_queued = !queue.lock().unwrap().is_empty();
            let sleeps = !notified && !work_queued;
            scheduler.join().unwrap();
            if sleeps {
                assert!(
                    eventfd.load(Ordering::Acquire),
                    "lost wake-up: the loop slept and nobody wrote the notifier"
                );
            }
            wake.block_end();
            wake.accept();
            let runs = queue
                .lock()
                .unwrap()
                .drain(..)
                .filter(|&t| bh.is_pending(t) && bh.claim(t))
                .count();
            assert_eq!(runs, 1, "the bottom half runs exactly once");
        });
    }

    /// A bare `notify()` (a `NotifyHandle`, no queued work to re-check) while the loop goes to
    /// sleep: here only the two fences stand between the loop and a lost wake-up.
    #[test]
    fn bare_notify_is_never_lost() {
        loom::model(|| {
            let wake = Arc::new(Wakeup::new());
            let eventfd = Arc::new(LoomBool::new(false));
            let notifier = {
                let (wake, eventfd) = (wake.clone(), eventfd.clone());
                thread::spawn(move || {
                    if wake.notify() {
                        eventfd.store(true, Ordering::Release);
                    }
                })
            };
            let sleeps = !wake.block_begin();
            notifier.join().unwrap();
            if sleeps {
                assert!(
                    eventfd.load(Ordering::Acquire),
                    "lost wake-up: the loop slept and nobody wrote the notifier"
                );
            }
            wake.block_end();
            assert!(wake.accept(), "the notification is accepted");
        });
    }

    /// Two threads schedule the same bottom half while the loop runs it: no schedule that
    /// finds it unscheduled is lost (it is queued with a pending ticket, or the run took it),
    /// and it never runs twice for one schedule.
    #[test]
    fn concurrent_schedules_and_a_run_lose_nothing() {
        loom::model(|| {
            let bh = Arc::new(BhState::default());
            let queue = Arc::new(Mutex::new(Vec::<u64>::new()));
            let first = bh.try_schedule().unwrap().expect("first schedule");
            queue.lock().unwrap().push(first);
            let schedulers: Vec<_> = (0..2)
                .map(|_| {
                    let (bh, queue) = (bh.clone(), queue.clone());
                    thread::spawn(move || {
                        if let Ok(Some(t)) = bh.try_schedule() {
                            queue.lock().unwrap().push(t);
                        }
                    })
                })
                .collect();
            // The loop runs what is queued now.
            let now: Vec<u64> = queue.lock().unwrap().drain(..).collect();
            let mut runs = now
                .into_iter()
                .filter(|&t| bh.is_pending(t) && bh.claim(t))
                .count();
            for s in schedulers {
                s.join().unwrap();
            }
            // The next iteration runs the rest.
            let later: Vec<u64> = queue.lock().unwrap().drain(..).collect();
            runs += later
                .into_iter()
                .filter(|&t| bh.is_pending(t) && bh.claim(t))
                .count();
            assert!((1..=2).contains(&runs), "ran {runs} times");
            assert!(
                !bh.is_scheduled(),
                "no schedule is left pending without a queue entry"
            );
        });
    }
}
