//! The JSON API handlers. Field names are documented in docs/api.md.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::daemon::Shared;

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

/// `GET /api/v1/history?seconds=N`: points from the last N seconds (default 300).
pub async fn history(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(k) = q.keys().find(|k| k.as_str() != "seconds") {
        return error(
            StatusCode::BAD_REQUEST,
            format!("unknown query parameter `{k}`; only `seconds` is accepted"),
        );
    }
    let max = shared.history_seconds;
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

/// `GET /api/v1/jobs`: attached jobs with their processes, cgroup, GPU memory and limits, and the
/// current level of every resource.
pub async fn jobs(State(shared): State<Arc<Shared>>) -> Response {
    let v = shared.view();
    Json(json!({ "dry_run": v.dry_run, "jobs": v.jobs, "levels": v.levels })).into_response()
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
    Json(json!({ "events": v.events[skip..], "interventions": v.interventions })).into_response()
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
