//! Config work run off the owner task, and the one read the engine asks for at attach: a job's
//! config file read and rewritten with its owner's rights (`rewrite::write`), each rewrite journaled
//! ahead in the state directory. The tasks and their outcomes are the engine's data
//! (`engine::AdaptTask`, `engine::AdaptDone`).

use std::collections::BTreeMap;
use std::path::Path;

use crate::adapt::rules;
use crate::adapt::{Change, ConfigFileError, Directive, JobConfig};
use crate::rewrite::profile::{Knob, Profile};
use crate::rewrite::{Format, Scalar, write};
use memwatch_core::engine::{AdaptDone, AdaptTask, Intents, JOURNAL, Staged};

/// The journal is rotated (to `journal.jsonl.1`) past this size.
const JOURNAL_MAX_BYTES: u64 = 4 << 20;

/// Validates a job's config file at attach time and reads its knobs.
pub fn open_config(
    file: &Path,
    profile: &str,
    keys: &[String],
    owner: u32,
    within: Option<u32>,
) -> Result<JobConfig, ConfigFileError> {
    if !file.is_absolute() {
        return Err(ConfigFileError::NotAbsolute(file.to_owned()));
    }
    let file = file.to_owned();
    let format = Format::of(&file).ok_or_else(|| ConfigFileError::UnknownFormat(file.clone()))?;
    let profile = Profile::build(profile, keys)?;
    let knobs = read_knobs(&file, format, &profile, write::Owner::of(owner, within))?;
    if knobs.is_empty() {
        return Err(ConfigFileError::NoKnobs {
            keys: profile
                .keys
                .iter()
                .map(|(_, p)| p.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            path: file,
        });
    }
    Ok(JobConfig {
        file,
        within,
        format,
        profile,
        token: crate::adapt::new_token()?,
        generation: 0,
        directives: Vec::new(),
        progress: None,
        knobs,
        roomy_since_ms: None,
        last_error: None,
        unconfirmed: None,
        checkpoint: None,
        polled_at_ms: None,
        self_attached: false,
        oom_stage: None,
    })
}

fn read_knobs(
    file: &Path,
    format: Format,
    profile: &Profile,
    owner: write::Owner,
) -> Result<BTreeMap<Knob, Scalar>, write::RewriteError> {
    let paths: Vec<&str> = profile.keys.iter().map(|(_, p)| p.as_str()).collect();
    let values = write::read_values(file, format, owner, &paths)?;
    Ok(profile
        .keys
        .iter()
        .zip(values)
        .filter_map(|((k, _), v)| Some((*k, v?)))
        .collect())
}

/// Reads the job's config, proposes a change, and rewrites the file (with the owner's rights) and
/// journals it. Blocking: runs on the blocking pool, never on the owner task.
pub fn run_adapt_task(t: AdaptTask) -> AdaptDone {
    let done = |knobs, staged| AdaptDone {
        job: t.job.clone(),
        knobs,
        roomy_since: t.roomy_since,
        staged,
        oom: t.oom.clone().map(Box::new),
    };
    let knobs = match read_knobs(
        &t.file,
        t.format,
        &t.profile,
        write::Owner::of(t.owner, t.within),
    ) {
        Ok(k) => k,
        Err(e) => return done(Err(e), Staged::Nothing),
    };
    if let Some(d) = t.unconfirmed.clone() {
        let landed = d
            .changes
            .iter()
            .all(|ch| knobs.get(&ch.knob) == Some(&ch.new));
        let staged = if landed {
            Staged::Recovered(d)
        } else {
            Staged::NeverWritten(d.generation)
        };
        return done(Ok(knobs), staged);
    }
    // What a trainer recovered at after a CUDA OOM: written past the hold, as applied already.
    if let Some(oom) = &t.oom {
        let Some(d) = oom.directive(
            &knobs,
            |k| t.profile.path(k).map(str::to_owned),
            t.generation,
        ) else {
            return done(Ok(knobs), Staged::Nothing);
        };
        if t.dry_run {
            let what = format!("would change {}: {}", t.file.display(), d.reason);
            return done(Ok(knobs), Staged::WouldChange(what));
        }
        return write_directive(&t, knobs, d, done);
    }
    let proposal = if t.hold {
        None
    } else {
        rules::propose(&knobs, t.signals.clone(), &t.adapt)
    };
    let Some(p) = proposal else {
        return done(Ok(knobs), Staged::Nothing);
    };
    let changes: Vec<Change> = p
        .changes
        .iter()
        .filter_map(|(k, old, new)| {
            Some(Change {
                knob: *k,
                path: t.profile.path(*k)?.to_owned(),
                old: old.clone(),
                new: new.clone(),
            })
        })
        .collect();
    if t.dry_run {
        let what = format!("would change {}: {}", t.file.display(), p.reason);
        return done(Ok(knobs), Staged::WouldChange(what));
    }
    let d = Directive {
        generation: t.generation,
        changes,
        reason: p.reason,
        staged_at_ms: 0,
        applied_epoch: None,
        applied_at_ms: None,
        declined: None,
        verification: None,
        urgent: false,
        staged_processes: None,
    };
    write_directive(&t, knobs, d, done)
}

/// Journals `d` ahead, rewrites the file with its new values (with the owner's rights), and journals
/// it as written.
fn write_directive(
    t: &AdaptTask,
    knobs: BTreeMap<Knob, Scalar>,
    d: Directive,
    done: impl Fn(Result<BTreeMap<Knob, Scalar>, write::RewriteError>, Staged) -> AdaptDone,
) -> AdaptDone {
    let edits: Vec<(String, Scalar)> = d
        .changes
        .iter()
        .map(|ch| (ch.path.clone(), ch.new.clone()))
        .collect();
    // Write-ahead: the intent is durable before the file changes, so a daemon killed between the
    // rename and its next state save comes back knowing which rewrite may have landed.
    let intent = serde_json::json!({ "job": t.job, "file": t.file, "intent": d });
    if let Err(e) = journal(&t.journal, &intent) {
        return done(
            Ok(knobs),
            Staged::Refused(format!("cannot journal the change first: {e}")),
        );
    }
    match write::rewrite(
        &t.file,
        t.format,
        write::Owner::of(t.owner, t.within),
        &edits,
    ) {
        Ok(_) => {
            let written = serde_json::json!({ "job": t.job, "directive": d });
            if let Err(e) = journal(&t.journal, &written) {
                tracing::warn!(path = %t.journal.display(), error = %e, "cannot write the journal of changes");
            }
            done(Ok(knobs), Staged::Written(d))
        }
        Err(e) => done(Ok(knobs), Staged::Refused(e.to_string())),
    }
}

/// The rewrites the journal in `state_dir` (and its rotated predecessor) shows memwatch was about to
/// make, oldest first. Read once at start.
pub fn read_intents(state_dir: &Path) -> Intents {
    let path = state_dir.join(JOURNAL);
    let texts: Vec<String> = [path.with_extension("jsonl.1"), path]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .collect();
    Intents::of_lines(texts.iter().flat_map(|t| t.lines()))
}

/// Appends a record to the journal of changes (fsync'd), rotating it when it grows past its bound.
fn journal(path: &Path, line: &serde_json::Value) -> std::io::Result<()> {
    use std::io::Write;
    if std::fs::metadata(path).is_ok_and(|m| m.len() > JOURNAL_MAX_BYTES) {
        let _ = std::fs::rename(path, path.with_extension("jsonl.1"));
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| {
            writeln!(f, "{line}")?;
            f.sync_all()
        })
}
