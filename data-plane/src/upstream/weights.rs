//! A weight line: entries laid end to end, each as long as its weight, so a
//! position on the line names an entry with probability weight / total.
//! Shared by weighted instances (the balancer) and route splits.
//!
//! Requests walk the line by a fixed stride coprime with its length, so each
//! run of `total` consecutive requests visits every position exactly once
//! (exact proportions) while consecutive requests land far apart (interleaved
//! rather than in bursts: 95/5 does not send 95 in a row, then 5). A hashed
//! key lands on a fixed position instead (sticky).

/// Entries with weights, laid end to end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightLine {
    /// Cumulative ends: entry `i` covers `[ends[i-1], ends[i])`.
    ends: Box<[u64]>,
    /// The stride between consecutive requests, coprime with the total.
    stride: u64,
}

impl WeightLine {
    /// A line of `weights` (zero weights take no room). `None` when every
    /// weight is zero or there is none.
    pub fn new(weights: impl IntoIterator<Item = u32>) -> Option<Self> {
        let mut total = 0u64;
        let ends: Box<[u64]> = weights
            .into_iter()
            .map(|w| {
                total += u64::from(w);
                total
            })
            .collect();
        (total > 0).then(|| Self {
            stride: stride_for(total),
            ends,
        })
    }

    /// The line's length: the sum of the weights.
    pub fn total(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// The entry at the `n`th step of the walk.
    pub fn step(&self, n: u64) -> usize {
        let total = self.total();
        // (n mod total) × stride mod total, without overflow for any total.
        let pos = ((u128::from(n % total) * u128::from(self.stride)) % u128::from(total)) as u64;
        self.at(pos)
    }

    /// The entry a hashed key lands on: the same key, the same entry, as long
    /// as the weights stay the same.
    pub fn sticky(&self, hash: u64) -> usize {
        // Multiply-shift: an even spread of a 64-bit hash over [0, total).
        let pos = ((u128::from(hash) * u128::from(self.total())) >> 64) as u64;
        self.at(pos)
    }

    /// The entry covering position `pos` (< total).
    pub fn at(&self, pos: u64) -> usize {
        self.ends.partition_point(|&end| end <= pos)
    }
}

/// A stride close to total × 0.618 (the golden ratio spreads consecutive
/// steps the most evenly) that shares no factor with `total`.
fn stride_for(total: u64) -> u64 {
    if total <= 2 {
        return 1;
    }
    let mut s = ((total as f64) * 0.618_033_988_75) as u64;
    s = s.max(1);
    while gcd(s, total) != 1 {
        s += 1;
    }
    s
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(line: &WeightLine, n: u64, entries: usize) -> Vec<u64> {
        let mut c = vec![0; entries];
        for i in 0..n {
            c[line.step(i)] += 1;
        }
        c
    }

    #[test]
    fn every_run_of_total_steps_is_exact() {
        let line = WeightLine::new([95, 5]).unwrap();
        assert_eq!(counts(&line, 100, 2), vec![95, 5]);
        assert_eq!(counts(&line, 10_000, 2), vec![9_500, 500]);
        let line = WeightLine::new([3, 0, 1, 6]).unwrap();
        assert_eq!(counts(&line, 10, 4), vec![3, 0, 1, 6]);
        let line = WeightLine::new([1]).unwrap();
        assert_eq!(counts(&line, 7, 1), vec![7]);
    }

    #[test]
    fn the_walk_interleaves() {
        // 95/5: the five canary requests of each hundred are spread out, not adjacent.
        let line = WeightLine::new([95, 5]).unwrap();
        let canary: Vec<u64> = (0..100).filter(|&i| line.step(i) == 1).collect();
        assert_eq!(canary.len(), 5);
        assert!(canary.windows(2).all(|w| w[1] - w[0] > 5), "{canary:?}");
    }

    #[test]
    fn zero_weights_take_no_room() {
        assert!(WeightLine::new([0, 0]).is_none());
        assert!(WeightLine::new([]).is_none());
        let line = WeightLine::new([0, 100]).unwrap();
        assert!((0..1000).all(|i| line.step(i) == 1));
        assert!((0..1000u64).all(|h| line.sticky(h.wrapping_mul(0x9e37_79b9_7f4a_7c15)) == 1));
    }

    #[test]
    fn sticky_positions_move_only_towards_the_growing_side() {
        // Keys on the canary (entry 0) at 5 % stay there at 50 %.
        let small = WeightLine::new([5, 95]).unwrap();
        let big = WeightLine::new([50, 50]).unwrap();
        for k in 0..10_000u64 {
            let h = k.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            if small.sticky(h) == 0 {
                assert_eq!(big.sticky(h), 0);
            }
        }
    }

    #[test]
    fn strides_are_coprime() {
        for total in 1..500 {
            let s = stride_for(total);
            assert_eq!(gcd(s, total), 1, "total {total}");
        }
    }
}
