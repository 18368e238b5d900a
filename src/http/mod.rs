//! The HTTP surface on :9300: `/metrics`, the JSON API under `/api/v1`, and health endpoints.
//! Only this module knows HTTP and the wire formats it serves. Every endpoint is read-only except the
//! trainer's (`/api/v1/jobs/{job}/ack`, `/progress` and `/oom`), which need the job's token.

mod api;

mod jobs_metrics;
pub mod metrics;
mod serve;
mod trainer;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

pub use serve::{Limits, serve};

use crate::config::Http;
use crate::control::server::Envelope;
use crate::shared::Shared;

/// What handlers get: the published state, and the way to the task that owns the jobs.
#[derive(Clone)]
pub struct AppState {
    /// The published snapshot handlers read.
    pub shared: Arc<Shared>,
    /// The way to the owner task, for requests that change something.
    pub owner: tokio::sync::mpsc::Sender<Envelope>,
}

impl axum::extract::FromRef<AppState> for Arc<Shared> {
    fn from_ref(s: &AppState) -> Arc<Shared> {
        s.shared.clone()
    }
}

/// Builds the router over the daemon's published state.
pub fn router(
    shared: Arc<Shared>,
    owner: tokio::sync::mpsc::Sender<Envelope>,
    limits: &Http,
) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/metrics", get(metrics_handler))
        .route("/api/v1/snapshot", get(api::snapshot))
        .route("/api/v1/history", get(api::history))
        .route("/api/v1/jobs", get(api::jobs))
        .route("/api/v1/events", get(api::events))
        .route("/api/v1/advice", get(api::advice))
        .route("/api/v1/jobs/{job}/directives", get(trainer::directives))
        .route("/api/v1/jobs/{job}/ack", axum::routing::post(trainer::ack))
        .route(
            "/api/v1/jobs/{job}/progress",
            axum::routing::post(trainer::progress),
        )
        .route("/api/v1/jobs/{job}/oom", axum::routing::post(trainer::oom))
        .route("/-/healthy", get(|| async { "OK\n" }))
        .route("/-/ready", get(api::ready))
        .fallback(api::not_found)
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            fresh_reads,
        ))
        .layer(axum::middleware::from_fn(json_errors))
        .layer(DefaultBodyLimit::max(
            usize::try_from(limits.max_body_bytes.0).unwrap_or(usize::MAX),
        ))
        .with_state(AppState { shared, owner })
}

/// The longest a read waits for the fresh sample it asked for (an idle host's takes a few ms, a walk
/// of 1 024 processes about 60); then it is answered with the last.
const FRESH_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// A read of the data (`/metrics`, the JSON API; not the trainer's endpoints, not health) finds a
/// sample no older than `sampling.interval_ms`: while calm, samples are stretched, and the reader
/// asks for one (`Shared::freshen`). Someone looking gets live data; nobody looking costs nothing.
async fn fresh_reads(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let path = request.uri().path();
    let trainer = ["/directives", "/ack", "/progress", "/oom"]
        .iter()
        .any(|t| path.ends_with(t));
    if request.method() == axum::http::Method::GET
        && (path == "/metrics" || path.starts_with("/api/v1/"))
        && !trainer
    {
        shared.freshen(FRESH_WAIT).await;
    }
    next.run(request).await
}

/// Every error answer outside the health endpoints (`/-/…`, plain text as Prometheus's) is JSON,
/// `{"error": "…"}`, also those axum makes itself: 400, 405, 413, 415 and 422 for a body or path that
/// does not parse.
async fn json_errors(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let health = request.uri().path().starts_with("/-/");
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if health || is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase()
    } else {
        text
    };
    let mut out = api::error(status, message);
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

/// The token in `Authorization: Bearer <token>`, if any.
fn bearer(headers: &axum::http::HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    v.strip_prefix("Bearer ").map(|t| t.trim().to_owned())
}

/// Whether the client takes gzip (`Accept-Encoding: gzip`, as Prometheus always sends), and not with q=0.
fn accepts_gzip(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

/// `body` gzipped (fast level: /metrics is small and scraped often).
fn gzip(body: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(body)?;
    e.finish()
}

async fn metrics_handler(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    // One snapshot: the sample and the view below belong to the same moment.
    let snap = shared.snapshot();
    let info = metrics::DaemonInfo {
        version: env!("CARGO_PKG_VERSION"),
        samples_total: snap.samples_total,
        sample_interval_ms: shared
            .sample_interval_ms
            .load(std::sync::atomic::Ordering::Relaxed),
    };
    let mut body = metrics::render(snap.sample.as_deref(), &info);
    jobs_metrics::render(&mut body, &snap.view);
    metrics::notifications(&mut body, &shared.notify.snapshot());
    metrics::kernel_notifications(&mut body, &shared.kernel.snapshot());
    if accepts_gzip(&headers) {
        if let Ok(zipped) = gzip(body.as_bytes()) {
            return (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, metrics::CONTENT_TYPE),
                    (header::CONTENT_ENCODING, "gzip"),
                    (header::VARY, "Accept-Encoding"),
                ],
                zipped,
            )
                .into_response();
        }
    }
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, metrics::CONTENT_TYPE),
            (header::VARY, "Accept-Encoding"),
        ],
        body,
    )
        .into_response()
}

/// The live dashboard: one page, embedded in the binary, that polls the JSON API. Nothing is fetched
/// from anywhere else.
async fn dashboard() -> impl IntoResponse {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data:",
            ),
        ],
        include_str!("assets/index.html"),
    )
}
