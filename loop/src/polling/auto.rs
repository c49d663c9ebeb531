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
//!   [`ADAPTS_WITHIN`] waits. The counts are fractions, so a wait rarer than one per halving
//!   still weighs what it should.
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
//!   another, so that a wait after a hit is measured too (below); one that missed doubles the
//!   gap to the next, up to [`MAX_PROBE_EVERY`] waits, so that on a device far slower than a
//!   wake-up the probes cost next to nothing. Turning polling back on for a device that sped
//!   up takes at most [`ADAPTS_BACK_WITHIN`] waits.
//! * **What a sleep costs the next wait.** Sleeping through a wait can make the next one
//!   longer: a thread pool's worker that finished while the loop slept has often gone to sleep
//!   too when the next request comes, and then must be woken as well. The model keeps
//!   histograms of the waits that follow a sleep and of those that follow a hit, and adds the
//!   difference of their medians, at most two more wake-ups, to what a missed wait costs
//!   (medians, since a few scheduling stalls of milliseconds would make a mean of the waits
//!   after a sleep say nothing about the typical one). The waits after a hit fade with the
//!   histogram; those after a sleep, once known, stay until new sleeps move them (while
//!   polling catches every wait there is nothing to measure them by again). On a device whose
//!   waits do not depend on the loop's (a disk, an NVMe queue) the two medians agree and
//!   nothing is added.
//! * **The CPU bound.** Polling that finds nothing (the window ran out) may take at most
//!   [`MISS_BUDGET_PERCENT`]% of the loop thread's time, and a burst of at most 100 ms more:
//!   a budget grows with the clock, up to that burst, and each missed poll spends its length.
//!   The burst is what lets the loop poll through a stretch of waits that end just after the
//!   window (a pool's worker woken late), which a budget of a few ms ran dry on: the windows
//!   it then cut missed more waits still, each making the next longer. A window the budget
//!   cannot pay for is cut to what it can, or, where that is shorter than the median wait
//!   (after a wait the loop slept through: than the median wait after a sleep, if longer),
//!   not polled at all: a window cut that short would mostly miss, spend the budget again,
//!   and keep it empty.
//! * **Off the request's path.** The loop feeds the model a wait after the callbacks that wait
//!   woke (the next request is out by then): its arithmetic, a pass over the histogram every
//!   [`UPDATE_EVERY`] waits, delays no request.

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
/// While polling is off, every this many waits polls as a probe, at first.
pub const PROBE_EVERY: u32 = 4;
/// Each probe that misses doubles the gap to the next, up to this many waits; a probe that
/// hits brings it back to [`PROBE_EVERY`].
pub const MAX_PROBE_EVERY: u32 = 64;
/// Waits after which a device that sped up while polling was off has polling on again: the
/// next probe comes within [`MAX_PROBE_EVERY`] waits, and from its hit on the probes are at
/// least a quarter of the waits.
#[cfg_attr(not(test), allow(dead_code))] // The promise the tests hold the model to.
pub const ADAPTS_BACK_WITHIN: u32 = MAX_PROBE_EVERY + PROBE_EVERY * ADAPTS_WITHIN;
/// The price of a ns of polling, in ns of latency: polling that saves a wake-up pays for itself
/// when it costs less than twice the wake-up.
pub const CPU_PRICE: f64 = 0.5;
/// The share of the loop thread's time that polling without a hit may take.
pub const MISS_BUDGET_PERCENT: u64 = 10;
/// The most the miss budget can hold, in ns: polling without a hit takes at most
/// [`MISS_BUDGET_PERCENT`]% of any stretch of time plus this.
const BUDGET_CAP_NS: u64 = 100_000_000;
/// Waits (decayed) each side of the follow-up comparison needs before it counts.
const FOLLOWUP_MIN_WAITS: f64 = 8.0;

/// Event times in buckets whose counts fade. The counts are fractions: a wait rarer than one
/// per halving still weighs what it should (a whole count halved to nothing would drop it, and
/// the window would shrink below the rare waits it pays to catch).
#[derive(Debug, Clone)]
struct Histogram {
    counts: [f64; BUCKETS],
}

impl Histogram {
    const EMPTY: Histogram = Histogram {
        counts: [0.0; BUCKETS],
    };

    fn add(&mut self, t: u64) {
        self.counts[bucket(t)] += 1.0;
    }

    /// The waits in it, faded.
    fn total(&self) -> f64 {
        self.counts.iter().sum()
    }

    /// Halves the weight of the waits so far, but not below `floor` waits (nor above what
    /// there is): a histogram kept at the floor stays until new waits move it.
    fn fade(&mut self, floor: f64) {
        let total = self.total();
        if total > 0.0 {
            let scale = (total / 2.0).max(floor.min(total)) / total;
            for c in &mut self.counts {
                *c *= scale;
            }
        }
    }

    /// The middle of the bucket that holds the median wait, once `min_waits` are in.
    fn median_ns(&self, min_waits: f64) -> Option<u64> {
        let total = self.total();
        // (A histogram faded to `min_waits` may sum to a hair below it.)
        if total == 0.0 || total < min_waits * (1.0 - 1e-9) {
            return None;
        }
        let mut below = 0.0;
        let b = self.counts.iter().position(|&c| {
            below += c;
            2.0 * below >= total
        })?;
        Some((edge(b) + edge(b + 1)) / 2)
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
    /// Every wait's event time.
    waits: Histogram,
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
    /// While off: waits left before the next probe, the gap after it, and whether the
    /// current wait is one.
    probe_in: u32,
    probe_gap: u32,
    probing: bool,
    /// Event times of the waits after one the loop slept through, and after a hit; whether the
    /// last wait was slept through.
    after_sleep: Histogram,
    after_hit: Histogram,
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
            waits: Histogram::EMPTY,
            since_decay: 0,
            since_update: 0,
            window_ns: POLL_START_NS,
            choice: Choice::Learning,
            wake_ns,
            budget_ns: BUDGET_CAP_NS / 4,
            budget_at: None,
            probe_in: PROBE_EVERY,
            probe_gap: PROBE_EVERY,
            probing: false,
            after_sleep: Histogram::EMPTY,
            after_hit: Histogram::EMPTY,
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

    /// How much longer the median wait is after one the loop slept through than after a hit,
    /// in ns: what a miss costs beyond the wake-up (0 until both are known; at most two
    /// wake-ups).
    pub(crate) fn followup_ns(&self) -> u64 {
        match (
            self.after_sleep.median_ns(FOLLOWUP_MIN_WAITS),
            self.after_hit.median_ns(FOLLOWUP_MIN_WAITS),
        ) {
            (Some(slept), Some(hit)) => slept
                .saturating_sub(hit)
                .min(self.wake_ns.saturating_mul(2)),
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
            self.probe_in = self.probe_gap;
            self.probing = true;
            want = self.probe_window(max_ns);
        }
        if want > self.budget_ns {
            self.budget_cuts += 1;
            if self.budget_ns < self.shortest_cut_ns() {
                return 0;
            }
            return self.budget_ns;
        }
        want
    }

    /// The shortest window a budget cut may leave: the median wait, or after a wait the loop
    /// slept through the median wait after a sleep if that is longer (a pool's worker asleep
    /// too makes the next wait long, and a cut that misses it sleeps again).
    fn shortest_cut_ns(&self) -> u64 {
        let after_sleep = match self.last_slept {
            Some(true) => self.after_sleep.median_ns(FOLLOWUP_MIN_WAITS).unwrap_or(0),
            _ => 0,
        };
        self.median_ns.max(after_sleep)
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
        self.waits.add(t);
        match slept_before {
            Some(true) => self.after_sleep.add(t),
            Some(false) => self.after_hit.add(t),
            None => {}
        }
        if self.probing {
            if wait.hit {
                // The next wait follows a hit: probe it as well.
                self.probe_in = 1;
                self.probe_gap = PROBE_EVERY;
            } else {
                // On a device this slow the probes only burn the budget: fewer of them.
                self.probe_gap = (self.probe_gap * 2).min(MAX_PROBE_EVERY);
            }
        }
        self.since_decay += 1;
        if self.since_decay >= DECAY_EVERY {
            self.since_decay = 0;
            self.waits.fade(0.0);
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

    /// Chooses the window again from the histogram (see [`cheapest_window`]).
    fn choose(&mut self, max_ns: u64) {
        let miss_ns = self.wake_ns.saturating_add(self.followup_ns()) as f64;
        let total = self.waits.total();
        let Some(median_ns) = self.waits.median_ns(0.0) else {
            return;
        };
        self.median_ns = median_ns;
        let best = cheapest_window(&self.waits.counts, total, miss_ns, max_ns);
        self.updates += 1;
        self.window_ns = best.0;
        self.choice = if best.0 == 0 {
            self.offs += 1;
            Choice::Off
        } else {
            self.probe_gap = PROBE_EVERY;
            Choice::Polling
        };
    }
}

/// The window of least expected cost, and that cost: `miss * P(t > W) + price * E[min(t, W)]`
/// over 0 and the bucket edges up to `max_ns`, a bucket's waits counted at its middle (the last
/// bucket's, 4 ms and more, never caught). One pass: a window at the upper edge of bucket `k`
/// catches buckets `0..=k`, whose polling is their own time, and polls the whole window for
/// the rest, which also pay the miss. This runs on the loop's thread between a completion and
/// the next request, so it must stay cheap.
fn cheapest_window(counts: &[f64; BUCKETS], total: f64, miss_ns: f64, max_ns: u64) -> (u64, f64) {
    let mut caught_cost = 0.0;
    let mut beyond = 1.0;
    let mut best = (0u64, miss_ns);
    for (k, &c) in counts.iter().enumerate() {
        let w = edge(k + 1);
        if w > max_ns {
            break;
        }
        if k + 1 < BUCKETS {
            let p = c / total;
            caught_cost += p * CPU_PRICE * (edge(k) + edge(k + 1)) as f64 / 2.0;
            beyond -= p;
        }
        let cost = caught_cost + beyond.max(0.0) * (miss_ns + CPU_PRICE * w as f64);
        if cost < best.1 {
            best = (w, cost);
        }
    }
    best
}

#[cfg(test)]
#[path = "auto_tests.rs"]
mod tests;
