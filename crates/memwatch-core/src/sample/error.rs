//! The error every reader and parser returns: what went wrong and with which file.

use std::path::{Path, PathBuf};

/// A reader's failure, always naming the file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Reading the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS's error.
        #[source]
        source: std::io::Error,
    },
    /// The file's text is not what the kernel writes there.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
}

/// Linux's errno for "no such process".
const ESRCH: i32 = 3;

impl ReadError {
    /// A parse failure of the file at `path`.
    pub fn parse(path: &Path, message: impl Into<String>) -> Self {
        ReadError::Parse {
            path: path.to_owned(),
            message: message.into(),
        }
    }

    /// True when the file does not exist (a feature the kernel lacks, not a fault).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }

    /// True when the process behind a /proc file is gone: its directory no longer exists, or it
    /// exited between the file's open and its read (the kernel answers ESRCH).
    pub fn is_gone(&self) -> bool {
        self.is_not_found()
            || matches!(self, ReadError::Io { source, .. } if source.raw_os_error() == Some(ESRCH))
    }

    /// A short, stable label for counting and log-once bookkeeping.
    pub fn kind(&self) -> &'static str {
        match self {
            ReadError::Io { .. } => "io",
            ReadError::Parse { .. } => "parse",
        }
    }
}

/// Parses a decimal u64, naming the file and the field on failure.
pub fn parse_u64(path: &Path, field: &str, value: &str) -> Result<u64, ReadError> {
    value
        .trim()
        .parse()
        .map_err(|_| ReadError::parse(path, format!("{field}: {value:?} is not a whole number")))
}
