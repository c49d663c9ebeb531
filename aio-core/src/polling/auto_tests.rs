//! The automatic window on made-up waits: a simulated loop on a fake clock polls with the
//! window the model gives, is woken `WAKE` after the event when polling missed it, and feeds
//! each wait back.

use super::*;

/// A wake-up on this VM: 20-50 µs.
const WAKE: u64 = 30_000;
const MAX: u64 = 262_144;

/// A loop on a fake clock.
struct Sim {
    model: AutoWindow,
    now: u64,
    waits: u64,
    hits: u64,
}

impl Sim {
    fn new() -> Sim {
        Sim {
            model: AutoWindow::new(WAKE),
            now: 0,
            waits: 0,
            hits: 0,
        }
    }

    /// One wait for an event `t` ns away.
    fn wait(&mut self, t: u64) {
        let w = self.model.next_window(self.now, MAX);
        let (block, polled, hit) = if t <= w {
            (t, t, true)
        } else {
            (t + WAKE, w, false)
        };
        self.now += block;
        self.waits += 1;
        self.hits += u64::from(hit);
        self.model.observe(
            AutoWait {
                block_ns: block,
                polled_ns: polled,
                hit,
                now_ns: self.now,
            },
            MAX,
        );
    }

    fn run(&mut self, n: u64, mut t: impl FnMut(u64) -> u64) {
        for i in 0..n {
            self.wait(t(i));
        }
    }
}

#[test]
fn buckets_are_four_per_doubling_from_one_microsecond() {
    assert_eq!(edge(0), 1_000);
    assert_eq!(edge(4), 2_000);
    assert_eq!(edge(8), 4_000);
    assert_eq!(bucket(999), 0);
    assert_eq!(bucket(1_000), 0);
    assert_eq!(bucket(2_000), 4);
    assert_eq!(bucket(1_999), 3);
    assert_eq!(bucket(u64::MAX), BUCKETS - 1);
}

#[test]
fn short_waits_are_polled_for_and_caught() {
    let mut sim = Sim::new();
    // A fast device: 12-20 µs.
    sim.run(2_000, |i| 12_000 + (i * 7_919) % 8_000);
    let m = &sim.model;
    assert_eq!(m.choice(), Choice::Polling);
    assert!(
        (20_000..=64_000).contains(&m.chosen_ns()),
        "the window covers 20 µs without running far past it: {}",
        m.chosen_ns()
    );
    assert!(
        sim.hits * 100 >= sim.waits * 95,
        "{} of {} caught",
        sim.hits,
        sim.waits
    );
    assert_eq!(m.updates, sim.waits / u64::from(UPDATE_EVERY));
}

#[test]
fn a_wake_up_underestimated_does_not_keep_polling_off() {
    // The model believes a wake-up costs 10 µs; it costs 40. Slept waits then look 30 µs
    // longer than they are, which alone would argue for staying off; the probes see the
    // device as it is.
    let mut m = AutoWindow::new(10_000);
    let mut now = 0u64;
    for i in 0..4_000u64 {
        let t = 12_000 + (i * 7_919) % 6_000;
        let w = m.next_window(now, MAX);
        let (block, polled, hit) = if t <= w {
            (t, t, true)
        } else {
            (t + 40_000, w, false)
        };
        now += block;
        m.observe(
            AutoWait {
                block_ns: block,
                polled_ns: polled,
                hit,
                now_ns: now,
            },
            MAX,
        );
    }
    assert_eq!(m.choice(), Choice::Polling);
    assert!(m.chosen_ns() >= 18_000, "{}", m.chosen_ns());
}

#[test]
fn long_waits_turn_polling_off() {
    let mut sim = Sim::new();
    // A slow disk: 80-400 µs, far beyond a wake-up.
    sim.run(2_000, |i| 80_000 + (i * 7_919) % 320_000);
    assert_eq!(sim.model.choice(), Choice::Off);
    assert_eq!(sim.model.chosen_ns(), 0);
    // Off after the first choice: what polled since is the probes, one wait in PROBE_EVERY
    // for twice the wake-up; under a tenth of the time.
    assert!(
        sim.model.missed_ns * 10 < sim.now,
        "{} ns polled for nothing in {} ns",
        sim.model.missed_ns,
        sim.now
    );
}

#[test]
fn a_sleep_that_makes_the_next_wait_longer_is_priced_and_polled_through() {
    // A thread pool's worker: 12-20 µs while the loop catches each completion, one wait in 40
    // a 100 µs hiccup; after a wait the loop slept through, the worker has gone to sleep too
    // and the next request waits 20-70 µs more for it. Priced at a wake-up alone, neither the
    // hiccup nor most waits after a sleep are worth polling for, so that one miss leads to
    // the next.
    let mut sim = Sim::new();
    let mut last_hit = true;
    let mut recent_hits = 0;
    for i in 0..4_000u64 {
        let own = if i % 40 == 0 {
            100_000
        } else {
            12_000 + (i * 7_919) % 8_000
        };
        let hits = sim.hits;
        let woken = 20_000 + (i * 104_729) % 50_000;
        sim.wait(if last_hit { own } else { own + woken });
        last_hit = sim.hits > hits;
        recent_hits += u64::from(last_hit && i >= 3_000);
    }
    let m = &sim.model;
    assert_eq!(
        m.followup_ns(),
        WAKE,
        "45 µs more after a sleep on average, counted up to one wake-up"
    );
    assert!(
        m.chosen_ns() >= 100_000,
        "the window catches the hiccups too: {}",
        m.chosen_ns()
    );
    assert!(recent_hits >= 990, "{recent_hits} of the last 1000 caught");
}

#[test]
fn a_bimodal_device_is_polled_for_its_short_mode_only() {
    let mut sim = Sim::new();
    // Half the requests from a cache in 8 µs, half from the disk in 2 ms.
    sim.run(2_000, |i| if i % 2 == 0 { 8_000 } else { 2_000_000 });
    let m = &sim.model;
    assert_eq!(m.choice(), Choice::Polling);
    assert!(
        (8_000..=16_000).contains(&m.chosen_ns()),
        "catches the 8 µs mode, not the 2 ms one: {}",
        m.chosen_ns()
    );
    assert_eq!(m.followup_ns(), 0, "a wait after a sleep is no longer");
}

#[test]
fn a_device_that_slows_down_and_recovers_is_followed_within_the_promised_waits() {
    let mut sim = Sim::new();
    sim.run(1_000, |_| 20_000);
    assert_eq!(sim.model.choice(), Choice::Polling);
    // 20 -> 200 µs: off within ADAPTS_WITHIN waits.
    let mut off_after = None;
    for i in 0..u64::from(ADAPTS_WITHIN) {
        sim.wait(200_000);
        if off_after.is_none() && sim.model.choice() == Choice::Off {
            off_after = Some(i + 1);
        }
    }
    let off_after = off_after.expect("polling off within ADAPTS_WITHIN waits");
    assert_eq!(sim.model.choice(), Choice::Off, "and it stays off");
    // And back: polling again, learned from the probes, within their bound.
    let mut on_after = None;
    for i in 0..u64::from(ADAPTS_BACK_WITHIN) {
        sim.wait(20_000);
        if on_after.is_none() && sim.model.choice() == Choice::Polling {
            on_after = Some(i + 1);
        }
    }
    let on_after = on_after.expect("polling on again within ADAPTS_BACK_WITHIN waits");
    assert!(sim.model.chosen_ns() >= 20_000);
    assert!(off_after <= u64::from(ADAPTS_WITHIN));
    assert!(on_after <= u64::from(ADAPTS_BACK_WITHIN));
}

#[test]
fn polling_without_hits_never_takes_more_than_its_share_of_the_time() {
    // An adversary: each event comes just after the window the model gives, so every poll
    // misses; the model keeps polling as long as its histogram says the waits are short.
    let mut m = AutoWindow::new(WAKE);
    let mut now = 0u64;
    for _ in 0..20_000 {
        let w = m.next_window(now, MAX);
        let t = w + 1_000;
        now += t + WAKE;
        m.observe(
            AutoWait {
                block_ns: t + WAKE,
                polled_ns: w,
                hit: false,
                now_ns: now,
            },
            MAX,
        );
        assert!(
            m.missed_ns <= now * MISS_BUDGET_PERCENT / 100 + BUDGET_CAP_NS,
            "{} ns missed in {} ns",
            m.missed_ns,
            now
        );
    }
    assert!(m.missed_ns > 0, "it did poll");
}

#[test]
fn the_budget_cuts_a_window_it_cannot_pay_for_and_says_so() {
    let mut m = AutoWindow::new(WAKE);
    // Learn short waits at a high rate: the window opens.
    let mut now = 0;
    for _ in 0..64 {
        now += 10_000;
        m.observe(
            AutoWait {
                block_ns: 10_000,
                polled_ns: 10_000,
                hit: true,
                now_ns: now,
            },
            MAX,
        );
    }
    assert!(m.chosen_ns() >= 10_000);
    // Now a burst of misses at the same instant empties the budget.
    for _ in 0..1_000 {
        let w = m.next_window(now, MAX);
        m.observe(
            AutoWait {
                block_ns: w,
                polled_ns: w,
                hit: false,
                now_ns: now,
            },
            MAX,
        );
    }
    assert!(m.budget_cuts > 0);
    assert_eq!(m.next_window(now, MAX), 0, "nothing left to poll with");
    // Time refills it at 10% of the clock.
    assert_eq!(m.next_window(now + 100_000, MAX), m.chosen_ns().min(10_000));
}

#[test]
fn a_cut_shorter_than_the_median_wait_polls_nothing() {
    let mut m = AutoWindow::new(WAKE);
    let mut now = 0;
    let wait = |m: &mut AutoWindow, now: u64, polled: u64, hit: bool| {
        m.observe(
            AutoWait {
                block_ns: if hit { 30_000 } else { 30_000 + WAKE },
                polled_ns: polled,
                hit,
                now_ns: now,
            },
            MAX,
        )
    };
    // Waits of 30 µs, caught: the window opens past them.
    for _ in 0..64 {
        now += 30_000;
        wait(&mut m, now, 30_000, true);
    }
    assert!(m.chosen_ns() >= 30_000);
    // The same waits missed at one instant (each poll ending just short of its event) empty
    // the budget until the next window is not polled at all.
    loop {
        let w = m.next_window(now, MAX);
        if w == 0 {
            break;
        }
        wait(&mut m, now, w, false);
    }
    assert!(m.budget_cuts > 0);
    assert!(
        m.budget_ns < m.median_ns,
        "what is left would not catch half"
    );
    // As time refills it, a window is polled whole, or cut to no less than the median wait,
    // never to a few µs that would miss and spend the budget again.
    for step in 1..40 {
        let w = m.next_window(now + step * 10_000, MAX);
        assert!(w == 0 || w >= m.median_ns, "{w} at {step}");
    }
    assert!(m.next_window(now + 400_000, MAX) >= 30_000);
}
