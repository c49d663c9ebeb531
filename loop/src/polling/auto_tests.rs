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
    // Off after the first choice: what polled since is the probes, for twice the wake-up each,
    // further apart after each miss (up to MAX_PROBE_EVERY waits): under 1% of the time.
    assert!(
        sim.model.missed_ns * 100 < sim.now,
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
    assert!(
        (35_000..=50_000).contains(&m.followup_ns()),
        "45 µs more after a sleep in the median (to a bucket's width): {}",
        m.followup_ns()
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
    // What is left would not catch half: of all waits, nor of those after a sleep (the loop
    // slept through the last one).
    let shortest = m.shortest_cut_ns();
    assert!(shortest >= m.median_ns);
    assert!(m.budget_ns < shortest, "{} left", m.budget_ns);
    // As time refills it, a window is polled whole, or cut to no less than that, never to a
    // few µs that would miss and spend the budget again.
    for step in 1..40 {
        let w = m.next_window(now + step * 10_000, MAX);
        assert!(w == 0 || w >= shortest, "{w} at {step}");
    }
    assert!(m.next_window(now + 400_000, MAX) >= 30_000);
}

#[test]
fn a_rare_wait_worth_polling_for_stays_in_the_window() {
    // 10-14 µs, and one wait in 300 of 40 µs: cheaper to poll for (20 µs at the price) than
    // to be woken (30 µs). Fewer than one such wait per halving must not fade out of the
    // histogram.
    let mut sim = Sim::new();
    let mut caught = 0;
    for i in 0..20_000u64 {
        let long = i % 300 == 0;
        let hits = sim.hits;
        sim.wait(if long {
            40_000
        } else {
            10_000 + (i * 7_919) % 4_000
        });
        if long && i >= 2_000 && sim.hits > hits {
            caught += 1;
        }
    }
    assert!(caught >= 57, "{caught} of the last 60 long waits caught");
    assert!(sim.model.chosen_ns() >= 40_000, "{}", sim.model.chosen_ns());
}

/// [`cheapest_window`] written out: every candidate window against every bucket.
fn cheapest_window_by_hand(counts: &[f64; BUCKETS], miss_ns: f64, max_ns: u64) -> (u64, f64) {
    let total: f64 = counts.iter().sum();
    let mid = |b: usize| (edge(b) + edge(b + 1)) as f64 / 2.0;
    let cost = |w: u64| -> f64 {
        let mut cost = 0.0;
        for (b, &c) in counts.iter().enumerate() {
            let t = if b + 1 == BUCKETS { f64::MAX } else { mid(b) };
            let p = c / total;
            if t <= w as f64 {
                cost += p * CPU_PRICE * t;
            } else {
                cost += p * (miss_ns + CPU_PRICE * w as f64);
            }
        }
        cost
    };
    let mut best = (0u64, cost(0));
    for b in 0..BUCKETS {
        let w = edge(b + 1);
        if w > max_ns {
            break;
        }
        let c = cost(w);
        if c < best.1 {
            best = (w, c);
        }
    }
    best
}

#[test]
fn the_one_pass_choice_is_the_cheapest_window_by_hand() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..500 {
        let mut counts = [0.0; BUCKETS];
        // Sparse, clustered and fractional counts, the last bucket included now and then.
        for _ in 0..1 + next() % 12 {
            let b = (next() % BUCKETS as u64) as usize;
            counts[b] += (next() % 1000) as f64 / 10.0 + 0.01;
        }
        let miss = (next() % 200_000) as f64;
        let max = [0, 1, 4_000, 65_536, 262_144, 10_000_000][round % 6];
        let total: f64 = counts.iter().sum();
        let (w, cost) = cheapest_window(&counts, total, miss, max);
        let (w_hand, cost_hand) = cheapest_window_by_hand(&counts, miss, max);
        assert!(
            (cost - cost_hand).abs() <= 1e-6 * cost_hand.max(1.0),
            "round {round}: {cost} against {cost_hand}"
        );
        // (Equal costs may pick either window: the costs are what must agree.)
        let _ = (w, w_hand);
    }
    // Waits of 4 ms and more (the last bucket) are never caught, whatever the cap.
    let mut counts = [0.0; BUCKETS];
    counts[BUCKETS - 1] = 10.0;
    assert_eq!(
        cheapest_window(&counts, 10.0, 5_000_000.0, 10_000_000),
        (0, 5_000_000.0)
    );
}

#[test]
fn after_a_sleep_the_budget_cuts_no_window_short_of_the_waits_that_follow_sleeps() {
    // A thread pool's worker: 10 µs after a hit, 80 µs after a sleep (it fell asleep too).
    let mut m = AutoWindow::new(WAKE);
    let mut now = 0;
    for i in 0..256u64 {
        let slept = i % 8 == 7;
        let after_sleep = i % 8 == 0 && i > 0;
        let t = if after_sleep { 80_000 } else { 10_000 };
        now += t + if slept { WAKE } else { 0 };
        m.observe(
            AutoWait {
                block_ns: t + if slept { WAKE } else { 0 },
                polled_ns: if slept { t.min(m.chosen_ns()) } else { t },
                hit: !slept,
                now_ns: now,
            },
            MAX,
        );
    }
    assert!(
        m.median_ns < 20_000,
        "most waits are short: {}",
        m.median_ns
    );
    // Budget left for 40 µs of polling: enough for the median, not for a wait after a sleep.
    m.budget_ns = 40_000;
    m.budget_at = Some(now);
    m.last_slept = Some(false);
    assert_eq!(
        m.next_window(now, MAX),
        40_000,
        "after a hit: cut, still past the median"
    );
    m.last_slept = Some(true);
    assert_eq!(
        m.next_window(now, MAX),
        0,
        "after a sleep: a 40 µs cut would miss the 80 µs wait"
    );
}

#[test]
fn a_burst_of_near_misses_spends_the_budget_without_cutting_the_window() {
    // 10-14 µs with a 40 µs wait in 50 (a window of 40 µs and more pays), then 100 waits in a
    // row that each end just after the window (a pool's worker woken late: the waits a budget
    // cut makes longer still). Each polls its whole window for nothing; the budget holds a
    // burst like this, so no window is cut through it or after it.
    let mut sim = Sim::new();
    let fast = |i: u64| {
        if i % 50 == 0 {
            40_000
        } else {
            10_000 + (i * 7_919) % 4_000
        }
    };
    sim.run(2_000, fast);
    let window = sim.model.chosen_ns();
    assert!(window >= 40_000, "{window}");
    let missed_before = sim.model.missed_ns;
    for _ in 0..100 {
        let w = sim.model.chosen_ns();
        sim.wait(w + 1_000);
    }
    assert!(
        sim.model.missed_ns - missed_before >= 100 * 40_000,
        "every near miss polled a whole window: {} ns",
        sim.model.missed_ns - missed_before
    );
    let hits = sim.hits;
    sim.run(200, fast);
    assert_eq!(sim.model.budget_cuts, 0);
    assert!(
        sim.hits - hits >= 196,
        "{} of 200 caught after the burst",
        sim.hits - hits
    );
}

#[test]
fn a_budget_run_dry_holds_polling_without_hits_to_its_share_of_the_time() {
    // Priced at 10 ms a wake-up, every wait up to the cap is worth polling for; every event
    // comes 300 µs out, past the longest window, a µs before the loop would have woken. Left
    // alone, the loop would poll 87% of its time for nothing; the budget holds it to 10% and
    // the burst, however long it runs.
    let mut m = AutoWindow::new(10_000_000);
    let mut now = 0u64;
    for _ in 0..20_000 {
        let w = m.next_window(now, MAX);
        now += 301_000;
        m.observe(
            AutoWait {
                block_ns: 301_000,
                polled_ns: w,
                hit: false,
                now_ns: now,
            },
            MAX,
        );
    }
    assert_eq!(m.choice(), Choice::Polling, "it still wants to poll");
    assert!(m.budget_cuts > 0);
    assert!(
        m.missed_ns <= now * MISS_BUDGET_PERCENT / 100 + BUDGET_CAP_NS,
        "{} ns missed in {} ns",
        m.missed_ns,
        now
    );
    // And it polled what the budget allowed, not nothing.
    assert!(
        m.missed_ns >= now * MISS_BUDGET_PERCENT / 200,
        "{}",
        m.missed_ns
    );
}

#[test]
fn a_histogram_fades_to_its_floor_and_gives_the_middle_of_its_median_bucket() {
    let mut h = Histogram::EMPTY;
    // Faded while empty, it still learns (no 0 / 0).
    h.fade(FOLLOWUP_MIN_WAITS);
    for _ in 0..7 {
        h.add(10_000);
    }
    assert_eq!(h.median_ns(8.0), None, "7 waits are not enough");
    h.add(10_000);
    let b = bucket(10_000);
    assert_eq!(h.median_ns(8.0), Some((edge(b) + edge(b + 1)) / 2));
    // Halved, but not below the floor; whatever the floor, never above what there is.
    h.fade(4.0);
    assert!((h.total() - 4.0).abs() < 1e-9);
    h.fade(6.0);
    assert!((h.total() - 4.0).abs() < 1e-9, "{}", h.total());
    h.fade(0.0);
    assert!((h.total() - 2.0).abs() < 1e-9);
    assert_eq!(h.median_ns(0.0), Some((edge(b) + edge(b + 1)) / 2));
}

#[test]
fn a_wake_up_given_as_large_as_it_goes_overflows_nothing() {
    // `PollParams::with_wake_ns` takes any u64: the model's arithmetic saturates.
    // Every third wait missed, and the wait after it longer (a follow-up cost to add).
    let mut m = AutoWindow::new(u64::MAX);
    let mut now = 0u64;
    for i in 0..1_000u64 {
        let w = m.next_window(now, MAX);
        let hit = i % 3 != 0;
        let t = if i % 3 == 1 { 40_000 } else { 10_000 };
        now += 50_000;
        m.observe(
            AutoWait {
                block_ns: if hit { t } else { 50_000 },
                polled_ns: if hit { t } else { w },
                hit,
                now_ns: now,
            },
            MAX,
        );
    }
    assert_eq!(m.choice(), Choice::Polling);
    assert!(m.followup_ns() > 0, "a follow-up priced in");
}
