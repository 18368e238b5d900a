//! The trainer's endpoints: directives at an epoch boundary, acknowledgements, progress, CUDA OOM
//! reports.
//!
//! HTTP cannot tell who is calling, so these need the job's token (`Authorization: Bearer <token>`),
//! which the daemon hands to whoever attached the job with its config file (the job's owner or root).
//! Requests go to the task that owns the jobs, like control-socket commands.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use tokio::sync::oneshot;

use super::AppState;
use super::api::error;
use crate::adapt::Progress;
use crate::control::server::Envelope;
use crate::control::{Caller, ErrorKind, Refusal, Request};

async fn ask(state: &AppState, request: Request) -> Response {
    let (reply, answer) = oneshot::channel();
    let env = Envelope {
        request,
        caller: Caller::ANONYMOUS,
        // The trainer's requests need no read of the host.
        prepared: Default::default(),
        reply,
    };
    if state.owner.send(env).await.is_err() {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the daemon is shutting down",
        );
    }
    match answer.await {
        Ok(r) if r.ok => match r.directives {
            Some(d) => Json(d).into_response(),
            None => Json(serde_json::json!({ "ok": true })).into_response(),
        },
        Ok(r) => {
            let refusal = r.refusal().unwrap_or_else(|| Refusal::invalid(""));
            error(status_of(refusal.kind), refusal.message)
        }
        Err(_) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the daemon is shutting down",
        ),
    }
}

/// The HTTP status for a refusal of `kind`.
fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Limit => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Failed => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Since {
    #[serde(default)]
    since: u64,
}

/// `GET /api/v1/jobs/{job}/directives?since=G`
pub async fn directives(
    State(state): State<AppState>,
    Path(job): Path<String>,
    Query(q): Query<Since>,
    headers: HeaderMap,
) -> Response {
    ask(
        &state,
        Request::Directives {
            target: job,
            since: q.since,
            token: super::bearer(&headers),
        },
    )
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AckBody {
    #[serde(default)]
    generation: u64,
    #[serde(default)]
    checkpoint: bool,
    #[serde(default)]
    epoch: u64,
    #[serde(default)]
    cannot_apply: Option<String>,
}

/// `POST /api/v1/jobs/{job}/ack` with `{"generation": G, "epoch": E}`
pub async fn ack(
    State(state): State<AppState>,
    Path(job): Path<String>,
    headers: HeaderMap,
    Json(b): Json<AckBody>,
) -> Response {
    ask(
        &state,
        Request::Ack {
            target: job,
            generation: b.generation,
            epoch: b.epoch,
            token: super::bearer(&headers),
            cannot_apply: b.cannot_apply,
            checkpoint: b.checkpoint,
        },
    )
    .await
}

/// `POST /api/v1/jobs/{job}/progress` with `{"epoch": E, "step": S, "loss": L, "samples_per_second": R}`
pub async fn progress(
    State(state): State<AppState>,
    Path(job): Path<String>,
    headers: HeaderMap,
    Json(p): Json<Progress>,
) -> Response {
    ask(
        &state,
        Request::Progress {
            target: job,
            progress: p,
            token: super::bearer(&headers),
        },
    )
    .await
}

/// `POST /api/v1/jobs/{job}/oom` with the report (docs/protocol.md, "CUDA OOM reports")
pub async fn oom(
    State(state): State<AppState>,
    Path(job): Path<String>,
    headers: HeaderMap,
    Json(report): Json<crate::cuda_oom::OomReport>,
) -> Response {
    ask(
        &state,
        Request::Oom {
            target: job,
            oom: report,
            token: super::bearer(&headers),
        },
    )
    .await
}
