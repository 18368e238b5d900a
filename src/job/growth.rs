//! Growth rates: a least-squares slope over a sliding window of (time, value) points.

use std::collections::VecDeque;

#[derive(Debug, Clone)]
pub struct Growth {
    points: VecDeque<(u64, f64)>,
    window_ms: u64,
}

impl Growth {
    pub fn new(window_ms: u64) -> Self {
        Growth {
            points: VecDeque::new(),
            window_ms: window_ms.max(1),
        }
    }

    pub fn push(&mut self, t_ms: u64, value: f64) {
        if self.points.back().is_some_and(|(t, _)| *t >= t_ms) {
            return;
        }
        self.points.push_back((t_ms, value));
        while self
            .points
            .front()
            .is_some_and(|(t, _)| t_ms - t > self.window_ms)
        {
            self.points.pop_front();
        }
    }

    pub fn clear(&mut self) {
        self.points.clear();
    }

    /// Units per second: the steeper of the slope over the whole window and over its last quarter, so
    /// the onset of fast growth is not averaged away by the calm before it. 0 with too few points.
    pub fn rate_per_second(&self) -> f64 {
        let recent_from = self
            .points
            .back()
            .map_or(0, |(t, _)| t.saturating_sub(self.window_ms / 4));
        let start = self.points.partition_point(|(t, _)| *t < recent_from);
        let recent = if self.points.len() - start >= 3 {
            slope(self.points.range(start..))
        } else {
            0.0
        };
        slope(self.points.iter()).max(recent)
    }
}

/// Least-squares slope of (ms, value) points, per second; 0 with fewer than two points or a span
/// under 5 ms.
fn slope<'a>(points: impl Iterator<Item = &'a (u64, f64)> + Clone) -> f64 {
    {
        let n = points.clone().count();
        let (Some(first), Some(last)) = (points.clone().next(), points.clone().last()) else {
            return 0.0;
        };
        if n < 2 || last.0 - first.0 < 5 {
            return 0.0;
        }
        let t0 = first.0 as f64;
        let (mut st, mut sv, mut stt, mut stv) = (0.0, 0.0, 0.0, 0.0);
        for &(t, v) in points {
            let t = (t as f64 - t0) / 1000.0;
            st += t;
            sv += v;
            stt += t * t;
            stv += t * v;
        }
        let nf = n as f64;
        let denom = nf * stt - st * st;
        if denom.abs() < f64::EPSILON {
            return 0.0;
        }
        (nf * stv - st * sv) / denom
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slope_over_window() {
        let mut g = Growth::new(1000);
        assert_eq!(g.rate_per_second(), 0.0);
        for i in 0..=20 {
            g.push(i * 100, (i * 100) as f64 * 2.0);
        }
        // Only the last second is kept; the slope is 2 units per ms.
        assert!((g.rate_per_second() - 2000.0).abs() < 1e-6);
        g.push(2000, 0.0);
        assert!(g.rate_per_second() < 2000.0);
    }
}
