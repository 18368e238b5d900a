//! A small blocking client for the daemon's JSON API, used by `memwatch status` and by trainers
//! (`memwatch-train` is its reference user): typed snapshot, jobs, directives, ack and progress.

use std::time::Duration;

use serde::de::DeserializeOwned;

/// Why a request to the daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon could not be reached.
    #[error(
        "cannot reach the memwatch daemon at {url}: {reason} (is it running? start it with `memwatch run` or `systemctl start memwatch`)"
    )]
    Unreachable {
        /// The URL asked.
        url: String,
        /// Why, in the transport's words.
        reason: String,
    },
    /// The daemon answered with an error status.
    #[error("the memwatch daemon at {url} answered {status}: {message}")]
    Status {
        /// The URL asked.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The daemon's error message.
        message: String,
    },
    /// The answer could not be read.
    #[error("the memwatch daemon at {url} sent a reply memwatch cannot read: {reason}")]
    Decode {
        /// The URL asked.
        url: String,
        /// What was wrong with it.
        reason: String,
    },
}

/// A client for one daemon, e.g. `Client::new("http://127.0.0.1:9300")`.
pub struct Client {
    base: String,
    agent: ureq::Agent,
}

impl Client {
    /// A client for the daemon at `base` (e.g. `http://127.0.0.1:9300`), with a 5 s timeout per
    /// request.
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
        self.call("GET", path, None, None)
    }

    /// The latest sample as JSON.
    pub fn snapshot(&self) -> Result<serde_json::Value, ClientError> {
        self.get("/api/v1/snapshot")
    }

    /// The latest sample, typed.
    pub fn sample(&self) -> Result<crate::sample::Sample, ClientError> {
        self.get("/api/v1/snapshot")
    }

    /// One attached job as the daemon sees it.
    pub fn job(&self, name: &str) -> Result<Option<crate::job::JobView>, ClientError> {
        #[derive(serde::Deserialize)]
        struct Jobs {
            jobs: Vec<crate::job::JobView>,
        }
        let jobs: Jobs = self.get("/api/v1/jobs")?;
        Ok(jobs.jobs.into_iter().find(|j| j.name == name))
    }

    /// Sends a request (with the job's token, if given) and decodes the JSON reply; a non-200 answer
    /// becomes `ClientError::Status` with the daemon's `error` message.
    fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<serde_json::Value>,
    ) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.base);
        let unreachable = |e: ureq::Error| ClientError::Unreachable {
            url: url.clone(),
            reason: e.to_string(),
        };
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut resp = match (method, body) {
            ("POST", Some(b)) => {
                let req = self.agent.post(&url);
                let req = match &auth {
                    Some(a) => req.header("Authorization", a),
                    None => req,
                };
                req.send_json(b).map_err(unreachable)?
            }
            _ => {
                let req = self.agent.get(&url);
                let req = match &auth {
                    Some(a) => req.header("Authorization", a),
                    None => req,
                };
                req.call().map_err(unreachable)?
            }
        };
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| ClientError::Decode {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        if status != 200 {
            let message = serde_json::from_str::<serde_json::Value>(&text)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                .unwrap_or(text);
            return Err(ClientError::Status {
                url,
                status,
                message,
            });
        }
        serde_json::from_str(&text).map_err(|e| ClientError::Decode {
            url,
            reason: e.to_string(),
        })
    }

    /// Directives staged for `job` after generation `since` (call at an epoch boundary).
    pub fn directives(
        &self,
        job: &str,
        since: u64,
        token: &str,
    ) -> Result<crate::control::DirectivesReply, ClientError> {
        self.call(
            "GET",
            &format!("/api/v1/jobs/{job}/directives?since={since}"),
            Some(token),
            None,
        )
    }

    /// Acknowledges that everything up to `generation` was applied at `epoch`.
    pub fn ack(
        &self,
        job: &str,
        generation: u64,
        epoch: u64,
        token: &str,
    ) -> Result<(), ClientError> {
        let body = serde_json::json!({ "generation": generation, "epoch": epoch });
        self.call::<serde_json::Value>(
            "POST",
            &format!("/api/v1/jobs/{job}/ack"),
            Some(token),
            Some(body),
        )
        .map(|_| ())
    }

    /// Reports training progress.
    /// Tells memwatch that the checkpoint it asked for is saved.
    pub fn checkpoint_saved(&self, job: &str, token: &str) -> Result<(), ClientError> {
        self.call::<serde_json::Value>(
            "POST",
            &format!("/api/v1/jobs/{job}/ack"),
            Some(token),
            Some(serde_json::json!({ "checkpoint": true })),
        )
        .map(|_| ())
    }

    /// Reports a trainer's progress for `job`.
    pub fn progress(
        &self,
        job: &str,
        p: &crate::adapt::Progress,
        token: &str,
    ) -> Result<(), ClientError> {
        let body = serde_json::to_value(p).map_err(|e| ClientError::Decode {
            url: self.base.clone(),
            reason: e.to_string(),
        })?;
        self.call::<serde_json::Value>(
            "POST",
            &format!("/api/v1/jobs/{job}/progress"),
            Some(token),
            Some(body),
        )
        .map(|_| ())
    }
}
