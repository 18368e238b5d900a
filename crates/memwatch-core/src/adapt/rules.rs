//! Which rewrite to make: a pure function of the knobs in the file, the pressure on the job and the bounds.
//!
//! - host RAM or the job's own cgroup at warn → DataLoader workers halve (down to the minimum, 1 → 0)
//!   and pin_memory goes off;
//! - GPU memory at warn → micro-batch to its largest divisor ≤ half, accumulation up by the same factor,
//!   so micro × accumulation (× world size) stays exactly the same;
//! - opt-in: after a long time with lots of room, the reverse (micro-batch doubles, accumulation halves).
//!
//! Never past the bounds; nothing that needs a restart.

use std::collections::BTreeMap;

use crate::config::Adapt;
use crate::rewrite::Scalar;
use crate::rewrite::profile::Knob;

/// The pressure on one job.
#[derive(Debug, Clone, PartialEq)]
pub struct Signals {
    /// Host RAM or the job's memory cgroup at warn or worse (or the job paused for memory), as the
    /// rewrite's reason cites it: the resource, its level and its number.
    pub ram: Option<String>,
    /// A GPU the job uses at warn or worse, cited the same way.
    pub gpu: Option<String>,
    /// How long every resource of the job has had lots of room (ms), if it has.
    pub roomy_for_ms: Option<u64>,
}

/// One proposed rewrite: (knob, old, new) for each knob, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    /// (knob, old, new) for each knob to change.
    pub changes: Vec<(Knob, Scalar, Scalar)>,
    /// Why, for people.
    pub reason: String,
}

fn u(knobs: &BTreeMap<Knob, Scalar>, k: Knob) -> Option<u64> {
    knobs.get(&k).and_then(Scalar::as_u64)
}

fn int(v: u64) -> Scalar {
    Scalar::Int(i64::try_from(v).unwrap_or(i64::MAX))
}

/// The change the rules propose for a job's knobs under these signals, if any (never one that
/// changes the effective batch).
pub fn propose(knobs: &BTreeMap<Knob, Scalar>, s: Signals, cfg: &Adapt) -> Option<Proposal> {
    let mut changes = Vec::new();
    let mut why = Vec::new();
    if let Some(ram) = &s.ram {
        if let Some(w) = u(knobs, Knob::Workers).filter(|w| *w > cfg.min_workers) {
            let new = (w / 2).max(cfg.min_workers);
            changes.push((Knob::Workers, int(w), int(new)));
        }
        if knobs.get(&Knob::PinMemory).and_then(Scalar::as_bool) == Some(true) {
            changes.push((Knob::PinMemory, Scalar::Bool(true), Scalar::Bool(false)));
        }
        if !changes.is_empty() {
            why.push(ram.clone());
        }
    }
    if let Some(gpu) = &s.gpu {
        if let (Some(b), Some(a)) = (u(knobs, Knob::MicroBatch), u(knobs, Knob::Accumulation)) {
            let nb = smaller_divisor(b);
            let na = a * (b / nb.max(1));
            if nb < b && nb >= cfg.min_micro_batch && na <= cfg.max_accumulation {
                changes.push((Knob::MicroBatch, int(b), int(nb)));
                changes.push((Knob::Accumulation, int(a), int(na)));
                why.push(format!("{gpu}: micro-batch {b} → {nb}, accumulation {a} → {na}, effective batch unchanged"));
            }
        }
    } else if cfg.grow
        && s.ram.is_none()
        && s.roomy_for_ms
            .is_some_and(|t| t >= cfg.grow_after_seconds.saturating_mul(1000))
    {
        if let (Some(b), Some(a)) = (u(knobs, Knob::MicroBatch), u(knobs, Knob::Accumulation)) {
            if a >= 2 && a % 2 == 0 && b * 2 <= cfg.max_micro_batch {
                changes.push((Knob::MicroBatch, int(b), int(b * 2)));
                changes.push((Knob::Accumulation, int(a), int(a / 2)));
                why.push(format!(
                    "lots of room for {} s: micro-batch {b} → {}, accumulation {a} → {}",
                    cfg.grow_after_seconds,
                    b * 2,
                    a / 2
                ));
            }
        }
    }
    (!changes.is_empty()).then(|| Proposal {
        changes,
        reason: why.join("; "),
    })
}

/// The largest divisor of `b` that is at most `b / 2` (so micro × accumulation stays exact).
pub fn smaller_divisor(b: u64) -> u64 {
    (1..=b / 2).rev().find(|d| b % d == 0).unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs(pairs: &[(Knob, Scalar)]) -> BTreeMap<Knob, Scalar> {
        pairs.iter().cloned().collect()
    }

    const CALM: Signals = Signals {
        ram: None,
        gpu: None,
        roomy_for_ms: None,
    };

    #[test]
    fn the_reason_cites_the_resource_its_level_and_its_number() {
        let k = knobs(&[
            (Knob::MicroBatch, Scalar::Int(16)),
            (Knob::Accumulation, Scalar::Int(2)),
            (Knob::Workers, Scalar::Int(4)),
        ]);
        let p = propose(
            &k,
            Signals {
                ram: Some("the job's memory cgroup is at warn (86 % used)".into()),
                gpu: Some("GPU 0's memory is at critical (98 % used)".into()),
                ..CALM
            },
            &Adapt::default(),
        )
        .unwrap();
        assert!(
            p.reason
                .contains("the job's memory cgroup is at warn (86 % used)")
                && p.reason
                    .contains("GPU 0's memory is at critical (98 % used): micro-batch 16 → 8"),
            "{}",
            p.reason
        );
    }

    #[test]
    fn table() {
        let cfg = Adapt::default();
        let grow = Adapt {
            grow: true,
            ..Adapt::default()
        };
        let k = knobs(&[
            (Knob::MicroBatch, Scalar::Int(32)),
            (Knob::Accumulation, Scalar::Int(2)),
            (Knob::Workers, Scalar::Int(8)),
            (Knob::PinMemory, Scalar::Bool(true)),
        ]);
        let changes = |p: Option<Proposal>| {
            p.map(|p| {
                p.changes
                    .iter()
                    .map(|(k, o, n)| format!("{k:?} {o}→{n}"))
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(changes(propose(&k, CALM, &cfg)), None);
        assert_eq!(
            changes(propose(
                &k,
                Signals {
                    ram: Some("host RAM is at warn".into()),
                    ..CALM
                },
                &cfg
            )),
            Some(vec!["Workers 8→4".into(), "PinMemory true→false".into()])
        );
        assert_eq!(
            changes(propose(
                &k,
                Signals {
                    gpu: Some("GPU 0's memory is at warn".into()),
                    ..CALM
                },
                &cfg
            )),
            Some(vec!["MicroBatch 32→16".into(), "Accumulation 2→4".into()])
        );
        let odd = knobs(&[
            (Knob::MicroBatch, Scalar::Int(3)),
            (Knob::Accumulation, Scalar::Int(5)),
        ]);
        assert_eq!(
            changes(propose(
                &odd,
                Signals {
                    gpu: Some("GPU 0's memory is at warn".into()),
                    ..CALM
                },
                &cfg
            )),
            Some(vec!["MicroBatch 3→1".into(), "Accumulation 5→15".into()])
        );
        let one = knobs(&[
            (Knob::MicroBatch, Scalar::Int(1)),
            (Knob::Accumulation, Scalar::Int(16)),
            (Knob::Workers, Scalar::Int(1)),
        ]);
        assert_eq!(
            changes(propose(
                &one,
                Signals {
                    gpu: Some("GPU 0's memory is at warn".into()),
                    ..CALM
                },
                &cfg
            )),
            None,
            "not below 1"
        );
        assert_eq!(
            changes(propose(
                &one,
                Signals {
                    ram: Some("host RAM is at warn".into()),
                    ..CALM
                },
                &cfg
            )),
            Some(vec!["Workers 1→0".into()])
        );
        let capped = Adapt {
            max_accumulation: 3,
            ..Adapt::default()
        };
        assert_eq!(
            changes(propose(
                &k,
                Signals {
                    gpu: Some("GPU 0's memory is at warn".into()),
                    ..CALM
                },
                &capped
            )),
            None,
            "bounds hold"
        );
        let roomy = Signals {
            roomy_for_ms: Some(1_800_000),
            ..CALM
        };
        assert_eq!(
            changes(propose(&k, roomy.clone(), &cfg)),
            None,
            "growing is opt-in"
        );
        assert_eq!(
            changes(propose(&k, roomy, &grow)),
            Some(vec!["MicroBatch 32→64".into(), "Accumulation 2→1".into()])
        );
        assert_eq!(
            changes(propose(
                &k,
                Signals {
                    roomy_for_ms: Some(1000),
                    ..CALM
                },
                &grow
            )),
            None,
            "not yet"
        );
    }
}
