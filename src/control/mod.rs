//! The control socket: `attach`, `detach`, `pause`, `resume`, `jobs`. One JSON object per line each way.
//! The daemon takes the caller's uid from the socket (SO_PEERCRED), never from the message.

pub mod client;
pub mod server;

use serde::{Deserialize, Serialize};

use crate::job::JobView;

/// The longest request line accepted.
pub const MAX_LINE: usize = 64 * 1024;

/// A command sent to the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    Attach {
        pid: u32,
        #[serde(default)]
        name: Option<String>,
    },
    /// `target` is a job name or a pid.
    Detach {
        target: String,
    },
    Pause {
        target: String,
    },
    Resume {
        target: String,
    },
    /// A struct variant, so that extra fields (a claimed `uid`, say) are rejected.
    Jobs {},
}

/// The daemon's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs: Option<Vec<JobView>>,
}

impl Response {
    pub fn error(message: impl Into<String>) -> Self {
        Response {
            ok: false,
            error: Some(message.into()),
            job: None,
            jobs: None,
        }
    }
    pub fn job(job: JobView) -> Self {
        Response {
            ok: true,
            error: None,
            job: Some(job),
            jobs: None,
        }
    }
    pub fn jobs(jobs: Vec<JobView>) -> Self {
        Response {
            ok: true,
            error: None,
            job: None,
            jobs: Some(jobs),
        }
    }
}

/// Who is asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub pid: Option<i32>,
}

impl Caller {
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}
