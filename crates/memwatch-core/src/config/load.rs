//! Reading and checking the config file: size and UTF-8 first, then TOML with serde's range checks,
//! then the bounds and cross-field checks; every error names the line and key where it can.

use std::path::{Path, PathBuf};

use super::{Config, DEFAULT_CONFIG_PATH};

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file does not parse or a value is out of range.
    #[error("invalid config file {path}: {error}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What, and where in the file.
        error: ParseError,
    },
}

/// Why a config text is refused: what, and where (line, column, dotted key) where it can say.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Larger than memwatch reads.
    #[error("larger than {MAX_CONFIG_BYTES} bytes; is this the right file?")]
    TooBig,
    /// Not UTF-8 text.
    #[error("line {line}, column {column}: not valid UTF-8 (byte 0x{byte:02x})")]
    NotUtf8 {
        /// The line (1-based).
        line: usize,
        /// The column (1-based, in bytes).
        column: usize,
        /// The first byte that is not.
        byte: u8,
    },
    /// Not TOML, an unknown key, or a value of the wrong type or out of its range.
    #[error("{}{message}", syntax_place(*.line, *.column, .key.as_deref()))]
    Syntax {
        /// The line (1-based), where the parser says.
        line: Option<usize>,
        /// The column (1-based).
        column: Option<usize>,
        /// The dotted key set there, if any.
        key: Option<String>,
        /// The parser's words.
        message: String,
    },
    /// A value the checks after parsing refuse (a bound, a relation between keys).
    #[error("{}key `{key}`: {why}", line.map(|l| format!("line {l}, ")).unwrap_or_default())]
    Value {
        /// The line (1-based) where the key is set, if it is set in the text.
        line: Option<usize>,
        /// The dotted key.
        key: String,
        /// What is wrong with it.
        why: String,
    },
}

/// "line L, column C, key `k`: " or as much of it as is known.
fn syntax_place(line: Option<usize>, column: Option<usize>, key: Option<&str>) -> String {
    match (line, column, key) {
        (Some(l), Some(c), Some(k)) => format!("line {l}, column {c}, key `{k}`: "),
        (Some(l), Some(c), None) => format!("line {l}, column {c}: "),
        _ => String::new(),
    }
}

/// The largest config file read (a real one is a few kB).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Loads the configuration. `explicit` is the `--config` argument: a missing explicit file is an error,
/// a missing default file means defaults.
pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
    use std::io::Read as _;
    let path = explicit.unwrap_or(Path::new(DEFAULT_CONFIG_PATH));
    let invalid = |error: ParseError| ConfigError::Invalid {
        path: path.to_owned(),
        error,
    };
    let read = std::fs::File::open(path).and_then(|f| {
        let mut bytes = Vec::new();
        f.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes)?;
        Ok(bytes)
    });
    match read {
        Ok(bytes) if bytes.len() as u64 > MAX_CONFIG_BYTES => Err(invalid(ParseError::TooBig)),
        Ok(bytes) => parse(&utf8(&bytes).map_err(invalid)?).map_err(invalid),
        Err(e) if explicit.is_none() && e.kind() == std::io::ErrorKind::NotFound => {
            Ok(Config::default())
        }
        Err(source) => Err(ConfigError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// The text of a config file, or where its first invalid UTF-8 byte is.
fn utf8(bytes: &[u8]) -> Result<String, ParseError> {
    std::str::from_utf8(bytes).map(str::to_owned).map_err(|e| {
        let before = &bytes[..e.valid_up_to()];
        let line = before.iter().filter(|b| **b == b'\n').count() + 1;
        let column = before.len()
            - before
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |i| i + 1)
            + 1;
        ParseError::NotUtf8 {
            line,
            column,
            byte: bytes.get(e.valid_up_to()).copied().unwrap_or(0),
        }
    })
}

/// Upper bounds on counts and sizes: beyond them a value is a typo, or would exhaust the daemon.
fn bounds(c: &Config) -> Result<(), (String, String)> {
    let checks: [(&str, u64, u64); 9] = [
        ("http.max_connections", c.http.max_connections.0, 65_536),
        ("http.max_body_bytes", c.http.max_body_bytes.0, 64 << 20),
        (
            "control.audit_max_bytes",
            c.control.audit_max_bytes.0,
            1 << 30,
        ),
        ("control.max_connections", c.control.max_connections.0, 4096),
        (
            "control.max_connections_per_uid",
            c.control.max_connections_per_uid.0,
            c.control.max_connections.0,
        ),
        (
            "control.max_jobs_per_uid",
            c.control.max_jobs_per_uid.0,
            1024,
        ),
        (
            "control.max_directives_per_job",
            c.control.max_directives_per_job.0,
            4096,
        ),
        ("adapt.max_micro_batch", c.adapt.max_micro_batch, 1 << 20),
        (
            "control.successor_grace_ms",
            c.control.successor_grace_ms,
            60_000,
        ),
    ];
    for (key, value, max) in checks {
        if value > max {
            return Err((
                key.to_owned(),
                format!("must be at most {max}, got {value}"),
            ));
        }
    }
    Ok(())
}

/// Parses configuration text; the error names the key and line.
pub fn parse(text: &str) -> Result<Config, ParseError> {
    let mut config: Config = toml::from_str(text).map_err(|e| describe(text, &e))?;
    let named = config.notify.validate();
    let checks = [
        named,
        bounds(&config),
        config.policy.validate(),
        config.way_out.validate(),
        config.slurm.validate(),
        (config.sampling.fast_interval_ms.0 > config.sampling.probe_interval_ms.0)
            .then(|| {
                (
                    "sampling.fast_interval_ms".to_owned(),
                    "must not be above `probe_interval_ms`".to_owned(),
                )
            })
            .map_or(Ok(()), Err),
    ];
    for check in checks {
        if let Err((key, why)) = check {
            return Err(ParseError::Value {
                line: line_of(text, &key),
                key,
                why,
            });
        }
    }
    Ok(config)
}

/// The line (1-based) where dotted `key` is set, if it is set in `text`: from the key's span in
/// toml_edit's parse of the file (dotted keys, inline tables and `[table]` headers alike).
fn line_of(text: &str, key: &str) -> Option<usize> {
    let doc = toml_edit::Document::parse(text).ok()?;
    let mut table: &dyn toml_edit::TableLike = doc.as_table();
    let parts: Vec<&str> = key.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let (k, item) = table.get_key_value(part)?;
        if i + 1 == parts.len() {
            return k.span().map(|r| line_col(text, r.start).0);
        }
        table = item.as_table_like()?;
    }
    None
}

/// The line and column (1-based) of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// A toml error with its place: "line L, column C, key `a.b`: message".
fn describe(text: &str, e: &toml::de::Error) -> ParseError {
    let message = e.message().trim().to_owned();
    let Some(span) = e.span() else {
        return ParseError::Syntax {
            line: None,
            column: None,
            key: None,
            message,
        };
    };
    let (line, column) = line_col(text, span.start);
    ParseError::Syntax {
        line: Some(line),
        column: Some(column),
        key: key_at(text, span.start),
        message,
    }
}

/// The dotted key set at byte `offset`: in each table, the last key that starts at or before it,
/// followed down into its table (from toml_edit's spans).
fn key_at(text: &str, offset: usize) -> Option<String> {
    let doc = toml_edit::Document::parse(text).ok()?;
    let mut path: Vec<String> = Vec::new();
    let mut table: &dyn toml_edit::TableLike = doc.as_table();
    loop {
        let here = table
            .iter()
            .filter_map(|(k, item)| Some((k, item, starts_at(table.key(k)?, item)?)))
            .filter(|(_, _, start)| *start <= offset)
            .max_by_key(|(_, _, start)| *start);
        let Some((k, item, _)) = here else {
            break;
        };
        if let Some(array) = item.as_array_of_tables() {
            // `[[notify.channels]]`: the last entry that starts at or before the offset.
            let tables: Vec<&toml_edit::Table> = array.iter().collect();
            let entry = tables.into_iter().enumerate().rev().find(|(_, t)| {
                t.span()
                    .map(|r| r.start)
                    .or_else(|| t.iter().filter_map(|(k, i)| starts_at(t.key(k)?, i)).min())
                    .is_some_and(|s| s <= offset)
            });
            let Some((n, t)) = entry else {
                path.push(k.to_owned());
                break;
            };
            path.push(format!("{k}[{n}]"));
            table = t;
            continue;
        }
        path.push(k.to_owned());
        match item.as_table_like() {
            Some(t) => table = t,
            None => break,
        }
    }
    (!path.is_empty()).then(|| path.join("."))
}

/// Where a key's definition starts: a table's header (`[policy.job_cgroup]` starts at its `[`,
/// before the key's own span inside it), else the key's own span, or for a table only named by
/// headers below it (`[policy.job_cgroup]` defines `policy`), its first key's.
fn starts_at(key: &toml_edit::Key, item: &toml_edit::Item) -> Option<usize> {
    let header = match item.as_array_of_tables() {
        // `[[notify.channels]]`: the first entry's header.
        Some(a) => a.iter().next().and_then(|t| t.span()),
        None => item.as_table().and_then(|t| t.span()),
    }
    .map(|r| r.start);
    let own = key.span().map(|r| r.start);
    match (header, own) {
        (Some(h), Some(o)) => Some(h.min(o)),
        (h, o) => h.or(o).or_else(|| {
            let t = item.as_table_like()?;
            t.iter().filter_map(|(k, i)| starts_at(t.key(k)?, i)).min()
        }),
    }
}
