//! Events recorded for people rather than for the policy: a running job about to reach a limit, and
//! a collector that stopped working. Both are edge-triggered: recorded once when they begin.

use std::collections::BTreeMap;

use super::Engine;
use crate::audit::Action;
use crate::human::bytes as human_bytes;

/// What people were told of that is not over yet.
#[derive(Debug, Default)]
pub(super) struct Notices {
    /// Jobs told to be near exhaustion, until they are well clear again.
    pub(super) near: NearWatch,
    /// Collectors failing in the latest sample.
    pub(super) failing: std::collections::BTreeSet<String>,
}

/// The jobs told to be near exhaustion. A job is told once; it is told again only after it has been
/// clear (more than twice the notice's horizon from a limit, or not growing toward one) for a whole
/// horizon without a break, so an estimate that wobbles across the line tells nobody twice.
#[derive(Debug, Default)]
pub(super) struct NearWatch {
    /// Jobs told, each with when it was last seen clear without a break since (ms).
    told: BTreeMap<String, Option<u64>>,
}

impl NearWatch {
    /// Takes the job's time to its soonest limit (`None`: not growing toward any) against the
    /// horizon; true when the job is to be told now.
    pub(super) fn update(
        &mut self,
        job: &str,
        seconds_left: Option<f64>,
        horizon_s: f64,
        now_ms: u64,
    ) -> bool {
        let near = seconds_left.is_some_and(|t| t <= horizon_s);
        let clear = seconds_left.is_none_or(|t| t > 2.0 * horizon_s);
        match self.told.get_mut(job) {
            None => {
                if near {
                    self.told.insert(job.to_owned(), None);
                }
                near
            }
            Some(clear_since) => {
                match (clear, *clear_since) {
                    (false, _) => *clear_since = None,
                    (true, None) => *clear_since = Some(now_ms),
                    (true, Some(since)) => {
                        if now_ms.saturating_sub(since) as f64 >= horizon_s * 1000.0 {
                            self.told.remove(job);
                        }
                    }
                }
                false
            }
        }
    }

    /// Forgets the jobs no longer attached.
    pub(super) fn retain(&mut self, attached: impl Fn(&str) -> bool) {
        self.told.retain(|n, _| attached(n));
    }
}

impl Engine {
    /// Records `near_exhaustion` (its reason the resource whose limit it is: `job_cgroup`,
    /// `host_memory`, `gpu_memory`) for a running job whose sustained growth reaches a limit within
    /// `notify.near_exhaustion_seconds`, once, until it has stayed more than twice that far for that
    /// long again ([`NearWatch`]); and
    /// `collector_down` / `collector_up` when a collector starts or stops failing.
    pub(super) fn watch_for_notices(&mut self, now_ms: u64) {
        let near_s = self.cfg.near_exhaustion_seconds as f64;
        let mut found = Vec::new();
        for j in self.jobs.values().filter(|j| j.pause.is_none()) {
            let soonest = self
                .limits_on(j, true)
                .into_iter()
                .filter_map(|(r, l)| Some((l.time_to_exhaustion_seconds?, r, l)))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            found.push((j.name.clone(), soonest));
        }
        for (name, soonest) in found {
            let seconds_left = soonest.as_ref().map(|(t, _, _)| *t);
            if !self
                .notices
                .near
                .update(&name, seconds_left, near_s, now_ms)
            {
                continue;
            }
            if let Some((t, resource, l)) = soonest {
                let detail = format!(
                    "{}: {} left, growing {}/s: full in {:.0} s",
                    l.limit,
                    human_bytes(l.headroom_bytes),
                    human_bytes(l.growth_bytes_per_second.max(0.0) as u64),
                    t
                );
                self.record(
                    now_ms,
                    Action::NearExhaustion,
                    &name,
                    (&resource).into(),
                    detail,
                    false,
                );
            }
        }
        let jobs = &self.jobs;
        self.notices.near.retain(|n| jobs.contains_key(n));
        let Some(sample) = self.readings.latest.clone() else {
            return;
        };
        for c in &sample.collectors {
            let Some(collector) = crate::sample::Collector::by_name(&c.name) else {
                continue;
            };
            let was = self.notices.failing.contains(&c.name);
            if !c.success && !was {
                self.notices.failing.insert(c.name.clone());
                let detail = format!(
                    "the {} collector failed ({} failures since the daemon started); see the daemon's log",
                    c.name, c.errors_total
                );
                self.record(
                    now_ms,
                    Action::CollectorDown,
                    "",
                    collector.into(),
                    detail,
                    false,
                );
            } else if c.success && was {
                self.notices.failing.remove(&c.name);
                let detail = format!("the {} collector works again", c.name);
                self.record(
                    now_ms,
                    Action::CollectorUp,
                    "",
                    collector.into(),
                    detail,
                    false,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::NearWatch;

    /// Seconds to the limit, one sample a second, against a 120 s horizon.
    fn told(series: &[Option<f64>]) -> Vec<u64> {
        let mut w = NearWatch::default();
        series
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                w.update("j", *t, 120.0, i as u64 * 1000)
                    .then_some(i as u64)
            })
            .collect()
    }

    #[test]
    fn a_wobbling_estimate_tells_once() {
        // Near, then the growth estimate drops out and comes back every few samples for a minute.
        let mut s = Vec::new();
        for i in 0..60 {
            s.push(if i % 4 == 3 { None } else { Some(50.0) });
        }
        assert_eq!(told(&s), vec![0]);
        // Between the horizon and twice it: still the same approach.
        assert_eq!(told(&[Some(100.0), Some(200.0), Some(100.0)]), vec![0]);
    }

    #[test]
    fn a_job_clear_for_a_whole_horizon_is_told_again() {
        let mut s = vec![Some(50.0)];
        s.extend(std::iter::repeat_n(Some(1000.0), 121));
        s.push(Some(50.0));
        assert_eq!(told(&s), vec![0, 122]);
        // Clear for less than the horizon, with a break: not again.
        let mut s = vec![Some(50.0)];
        s.extend(std::iter::repeat_n(None, 100));
        s.push(Some(150.0));
        s.extend(std::iter::repeat_n(None, 100));
        s.push(Some(50.0));
        assert_eq!(told(&s), vec![0]);
    }

    #[test]
    fn far_or_flat_jobs_are_never_told() {
        assert!(told(&[None, Some(121.0), Some(10_000.0)]).is_empty());
    }
}
