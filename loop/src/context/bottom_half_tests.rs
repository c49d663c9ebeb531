//! Unit tests of the bottom-half table's loop side, on the scripted monitor of `tests.rs`: a
//! nested poll sees the outer poll's pending bottom halves (and does not block), each poll
//! gives back its slice, and a deleted bottom half's callback is dropped.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use super::tests::{scripted, DropFlag};

#[test]
fn a_nested_poll_sees_the_outer_polls_pending_bottom_half_and_does_not_block() {
    let (ctx, script) = scripted();
    let nested_timeout = Rc::new(RefCell::new(None));
    let b_ran = Rc::new(Cell::new(false));
    let (seen, timeouts, ran) = (
        nested_timeout.clone(),
        script.timeouts.clone(),
        b_ran.clone(),
    );
    let a = ctx.bh_new(move |ctx| {
        // `b` waits in this poll's slice, behind `a`: the nested poll must not sleep.
        ctx.poll(true);
        *seen.borrow_mut() = Some(timeouts.borrow().last().copied().flatten());
    });
    let b = ctx.bh_new(move |_| ran.set(true));
    a.schedule();
    b.schedule();
    assert!(ctx.poll(false));
    assert!(
        b_ran.get(),
        "the nested poll ran the outer one's bottom half"
    );
    let timeout = nested_timeout.borrow().expect("the nested poll waited");
    assert_eq!(timeout, Some(Duration::ZERO), "a bottom half was pending");
}

#[test]
fn each_poll_gives_back_its_slice() {
    let (ctx, _script) = scripted();
    let levels = Rc::new(Cell::new(0));
    let seen = levels.clone();
    let outer = ctx.bh_new(move |ctx| {
        ctx.poll(false);
        seen.set(ctx.bottom_halves.slice_levels());
    });
    for _ in 0..3 {
        outer.schedule();
        ctx.poll(false);
    }
    assert_eq!(
        levels.get(),
        1,
        "inside a bottom half: its own poll's slice only"
    );
    assert_eq!(ctx.bottom_halves.slice_levels(), 0, "none after the polls");
}

#[test]
fn a_deleted_bottom_half_drops_its_callback() {
    let (ctx, _script) = scripted();
    let dropped = Rc::new(Cell::new(false));
    let guard = DropFlag(dropped.clone());
    let bh = ctx.bh_new(move |_| {
        let _ = &guard;
    });
    assert!(bh.delete());
    ctx.poll(false);
    assert!(dropped.get(), "the callback and what it captured are gone");
}
