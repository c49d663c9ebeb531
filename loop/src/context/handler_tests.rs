//! Unit tests of what fd handlers promise, on the scripted monitor and fake clock of
//! `tests.rs`: a re-entrant read callback runs again in a nested `poll()`, an exclusive
//! callback that is running is neither polled by a nested `poll()` nor loses a bottom half's
//! schedule, one polling-mode hook is enough to get it, and a failed wait keeps its error; the
//! table's count of writers through updates and removals, an update's poll set and interest,
//! the refusals of `set_fd_handler`, deregistration errors, and forgetting a closed fd.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::AsRawFd;
use std::rc::Rc;

use super::tests::{countdown_handler, scripted};
use super::*;
use crate::polling::{PollParams, PollRule};
use crate::FdHandler;

#[test]
fn a_reentrant_read_callback_runs_again_in_a_nested_poll() {
    let (ctx, script) = scripted();
    let fd = Notifier::new().unwrap();
    let raw = fd.as_raw_fd();
    let depths = Rc::new(RefCell::new(Vec::new()));
    let seen = depths.clone();
    let inject = script.inject.clone();
    ctx.set_fd_handler(
        &fd,
        FdHandler::new().on_read_reentrant(move |ctx| {
            let depth = seen.borrow().len();
            seen.borrow_mut().push(depth);
            if depth == 0 {
                // Readable again while this call runs: the nested poll runs it inside.
                inject.borrow_mut().push(raw);
                ctx.poll(false);
            }
        }),
    )
    .unwrap();
    script.inject.borrow_mut().push(raw);
    assert!(ctx.poll(true));
    assert_eq!(*depths.borrow(), [0, 1], "ran once outside, once nested");
}

#[test]
fn a_nested_poll_does_not_poll_a_handler_whose_callback_is_running() {
    let (ctx, _script) = scripted();
    ctx.set_poll_params(PollParams::iothread().with_rule(PollRule::Qemu));
    let checks = Rc::new(Cell::new(0u32));
    let nested = Rc::new(Cell::new(None));
    let fd = Notifier::new().unwrap();
    let (counted, inside, during) = (checks.clone(), checks.clone(), nested.clone());
    ctx.set_fd_handler(
        &fd,
        FdHandler::new()
            .on_poll(move || {
                counted.set(counted.get() + 1);
                counted.get() == 1
            })
            .on_poll_ready(move |ctx| {
                let before = inside.get();
                // A blocking nested poll busy-polls; this handler cannot run there, so it is
                // not checked (it would spin on a handler it cannot dispatch).
                ctx.poll(true);
                during.set(Some(inside.get() - before));
            }),
    )
    .unwrap();
    assert!(ctx.poll(true), "the first check found work");
    assert_eq!(nested.get(), Some(0), "no check inside its own callback");
}

#[test]
fn a_bottom_half_rescheduled_by_its_own_run_keeps_the_schedule_across_a_nested_poll() {
    let (ctx, _script) = scripted();
    let runs = Rc::new(Cell::new(0u32));
    let me: Rc<RefCell<Option<BottomHalf>>> = Rc::new(RefCell::new(None));
    let (count, handle) = (runs.clone(), me.clone());
    let bh = ctx.bh_new(move |ctx| {
        count.set(count.get() + 1);
        if count.get() == 1 {
            // Scheduled again while it runs, then a nested poll: it cannot run there, and
            // the schedule must wait for this run to return instead of being used up.
            handle.borrow().as_ref().unwrap().schedule();
            ctx.poll(false);
        }
    });
    *me.borrow_mut() = Some(bh.clone());
    bh.schedule();
    ctx.poll(false);
    ctx.poll(false);
    assert_eq!(runs.get(), 2, "the second schedule ran after the first run");
}

#[test]
fn one_polling_mode_hook_is_enough_to_get_it() {
    let (ctx, _script) = scripted();
    ctx.set_poll_params(PollParams::iothread().with_rule(PollRule::Qemu));
    let begins = Rc::new(Cell::new(0u32));
    let ends = Rc::new(Cell::new(0u32));
    let (b, e) = (begins.clone(), ends.clone());
    let (begin_only, end_only) = (Notifier::new().unwrap(), Notifier::new().unwrap());
    ctx.set_fd_handler(
        &begin_only,
        FdHandler::new()
            .on_read(|_| {})
            .on_poll(|| false)
            .on_poll_begin(move || b.set(b.get() + 1)),
    )
    .unwrap();
    ctx.set_fd_handler(
        &end_only,
        FdHandler::new()
            .on_read(|_| {})
            .on_poll(|| false)
            .on_poll_end(move || e.set(e.get() + 1)),
    )
    .unwrap();
    // An iteration that polls and finds nothing begins polling mode and ends it before it
    // blocks.
    ctx.poll(true);
    assert_eq!((begins.get(), ends.get()), (1, 1));
}

#[test]
fn a_failed_wait_keeps_its_error_for_the_caller_once() {
    let (ctx, script) = scripted();
    assert!(ctx.take_last_wait_error().is_none());
    script
        .errors
        .borrow_mut()
        .push_back(io::ErrorKind::PermissionDenied);
    assert!(!ctx.poll(true), "no progress");
    let e = ctx.take_last_wait_error().expect("the wait's error kept");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    assert!(ctx.take_last_wait_error().is_none(), "taken");
}

#[test]
fn replacing_or_removing_the_only_writer_lets_polling_skip_the_wait_again() {
    let (ctx, _script) = scripted();
    ctx.set_poll_params(PollParams::iothread().with_rule(PollRule::Qemu));
    let (_first, countdown) = countdown_handler(&ctx);
    let writer = Notifier::new().unwrap();
    let writing = || {
        FdHandler::new()
            .on_read(|_| {})
            .on_write(|_| {})
            .on_poll(|| false)
    };
    let skipped_after_a_hit = || {
        countdown.set(3);
        assert!(ctx.poll(true));
        ctx.counters().waits_skipped
    };
    ctx.set_fd_handler(&writer, writing()).unwrap();
    assert_eq!(skipped_after_a_hit(), 0, "a writer: the monitor must look");
    ctx.update_fd_handler(&writer, writing()).unwrap();
    assert_eq!(skipped_after_a_hit(), 0, "a writer replaced by a writer");
    ctx.update_fd_handler(&writer, FdHandler::new().on_read(|_| {}).on_poll(|| false))
        .unwrap();
    assert_eq!(skipped_after_a_hit(), 1, "no writer left");
    ctx.update_fd_handler(&writer, writing()).unwrap();
    assert_eq!(skipped_after_a_hit(), 1, "a writer again");
    ctx.remove_fd_handler(&writer).unwrap();
    assert_eq!(skipped_after_a_hit(), 2, "the writer removed");
}

#[test]
fn an_update_without_a_poll_check_leaves_the_poll_set_and_changes_the_interest() {
    let (ctx, script) = scripted();
    ctx.set_poll_params(PollParams::iothread());
    let (fd, _countdown) = countdown_handler(&ctx);
    assert_eq!(ctx.counters().poll_set, 1);
    ctx.update_fd_handler(&fd, FdHandler::new().on_write(|_| {}))
        .unwrap();
    assert_eq!(ctx.counters().poll_set, 0, "no io_poll: out of the set");
    let interest = script.interests.borrow()[&fd.as_raw_fd()];
    assert_eq!(
        interest,
        Interest::WRITABLE,
        "the monitor watches what the new one needs"
    );
}

#[test]
fn the_contexts_own_notifier_cannot_get_a_handler() {
    let (ctx, _script) = scripted();
    let e = ctx
        .set_fd_handler(&ctx.shared.notifier, FdHandler::new().on_read(|_| {}))
        .unwrap_err();
    assert!(matches!(e, AioError::InvalidFd { .. }), "{e}");
}

#[test]
fn a_deregistration_the_kernel_already_forgot_is_no_error_and_another_one_is() {
    let (ctx, script) = scripted();
    let fds: Vec<Notifier> = (0..3).map(|_| Notifier::new().unwrap()).collect();
    for fd in &fds {
        ctx.set_fd_handler(fd, FdHandler::new().on_read(|_| {}))
            .unwrap();
    }
    script
        .deregister_errors
        .borrow_mut()
        .extend([libc::EBADF, libc::ENOENT, libc::EPERM]);
    ctx.remove_fd_handler(&fds[0]).unwrap();
    ctx.remove_fd_handler(&fds[1]).unwrap();
    let e = ctx.remove_fd_handler(&fds[2]).unwrap_err();
    assert!(
        matches!(
            e,
            AioError::Monitor {
                op: "deregister",
                ..
            }
        ),
        "{e}"
    );
    for fd in &fds {
        assert!(!ctx.has_fd_handler(fd), "removed either way");
    }
}

#[test]
fn forgetting_a_closed_fd_makes_the_monitor_forget_it() {
    let (ctx, script) = scripted();
    let before = script.registered();
    let fd = Notifier::new().unwrap();
    ctx.set_fd_handler(&fd, FdHandler::new().on_read(|_| {}))
        .unwrap();
    assert_eq!(script.registered(), before + 1);
    ctx.forget_closed_fd(fd.as_raw_fd()).unwrap();
    assert_eq!(script.registered(), before, "the monitor forgot the number");
    assert!(!ctx.has_fd_handler(fd));
}

#[test]
fn a_handler_says_which_callbacks_it_has() {
    let handler: FdHandler<super::tests::Script> =
        FdHandler::new().on_read(|_| {}).on_poll(|| false);
    let text = format!("{handler:?}");
    assert!(text.starts_with("FdHandler"), "{text}");
    assert!(
        text.contains("io_read: true") && text.contains("io_write: false"),
        "{text}"
    );
    assert!(text.contains("io_poll: true"), "{text}");
}

#[test]
fn an_fd_reported_twice_in_one_wait_runs_each_direction_once() {
    let (ctx, script) = scripted();
    let (reads, writes) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(0)));
    let (r, w) = (reads.clone(), writes.clone());
    let fd = Notifier::new().unwrap();
    ctx.set_fd_handler(
        &fd,
        FdHandler::new()
            .on_read(move |_| r.set(r.get() + 1))
            .on_write(move |_| w.set(w.get() + 1)),
    )
    .unwrap();
    // A monitor may report one fd twice in a wait (two ring entries for it, say).
    script
        .inject
        .borrow_mut()
        .extend([fd.as_raw_fd(), fd.as_raw_fd()]);
    script.inject_writable.borrow_mut().push(fd.as_raw_fd());
    assert!(ctx.poll(true));
    assert_eq!((reads.get(), writes.get()), (1, 1));
}
