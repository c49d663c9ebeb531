//! Latency histograms (QEMU's `block-latency-histogram-set`): per kind of request, how many
//! took a time in each interval a list of boundaries makes.
//!
//! This module owns the boundaries' rule and the bins; the statistics count into them only
//! while a histogram is set (otherwise a request pays one relaxed load).
//!
//! * Boundaries are nanoseconds, positive and strictly ascending (QEMU's rule).
//! * Bin 0 counts times below the first boundary, bin `i` times from boundary `i - 1` up to
//!   (not including) boundary `i`, the last bin times from the last boundary on.
//! * Setting a kind's histogram starts its bins at zero.

/// Why a histogram's boundaries were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HistogramError {
    /// A boundary is zero, or not above the one before it.
    #[error("boundary {value} at {index} is not above the one before it ({previous}); boundaries are positive and strictly ascending")]
    NotAscending {
        /// Its place in the list.
        index: usize,
        /// Its value.
        value: u64,
        /// The value before it (0 for the first).
        previous: u64,
    },
}

impl From<HistogramError> for std::io::Error {
    fn from(e: HistogramError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e)
    }
}

/// One kind's latency histogram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// The interval boundaries in ns, ascending.
    pub boundaries: Vec<u64>,
    /// The counts: one more than the boundaries.
    pub bins: Vec<u64>,
}

impl LatencyHistogram {
    /// An empty histogram over `boundaries`, or why they are refused.
    pub fn new(boundaries: Vec<u64>) -> Result<Self, HistogramError> {
        check(&boundaries)?;
        let bins = vec![0; boundaries.len() + 1];
        Ok(LatencyHistogram { boundaries, bins })
    }

    /// Counts one request that took `ns`.
    pub fn count(&mut self, ns: u64) {
        let bin = self.boundaries.partition_point(|&b| b <= ns);
        self.bins[bin] += 1;
    }

    /// Adds `other`'s counts (a histogram over the same boundaries).
    pub(super) fn add(&mut self, other: &LatencyHistogram) {
        if other.boundaries == self.boundaries {
            for (sum, n) in self.bins.iter_mut().zip(&other.bins) {
                *sum += n;
            }
        }
    }
}

/// Checks QEMU's rule: positive, strictly ascending.
pub fn check(boundaries: &[u64]) -> Result<(), HistogramError> {
    let mut previous = 0;
    for (index, &value) in boundaries.iter().enumerate() {
        if value <= previous {
            return Err(HistogramError::NotAscending {
                index,
                value,
                previous,
            });
        }
        previous = value;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_fall_in_half_open_bins_and_bad_boundaries_are_named() {
        let mut h = LatencyHistogram::new(vec![10, 100]).unwrap();
        for ns in [0, 9, 10, 99, 100, 1_000_000] {
            h.count(ns);
        }
        assert_eq!(h.bins, [2, 2, 2]);
        let mut sum = LatencyHistogram::new(vec![10, 100]).unwrap();
        sum.add(&h);
        sum.add(&h);
        assert_eq!(sum.bins, [4, 4, 4]);
        let empty = LatencyHistogram::new(Vec::new()).unwrap();
        assert_eq!(empty.bins, [0], "no boundary: one bin for everything");
        assert_eq!(
            LatencyHistogram::new(vec![0]).unwrap_err(),
            HistogramError::NotAscending {
                index: 0,
                value: 0,
                previous: 0
            }
        );
        assert!(matches!(
            LatencyHistogram::new(vec![5, 5]),
            Err(HistogramError::NotAscending { index: 1, .. })
        ));
        assert!(LatencyHistogram::new(vec![20, 10]).is_err());
    }
}
