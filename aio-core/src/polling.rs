//! Adaptive busy polling: the parameters and QEMU's grow/shrink rule.
//!
//! This module owns the arithmetic only: given how long the loop last blocked, what should the
//! next polling window be. [`AioContext`](crate::AioContext) runs the `io_poll` callbacks and
//! feeds the measured block time back here.

/// The polling window a context starts from when polling is turned on or grows from 0 (4 µs,
/// as QEMU).
pub const POLL_START_NS: u64 = 4_000;

/// QEMU's IOThread default for `poll-max-ns`.
pub const DEFAULT_POLL_MAX_NS: u64 = 32_768;

/// How long a handler may go without activity before it leaves the poll set (QEMU: 7 s).
pub const DEFAULT_POLL_IDLE_NS: u64 = 7_000_000_000;

/// Adaptive polling parameters, settable at run time with
/// [`AioContext::set_poll_params`](crate::AioContext::set_poll_params).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollParams {
    /// The longest busy-poll window in ns; 0 turns polling off.
    pub max_ns: u64,
    /// Growth factor; 0 means the default, x2.
    pub grow: u64,
    /// Shrink divisor; 0 means reset the window to 0.
    pub shrink: u64,
}

impl Default for PollParams {
    /// Polling off, as a plain QEMU AioContext starts; IOThreads use
    /// [`PollParams::iothread`].
    fn default() -> Self {
        PollParams {
            max_ns: 0,
            grow: 0,
            shrink: 0,
        }
    }
}

impl PollParams {
    /// QEMU's IOThread defaults: `poll-max-ns` 32768, grow x2, shrink to 0.
    pub fn iothread() -> Self {
        PollParams {
            max_ns: DEFAULT_POLL_MAX_NS,
            grow: 0,
            shrink: 0,
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

#[cfg(test)]
mod tests {
    use super::*;

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
