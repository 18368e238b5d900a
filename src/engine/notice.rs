//! Events recorded for people rather than for the policy: a running job about to reach a limit, and
//! a collector that stopped working. Both are edge-triggered: recorded once when they begin.

use super::Engine;
use crate::act::audit::Action;
use crate::human::bytes as human_bytes;

impl Engine {
    /// Records `near_exhaustion` for a running job whose sustained growth reaches a limit within
    /// `notify.near_exhaustion_seconds`, once, until it is more than twice that far again; and
    /// `collector_down` / `collector_up` when a collector starts or stops failing.
    pub(super) fn watch_for_notices(&mut self, now_ms: u64) {
        let near_s = self.cfg.notify.near_exhaustion_seconds as f64;
        let mut found = Vec::new();
        for j in self.jobs.values().filter(|j| j.pause.is_none()) {
            let soonest = self
                .limits_with(j, true)
                .into_iter()
                .filter_map(|l| Some((l.time_to_exhaustion_seconds?, l)))
                .min_by(|a, b| a.0.total_cmp(&b.0));
            found.push((j.name.clone(), soonest));
        }
        for (name, soonest) in found {
            match soonest {
                Some((t, l)) if t <= near_s && !self.near.contains(&name) => {
                    self.near.insert(name.clone());
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
                        &l.limit,
                        detail,
                        false,
                    );
                }
                Some((t, _)) if t <= 2.0 * near_s => {}
                _ => {
                    self.near.remove(&name);
                }
            }
        }
        self.near.retain(|n| self.jobs.contains_key(n));
        let Some(sample) = self.latest.clone() else {
            return;
        };
        for c in &sample.collectors {
            let was = self.failing.contains(&c.name);
            if !c.success && !was {
                self.failing.insert(c.name.clone());
                let detail = format!(
                    "the {} collector failed ({} failures since the daemon started); see the daemon's log",
                    c.name, c.errors_total
                );
                self.record(now_ms, Action::CollectorDown, "", &c.name, detail, false);
            } else if c.success && was {
                self.failing.remove(&c.name);
                let detail = format!("the {} collector works again", c.name);
                self.record(now_ms, Action::CollectorUp, "", &c.name, detail, false);
            }
        }
    }
}
