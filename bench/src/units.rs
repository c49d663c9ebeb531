//! fio's units: sizes (`4k` = 4096, `1m`, `2g`, `512`) and durations (`10s`, `500ms`, `2m`,
//! `1h`, `1d`, a bare number = seconds), and the limits the command lines add to them (a
//! `--runtime` above zero, a `--poll-max-ns` of at most 1 s). Each parser is a clap
//! `value_parser` as it stands: its error is what clap prints after the flag's name.
//!
//! This module owns parsing and its errors only.

use std::time::Duration;

/// A size or duration that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UnitError {
    /// Not a size.
    #[error("'{0}' is not a size (examples: 4096, 4k, 1m, 2g)")]
    Size(String),
    /// Not a duration.
    #[error("'{0}' is not a duration (examples: 10, 10s, 500ms, 2m, 1h, 1d)")]
    Duration(String),
    /// A duration longer than [`MAX_DURATION`].
    #[error("'{0}' is longer than the longest run this tool accepts (365d)")]
    TooLong(String),
    /// A measured time of zero (it would report no measurement, NaN rates).
    #[error("'{0}': the measured time must be more than 0")]
    ZeroRuntime(String),
    /// Not a polling limit: a number of ns, or `auto`.
    #[error(transparent)]
    PollMaxNs(#[from] aio_loop::BadPollMaxNs),
    /// A polling limit over 1 s.
    #[error("{0} ns is more than 1 s")]
    PollMaxNsTooLong(u64),
}

/// The longest duration accepted: a year (deadlines are computed as `now + duration`).
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 86_400);

fn split_number(s: &str) -> Option<(u64, &str)> {
    let digits = s.bytes().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let n = s[..digits].parse().ok()?;
    Some((n, &s[digits..]))
}

/// Parses a size with fio's binary suffixes (k = 1024, m, g, t, p; optional trailing
/// `b`/`ib`).
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let t = s.trim().to_ascii_lowercase();
    let err = || UnitError::Size(s.to_string());
    let (n, rest) = split_number(&t).ok_or_else(err)?;
    let rest = rest.trim_end_matches("ib").trim_end_matches('b');
    let mult: u64 = match rest {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        "p" => 1 << 50,
        _ => return Err(err()),
    };
    n.checked_mul(mult).ok_or_else(err)
}

/// Parses a duration (a bare number is seconds, as in fio's `runtime=`).
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let t = s.trim().to_ascii_lowercase();
    let err = || UnitError::Duration(s.to_string());
    let (n, rest) = split_number(&t).ok_or_else(err)?;
    let d = match rest {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "us" => Duration::from_micros(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(err)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(err)?),
        "d" => Duration::from_secs(n.checked_mul(86_400).ok_or_else(err)?),
        _ => return Err(err()),
    };
    if d > MAX_DURATION {
        return Err(UnitError::TooLong(s.to_string()));
    }
    Ok(d)
}

/// Parses a `--runtime`: a duration above zero.
pub fn parse_runtime(s: &str) -> Result<Duration, UnitError> {
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err(UnitError::ZeroRuntime(s.to_string()));
    }
    Ok(d)
}

/// Parses a `--poll-max-ns`: ns (0 turns polling off, at most 1 s) or `auto`.
pub fn parse_poll_max_ns(s: &str) -> Result<aio_loop::PollMaxNs, UnitError> {
    match s.parse::<aio_loop::PollMaxNs>()? {
        aio_loop::PollMaxNs::Fixed(ns) if ns > 1_000_000_000 => {
            Err(UnitError::PollMaxNsTooLong(ns))
        }
        p => Ok(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("256m"), Ok(256 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
        assert_eq!(parse_size("1p"), Ok(1 << 50));
        assert_eq!(parse_size("3PiB"), Ok(3 << 50));
        assert!(parse_size("99999p").is_err(), "overflow");
        assert!(parse_size("k").is_err());
        assert!(parse_size("4x").is_err());
        assert!(parse_size("99999999999999t").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert!(parse_duration("5w").is_err());
        assert_eq!(parse_duration("365d"), Ok(MAX_DURATION));
        assert!(matches!(parse_duration("366d"), Err(UnitError::TooLong(_))));
    }

    /// Property tests with a seeded generator: random strings never panic and either parse or
    /// name the input; every number with every suffix parses to number x unit, or is refused as
    /// an overflow (never wrapped).
    #[test]
    fn random_input_never_panics_and_units_multiply_exactly() {
        let mut rng = aio_conformance::engine::Rng::new(11);
        let alphabet: Vec<char> = "0123456789kKmMgGtTbBiIsSuUhHdD .-+x\u{e9}"
            .chars()
            .collect();
        for _ in 0..50_000 {
            let len = (rng.next_u64() % 12) as usize;
            let s: String = (0..len)
                .map(|_| alphabet[(rng.next_u64() % alphabet.len() as u64) as usize])
                .collect();
            if let Err(e) = parse_size(&s) {
                assert!(e.to_string().contains(&format!("'{s}'")));
            }
            if let Err(e) = parse_duration(&s) {
                assert!(e.to_string().contains(&format!("'{s}'")));
            }
        }
        let sizes = [
            ("", 1u64),
            ("k", 1 << 10),
            ("m", 1 << 20),
            ("g", 1 << 30),
            ("t", 1 << 40),
        ];
        let times = [
            ("", 1_000_000u64),
            ("s", 1_000_000),
            ("ms", 1_000),
            ("us", 1),
            ("m", 60_000_000),
            ("h", 3_600_000_000),
            ("d", 86_400_000_000),
        ];
        for _ in 0..20_000 {
            // Numbers of every magnitude, up to u64::MAX.
            let n = rng.next_u64() >> (rng.next_u64() % 64);
            let (suffix, unit) = sizes[(rng.next_u64() % sizes.len() as u64) as usize];
            match n.checked_mul(unit) {
                Some(v) => assert_eq!(parse_size(&format!("{n}{suffix}")), Ok(v)),
                None => assert!(parse_size(&format!("{n}{suffix}")).is_err()),
            }
            let (suffix, us) = times[(rng.next_u64() % times.len() as u64) as usize];
            let got = parse_duration(&format!("{n}{suffix}"));
            let want_us = u128::from(n) * u128::from(us);
            if want_us <= MAX_DURATION.as_micros() {
                assert_eq!(got.map(|d| d.as_micros()), Ok(want_us), "{n}{suffix}");
            } else {
                assert!(got.is_err(), "{n}{suffix} is longer than MAX_DURATION");
            }
        }
    }
}
