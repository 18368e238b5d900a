//! A command-line value memwatch cannot take: the value as given, and what it expects instead
//! (clap prints it after the option's name).

/// Why a command-line value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// A parameter count with a suffix memwatch does not know.
    #[error("{0:?}: unknown suffix {1:?}; use K, M, B or T (1.5B, 350M)")]
    Suffix(String, char),
    /// Not a parameter count.
    #[error("{0:?}: expected a parameter count such as 1.5e9, 1.5B or 350M")]
    Params(String),
    /// A parameter count below one.
    #[error("{0:?}: expected a positive number of parameters")]
    NotPositive(String),
    /// Not a positive number of GiB.
    #[error("{0:?}: expected a positive number of GiB, such as 24 or 79.2")]
    Gib(String),
    /// Not a size of at least 1 MiB.
    #[error("{0:?}: give a size of at least 1M, e.g. 512M or 2G")]
    Size(String),
}
