//! Whether a stop is a restart: asked of systemd when the daemon is stopping. `systemctl restart
//! memwatch` (and a package upgrade, whose maintainer script restarts the service) stops the daemon
//! with SIGTERM exactly as `systemctl stop` does; only the job systemd is running for the unit tells
//! them apart (its `JobType` is `restart` until the stop half is done). On a restart the daemon keeps
//! the pauses the policy holds for its successor instead of resuming them, which would hand a job
//! held at its memory limit to the OOM killer in the second before the new daemon starts.
//!
//! Asked with `busctl` (systemd's own client, there wherever systemd is; no D-Bus library), bounded
//! by a timeout. Any failure (not a systemd service, no bus, a manager that does not answer) counts
//! as a plain stop, which resumes everything: the behaviour of a stop without this check.

use std::time::Duration;

/// Why systemd's answer about this unit's job could not be had.
#[derive(Debug, thiserror::Error)]
enum AskError {
    /// busctl could not be run, failed, or did not answer in time (and was killed).
    #[error(transparent)]
    Busctl(#[from] crate::command::RunError),
    /// busctl's output is not JSON.
    #[error("busctl {call}: {source}")]
    Json {
        /// Its arguments.
        call: String,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// A reply without the value asked for.
    #[error("{asked}: no {what} in {reply}")]
    Missing {
        /// What was asked (a call with its pid, a unit or a job's object path).
        asked: String,
        /// The value that is missing.
        what: &'static str,
        /// The reply.
        reply: serde_json::Value,
    },
}

/// How long each question to systemd may take.
const ASK: Duration = Duration::from_secs(2);

/// Whether systemd is restarting the unit this daemon runs in, as far as it says.
pub fn restart_pending() -> bool {
    // Set by systemd for every service it runs; a daemon run by hand is never restarted.
    if std::env::var_os("INVOCATION_ID").is_none() {
        return false;
    }
    match job_type() {
        Ok(t) => {
            tracing::info!(job = %t, "the service manager's job for this unit");
            matches!(t.as_str(), "restart" | "try-restart" | "reload-or-restart")
        }
        Err(e) => {
            tracing::info!(error = %e, "cannot tell a restart from a stop; stopping as for a stop");
            false
        }
    }
}

/// The type of the job systemd runs for this process's unit ("stop", "restart", …).
fn job_type() -> Result<String, AskError> {
    let pid = std::process::id().to_string();
    let unit = busctl(&[
        "call",
        "org.freedesktop.systemd1",
        "/org/freedesktop/systemd1",
        "org.freedesktop.systemd1.Manager",
        "GetUnitByPID",
        "u",
        &pid,
    ])?;
    let unit = first_data(&unit)
        .and_then(|v| v.as_str().map(str::to_owned))
        .ok_or_else(|| AskError::Missing {
            asked: format!("GetUnitByPID {pid}"),
            what: "unit path",
            reply: unit.clone(),
        })?;
    let job = busctl(&[
        "get-property",
        "org.freedesktop.systemd1",
        &unit,
        "org.freedesktop.systemd1.Unit",
        "Job",
    ])?;
    let path = job_path(&job).ok_or_else(|| AskError::Missing {
        asked: unit.clone(),
        what: "job",
        reply: job.clone(),
    })?;
    let kind = busctl(&[
        "get-property",
        "org.freedesktop.systemd1",
        &path,
        "org.freedesktop.systemd1.Job",
        "JobType",
    ])?;
    first_data(&kind)
        .and_then(|v| v.as_str().map(str::to_owned))
        .ok_or_else(|| AskError::Missing {
            asked: path.clone(),
            what: "JobType",
            reply: kind.clone(),
        })
}

/// `busctl --system -j ARGS…`, its output parsed as JSON.
fn busctl(args: &[&str]) -> Result<serde_json::Value, AskError> {
    let all: Vec<&str> = ["--system", "--json=short", "--timeout=2"]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let out = crate::command::run("busctl", &all, ASK + Duration::from_secs(1))?;
    serde_json::from_str(&out).map_err(|source| AskError::Json {
        call: args.join(" "),
        source,
    })
}

/// A reply's first value: `{"data": [v, …]}` for a call, `{"data": v}` for a property.
fn first_data(v: &serde_json::Value) -> Option<&serde_json::Value> {
    match v.get("data")? {
        serde_json::Value::Array(a) => a.first(),
        other => Some(other),
    }
}

/// The job's object path from a unit's `Job` property, `(uo)`: none when its id is 0.
fn job_path(v: &serde_json::Value) -> Option<String> {
    let pair = v.get("data")?.as_array()?;
    let id = pair.first()?.as_u64()?;
    let path = pair.get(1)?.as_str()?;
    (id != 0).then(|| path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_busctls_json_replies() {
        let unit: serde_json::Value = serde_json::from_str(
            r#"{"type":"o","data":["/org/freedesktop/systemd1/unit/memwatch_2eservice"]}"#,
        )
        .unwrap();
        assert_eq!(
            first_data(&unit).and_then(|v| v.as_str()),
            Some("/org/freedesktop/systemd1/unit/memwatch_2eservice")
        );
        let job: serde_json::Value = serde_json::from_str(
            r#"{"type":"(uo)","data":[412,"/org/freedesktop/systemd1/job/412"]}"#,
        )
        .unwrap();
        assert_eq!(
            job_path(&job).as_deref(),
            Some("/org/freedesktop/systemd1/job/412")
        );
        let none: serde_json::Value =
            serde_json::from_str(r#"{"type":"(uo)","data":[0,"/"]}"#).unwrap();
        assert_eq!(job_path(&none), None);
        let kind: serde_json::Value =
            serde_json::from_str(r#"{"type":"s","data":"restart"}"#).unwrap();
        assert_eq!(first_data(&kind).and_then(|v| v.as_str()), Some("restart"));
        assert_eq!(job_path(&kind), None);
    }
}
