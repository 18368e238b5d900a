//! The trainer's link to memwatch: it registers (attaches itself with its config file), asks for
//! directives (at epoch boundaries, and between steps for urgent ones and checkpoint requests),
//! acknowledges them and reports progress and out-of-memory errors inside a step. When the daemon is down the trainer keeps training: it warns
//! once and retries with backoff.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use memwatch::adapt::Progress;
use memwatch::client::Client;
use memwatch::control::{self, Request};

pub struct Link {
    client: Client,
    url: String,
    socket: PathBuf,
    name: String,
    config_file: PathBuf,
    token: Option<String>,
    /// The newest generation applied.
    pub generation: u64,
    next_try: Instant,
    backoff: Duration,
    warned: bool,
}

const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// One answer to "anything for me?".
#[derive(Debug, Default)]
pub struct Poll {
    /// The newest generation staged, if newer than the one applied.
    pub staged: Option<u64>,
    /// Some of it must be applied at the next step, not the next epoch.
    pub urgent: bool,
    /// memwatch asks for a checkpoint now.
    pub checkpoint: bool,
}

impl Link {
    pub fn new(url: &str, socket: PathBuf, name: String, config_file: PathBuf) -> Link {
        Link {
            client: Client::new(url),
            url: url.trim_end_matches('/').to_owned(),
            socket,
            name,
            config_file,
            token: None,
            generation: 0,
            next_try: Instant::now(),
            backoff: Duration::from_secs(1),
            warned: false,
        }
    }

    fn down(&mut self, why: &str) {
        if !self.warned {
            eprintln!(
                "memwatch-train: memwatch is not reachable ({why}); training on, retrying with backoff"
            );
            self.warned = true;
        }
        self.next_try = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    fn up(&mut self) {
        if self.warned {
            eprintln!("memwatch-train: memwatch is reachable again");
        }
        self.warned = false;
        self.backoff = Duration::from_secs(1);
    }

    /// Attaches this process with its config file, unless done already; false while memwatch is down.
    pub fn register(&mut self) -> bool {
        if self.token.is_some() {
            return true;
        }
        if Instant::now() < self.next_try {
            return false;
        }
        // Itself: in a container the daemon knows it by another pid, which the socket gives.
        let req = Request::Attach {
            pid: std::process::id(),
            itself: true,
            name: Some(self.name.clone()),
            config_file: Some(self.config_file.clone()),
            profile: Some("generic".into()),
            keys: vec![
                "batch=train.micro_batch".into(),
                "accumulation=train.accumulation".into(),
                "seq_len=train.seq_len".into(),
            ],
            launch: None,
        };
        match control::client::call(&self.socket, &req) {
            Ok(r) => {
                self.token = r.token;
                self.up();
                eprintln!("memwatch-train: attached to memwatch as {}", self.name);
                true
            }
            Err(e) => {
                self.down(&format!("{e:#}"));
                false
            }
        }
    }

    /// What memwatch asks for now: the newest generation staged (if newer than the one applied),
    /// whether any of it is urgent, and whether a checkpoint is requested.
    pub fn poll(&mut self) -> Poll {
        let none = Poll::default();
        if !self.register() {
            return none;
        }
        let Some(token) = self.token.clone() else {
            return none;
        };
        match self.client.directives(&self.name, self.generation, &token) {
            Ok(d) => {
                self.up();
                Poll {
                    staged: (d.generation > self.generation).then_some(d.generation),
                    urgent: d.directives.iter().any(|x| x.urgent),
                    checkpoint: d.checkpoint.is_some(),
                }
            }
            Err(memwatch::client::ClientError::Status { status: 404, .. }) => {
                // The daemon lost the job (a fresh state directory): register again.
                self.token = None;
                none
            }
            Err(e) => {
                self.down(&e.to_string());
                none
            }
        }
    }

    /// Tells memwatch the checkpoint it asked for is saved.
    pub fn checkpoint_saved(&mut self) {
        if let Some(token) = self.token.clone() {
            if let Err(e) = self.client.checkpoint_saved(&self.name, &token) {
                self.down(&e.to_string());
            }
        }
    }

    /// Acknowledges `generation`, applied at `epoch`.
    pub fn ack(&mut self, generation: u64, epoch: u64) {
        self.generation = generation;
        if let Some(token) = self.token.clone() {
            if let Err(e) = self.client.ack(&self.name, generation, epoch, &token) {
                self.down(&e.to_string());
            }
        }
    }

    pub fn progress(&mut self, p: &Progress) {
        if Instant::now() < self.next_try {
            return;
        }
        if let Some(token) = self.token.clone() {
            if let Err(e) = self.client.progress(&self.name, p, &token) {
                self.down(&e.to_string());
            }
        }
    }

    /// Reports an out-of-memory error inside a step (`POST /api/v1/jobs/{job}/oom`, docs/protocol.md).
    /// Whatever the answer, the trainer goes on: a daemon that does not know the endpoint (404, 405)
    /// or refuses the report is logged, and an unreachable one is retried later like any call.
    pub fn oom(&mut self, body: &serde_json::Value) {
        if !self.register() {
            eprintln!(
                "memwatch-train: the out-of-memory report was not sent (memwatch is not reachable)"
            );
            return;
        }
        let Some(token) = self.token.clone() else {
            return;
        };
        let url = format!("{}/api/v1/jobs/{}/oom", self.url, self.name);
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(5)))
            .http_status_as_error(false)
            .build()
            .new_agent();
        match agent
            .post(&url)
            .header("Authorization", &format!("Bearer {token}"))
            .send_json(body)
        {
            Ok(mut r) => {
                self.up();
                let status = r.status().as_u16();
                if status != 200 {
                    let text = r.body_mut().read_to_string().unwrap_or_default();
                    let text: String = text.chars().take(200).collect();
                    let why = match status {
                        404 | 405 => " (this memwatch does not take out-of-memory reports)",
                        _ => "",
                    };
                    eprintln!(
                        "memwatch-train: memwatch answered {status} to the out-of-memory report{why}: {}; training on",
                        text.trim()
                    );
                }
            }
            Err(e) => self.down(&e.to_string()),
        }
    }
}
