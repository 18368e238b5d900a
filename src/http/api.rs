//! The JSON API handlers. Field names are documented in docs/api.md.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::shared::Shared;

/// A JSON error body: `{"error": "..."}` with the status.
pub fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": message.into() }))).into_response()
}

pub async fn snapshot(State(shared): State<Arc<Shared>>) -> Response {
    match shared.latest() {
        Some(s) => Json(&*s).into_response(),
        None => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no sample taken yet; retry in a second",
        ),
    }
}

/// `GET /api/v1/history?seconds=N` (default 300): points from the last N seconds; or
/// `?since_ms=T`: the points newer than T, for a client that holds the rest.
pub async fn history(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(k) = q
        .keys()
        .find(|k| k.as_str() != "seconds" && k.as_str() != "since_ms")
    {
        return error(
            StatusCode::BAD_REQUEST,
            format!("unknown query parameter `{k}`; `seconds` or `since_ms` is accepted"),
        );
    }
    let max = shared.history_seconds;
    if let Some(v) = q.get("since_ms") {
        if q.contains_key("seconds") {
            return error(
                StatusCode::BAD_REQUEST,
                "give `seconds` or `since_ms`, not both",
            );
        }
        return match v.parse::<u64>() {
            Ok(ms) => {
                Json(json!({ "since_ms": ms, "points": shared.history_after(ms) })).into_response()
            }
            Err(_) => error(
                StatusCode::BAD_REQUEST,
                format!("`since_ms` must be a whole number of Unix milliseconds, got {v:?}"),
            ),
        };
    }
    let seconds = match q.get("seconds") {
        None => 300.min(max),
        Some(v) => match v.parse::<u64>() {
            Ok(n) if (1..=max).contains(&n) => n,
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "`seconds` must be a whole number from 1 to {max} (the history kept), got {v:?}"
                    ),
                );
            }
        },
    };
    let points = shared.history(seconds);
    Json(json!({ "seconds": seconds, "points": points })).into_response()
}

pub async fn ready(State(shared): State<Arc<Shared>>) -> Response {
    if shared.fresh() {
        (StatusCode::OK, "ready\n").into_response()
    } else if shared.latest().is_some() {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the latest sample is older than {} ms\n",
                shared.stale_after_ms
            ),
        )
            .into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no sample taken yet\n").into_response()
    }
}

pub async fn not_found(uri: Uri) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("no such endpoint: {}", uri.path()),
    )
}

/// `GET /api/v1/jobs`: attached jobs with their state, memory, GPU memory and limits, and the current
/// level of every resource.
///
/// HTTP cannot tell who is calling, and every local user can reach it: a job's details (its
/// processes' names, its config file, knobs, directives and the trainer's progress) are shown only
/// with that job's token (`Authorization: Bearer <token>`); everyone sees names, states, levels and
/// numbers. The control socket shows each user all of their own jobs (docs/api.md).
pub async fn jobs(State(shared): State<Arc<Shared>>, headers: axum::http::HeaderMap) -> Response {
    let v = shared.view();
    let token = super::bearer(&headers);
    let jobs: Vec<serde_json::Value> = v
        .jobs
        .iter()
        .map(|j| {
            let owner = token.as_deref().is_some_and(|t| {
                v.tokens
                    .get(&j.name)
                    .is_some_and(|expected| crate::adapt::token_matches(expected, t))
            });
            job_json(j, owner)
        })
        .collect();
    Json(json!({ "dry_run": v.dry_run, "jobs": jobs, "ended": v.ended, "levels": v.levels }))
        .into_response()
}

/// A job as HTTP shows it: with `details` only for its owner (see [`jobs`]).
fn job_json(job: &crate::job::JobView, details: bool) -> serde_json::Value {
    let mut v = serde_json::to_value(job).unwrap_or_default();
    if let Some(s) = v.get_mut("sample").and_then(|s| s.as_object_mut()) {
        if !details {
            s.remove("processes");
        }
    }
    if !details {
        if let Some(c) = v.get_mut("config").filter(|c| !c.is_null()) {
            *c = json!({
                "generation": c["generation"],
                "applied_generation": c["applied_generation"],
            });
        }
        // Of the last CUDA OOM, the numbers: not the snapshot's path nor the exception's words.
        if let Some(l) = v
            .get_mut("cuda_oom")
            .and_then(|o| o.get_mut("last"))
            .and_then(|l| l.as_object_mut())
        {
            l.remove("snapshot");
            l.remove("message");
        }
    }
    v["details"] = details.into();
    v
}

/// Events as HTTP shows them: what happened to which job and why, for everyone; the details of
/// config rewrites and errors (file paths, values) stay with the job's owner (the control socket).
fn public_event(e: &crate::act::audit::Event) -> serde_json::Value {
    let mut v = serde_json::to_value(e).unwrap_or_default();
    if !e.job.is_empty()
        && matches!(
            e.action,
            crate::act::audit::Action::Rewrite | crate::act::audit::Action::Error
        )
    {
        v["detail"] = "details for the job's owner and root: memwatch jobs --json".into();
    }
    v
}

/// `GET /api/v1/events?limit=N`: the newest interventions and level changes, newest last.
pub async fn events(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(k) = q.keys().find(|k| k.as_str() != "limit") {
        return error(
            StatusCode::BAD_REQUEST,
            format!("unknown query parameter `{k}`; only `limit` is accepted"),
        );
    }
    let limit = match q.get("limit").map(|v| v.parse::<usize>()) {
        None => 100,
        Some(Ok(n)) if (1..=crate::act::audit::RECENT).contains(&n) => n,
        Some(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "`limit` must be a whole number from 1 to {}",
                    crate::act::audit::RECENT
                ),
            );
        }
    };
    let v = shared.view();
    let skip = v.events.len().saturating_sub(limit);
    let events: Vec<serde_json::Value> = v.events[skip..].iter().map(public_event).collect();
    Json(json!({ "events": events, "interventions": v.interventions })).into_response()
}

/// `GET /api/v1/advice[?job=NAME]`: the current advice, most severe first.
pub async fn advice(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(k) = q.keys().find(|k| k.as_str() != "job") {
        return error(
            StatusCode::BAD_REQUEST,
            format!("unknown query parameter `{k}`; only `job` is accepted"),
        );
    }
    let v = shared.view();
    let items: Vec<_> = match q.get("job") {
        Some(job) => v
            .advice
            .iter()
            .filter(|a| a.job.as_deref().is_none_or(|j| j == job))
            .collect(),
        None => v.advice.iter().collect(),
    };
    Json(json!({ "advice": items })).into_response()
}
