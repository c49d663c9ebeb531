//! The values of the daemon's own option syntax (`--disk`, `--nbd`, `--nbd-export`): sizes
//! with a binary suffix, and on/off.
//!
//! This module owns those two value forms; which key takes which is the options' own.

/// `BYTES` with an optional binary suffix (K, M, G, T), as QEMU's sizes.
pub(crate) fn parse_size(value: &str) -> Option<u64> {
    let (digits, shift) = match value.char_indices().last()? {
        (i, 'k' | 'K') => (&value[..i], 10),
        (i, 'm' | 'M') => (&value[..i], 20),
        (i, 'g' | 'G') => (&value[..i], 30),
        (i, 't' | 'T') => (&value[..i], 40),
        _ => (value, 0),
    };
    digits.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// A boolean key's value: on or off (true/false, yes/no too).
pub(crate) fn on_off(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => Err(format!("{key}={value}: expected on or off")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_suffixes_and_booleans_their_spellings() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("2M"), Some(2 << 20));
        assert_eq!(parse_size("G"), None);
        assert_eq!(parse_size("99999999999T"), None);
        assert_eq!(on_off("k", "yes"), Ok(true));
        assert_eq!(on_off("k", "off"), Ok(false));
        assert!(on_off("k", "2").unwrap_err().contains("k=2"));
    }
}
