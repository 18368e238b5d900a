//! Why a config file's rewrite was refused or failed, saying which file and what (a wire of the
//! `memwatch` crate's `rewrite::write`, which reads and writes it for its owner), and its bounds.

use std::path::PathBuf;

use super::ContentError;

/// Configs larger than this are refused whole (a training config is a few KiB).
pub const MAX_BYTES: u64 = 4 << 20;

/// How many times a file that keeps changing is read again before the rewrite is refused.
pub const TRIES: u32 = 3;

/// Why a rewrite was refused or failed. Nothing was written in any case.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// The path is a symbolic link.
    #[error("{0}: is a symbolic link; memwatch rewrites regular files only")]
    Symlink(PathBuf),
    /// The path is not a regular file.
    #[error("{0}: not a regular file")]
    NotRegular(PathBuf),
    /// The file is not owned by the job's user.
    #[error(
        "{path}: owned by uid {owner}, not by the job's user (uid {expected}); refusing to rewrite it"
    )]
    ForeignOwner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The job's user.
        expected: u32,
    },
    /// The file is larger than memwatch reads.
    #[error(
        "{path}: {size} bytes; memwatch reads configs of at most {MAX_BYTES} bytes and left it untouched"
    )]
    TooBig {
        /// The file.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
    },
    /// The file or its directory is one memwatch must not write (e.g. writable by others).
    #[error("{path}: {message}")]
    Untrusted {
        /// The file.
        path: PathBuf,
        /// Why it is not trusted.
        message: String,
    },
    /// Reading, writing or renaming failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS's error.
        #[source]
        source: std::io::Error,
    },
    /// The path is not an absolute path to a file.
    #[error("{0}: give an absolute path to a file")]
    NotAbsolute(PathBuf),
    /// The file is not UTF-8 text.
    #[error("{path}: not UTF-8 text (at byte {at})")]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// The offset of the first byte that is not.
        at: usize,
    },
    /// The file does not parse, or the edit does not fit it.
    #[error("{path}: {error}")]
    Content {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where in the file.
        error: ContentError,
    },
    /// The file kept changing under memwatch.
    #[error(
        "{0}: the file changed while memwatch was writing it, {TRIES} times; left as its owner saved it"
    )]
    KeepsChanging(PathBuf),
}
