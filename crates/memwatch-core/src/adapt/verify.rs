//! Verify, don't trust: after an acknowledgement memwatch looks for the change itself — fewer DataLoader
//! workers as fewer processes, and whatever the trainer reports it runs with (`progress.running`) — and
//! marks the directive verified or unverified.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Directive;
use crate::rewrite::Scalar;
use crate::rewrite::profile::Knob;

/// What memwatch looks for after an acknowledgement, and what it found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verification {
    /// Where the check stands.
    pub state: VerifyState,
    /// What memwatch looks for, for people.
    pub expect: String,
    /// The job's process count must fall to at most this; absent when the evidence is the trainer's
    /// report of what it runs with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_processes: Option<usize>,
    /// ... and stay at least this (the new workers run): between epochs a DataLoader without
    /// persistent workers has none at all, which proves nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_processes: Option<usize>,
    /// Since when the count has been in range: it must stay there `HOLD_MS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_range_since_ms: Option<u64>,
    /// When the acknowledgement came (engine clock, ms).
    pub since_ms: u64,
    /// When it was verified or given up on.
    pub settled_at_ms: Option<u64>,
}

/// Whether an acknowledged change was seen to take effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VerifyState {
    /// Still being watched (within `adapt.verify_seconds`).
    Pending,
    /// Seen: the job's processes or its report match the change.
    Verified,
    /// Not seen within the time allowed: the trainer said it applied a change it did not.
    Unverified,
}

/// How long the process count must stay in range: a count taken while new workers are being started,
/// or in the gap between two epochs' workers, is not evidence.
pub const HOLD_MS: u64 = 1000;

/// What to look for once `d` is acknowledged, for a job of `processes` processes now: fewer DataLoader
/// workers must show as fewer processes, with the new workers running, for `HOLD_MS`. `None` when nothing in `d` is visible from outside (a
/// micro-batch change shows in GPU memory only when the trainer empties PyTorch's cache); the
/// trainer's report may then verify it (`running_report`).
pub fn expectation(d: &Directive, processes: usize, now_ms: u64) -> Option<Verification> {
    let ch = d.changes.iter().find(|c| c.knob == Knob::Workers)?;
    let (old, new) = (ch.old.as_u64()?, ch.new.as_u64()?);
    let fewer = usize::try_from(old.checked_sub(new).filter(|n| *n > 0)?).ok()?;
    // The usual count when the change was staged; the count now may already be the new one.
    let processes = d.staged_processes.unwrap_or(processes);
    let max_processes = processes.saturating_sub(fewer);
    let min_processes = max_processes.saturating_sub(usize::try_from(new).ok()?.saturating_sub(1));
    let range = if min_processes == max_processes {
        format!("{max_processes}")
    } else {
        format!("{min_processes} to {max_processes}")
    };
    Some(Verification {
        state: VerifyState::Pending,
        expect: format!(
            "DataLoader workers {old} → {new}: the job's processes go from {processes} to {range}, for {} s",
            HOLD_MS as f64 / 1000.0
        ),
        max_processes: Some(max_processes),
        min_processes: Some(min_processes),
        in_range_since_ms: None,
        since_ms: now_ms,
        settled_at_ms: None,
    })
}

impl Verification {
    /// Looks at the job's process count now: verified once it has fallen far enough, unverified once
    /// `window_ms` passed without that (or, for a report, without a report that agrees). `true`
    /// when the state changed.
    pub fn check(&mut self, processes: usize, now_ms: u64, window_ms: u64) -> bool {
        if self.state != VerifyState::Pending {
            return false;
        }
        let in_range = self.max_processes.is_some_and(|max| processes <= max)
            && self.min_processes.is_none_or(|min| processes >= min);
        if !in_range {
            self.in_range_since_ms = None;
        } else if self.in_range_since_ms.is_none() {
            self.in_range_since_ms = Some(now_ms);
        }
        if self
            .in_range_since_ms
            .is_some_and(|since| now_ms.saturating_sub(since) >= HOLD_MS)
        {
            self.state = VerifyState::Verified;
        } else if now_ms.saturating_sub(self.since_ms) >= window_ms {
            self.state = VerifyState::Unverified;
        } else {
            return false;
        }
        self.settled_at_ms = Some(now_ms);
        true
    }
}

/// Checks the trainer's report of what it runs with against the acknowledged directives that have no
/// outside evidence (no process count to watch): each is judged on the knobs it changed that the
/// report names and that no later acknowledged directive changed again. A report that agrees verifies
/// it; one that does not leaves it pending (the trainer may be between the ack and its next step),
/// and `Verification::check` gives up on it after the window. Returns the generations whose state
/// changed.
pub fn running_report(
    directives: &mut [Directive],
    running: &BTreeMap<Knob, Scalar>,
    now_ms: u64,
) -> Vec<u64> {
    let acked: Vec<usize> = (0..directives.len())
        .filter(|&i| directives[i].applied_epoch.is_some() && directives[i].declined.is_none())
        .collect();
    let mut changed = Vec::new();
    for (n, &i) in acked.iter().enumerate() {
        let later = &acked[n + 1..];
        let judged: Vec<(Knob, Scalar, Scalar)> = directives[i]
            .changes
            .iter()
            .filter(|c| {
                !later
                    .iter()
                    .any(|&l| directives[l].changes.iter().any(|lc| lc.knob == c.knob))
            })
            .filter_map(|c| Some((c.knob, c.new.clone(), running.get(&c.knob)?.clone())))
            .collect();
        if judged.is_empty() {
            continue;
        }
        let d = &mut directives[i];
        if d.verification
            .as_ref()
            .is_some_and(|v| v.max_processes.is_some() || v.state != VerifyState::Pending)
        {
            continue;
        }
        let agrees = judged.iter().all(|(_, want, got)| same(want, got));
        let expect = judged
            .iter()
            .map(|(k, want, got)| format!("{} {want} (reported {got})", k.name()))
            .collect::<Vec<_>>()
            .join(", ");
        let v = d.verification.get_or_insert_with(|| Verification {
            state: VerifyState::Pending,
            expect: String::new(),
            max_processes: None,
            min_processes: None,
            in_range_since_ms: None,
            since_ms: d.applied_at_ms.unwrap_or(now_ms),
            settled_at_ms: None,
        });
        v.expect = format!("the trainer runs with {expect}");
        if agrees {
            v.state = VerifyState::Verified;
            v.settled_at_ms = Some(now_ms);
            changed.push(d.generation);
        }
    }
    changed
}

/// Numbers compare by value (a report may send 8 or 8.0); the rest exactly.
fn same(a: &Scalar, b: &Scalar) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapt::Change;

    fn directive(generation: u64, changes: &[(Knob, i64, i64)]) -> Directive {
        Directive {
            generation,
            changes: changes
                .iter()
                .map(|(k, o, n)| Change {
                    knob: *k,
                    path: k.name().into(),
                    old: Scalar::Int(*o),
                    new: Scalar::Int(*n),
                })
                .collect(),
            reason: "test".into(),
            staged_at_ms: 0,
            applied_epoch: Some(1),
            applied_at_ms: Some(100),
            declined: None,
            verification: None,
            urgent: false,
            staged_processes: None,
        }
    }

    fn report(pairs: &[(Knob, i64)]) -> BTreeMap<Knob, Scalar> {
        pairs.iter().map(|(k, v)| (*k, Scalar::Int(*v))).collect()
    }

    #[test]
    fn a_report_that_agrees_verifies_and_one_that_does_not_times_out() {
        let mut ds = vec![directive(
            1,
            &[(Knob::MicroBatch, 16, 8), (Knob::Accumulation, 2, 4)],
        )];
        let wrong = report(&[(Knob::MicroBatch, 16), (Knob::Accumulation, 2)]);
        assert!(running_report(&mut ds, &wrong, 200).is_empty());
        let v = ds[0].verification.clone().unwrap();
        assert_eq!(v.state, VerifyState::Pending);
        assert!(
            v.expect.contains("micro_batch 8 (reported 16)"),
            "{}",
            v.expect
        );
        let mut timed_out = ds.clone();
        assert!(
            timed_out[0]
                .verification
                .as_mut()
                .unwrap()
                .check(9, 100 + 30_000, 30_000)
        );
        assert_eq!(
            timed_out[0].verification.as_ref().unwrap().state,
            VerifyState::Unverified
        );

        let right = report(&[(Knob::MicroBatch, 8), (Knob::Accumulation, 4)]);
        assert_eq!(running_report(&mut ds, &right, 300), vec![1]);
        assert_eq!(
            ds[0].verification.as_ref().unwrap().state,
            VerifyState::Verified
        );
    }

    #[test]
    fn only_the_latest_change_of_a_knob_is_judged_and_process_counts_win() {
        let mut ds = vec![
            directive(1, &[(Knob::MicroBatch, 16, 8)]),
            directive(2, &[(Knob::MicroBatch, 8, 4)]),
            directive(3, &[(Knob::Workers, 4, 2)]),
        ];
        ds[2].verification = expectation(&ds[2], 6, 100);
        let now = report(&[(Knob::MicroBatch, 4), (Knob::Workers, 4)]);
        assert_eq!(running_report(&mut ds, &now, 200), vec![2]);
        assert!(ds[0].verification.is_none(), "superseded by generation 2");
        let workers = ds[2].verification.as_ref().unwrap();
        assert_eq!(
            workers.state,
            VerifyState::Pending,
            "the process count decides"
        );
        assert_eq!(workers.max_processes, Some(4));
    }

    #[test]
    fn unacknowledged_or_unreported_changes_are_left_alone() {
        let mut ds = vec![directive(1, &[(Knob::MicroBatch, 16, 8)])];
        ds[0].applied_epoch = None;
        assert!(running_report(&mut ds, &report(&[(Knob::MicroBatch, 8)]), 1).is_empty());
        ds[0].applied_epoch = Some(1);
        assert!(running_report(&mut ds, &report(&[(Knob::Workers, 2)]), 1).is_empty());
        assert!(ds[0].verification.is_none());
    }
}
