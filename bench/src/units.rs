//! fio's units: sizes (`4k` = 4096, `1m`, `2g`, `512`) and durations (`10s`, `500ms`, `2m`,
//! `1h`, a bare number = seconds).
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
    #[error("'{0}' is not a duration (examples: 10, 10s, 500ms, 2m, 1h)")]
    Duration(String),
}

fn split_number(s: &str) -> Option<(u64, &str)> {
    let digits = s.bytes().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let n = s[..digits].parse().ok()?;
    Some((n, &s[digits..]))
}

/// Parses a size with fio's binary suffixes (k = 1024, m, g, t; optional trailing `b`/`ib`).
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
        _ => return Err(err()),
    };
    Ok(d)
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
        assert!(parse_duration("5d").is_err());
    }
}
