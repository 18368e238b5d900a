//! Adapting a job to the machine: its training config, rewritten between epochs.
//!
//! A change is staged with a generation number: the file is rewritten (the durable record) and the
//! directive is queued. The trainer, at its next epoch boundary, re-reads its config or asks for
//! directives since the generation it has, applies them, and acknowledges with the generation and epoch.
//! Only the job's owner may use the trainer endpoints; HTTP callers prove it with the job's token
//! (drawn by memwatch's `adapt::new_token`).

pub mod rules;
mod verify;

pub use verify::{Verification, VerifyState, expectation, running_report};

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::rewrite::profile::{Knob, Profile};
use crate::rewrite::{Format, Scalar};

/// One knob's change within a directive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// Which knob.
    pub knob: Knob,
    /// Its key in the trainer's file (dotted path).
    pub path: String,
    /// The value before.
    pub old: Scalar,
    /// The value after.
    pub new: Scalar,
}

/// A staged change to a job's training config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Directive {
    /// Increases by one with each change staged for the job; the trainer acknowledges by number.
    pub generation: u64,
    /// The knobs it changes.
    pub changes: Vec<Change>,
    /// Why, for people (the level or signal behind it).
    pub reason: String,
    /// When it was staged (engine clock, ms).
    pub staged_at_ms: u64,
    /// Set when the trainer acknowledged it: (epoch, when).
    pub applied_epoch: Option<u64>,
    /// When the trainer acknowledged it (engine clock, ms).
    pub applied_at_ms: Option<u64>,
    /// The trainer answered that it cannot apply this change, and why: the change stays in the file
    /// (for the next start) and no longer holds back later ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declined: Option<String>,
    /// Whether memwatch saw the acknowledged change take effect (only for what it can see).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<Verification>,
    /// Apply at the next step, not the next epoch: the job was paused and was resumed with emergency
    /// room (swap or a lent limit) only to take this change.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub urgent: bool,
    /// The job's process count when the change was staged: what fewer workers are counted from (the
    /// count at the acknowledgement may already be the new one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged_processes: Option<usize>,
}

/// memwatch asks the trainer to save a checkpoint now: the job is about to be stopped cleanly (and,
/// under `memwatch launch`, relaunched from it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointRequest {
    /// When memwatch asked (engine clock, ms).
    pub requested_at_ms: u64,
    /// When the trainer acknowledged that the checkpoint is saved.
    #[serde(default)]
    pub saved_at_ms: Option<u64>,
}

/// What the trainer last reported.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// The epoch the trainer is in.
    pub epoch: u64,
    /// The optimizer step within the run.
    pub step: u64,
    /// The last loss, if it reports one.
    pub loss: Option<f64>,
    /// Throughput, if it reports it.
    pub samples_per_second: Option<f64>,
    /// When the report came (engine clock, ms).
    #[serde(default)]
    pub timestamp_ms: u64,
    /// What the trainer says it runs with now (live DataLoader workers, micro-batch, accumulation,
    /// pin_memory): checked against the acknowledged changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<BTreeMap<Knob, Scalar>>,
}

/// A job's training config as memwatch manages it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobConfig {
    /// The trainer's config file (absolute).
    pub file: PathBuf,
    /// The process whose root the file's path is in, where that is not the daemon's: a job in a
    /// container that attached itself with a path of its own mount namespace. Read and written
    /// through `/proc/PID/root`, the path resolved inside that root (links cannot leave it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<u32>,
    /// Its format (JSON, YAML or TOML), from its extension.
    pub format: Format,
    /// Which key in the file is which knob.
    pub profile: Profile,
    /// The shared secret HTTP callers present as `Authorization: Bearer <token>`.
    #[serde(default)]
    pub token: String,
    /// The newest generation staged.
    pub generation: u64,
    /// The changes staged, newest last.
    pub directives: Vec<Directive>,
    /// What the trainer last reported.
    pub progress: Option<Progress>,
    /// The knobs as last read from the file.
    pub knobs: BTreeMap<Knob, Scalar>,
    /// Since when every resource of the job has had lots of room (ms).
    pub roomy_since_ms: Option<u64>,
    /// The last failure to read or rewrite the file, and when.
    pub last_error: Option<(u64, String)>,
    /// A rewrite the journal says was about to happen when the previous daemon stopped, not yet in
    /// the state: the next config read adopts it if the file shows its new values, else drops it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unconfirmed: Option<Directive>,
    /// A checkpoint memwatch asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointRequest>,
    /// When the trainer last asked for directives: one that asks can take an urgent change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub polled_at_ms: Option<u64>,
    /// The trainer attached itself with its config: it speaks the protocol (before its first poll).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub self_attached: bool,
    /// The micro-batch and accumulation a trainer recovered at after a CUDA OOM, not yet written to
    /// the file: the next config task stages them as applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_stage: Option<OomStage>,
}

/// What a trainer runs with since it recovered from a CUDA OOM, to be written to its config file for
/// the next start. The trainer applied it already: its directive is staged acknowledged at `epoch`
/// and verified by the report itself, past the one-pending-change and `settle_seconds` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomStage {
    /// The micro-batch it runs with now.
    pub micro_batch: u64,
    /// The accumulation it runs with now.
    pub accumulation: u64,
    /// The epoch of the report.
    pub epoch: u64,
    /// When the report came (engine clock, ms).
    pub reported_at_ms: u64,
    /// Why, for people: the directive's reason.
    pub reason: String,
}

impl OomStage {
    /// The directive that writes it, against the knobs the file holds now (`path` says where a knob
    /// is in the file); `None` when the file holds these values already, or lacks a knob.
    pub fn directive(
        &self,
        knobs: &BTreeMap<Knob, Scalar>,
        path: impl Fn(Knob) -> Option<String>,
        generation: u64,
    ) -> Option<Directive> {
        let mut changes = Vec::new();
        for (knob, new) in [
            (Knob::MicroBatch, self.micro_batch),
            (Knob::Accumulation, self.accumulation),
        ] {
            let old = knobs.get(&knob)?;
            let new = Scalar::Int(i64::try_from(new).ok()?);
            if *old != new {
                changes.push(Change {
                    knob,
                    path: path(knob)?,
                    old: old.clone(),
                    new,
                });
            }
        }
        (!changes.is_empty()).then(|| Directive {
            generation,
            changes,
            reason: self.reason.clone(),
            staged_at_ms: 0,
            applied_epoch: Some(self.epoch),
            applied_at_ms: Some(self.reported_at_ms),
            declined: None,
            verification: Some(Verification {
                state: VerifyState::Verified,
                expect: "the trainer reported running with it when it recovered from a CUDA OOM"
                    .into(),
                max_processes: None,
                min_processes: None,
                in_range_since_ms: None,
                since_ms: self.reported_at_ms,
                settled_at_ms: Some(self.reported_at_ms),
            }),
            urgent: false,
            staged_processes: None,
        })
    }
}

impl JobConfig {
    /// Whether the trainer takes directives: it attached itself, or has asked for them.
    pub fn speaks_protocol(&self) -> bool {
        self.self_attached || self.polled_at_ms.is_some()
    }
}

impl JobConfig {
    /// Directives not yet acknowledged.
    pub fn pending(&self) -> impl Iterator<Item = &Directive> {
        self.directives
            .iter()
            .filter(|d| d.applied_epoch.is_none() && d.declined.is_none())
    }

    /// What the API shows (everything but the token).
    pub fn view(&self) -> JobConfigView {
        JobConfigView {
            file: self.file.clone(),
            format: self.format,
            profile: self.profile.name.clone(),
            generation: self.generation,
            applied_generation: self
                .directives
                .iter()
                .filter(|d| d.applied_epoch.is_some())
                .map(|d| d.generation)
                .max()
                .unwrap_or(0),
            knobs: self
                .knobs
                .iter()
                .map(|(k, v)| (k.name().to_owned(), v.clone()))
                .collect(),
            directives: self.directives.clone(),
            progress: self.progress.clone(),
            last_error: self.last_error.as_ref().map(|(_, e)| e.clone()),
            checkpoint: self.checkpoint.clone(),
        }
    }
}

/// A job's config as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobConfigView {
    /// The trainer's config file.
    pub file: PathBuf,
    /// Its format.
    pub format: Format,
    /// The profile's name.
    pub profile: String,
    /// The newest generation staged.
    pub generation: u64,
    /// The newest generation the trainer acknowledged.
    pub applied_generation: u64,
    /// The knobs as last read from the file, by name.
    pub knobs: BTreeMap<String, Scalar>,
    /// The changes staged, newest last.
    pub directives: Vec<Directive>,
    /// What the trainer last reported.
    pub progress: Option<Progress>,
    /// The last failure to read or rewrite the file.
    pub last_error: Option<String>,
    /// A checkpoint memwatch asked for and is waiting on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointRequest>,
}

/// A job token's text: `bytes` in lowercase hex (memwatch's `adapt::new_token` draws them from
/// the kernel's random pool).
pub fn token_text(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `token` can be a token memwatch made: 32 hex digits, not all zero (a zero token is what a
/// broken random source yields; it is never accepted).
pub fn token_is_sound(token: &str) -> bool {
    token.len() == 32
        && token.bytes().all(|b| b.is_ascii_hexdigit())
        && token.bytes().any(|b| b != b'0')
}

/// Compares tokens in time independent of where they differ.
pub fn token_matches(expected: &str, given: &str) -> bool {
    token_is_sound(expected)
        && expected.len() == given.len()
        && expected
            .bytes()
            .zip(given.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The kernel's random pool failed: no job token, rather than a guessable one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot make a job token: getrandom: {0}")]
pub struct TokenError(pub crate::host::Errno);

/// Why a job's config file is not taken on at attach.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// A relative path.
    #[error("{0}: give an absolute path")]
    NotAbsolute(std::path::PathBuf),
    /// An extension memwatch cannot rewrite.
    #[error("{0}: unknown format; use .json, .yaml, .yml or .toml")]
    UnknownFormat(std::path::PathBuf),
    /// The profile or a `--key`.
    #[error(transparent)]
    Profile(#[from] crate::rewrite::ProfileError),
    /// The file cannot be read as the job's user, or does not parse.
    #[error(transparent)]
    Read(#[from] crate::rewrite::file::RewriteError),
    /// The file holds none of the profile's keys.
    #[error("{path}: none of the profile's keys ({keys}) is in the file")]
    NoKnobs {
        /// The file.
        path: std::path::PathBuf,
        /// The profile's dotted keys, joined.
        keys: String,
    },
    /// No token for the job.
    #[error(transparent)]
    Token(#[from] TokenError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_32_hex_digits_and_a_zero_token_never_matches() {
        let a = token_text(&[0xab; 16]);
        let b = token_text(&[0x01; 16]);
        assert_eq!(a, "ab".repeat(16));
        assert!(token_is_sound(&a) && token_is_sound(&b), "{a} {b}");
        assert!(token_matches(&a, &a));
        assert!(!token_matches(&a, &b));
        let zero = token_text(&[0; 16]);
        assert!(!token_matches(&zero, &zero), "a zero token was accepted");
        assert!(!token_matches("", ""));
        assert!(!token_matches("abc", "abc"), "a short token was accepted");
        assert!(!token_is_sound(&"g".repeat(32)));
    }

    #[test]
    fn fewer_workers_must_show_as_fewer_processes() {
        let change = |knob, old: i64, new: i64| Change {
            knob,
            path: "x".into(),
            old: Scalar::Int(old),
            new: Scalar::Int(new),
        };
        let d = Directive {
            generation: 1,
            changes: vec![
                change(Knob::Workers, 4, 2),
                change(Knob::MicroBatch, 32, 16),
            ],
            reason: String::new(),
            staged_at_ms: 0,
            applied_epoch: Some(1),
            applied_at_ms: Some(0),
            declined: None,
            verification: None,
            urgent: false,
            staged_processes: None,
        };
        let mut v = expectation(&d, 5, 1_000).unwrap();
        assert_eq!((v.min_processes, v.max_processes), (Some(2), Some(3)));
        assert!(!v.check(5, 2_000, 30_000), "decided before the window");
        // Between two epochs there are no workers at all: that proves nothing.
        assert!(!v.check(1, 2_500, 30_000));
        assert!(!v.check(1, 4_000, 30_000));
        // The new workers run: in range, but only once it has lasted.
        assert!(!v.check(3, 4_100, 30_000));
        assert!(!v.check(5, 4_600, 30_000), "the old count came back");
        assert!(!v.check(3, 5_000, 30_000));
        assert!(v.check(3, 6_000, 30_000));
        assert_eq!(
            (v.state, v.settled_at_ms),
            (VerifyState::Verified, Some(6_000))
        );
        assert!(
            !v.check(5, 90_000, 30_000),
            "a settled verdict never changes"
        );
        let mut v = expectation(&d, 5, 1_000).unwrap();
        assert!(v.check(5, 31_000, 30_000));
        assert_eq!(v.state, VerifyState::Unverified);
        // Nothing visible to check: more workers, or only the micro-batch.
        let grow = Directive {
            changes: vec![change(Knob::Workers, 2, 4)],
            ..d.clone()
        };
        assert!(expectation(&grow, 3, 0).is_none());
        let batch = Directive {
            changes: vec![change(Knob::MicroBatch, 32, 16)],
            ..d
        };
        assert!(expectation(&batch, 3, 0).is_none());
    }
}
