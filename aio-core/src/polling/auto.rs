//! [`PollRule::Auto`](super::PollRule::Auto): the polling window chosen from the waits the loop
//! observes, under a CPU budget.
//!
//! This module owns the model only (a pure function of the waits fed to it, tested on made-up
//! waits); the loop feeds it each blocking wait and asks it for the next window.
//!
//! * **What it learns.** Each blocking wait's length `t`, from the start of the iteration to the
//!   event that ended it: exact when polling caught the event, the block time less the wake-up
//!   cost when the loop slept. The lengths go into a histogram of 48 buckets, four per
//!   doubling from 1 µs to 4 ms (longer waits share the last). Every [`DECAY_EVERY`] waits the
//!   counts halve, so old waits fade and a device that changes is followed within
//!   [`ADAPTS_WITHIN`] waits.
//! * **What it chooses.** Every [`UPDATE_EVERY`] waits, the window `W` (0, or a bucket edge up
//!   to `max_ns`) that minimises the expected cost of a wait beyond the device's own time:
//!   `(wake + followup) · P(t > W) + price · E[min(t, W)]`. A wait longer than the window
//!   pays the wake-up (`wake`: what a sleeping loop pays for being woken, measured on this
//!   machine) and what sleeping adds to the next wait (`followup`, below); every wait
//!   pays for the polling it did, at [`CPU_PRICE`] per ns. Waits far longer than a wake-up make
//!   `W = 0` the cheapest (polling off); waits shorter than it make a window that catches most
//!   of them the cheapest.
//! * **Probes while off.** A wait the loop slept through without polling says only roughly how
//!   long the event took (its wake-up is estimated, and an error there would feed itself), so
//!   while polling is off such waits are not learned from: every [`PROBE_EVERY`]-th wait polls
//!   for twice the wake-up cost instead (a wait longer than that is never worth polling for,
//!   at [`CPU_PRICE`]) and that probe's wait is. A probe that caught its event is followed by
//!   another, so that a wait after a hit is measured too (below). Turning polling back on for
//!   a device that sped up takes at most [`ADAPTS_BACK_WITHIN`] waits.
//! * **What a sleep costs the next wait.** Sleeping through a wait can make the next one
//!   longer: a thread pool's worker that finished while the loop slept has often gone to sleep
//!   too when the next request comes, and then must be woken as well. The model keeps the mean
//!   event time of waits that follow a sleep and of those that follow a hit, and adds the
//!   difference, at most one more wake-up, to what a missed wait costs. The mean after a hit
//!   fades with the histogram; the one after a sleep, once known, stays until new sleeps move
//!   it (while polling catches every wait there is nothing to measure it by again).
//!   On a device whose waits do not depend on the loop's (a disk, an NVMe queue) the two means
//!   agree and nothing is added.
//! * **The CPU bound.** Polling that finds nothing (the window ran out) may take at most
//!   [`MISS_BUDGET_PERCENT`]% of the loop thread's time: a budget grows with the clock and each
//!   missed poll spends its length; a window the budget cannot pay for is cut to what it can,
//!   or, where that is shorter than the median wait, not polled at all: a window cut that short
//!   would mostly miss, spend the budget again, and keep it empty (a loop whose every poll is
//!   cut to a few µs catches nothing and sleeps as if polling were off).

use super::POLL_START_NS;

/// Buckets of the wait histogram: four per doubling, from 1 µs.
const BUCKETS: usize = 48;
/// The histogram's counts halve every this many waits.
pub const DECAY_EVERY: u32 = 128;
/// The window is chosen again every this many waits.
pub const UPDATE_EVERY: u32 = 16;
/// Waits after which a changed device has taken over the histogram: after four halvings the
/// waits from before the change weigh 1/16 of what they did.
#[cfg_attr(not(test), allow(dead_code))] // The promise the tests hold the model to.
pub const ADAPTS_WITHIN: u32 = 4 * DECAY_EVERY + UPDATE_EVERY;
/// While polling is off, every this many waits polls as a probe.
pub const PROBE_EVERY: u32 = 4;
/// Waits after which a device that sped up while polling was off has polling on again: the
/// probes are a quarter of the waits.
#[cfg_attr(not(test), allow(dead_code))] // The promise the tests hold the model to.
pub const ADAPTS_BACK_WITHIN: u32 = PROBE_EVERY * ADAPTS_WITHIN;
/// The price of a ns of polling, in ns of latency: polling that saves a wake-up pays for itself
/// when it costs less than twice the wake-up.
pub const CPU_PRICE: f64 = 0.5;
/// The share of the loop thread's time that polling without a hit may take.
pub const MISS_BUDGET_PERCENT: u64 = 10;
/// The most the miss budget can hold, in ns: a burst of missed polls after a long idle time
/// costs at most this.
const BUDGET_CAP_NS: u64 = 2_000_000;
/// Waits (decayed) each side of the follow-up comparison needs before it counts.
const FOLLOWUP_MIN_WAITS: f64 = 8.0;

/// A mean of event times that fades with the histogram.
#[derive(Debug, Clone, Copy, Default)]
struct FadingMean {
    sum_ns: f64,
    weight: f64,
}

impl FadingMean {
    fn add(&mut self, t: u64) {
        self.sum_ns += t as f64;
        self.weight += 1.0;
    }

    /// Halves the weight of the waits so far, but not below `floor` waits (nor above what
    /// there is): a mean kept at the floor stays until new waits move it.
    fn fade(&mut self, floor: f64) {
        if self.weight > 0.0 {
            let weight = (self.weight / 2.0).max(floor.min(self.weight));
            self.sum_ns *= weight / self.weight;
            self.weight = weight;
        }
    }

    /// The mean, once it rests on enough waits.
    fn mean(&self) -> Option<f64> {
        (self.weight >= FOLLOWUP_MIN_WAITS).then(|| self.sum_ns / self.weight)
    }
}

/// The lower edge of bucket `b`, in ns: 1 µs x 2^(b/4).
fn edge(b: usize) -> u64 {
    let whole = 1u64 << (b / 4);
    // 2^(k/4) for k in 0..4, in 1/1000ths.
    const QUARTERS: [u64; 4] = [1000, 1189, 1414, 1682];
    1000 * whole * QUARTERS[b % 4] / 1000
}

/// The bucket of a wait of `ns`.
fn bucket(ns: u64) -> usize {
    (0..BUCKETS).rev().find(|&b| ns >= edge(b)).unwrap_or(0)
}

/// Why the window is what it is (for the counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Choice {
    /// Not chosen yet (fewer waits than [`UPDATE_EVERY`]): the start window.
    #[default]
    Learning,
    /// Polling pays: the window catches enough waits to save more than it burns.
    Polling,
    /// Waits are too long for polling to pay: off.
    Off,
}

/// One blocking wait, as the model needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AutoWait {
    /// From the iteration's start to the end of its wait, in ns.
    pub(crate) block_ns: u64,
    /// How long the loop polled, in ns.
    pub(crate) polled_ns: u64,
    /// Polling caught the event.
    pub(crate) hit: bool,
    /// The clock when the wait ended, in ns.
    pub(crate) now_ns: u64,
}

/// What the model remembers.
#[derive(Debug, Clone)]
pub(crate) struct AutoWindow {
    counts: [u32; BUCKETS],
    /// Waits since the last halving, and since the last choice.
    since_decay: u32,
    since_update: u32,
    window_ns: u64,
    choice: Choice,
    /// What a wake-up costs on this machine, in ns.
    wake_ns: u64,
    /// The miss budget, in ns, and the clock when it last grew.
    budget_ns: u64,
    budget_at: Option<u64>,
    /// While off: waits left before the next probe, and whether the current wait is one.
    probe_in: u32,
    probing: bool,
    /// Event times of the waits after one the loop slept through, and after a hit; whether the
    /// last wait was slept through.
    after_sleep: FadingMean,
    after_hit: FadingMean,
    last_slept: Option<bool>,
    /// The middle of the histogram's median bucket at the last choice, in ns: a window the
    /// budget cuts below it is not polled.
    median_ns: u64,
    /// Choices made, those that turned polling off, windows cut by the budget, polling time
    /// without a hit.
    pub(crate) updates: u64,
    pub(crate) offs: u64,
    pub(crate) budget_cuts: u64,
    pub(crate) missed_ns: u64,
}

impl AutoWindow {
    /// A model for a machine whose wake-up costs `wake_ns`, starting at [`POLL_START_NS`].
    pub(crate) fn new(wake_ns: u64) -> AutoWindow {
        AutoWindow {
            counts: [0; BUCKETS],
            since_decay: 0,
            since_update: 0,
            window_ns: POLL_START_NS,
            choice: Choice::Learning,
            wake_ns,
            budget_ns: BUDGET_CAP_NS / 4,
            budget_at: None,
            probe_in: PROBE_EVERY,
            probing: false,
            after_sleep: FadingMean::default(),
            after_hit: FadingMean::default(),
            last_slept: None,
            median_ns: 0,
            updates: 0,
            offs: 0,
            budget_cuts: 0,
            missed_ns: 0,
        }
    }

    /// The window chosen (before the budget).
    pub(crate) fn chosen_ns(&self) -> u64 {
        self.window_ns
    }

    /// Why.
    #[cfg_attr(not(test), allow(dead_code))] // The counters carry it as counts.
    pub(crate) fn choice(&self) -> Choice {
        self.choice
    }

    /// The wake-up cost the model uses.
    pub(crate) fn wake_ns(&self) -> u64 {
        self.wake_ns
    }

    /// How much longer a wait is after one the loop slept through than after a hit, in ns:
    /// what a miss costs beyond the wake-up (0 until both are known; at most a wake-up).
    pub(crate) fn followup_ns(&self) -> u64 {
        match (self.after_sleep.mean(), self.after_hit.mean()) {
            (Some(slept), Some(hit)) if slept > hit => ((slept - hit) as u64).min(self.wake_ns),
            _ => 0,
        }
    }

    /// The window for a wait starting at `now_ns`: the chosen one, cut to what the miss budget
    /// can pay for, at most `max_ns`.
    pub(crate) fn next_window(&mut self, now_ns: u64, max_ns: u64) -> u64 {
        self.refill(now_ns);
        self.probing = false;
        let mut want = self.window_ns.min(max_ns);
        if self.choice == Choice::Off {
            self.probe_in = self.probe_in.saturating_sub(1);
            if self.probe_in > 0 {
                return 0;
            }
            self.probe_in = PROBE_EVERY;
            self.probing = true;
            want = self.probe_window(max_ns);
        }
        if want > self.budget_ns {
            self.budget_cuts += 1;
            if self.budget_ns < self.median_ns {
                return 0;
            }
            return self.budget_ns;
        }
        want
    }

    /// A probe's window: twice the wake-up cost (no longer wait is worth polling for).
    fn probe_window(&self, max_ns: u64) -> u64 {
        ((self.wake_ns as f64 / CPU_PRICE) as u64).min(max_ns)
    }

    fn refill(&mut self, now_ns: u64) {
        if let Some(at) = self.budget_at {
            let earned = now_ns.saturating_sub(at) * MISS_BUDGET_PERCENT / 100;
            self.budget_ns = (self.budget_ns + earned).min(BUDGET_CAP_NS);
        }
        self.budget_at = Some(now_ns);
    }

    /// Learns from one blocking wait; chooses the window again every [`UPDATE_EVERY`] waits
    /// (within `max_ns`).
    pub(crate) fn observe(&mut self, wait: AutoWait, max_ns: u64) {
        self.refill(wait.now_ns);
        if !wait.hit {
            self.budget_ns = self.budget_ns.saturating_sub(wait.polled_ns);
            self.missed_ns += wait.polled_ns;
        }
        let slept_before = self.last_slept.replace(!wait.hit);
        if self.choice == Choice::Off && !self.probing {
            // Slept through without polling: only the probes are learned from while off.
            return;
        }
        // The event's own time: exact when polling caught it; a loop that slept was woken
        // `wake_ns` after it (and it came after the polling, if any).
        let t = if wait.hit {
            wait.block_ns
        } else {
            wait.block_ns
                .saturating_sub(self.wake_ns)
                .max(wait.polled_ns)
        };
        self.counts[bucket(t)] += 1;
        match slept_before {
            Some(true) => self.after_sleep.add(t),
            Some(false) => self.after_hit.add(t),
            None => {}
        }
        if self.probing && wait.hit {
            // The next wait follows a hit: probe it as well.
            self.probe_in = 1;
        }
        self.since_decay += 1;
        if self.since_decay >= DECAY_EVERY {
            self.since_decay = 0;
            for c in &mut self.counts {
                *c /= 2;
            }
            // What a sleep costs stays known while polling catches everything (nothing is
            // slept through to measure it again); what a wait after a hit takes fades, so a
            // device whose every wait is slept through adds nothing.
            self.after_sleep.fade(FOLLOWUP_MIN_WAITS);
            self.after_hit.fade(0.0);
        }
        self.since_update += 1;
        if self.since_update >= UPDATE_EVERY {
            self.since_update = 0;
            self.choose(max_ns);
        }
    }

    /// The window of least expected cost: `(wake + followup) * P(t > W) + price *
    /// E[min(t, W)]`, over 0 and the bucket edges up to `max_ns`. A bucket's waits count at
    /// its middle.
    fn choose(&mut self, max_ns: u64) {
        let miss_ns = (self.wake_ns + self.followup_ns()) as f64;
        let total: u64 = self.counts.iter().map(|&c| u64::from(c)).sum();
        if total == 0 {
            return;
        }
        let mid = |b: usize| (edge(b) + edge(b + 1)) as f64 / 2.0;
        let mut below = 0u64;
        let median = self.counts.iter().position(|&c| {
            below += u64::from(c);
            2 * below >= total
        });
        self.median_ns = median.map_or(0, |b| mid(b) as u64);
        let cost = |w: u64| -> f64 {
            let mut cost = 0.0;
            for (b, &c) in self.counts.iter().enumerate() {
                if c == 0 {
                    continue;
                }
                let t = if b + 1 == BUCKETS {
                    // The last bucket: waits of 4 ms and more.
                    f64::MAX
                } else {
                    mid(b)
                };
                let p = f64::from(c) / total as f64;
                let caught = t <= w as f64;
                let polled = if caught { t } else { w as f64 };
                let woken = if caught { 0.0 } else { miss_ns };
                cost += p * (woken + CPU_PRICE * polled);
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
        self.updates += 1;
        self.window_ns = best.0;
        self.choice = if best.0 == 0 {
            self.offs += 1;
            Choice::Off
        } else {
            Choice::Polling
        };
    }
}

#[cfg(test)]
#[path = "auto_tests.rs"]
mod tests;
