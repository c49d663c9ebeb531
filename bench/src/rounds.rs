//! Repeated measurements: the median and the spread of a cell's rounds, for every command that
//! runs a measurement more than once (the matrix's `--repeat`, `latency`, the vhost and peer
//! comparisons).
//!
//! This module owns the statistics and the order of a round ([`order`]: A B, then B A); what
//! a round runs is each command's.

/// The order of round `round` (from 0) over `n` items: forward in even rounds, backward in
/// odd ones (A B, B A, ...), so that no item always runs first or always runs after the same
/// one.
pub fn order(round: usize, n: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |i| if round % 2 == 0 { i } else { n - 1 - i })
}

/// The median of `values` (the mean of the middle two for an even count), NaNs left out;
/// `None` when nothing is left.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 0 {
        (v[m - 1] + v[m]) / 2.0
    } else {
        v[m]
    })
}

/// The round whose `key` is the median (the lower middle one for an even count): a whole
/// round, so that its other figures stay consistent with each other. `None` when empty.
pub fn median_round<T>(mut rounds: Vec<T>, key: impl Fn(&T) -> f64) -> Option<T> {
    if rounds.is_empty() {
        return None;
    }
    rounds.sort_by(|a, b| key(a).total_cmp(&key(b)));
    Some(rounds.swap_remove((rounds.len() - 1) / 2))
}

/// The largest of `values` over the smallest (1 for one value; NaN when empty).
pub fn spread(values: impl IntoIterator<Item = f64>) -> f64 {
    let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values {
        min = min.min(v);
        max = max.max(v);
    }
    if min.is_finite() {
        max / min
    } else {
        f64::NAN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_spreads() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 2.0]), Some(2.0));
        let rounds = vec![(3.0, "c"), (1.0, "a"), (4.0, "d"), (2.0, "b")];
        assert_eq!(
            median_round(rounds, |r| r.0),
            Some((2.0, "b")),
            "lower middle"
        );
        assert_eq!(median_round(vec![(5.0, 'x')], |r| r.0), Some((5.0, 'x')));
        assert_eq!(median_round(Vec::<(f64, u8)>::new(), |r| r.0), None);
        assert_eq!(spread([2.0, 8.0, 4.0]), 4.0);
        assert!(spread([]).is_nan());
        assert_eq!(order(0, 3).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(order(1, 3).collect::<Vec<_>>(), [2, 1, 0]);
        assert_eq!(order(2, 0).count(), 0);
    }
}
