//! Delivering one notice on one channel: the message, the request or command, the retries.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{Notice, Stats};
use crate::config::{Channel, ChannelKind, NoticeKind};

/// (title, text) for people: "gpu-box-01: train paused", then the detail.
pub fn message(n: &Notice) -> (String, String) {
    let what = match n.kind {
        NoticeKind::Pause => "paused",
        NoticeKind::Resume => "resumed",
        NoticeKind::Stop => "stopped by memwatch",
        NoticeKind::Restart => "relaunched",
        NoticeKind::Staged => "config change staged",
        NoticeKind::Applied => "config change applied",
        NoticeKind::Unverified => "config change UNVERIFIED",
        NoticeKind::NearExhaustion => "close to running out of memory",
        NoticeKind::CollectorDown => "collector down",
    };
    let subject = if n.job.is_empty() {
        String::new()
    } else {
        format!(" {}", n.job)
    };
    let dry = if n.dry_run { " (dry run)" } else { "" };
    let title = format!("{}:{subject} {what}{dry}", n.host);
    let mut text = n.detail.clone();
    if n.held_back > 0 {
        text.push_str(&format!(
            " ({} more like this held back since the last notification)",
            n.held_back
        ));
    }
    (title, text)
}

/// Why a try failed, without the URL or token: whether another try may help.
struct Failure {
    why: String,
    retry: bool,
}

/// Delivers each notice the dispatcher hands over, in order, with retries. One HTTP agent per
/// channel (its TLS set-up and connection pool serve every try).
pub async fn worker(c: Channel, mut rx: mpsc::Receiver<Notice>, stats: Arc<Stats>) {
    let agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(c.timeout_seconds)))
        .http_status_as_error(false)
        .user_agent(concat!("memwatch/", env!("CARGO_PKG_VERSION")))
        .build()
        .new_agent();
    while let Some(n) = rx.recv().await {
        let mut attempt = 0u32;
        loop {
            match once(&c, &agent, &n).await {
                Ok(()) => {
                    stats.add(&c.name, "sent");
                    tracing::info!(channel = %c.name, event = n.kind.as_str(), job = %n.job, "notified");
                    break;
                }
                Err(f) if f.retry && attempt < c.retries => {
                    stats.add(&c.name, "retried");
                    let wait = c.retry_base_ms.saturating_mul(1 << attempt.min(16));
                    tracing::warn!(channel = %c.name, why = %f.why, retry_in_ms = wait, "notification failed; retrying");
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                    attempt += 1;
                }
                Err(f) => {
                    stats.add(&c.name, "failed");
                    tracing::error!(channel = %c.name, why = %f.why, event = n.kind.as_str(), "notification not delivered");
                    break;
                }
            }
        }
    }
}

async fn once(c: &Channel, agent: &ureq::Agent, n: &Notice) -> Result<(), Failure> {
    match c.kind {
        ChannelKind::Command => command(c, n, Duration::from_secs(c.timeout_seconds)).await,
        _ => {
            let (c, agent, n) = (c.clone(), agent.clone(), n.clone());
            tokio::task::spawn_blocking(move || http(&c, &agent, &n))
                .await
                .unwrap_or_else(|_| {
                    Err(Failure {
                        why: "the delivery task failed".into(),
                        retry: true,
                    })
                })
        }
    }
}

/// One POST: the event as JSON (webhook), `{"text"}` (Slack, Mattermost), or the message with
/// ntfy's headers.
fn http(c: &Channel, agent: &ureq::Agent, n: &Notice) -> Result<(), Failure> {
    let (title, text) = message(n);
    let mut req = agent.post(c.url.expose());
    if !c.token.expose().is_empty() {
        req = req.header("Authorization", &format!("Bearer {}", c.token.expose()));
    }
    let sent = match c.kind {
        ChannelKind::Slack => {
            req.send_json(serde_json::json!({ "text": format!("*{title}*\n{text}") }))
        }
        ChannelKind::Ntfy => {
            let urgent = matches!(
                n.kind,
                NoticeKind::Pause
                    | NoticeKind::Stop
                    | NoticeKind::NearExhaustion
                    | NoticeKind::Unverified
            );
            req.header("Title", &title)
                .header("Priority", if urgent { "high" } else { "default" })
                .header("Tags", &format!("memwatch,{}", n.kind.as_str()))
                .content_type("text/plain; charset=utf-8")
                .send(text.as_bytes())
        }
        _ => req.send_json(serde_json::json!({
            "version": 1,
            "event": n.kind.as_str(),
            "title": title,
            "message": text,
            "job": n.job,
            "slurm_job_id": n.slurm_job_id,
            "reason": n.reason,
            "detail": n.detail,
            "host": n.host,
            "timestamp_ms": n.timestamp_ms,
            "dry_run": n.dry_run,
            "held_back": n.held_back,
        })),
    };
    match sent {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => {
            let code = r.status().as_u16();
            Err(Failure {
                why: format!("the receiver answered HTTP {code}"),
                // Throttled or broken now: maybe not later. Any other 4xx will not change.
                retry: code == 429 || code == 408 || code >= 500,
            })
        }
        Err(e) => Err(Failure {
            why: describe(&e),
            retry: true,
        }),
    }
}

/// A ureq error in words that carry no URL.
fn describe(e: &ureq::Error) -> String {
    match e {
        ureq::Error::Timeout(_) => "timed out".into(),
        ureq::Error::Io(io) => format!("connection failed ({:?})", io.kind()),
        ureq::Error::HostNotFound => "host not found".into(),
        ureq::Error::ConnectionFailed => "connection failed".into(),
        ureq::Error::Tls(_) | ureq::Error::Rustls(_) => "TLS failed".into(),
        _ => "request failed".into(),
    }
}

/// Runs the channel's command with the event in its environment; exit 0 is delivered.
async fn command(c: &Channel, n: &Notice, timeout: Duration) -> Result<(), Failure> {
    let (title, text) = message(n);
    let Some((program, args)) = c.command.split_first() else {
        return Err(Failure {
            why: "no command".into(),
            retry: false,
        });
    };
    let child = tokio::process::Command::new(program)
        .args(args)
        .env("MEMWATCH_EVENT", n.kind.as_str())
        .env("MEMWATCH_JOB", &n.job)
        .env(
            "MEMWATCH_SLURM_JOB_ID",
            n.slurm_job_id.as_deref().unwrap_or(""),
        )
        .env("MEMWATCH_REASON", n.reason.as_str())
        .env("MEMWATCH_DETAIL", &n.detail)
        .env("MEMWATCH_MESSAGE", format!("{title}: {text}"))
        .env("MEMWATCH_HOST", &n.host)
        .env("MEMWATCH_TIMESTAMP_MS", n.timestamp_ms.to_string())
        .env("MEMWATCH_DRY_RUN", if n.dry_run { "1" } else { "0" })
        .env("MEMWATCH_HELD_BACK", n.held_back.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let mut child = child.map_err(|e| Failure {
        why: format!("cannot run the command ({:?})", e.kind()),
        retry: false,
    })?;
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(s)) if s.success() => Ok(()),
        Ok(Ok(s)) => Err(Failure {
            why: format!("the command exited with {s}"),
            retry: true,
        }),
        Ok(Err(e)) => Err(Failure {
            why: format!("waiting for the command failed ({:?})", e.kind()),
            retry: true,
        }),
        Err(_) => {
            let _ = child.kill().await;
            Err(Failure {
                why: format!(
                    "the command ran past {} s and was killed",
                    timeout.as_secs()
                ),
                retry: true,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_who_what_and_how_many_were_held_back() {
        let mut n = Notice {
            kind: NoticeKind::Pause,
            job: "train".into(),
            slurm_job_id: None,
            reason: crate::act::audit::Reason::GpuTemperature,
            detail: "GPU 0 temperature at 92 °C".into(),
            timestamp_ms: 1,
            dry_run: false,
            host: "gpu-box-01".into(),
            held_back: 0,
        };
        assert_eq!(
            message(&n),
            (
                "gpu-box-01: train paused".into(),
                "GPU 0 temperature at 92 °C".into()
            )
        );
        n.held_back = 2;
        n.kind = NoticeKind::CollectorDown;
        n.job.clear();
        let (title, text) = message(&n);
        assert_eq!(title, "gpu-box-01: collector down");
        assert!(text.ends_with("(2 more like this held back since the last notification)"));
    }
}
