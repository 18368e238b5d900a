//! The HTTP surface on :9300: `/metrics`, the JSON API under `/api/v1`, and health endpoints.
//! Only this module knows HTTP and the wire formats it serves. Every endpoint is read-only.

mod api;
mod jobs_metrics;
mod listener;
pub mod metrics;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

pub use listener::LimitedListener;

use crate::config::Http;
use crate::daemon::Shared;

/// Builds the router over the daemon's published state.
pub fn router(shared: Arc<Shared>, limits: &Http) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/api/v1/snapshot", get(api::snapshot))
        .route("/api/v1/history", get(api::history))
        .route("/api/v1/jobs", get(api::jobs))
        .route("/api/v1/events", get(api::events))
        .route("/-/healthy", get(|| async { "OK\n" }))
        .route("/-/ready", get(api::ready))
        .fallback(api::not_found)
        .layer(DefaultBodyLimit::max(
            usize::try_from(limits.max_body_bytes.0).unwrap_or(usize::MAX),
        ))
        .with_state(shared)
}

async fn metrics_handler(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
) -> impl IntoResponse {
    let latest = shared.latest();
    let info = metrics::DaemonInfo {
        version: env!("CARGO_PKG_VERSION"),
        samples_total: shared.samples_total(),
    };
    let mut body = metrics::render(latest.as_deref(), &info);
    jobs_metrics::render(&mut body, &shared.view());
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        body,
    )
}
