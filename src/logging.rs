//! Logging setup: `RUST_LOG` wins, then `--log-level`, then the config file.

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogLevel};

/// Installs the tracing subscriber: `level` unless `RUST_LOG` says otherwise, in `format`, to
/// stderr.
pub fn init(level: LogLevel, format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level.as_str()));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
