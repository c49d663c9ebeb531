//! Adaptive busy polling: the parameters, QEMU's grow/shrink rule, and the recovery this
//! project adds to it.
//!
//! This module owns the arithmetic only: given how long the loop last blocked, what should the
//! next polling window be. [`AioContext`](crate::AioContext) runs the `io_poll` callbacks and
//! feeds the measured block time back here.

pub(crate) mod auto;
pub(crate) mod wake;

/// The polling window a context starts from when polling is turned on or grows from 0 (4 µs,
/// as QEMU).
pub const POLL_START_NS: u64 = 4_000;

/// QEMU's IOThread default for `poll-max-ns`.
pub const DEFAULT_POLL_MAX_NS: u64 = 32_768;

/// How long a handler may go without activity before it leaves the poll set (QEMU: 7 s).
pub const DEFAULT_POLL_IDLE_NS: u64 = 7_000_000_000;

/// Which rule adapts the polling window.
///
/// # Why QEMU's rule alone collapses on a fast device
///
/// QEMU judges each wait alone: a wait that blocked longer than `poll_max_ns` resets the window
/// to 0, and the window grows again only after a wait that blocked *less* than `poll_max_ns`.
/// The block time of a wait that slept includes the cost of waking up, and on a virtual
/// machine whose idle vCPUs halt that cost is 20-50 µs: more than the device takes. On a
/// device that answers in 12-20 µs (a loop device with direct I/O over tmpfs, an NVMe drive),
/// a loop polling at QEMU's 32 µs default catches about 95% of completions; the first one that
/// comes late (a completion handled on the other, halted vCPU) resets the window, every later
/// wait sleeps and pays the wake-up (40-70 µs, above the max), and the window never grows
/// back. Measured at QD 1: polling ran in 48% of the waits and the mean latency was 38 µs,
/// against 17 µs with the window held at the max.
///
/// [`PollRule::Recovering`] (the default) keeps QEMU's grow, keep and shrink steps and adds two
/// things:
///
/// * **one late event is forgiven**: the window shrinks only after two waits in a row that
///   blocked longer than `poll_max_ns`;
/// * **a collapsed window is probed**: while the window is 0, every n-th blocking wait polls
///   once for `poll_max_ns` (n starts at 4 and doubles after each probe that finds nothing, up
///   to 1024); a probe that finds the event restores the window to `poll_max_ns`.
///
/// A slow device (a wait of 80 µs and more) still ends with polling off: two late waits shrink
/// the window and the probes back off to one spin of `poll_max_ns` per 1024 waits.
/// [`PollRule::Qemu`] is QEMU's rule, unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PollRule {
    /// QEMU's rule, each wait judged alone ([`PollParams::adjust`]).
    Qemu,
    /// QEMU's rule, plus: one late event is forgiven, and a collapsed window is probed back.
    #[default]
    Recovering,
    /// The window chosen from the waits the loop observes, no hand-set window needed:
    /// `max_ns` is only a cap.
    ///
    /// * The loop keeps a histogram of recent wait lengths and polls up to the length that
    ///   minimises the expected wake-up cost plus a price for the CPU polling burns (half a ns
    ///   of latency per ns polled).
    /// * It polls not at all when waits are far longer than a wake-up; every 4th wait then
    ///   still polls, as a probe, for twice the wake-up, and each probe that misses doubles
    ///   the gap to the next, up to 64 waits.
    /// * It follows a device that slows down within 528 waits (the histogram halves every
    ///   128), and one that speeds up again within 2176 (the next probe within 64 waits, and
    ///   from its hit on the probes are at least a quarter of the waits).
    /// * A miss costs the wake-up plus what sleeping made the next wait longer, measured
    ///   (`LoopCounters::poll_followup_ns`, the difference of the median waits after a sleep
    ///   and after a hit: a thread pool's worker that fell asleep too; 0 on a device that does
    ///   not care), at most two more wake-ups.
    /// * Polling that finds nothing takes at most 10% of the loop thread's time, plus a burst
    ///   of at most 100 ms (`LoopCounters::busy_poll_missed_ns`, `poll_auto_budget_cuts`); a
    ///   window the budget would cut below the median wait is not polled at all.
    /// * The model learns each wait after the callbacks it woke, off the next request's path.
    /// * The wake-up cost is measured once per process (`LoopCounters::poll_wake_ns`): the
    ///   latency of waking a sleeping thread, plus the CPU that thread spends on the sleep
    ///   and the wake-up at the price of polling's CPU (sleeping is not free either); or it
    ///   is given ([`PollParams::with_wake_ns`]).
    ///
    /// [`PollParams::auto`] caps it at [`AUTO_MAX_NS`]. Measured against fixed windows in
    /// BENCHMARKS.md ("Busy polling that tunes itself"); opt-in, the default is unchanged.
    Auto,
}

/// The cap on the window that `auto` comes with where a tool takes `poll_max_ns=auto`
/// (256 µs: past it, a wake-up is cheaper than polling on any machine measured here).
pub const AUTO_MAX_NS: u64 = 262_144;

/// Adaptive polling parameters, settable at run time with
/// [`AioContext::set_poll_params`](crate::AioContext::set_poll_params). Built from
/// [`PollParams::default`] (polling off) or [`PollParams::iothread`] and the `with_*` setters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PollParams {
    /// The longest busy-poll window in ns; 0 turns polling off.
    pub max_ns: u64,
    /// Growth factor; 0 means the default, x2.
    pub grow: u64,
    /// Shrink divisor; 0 means reset the window to 0.
    pub shrink: u64,
    /// How the window adapts (default [`PollRule::Recovering`]).
    pub rule: PollRule,
    /// For [`PollRule::Auto`]: what a wake-up costs, in ns of latency; 0 (the default)
    /// measures it on this machine, once per process (the wake-up's latency and the sleep's
    /// own CPU, priced).
    pub wake_ns: u64,
}

impl Default for PollParams {
    /// Polling off, as a plain QEMU AioContext starts; IOThreads use
    /// [`PollParams::iothread`].
    fn default() -> Self {
        PollParams {
            max_ns: 0,
            grow: 0,
            shrink: 0,
            rule: PollRule::Recovering,
            wake_ns: 0,
        }
    }
}

aio_core::kit::with_setters!(PollParams {
    /// With the longest busy-poll window `max_ns` (0 turns polling off).
    with_max_ns => max_ns: u64,
    /// With the growth factor `grow` (0: x2).
    with_grow => grow: u64,
    /// With the shrink divisor `shrink` (0: reset the window to 0).
    with_shrink => shrink: u64,
    /// With the window rule `rule`.
    with_rule => rule: PollRule,
    /// With the wake-up cost [`PollRule::Auto`] assumes, in ns (0: measured).
    with_wake_ns => wake_ns: u64,
});

impl PollParams {
    /// [`PollRule::Auto`] capped at [`AUTO_MAX_NS`]: what `poll_max_ns=auto` means.
    pub fn auto() -> Self {
        PollParams {
            max_ns: AUTO_MAX_NS,
            rule: PollRule::Auto,
            ..PollParams::iothread()
        }
    }

    /// QEMU's IOThread defaults: `poll-max-ns` 32768, grow x2, shrink to 0.
    pub fn iothread() -> Self {
        PollParams {
            max_ns: DEFAULT_POLL_MAX_NS,
            grow: 0,
            shrink: 0,
            rule: PollRule::Recovering,
            wake_ns: 0,
        }
    }

    /// The next polling window after a wait that blocked for `block_ns` with window `poll_ns`.
    ///
    /// * `block_ns <= poll_ns`: polling was long enough, keep the window;
    /// * `block_ns > max_ns`: polling could not have helped, shrink (divide by `shrink`, or 0);
    /// * otherwise grow (x`grow`, x2 by default; from 0 start at [`POLL_START_NS`]), capped at
    ///   `max_ns`.
    pub fn adjust(&self, poll_ns: u64, block_ns: u64) -> u64 {
        if self.max_ns == 0 {
            return 0;
        }
        if block_ns <= poll_ns {
            poll_ns
        } else if block_ns > self.max_ns {
            // shrink 0 means "reset to 0".
            poll_ns.checked_div(self.shrink).unwrap_or(0)
        } else {
            let grown = if poll_ns == 0 {
                POLL_START_NS
            } else {
                let grow = if self.grow == 0 { 2 } else { self.grow };
                poll_ns.saturating_mul(grow)
            };
            grown.min(self.max_ns)
        }
    }
}

/// A `poll-max-ns` as tools take it (`--poll-max-ns`, `poll_max_ns=` in job files): a window
/// in ns, 0 turning polling off, or `auto` ([`PollRule::Auto`] capped at [`AUTO_MAX_NS`]).
///
/// ```
/// use aio_loop::{PollMaxNs, PollRule};
/// let auto: PollMaxNs = "auto".parse().unwrap();
/// assert_eq!(auto.params().rule, PollRule::Auto);
/// let fixed: PollMaxNs = "32768".parse().unwrap();
/// assert_eq!(fixed.params().max_ns, 32_768);
/// assert!("soon".parse::<PollMaxNs>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMaxNs {
    /// This window, with QEMU's IOThread rule ([`PollParams::iothread`]); 0: polling off.
    Fixed(u64),
    /// The window chosen from the waits observed ([`PollParams::auto`]).
    Auto,
}

impl PollMaxNs {
    /// The parameters it stands for.
    pub fn params(self) -> PollParams {
        match self {
            PollMaxNs::Fixed(ns) => PollParams::iothread().with_max_ns(ns),
            PollMaxNs::Auto => PollParams::auto(),
        }
    }

    /// The fixed window, or `None` for `auto`.
    pub fn fixed(self) -> Option<u64> {
        match self {
            PollMaxNs::Fixed(ns) => Some(ns),
            PollMaxNs::Auto => None,
        }
    }
}

impl From<u64> for PollMaxNs {
    fn from(ns: u64) -> Self {
        PollMaxNs::Fixed(ns)
    }
}

impl std::fmt::Display for PollMaxNs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PollMaxNs::Fixed(ns) => write!(f, "{ns}"),
            PollMaxNs::Auto => f.write_str("auto"),
        }
    }
}

/// A `poll-max-ns` that is neither a number of ns nor `auto`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("poll-max-ns {0:?}: expected a number of ns (0 turns polling off) or `auto`")]
pub struct BadPollMaxNs(pub String);

impl std::str::FromStr for PollMaxNs {
    type Err = BadPollMaxNs;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "auto" {
            return Ok(PollMaxNs::Auto);
        }
        s.parse()
            .map(PollMaxNs::Fixed)
            .map_err(|_| BadPollMaxNs(s.to_string()))
    }
}

/// Blocking waits between the collapse of the window and the first probe.
const PROBE_FIRST: u32 = 4;
/// The longest interval between probes, in blocking waits.
const PROBE_MAX: u32 = 1024;

/// What one wait did to the window (counted by the context).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowChange {
    /// Unchanged (a hit, a forgiven late event, or still collapsed).
    Kept,
    /// Grew.
    Grew,
    /// Shrank (possibly to 0).
    Shrank,
    /// A probe of a collapsed window found nothing.
    ProbeMissed,
    /// A probe found the event: the window is back at the max.
    ProbeHit,
}

/// What one blocking iteration did, as the window's rule needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wait {
    /// From the iteration's start to the end of its wait (polling included), in ns.
    pub(crate) block_ns: u64,
    /// The iteration could have slept (no bottom half was pending): only such a wait says
    /// anything about how long events take.
    pub(crate) would_block: bool,
    /// The iteration's polling was a probe of a collapsed window.
    pub(crate) probe: bool,
    /// An `io_poll` check found an event (a notification that ended polling is not one).
    pub(crate) polled_hit: bool,
}

/// The adaptive window and what the [`PollRule::Recovering`] rule remembers between waits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PollWindow {
    ns: u64,
    /// Waits in a row that blocked longer than the max.
    late: u32,
    /// Blocking waits left before the next probe of a collapsed window.
    probe_in: u32,
    /// The current interval between probes.
    probe_every: u32,
}

impl PollWindow {
    /// The window now, in ns.
    pub(crate) fn ns(&self) -> u64 {
        self.ns
    }

    /// New parameters: polling turned on starts at 4 µs, turned off is 0, otherwise the
    /// window is capped at the new max; the recovery state starts afresh.
    pub(crate) fn reset(&mut self, params: &PollParams) {
        self.ns = if params.max_ns == 0 {
            0
        } else if self.ns == 0 {
            POLL_START_NS.min(params.max_ns)
        } else {
            self.ns.min(params.max_ns)
        };
        self.late = 0;
        self.probe_every = PROBE_FIRST;
        self.probe_in = PROBE_FIRST;
    }

    /// The window for the next blocking wait, and whether it is a probe of a collapsed window.
    pub(crate) fn next_window(&mut self, params: &PollParams) -> (u64, bool) {
        if self.ns > 0 || params.max_ns == 0 || params.rule == PollRule::Qemu {
            return (self.ns, false);
        }
        if self.probe_in == 0 {
            return (params.max_ns, true);
        }
        self.probe_in -= 1;
        (0, false)
    }

    /// Feeds back a blocking iteration that ran with the window [`next_window`] gave.
    ///
    /// [`next_window`]: PollWindow::next_window
    pub(crate) fn update(&mut self, params: &PollParams, wait: Wait) -> WindowChange {
        let Wait {
            block_ns,
            would_block,
            probe,
            polled_hit,
        } = wait;
        let old = self.ns;
        if params.rule == PollRule::Qemu || params.max_ns == 0 {
            self.ns = params.adjust(old, block_ns);
            return WindowChange::of(old, self.ns);
        }
        if !would_block {
            // A bottom half was pending: nothing was waited for and nothing is learned (QEMU's
            // rule would count it as a short wait and clear a run of late ones).
            return WindowChange::Kept;
        }
        if probe {
            // A hit only when polling found the event: a probe cut short by a timer or a
            // notification says nothing about the device.
            if polled_hit {
                self.ns = params.max_ns;
                self.late = 0;
                self.probe_every = PROBE_FIRST;
                return WindowChange::ProbeHit;
            }
            self.probe_every = (self.probe_every.saturating_mul(2)).min(PROBE_MAX);
            self.probe_in = self.probe_every;
            return WindowChange::ProbeMissed;
        }
        if block_ns > params.max_ns {
            self.late = self.late.saturating_add(1);
            if old > 0 && self.late < 2 {
                // The first late event after a run of good ones is forgiven.
                return WindowChange::Kept;
            }
        } else {
            self.late = 0;
        }
        self.ns = params.adjust(old, block_ns);
        if old > 0 && self.ns == 0 {
            self.probe_in = self.probe_every;
        }
        WindowChange::of(old, self.ns)
    }
}

impl WindowChange {
    fn of(old: u64, new: u64) -> WindowChange {
        match new.cmp(&old) {
            std::cmp::Ordering::Greater => WindowChange::Grew,
            std::cmp::Ordering::Less => WindowChange::Shrank,
            std::cmp::Ordering::Equal => WindowChange::Kept,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait that could block, of `block_ns`; a probe hits when it ended within the max.
    fn wait(block_ns: u64, probe: bool) -> Wait {
        Wait {
            block_ns,
            would_block: true,
            probe,
            polled_hit: block_ns <= DEFAULT_POLL_MAX_NS,
        }
    }

    fn window(params: &PollParams) -> PollWindow {
        let mut w = PollWindow::default();
        w.reset(params);
        w
    }

    #[test]
    fn qemu_rule_collapses_on_one_late_event_and_stays_collapsed() {
        let p = PollParams {
            rule: PollRule::Qemu,
            ..PollParams::iothread()
        };
        let mut w = window(&p);
        w.ns = p.max_ns;
        assert_eq!(w.update(&p, wait(40_000, false)), WindowChange::Shrank);
        assert_eq!(w.ns(), 0);
        // Every later wait sleeps and pays the wake-up: never below the max, never a probe.
        for _ in 0..100 {
            assert_eq!(w.next_window(&p), (0, false));
            assert_eq!(w.update(&p, wait(45_000, false)), WindowChange::Kept);
        }
        assert_eq!(w.ns(), 0);
    }

    #[test]
    fn one_late_event_is_forgiven_two_in_a_row_shrink() {
        let p = PollParams::iothread();
        let mut w = window(&p);
        w.ns = p.max_ns;
        assert_eq!(w.update(&p, wait(40_000, false)), WindowChange::Kept);
        assert_eq!(w.ns(), p.max_ns);
        // A hit in between resets the count.
        assert_eq!(w.update(&p, wait(15_000, false)), WindowChange::Kept);
        assert_eq!(w.update(&p, wait(40_000, false)), WindowChange::Kept);
        assert_eq!(w.update(&p, wait(40_000, false)), WindowChange::Shrank);
        assert_eq!(w.ns(), 0, "shrink 0 still resets");
    }

    #[test]
    fn a_collapsed_window_is_probed_and_restored_by_a_hit() {
        let p = PollParams::iothread();
        let mut w = window(&p);
        w.ns = p.max_ns;
        w.update(&p, wait(50_000, false));
        w.update(&p, wait(50_000, false));
        assert_eq!(w.ns(), 0);
        for _ in 0..PROBE_FIRST {
            assert_eq!(w.next_window(&p), (0, false));
            w.update(&p, wait(50_000, false));
        }
        assert_eq!(w.next_window(&p), (p.max_ns, true), "a probe at the max");
        assert_eq!(w.update(&p, wait(15_000, true)), WindowChange::ProbeHit);
        assert_eq!(w.ns(), p.max_ns);
    }

    #[test]
    fn failed_probes_back_off_to_one_in_1024_waits() {
        let p = PollParams::iothread();
        let mut w = window(&p);
        w.ns = 4_000;
        w.update(&p, wait(90_000, false));
        w.update(&p, wait(90_000, false));
        assert_eq!(w.ns(), 0);
        let mut gaps = vec![];
        let mut since = 0;
        for _ in 0..5_000 {
            let (ns, probe) = w.next_window(&p);
            if probe {
                assert_eq!(ns, p.max_ns);
                gaps.push(since);
                since = 0;
                assert_eq!(w.update(&p, wait(90_000, true)), WindowChange::ProbeMissed);
            } else {
                since += 1;
                w.update(&p, wait(90_000, false));
            }
        }
        assert_eq!(&gaps[..4], &[4, 8, 16, 32]);
        assert!(gaps.iter().all(|&g| g <= PROBE_MAX as usize));
        assert_eq!(*gaps.last().unwrap(), PROBE_MAX as usize);
        assert_eq!(w.ns(), 0, "a slow device keeps polling off");
    }

    #[test]
    fn iterations_that_could_not_wait_teach_nothing() {
        let p = PollParams::iothread();
        let mut w = window(&p);
        w.ns = p.max_ns;
        let busy = Wait {
            block_ns: 100,
            would_block: false,
            probe: false,
            polled_hit: false,
        };
        // Late, a bottom-half iteration, late: still two late waits in a row.
        assert_eq!(w.update(&p, wait(90_000, false)), WindowChange::Kept);
        assert_eq!(w.update(&p, busy), WindowChange::Kept);
        assert_eq!(w.update(&p, wait(90_000, false)), WindowChange::Shrank);
        // A collapsed window does not regrow from an iteration that could not wait.
        assert_eq!(w.update(&p, busy), WindowChange::Kept);
        assert_eq!(w.ns(), 0);
    }

    #[test]
    fn a_probe_cut_short_without_finding_anything_is_a_miss() {
        let p = PollParams::iothread();
        let mut w = window(&p);
        w.ns = 0;
        w.probe_in = 0;
        assert_eq!(w.next_window(&p), (p.max_ns, true));
        let cut_short = Wait {
            block_ns: 1_000, // a timer ended the probe after 1 µs
            would_block: true,
            probe: true,
            polled_hit: false,
        };
        assert_eq!(w.update(&p, cut_short), WindowChange::ProbeMissed);
        assert_eq!(w.ns(), 0);
    }

    #[test]
    fn a_short_wait_grows_a_collapsed_window_as_qemu_does() {
        let p = PollParams::iothread();
        let mut w = window(&p);
        w.ns = 0;
        assert_eq!(w.update(&p, wait(10_000, false)), WindowChange::Grew);
        assert_eq!(w.ns(), POLL_START_NS);
    }

    #[test]
    fn grow_from_zero_starts_at_4us_and_doubles_to_the_cap() {
        let p = PollParams::iothread();
        let mut ns = 0;
        let mut seen = vec![];
        for _ in 0..6 {
            ns = p.adjust(ns, 32_500); // blocked longer than the window, within the max
            seen.push(ns);
        }
        assert_eq!(seen, vec![4_000, 8_000, 16_000, 32_000, 32_768, 32_768]);
    }

    #[test]
    fn keep_when_polling_covered_the_wait() {
        let p = PollParams::iothread();
        assert_eq!(p.adjust(16_000, 16_000), 16_000);
        assert_eq!(p.adjust(16_000, 10), 16_000);
    }

    #[test]
    fn shrink_rules() {
        let mut p = PollParams::iothread();
        assert_eq!(p.adjust(16_000, 1_000_000), 0, "shrink 0 resets");
        p.shrink = 4;
        assert_eq!(p.adjust(16_000, 1_000_000), 4_000);
        p.grow = 3;
        assert_eq!(p.adjust(4_000, 20_000), 12_000);
    }

    #[test]
    fn off_is_off() {
        let p = PollParams::default();
        assert_eq!(p.adjust(0, 10), 0);
        assert_eq!(p.adjust(4_000, 10), 0);
    }
}
