//! A small blocking client for the daemon's JSON API, used by `memwatch status` and usable by trainers.

use std::time::Duration;

use serde::de::DeserializeOwned;

/// Why a request to the daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "cannot reach the memwatch daemon at {url}: {reason} (is it running? start it with `memwatch run` or `systemctl start memwatch`)"
    )]
    Unreachable { url: String, reason: String },
    #[error("the memwatch daemon at {url} answered {status}: {message}")]
    Status {
        url: String,
        status: u16,
        message: String,
    },
    #[error("the memwatch daemon at {url} sent a reply memwatch cannot read: {reason}")]
    Decode { url: String, reason: String },
}

/// A client for one daemon, e.g. `Client::new("http://127.0.0.1:9300")`.
pub struct Client {
    base: String,
    agent: ureq::Agent,
}

impl Client {
    pub fn new(base: impl Into<String>) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .http_status_as_error(false)
            .build()
            .new_agent();
        Client {
            base: base.into().trim_end_matches('/').to_owned(),
            agent,
        }
    }

    /// GETs `path` and decodes the JSON reply.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.base);
        let mut resp = self
            .agent
            .get(&url)
            .call()
            .map_err(|e| ClientError::Unreachable {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| ClientError::Decode {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        if status != 200 {
            let message = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                .unwrap_or(body);
            return Err(ClientError::Status {
                url,
                status,
                message,
            });
        }
        serde_json::from_str(&body).map_err(|e| ClientError::Decode {
            url,
            reason: e.to_string(),
        })
    }

    /// The latest sample as JSON.
    pub fn snapshot(&self) -> Result<serde_json::Value, ClientError> {
        self.get("/api/v1/snapshot")
    }
}
