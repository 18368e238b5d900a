//! Growth rates: a least-squares slope over a sliding window of (time, value) points.

use std::collections::VecDeque;

/// A series' growth over a sliding window of (time, value) points.
#[derive(Debug, Clone)]
pub struct Growth {
    points: VecDeque<(u64, f64)>,
    window_ms: u64,
    /// The "newest" slope of `sustained_rate_per_second` spans at least this long (and three
    /// points): 0 for a series read fresh each time, longer for one that moves in steps.
    newest_ms: u64,
}

impl Growth {
    /// A series fitted over the last `window_ms`, read fresh at each point.
    pub fn new(window_ms: u64) -> Self {
        Growth {
            points: VecDeque::new(),
            window_ms: window_ms.max(1),
            newest_ms: 0,
        }
    }

    /// For a series that moves in steps `step_ms` apart or less (MemAvailable, which the kernel
    /// refreshes when it folds per-CPU counts): its newest points are flat between steps, which is
    /// no sign that growth stopped, so the newest slope spans at least `step_ms`.
    pub fn stepped(window_ms: u64, step_ms: u64) -> Self {
        Growth {
            newest_ms: step_ms,
            ..Growth::new(window_ms)
        }
    }

    /// Adds a point (one no newer than the last is ignored) and drops those older than the window.
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

    /// Forgets every point (after a pause, whose flat stretch is no sign of the job's growth).
    pub fn clear(&mut self) {
        self.points.clear();
    }

    /// Units per second of growth that is a trend, for predicting exhaustion: the gentlest of the slopes
    /// over the whole window, over its last quarter and over the newest three points, and 0 when they
    /// disagree in sign or there are too few points (under 4, or spanning under 100 ms). A burst that
    /// levelled off has flat newest points; memory freed and taken again every step has a flat window:
    /// neither is a trend.
    pub fn sustained_rate_per_second(&self) -> f64 {
        let (Some(first), Some(last)) = (self.points.front(), self.points.back()) else {
            return 0.0;
        };
        if self.points.len() < 4 || last.0 - first.0 < 100 {
            return 0.0;
        }
        let recent_from = last.0.saturating_sub(self.window_ms / 4);
        let start = self.points.partition_point(|(t, _)| *t < recent_from);
        let recent = if self.points.len() - start >= 3 {
            slope(self.points.range(start..))
        } else {
            return 0.0;
        };
        let whole = slope(self.points.iter());
        // And the newest three points: if they show no growth, growth has stopped, whatever an older
        // fit says (a burst that just ended leaves a steep fit behind it).
        let newest_from = self
            .points
            .partition_point(|(t, _)| *t < last.0.saturating_sub(self.newest_ms))
            .min(self.points.len() - 3);
        let newest = slope(self.points.range(newest_from..));
        if whole.signum() != recent.signum() || newest.signum() != whole.signum() {
            return 0.0;
        }
        [whole, recent, newest]
            .into_iter()
            .min_by(|a, b| a.abs().total_cmp(&b.abs()))
            .unwrap_or(0.0)
    }

    /// Units per second over the whole window: the trend, for a series that moves in steps (host
    /// memory) where the last quarter's slope is mostly the size of the last step.
    pub fn trend_per_second(&self) -> f64 {
        slope(self.points.iter())
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

    #[test]
    fn only_a_trend_is_sustained() {
        // Steady growth: a trend.
        let mut g = Growth::new(1000);
        for i in 0..=100 {
            g.push(i * 10, (i * 10) as f64 * 1e6);
        }
        assert!((g.sustained_rate_per_second() - 1e9).abs() < 1e3);
        // A burst that levelled off 300 ms ago: steep over the window, flat now.
        let mut g = Growth::new(1000);
        for i in 0..=100u64 {
            let t = i * 10;
            g.push(t, (t.min(300) as f64) * 2e6);
        }
        assert!(g.rate_per_second() > 1e8);
        assert_eq!(g.sustained_rate_per_second(), 0.0);
        // The same burst seen from a point long before it, then three flat probes after it.
        let mut g = Growth::new(1000);
        for (t, v) in [(0, 1e6), (130, 257e6), (140, 257e6), (150, 257e6)] {
            g.push(t, v);
        }
        assert!(g.rate_per_second() > 1e9);
        assert_eq!(g.sustained_rate_per_second(), 0.0);
        // 256 MB taken and freed every 300 ms: steep now and then, no trend.
        let mut g = Growth::new(1000);
        for i in 0..=100u64 {
            let t = i * 10;
            g.push(t, ((t % 300).min(128) as f64) * 2e6);
        }
        assert!(
            g.sustained_rate_per_second().abs() < 5e7,
            "{}",
            g.sustained_rate_per_second()
        );
        // Too few points or too short a span says nothing.
        let mut g = Growth::new(1000);
        for i in 0..3 {
            g.push(i * 10, i as f64 * 1e9);
        }
        assert_eq!(g.sustained_rate_per_second(), 0.0);
    }

    /// Host memory in use as the probes see it: the true use, but MemAvailable only moves when the
    /// kernel folds its per-CPU counts (a step of about 4 MiB every 100 to 400 ms), plus noise from
    /// the rest of the machine.
    fn staircase(rate_mib_s: f64, seconds: f64, burst: bool) -> Vec<(u64, f64)> {
        let mib = 1048576.0;
        let (mut shown, mut out) = (0.0, Vec::new());
        for i in 0..=((seconds * 10.0) as u64) {
            let t = i * 100;
            let secs = t as f64 / 1000.0;
            let truth = if burst {
                // 0.75 s of growth at 4/3 of the rate, 0.25 s of none: the same average.
                let whole = secs.floor();
                let part = (secs - whole).min(0.75);
                (whole * 0.75 + part) * rate_mib_s * 4.0 / 3.0 * mib
            } else {
                secs * rate_mib_s * mib
            };
            if truth - shown >= 4.0 * mib || i % 3 == 0 {
                shown = truth;
            }
            out.push((t, shown + ((i * 7919) % 5) as f64 * 65536.0));
        }
        out
    }

    #[test]
    fn host_growth_follows_steady_and_bursty_use_within_ten_percent() {
        for (rate, burst) in [(20.0, false), (120.0, false), (60.0, true)] {
            let mut g = Growth::stepped(5000, 1000);
            for (i, (t, v)) in staircase(rate, 12.0, burst).into_iter().enumerate() {
                g.push(t, v);
                // After a few seconds, every probe's rate is within 10 % of the truth.
                if t >= 5000 && i % 5 == 0 {
                    let got = g.trend_per_second() / 1048576.0;
                    assert!(
                        (got - rate).abs() <= rate * 0.1,
                        "{rate} MiB/s{}: {got:.1} MiB/s at {t} ms",
                        if burst { " in bursts" } else { "" }
                    );
                    // The trend that predictions use sees steady growth through the steps (bursts
                    // with 250 ms pauses are its business to discount, but never to negate).
                    let sustained = g.sustained_rate_per_second() / 1048576.0;
                    if burst {
                        assert!(sustained >= 0.0, "{sustained:.1} MiB/s at {t} ms");
                    } else {
                        assert!(
                            (sustained - rate).abs() <= rate * 0.25,
                            "{rate} MiB/s sustained: {sustained:.1} MiB/s at {t} ms"
                        );
                    }
                }
            }
        }
    }
}
