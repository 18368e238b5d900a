//! Adapting a job to the machine: its training config, rewritten between epochs.
//!
//! A change is staged with a generation number: the file is rewritten (the durable record) and the
//! directive is queued. The trainer, at its next epoch boundary, re-reads its config or asks for
//! directives since the generation it has, applies them, and acknowledges with the generation and epoch.
//! Only the job's owner may use the trainer endpoints; HTTP callers prove it with the job's token.

pub mod rules;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::rewrite::profile::{Knob, Profile};
use crate::rewrite::{Format, Scalar};

/// One knob's change within a directive.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub knob: Knob,
    pub path: String,
    pub old: Scalar,
    pub new: Scalar,
}

/// A staged change to a job's training config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Directive {
    pub generation: u64,
    pub changes: Vec<Change>,
    pub reason: String,
    pub staged_at_ms: u64,
    /// Set when the trainer acknowledged it: (epoch, when).
    pub applied_epoch: Option<u64>,
    pub applied_at_ms: Option<u64>,
}

/// What the trainer last reported.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub epoch: u64,
    pub step: u64,
    pub loss: Option<f64>,
    pub samples_per_second: Option<f64>,
    #[serde(default)]
    pub timestamp_ms: u64,
}

/// A job's training config as memwatch manages it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobConfig {
    pub file: PathBuf,
    pub format: Format,
    pub profile: Profile,
    /// The shared secret HTTP callers present as `Authorization: Bearer <token>`.
    #[serde(default)]
    pub token: String,
    pub generation: u64,
    pub directives: Vec<Directive>,
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
}

impl JobConfig {
    /// Directives not yet acknowledged.
    pub fn pending(&self) -> impl Iterator<Item = &Directive> {
        self.directives.iter().filter(|d| d.applied_epoch.is_none())
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
        }
    }
}

/// A job's config as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobConfigView {
    pub file: PathBuf,
    pub format: Format,
    pub profile: String,
    pub generation: u64,
    pub applied_generation: u64,
    pub knobs: BTreeMap<String, Scalar>,
    pub directives: Vec<Directive>,
    pub progress: Option<Progress>,
    pub last_error: Option<String>,
}

/// A new job token: 128 bits from the kernel's random pool (getrandom(2), which blocks only until the
/// pool is first seeded at boot). Fails rather than hand out a guessable token.
pub fn new_token() -> Result<String, String> {
    let mut buf = [0u8; 16];
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(format!("cannot make a job token: getrandom: {e}")),
        }
    }
    Ok(token_text(&buf))
}

fn token_text(bytes: &[u8]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_a_zero_token_never_matches() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert!(token_is_sound(&a) && token_is_sound(&b), "{a} {b}");
        assert_ne!(a, b);
        assert!(token_matches(&a, &a));
        assert!(!token_matches(&a, &b));
        let zero = "0".repeat(32);
        assert!(!token_matches(&zero, &zero), "a zero token was accepted");
        assert!(!token_matches("", ""));
        assert!(!token_matches("abc", "abc"), "a short token was accepted");
    }
}
