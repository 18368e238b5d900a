//! Training-config rewrites, planned: change a few values in the text of a JSON, YAML or TOML file by
//! dotted path, touching nothing else. Writing the file back safely (no symlink followed, the owner's
//! rights, an atomic rename) is I/O and lives in the `memwatch` crate (`memwatch::rewrite::write`).
//!
//! Each format parses a file into a bounded [`Doc`]: every node in document order with its key and, for
//! a scalar, the byte span of its text. An edit replaces exactly those spans, so comments, key order
//! and formatting of everything else stay byte for byte. A dotted path must name exactly one node (a
//! key holding a dot, or duplicate keys, make it ambiguous and it is refused), and its span must read
//! back on its own as the old value. The new text is then parsed in full: it must have the same nodes,
//! the edited ones holding the new values and every other one unchanged. Otherwise nothing is written.

pub mod doc;
pub mod error;
pub mod file;
mod json;
pub mod profile;
mod toml_fmt;
mod yaml;

use std::path::Path;

pub use doc::Doc;
pub use error::{ContentError, ProfileError};

use serde::{Deserialize, Serialize};

/// The file formats memwatch can rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// `.json`.
    Json,
    /// `.yaml` or `.yml`.
    Yaml,
    /// `.toml`.
    Toml,
}

impl Format {
    /// From the file's extension.
    pub fn of(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
            "json" => Some(Format::Json),
            "yaml" | "yml" => Some(Format::Yaml),
            "toml" => Some(Format::Toml),
            _ => None,
        }
    }
}

/// A value memwatch reads or writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Scalar {
    /// true or false.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// A string.
    Str(String),
}

impl Scalar {
    /// A non-negative integer (a float with no fraction counts).
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Scalar::Int(i) => u64::try_from(*i).ok(),
            Scalar::Float(f) if f.fract() == 0.0 && *f >= 0.0 => Some(*f as u64),
            _ => None,
        }
    }
    /// A number.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Scalar::Int(i) => Some(*i as f64),
            Scalar::Float(f) => Some(*f),
            _ => None,
        }
    }
    /// A boolean.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Scalar::Bool(b) => Some(*b),
            _ => None,
        }
    }
    /// Parses a command-line value: true/false, an integer, a float, else a string.
    pub fn parse(s: &str) -> Scalar {
        if let Ok(b) = s.parse::<bool>() {
            Scalar::Bool(b)
        } else if let Ok(i) = s.parse::<i64>() {
            Scalar::Int(i)
        } else if let Ok(f) = s.parse::<f64>() {
            Scalar::Float(f)
        } else {
            Scalar::Str(s.to_owned())
        }
    }
}

impl std::fmt::Display for Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => write!(f, "{x}"),
            Scalar::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// Reads `path` (dotted) from `text`.
pub fn get(format: Format, text: &str, path: &str) -> Result<Option<Scalar>, ContentError> {
    parse(format, text)?.get(path)
}

/// The whole document, or why it does not parse.
pub fn parse(format: Format, text: &str) -> Result<Doc, ContentError> {
    match format {
        Format::Json => json::parse(text),
        Format::Yaml => yaml::parse(text),
        Format::Toml => toml_fmt::parse(text),
    }
}

fn render(format: Format, value: &Scalar) -> Result<String, ContentError> {
    match format {
        Format::Json => json::render(value),
        Format::Yaml => yaml::render(value),
        Format::Toml => toml_fmt::render(value),
    }
}

/// A value's text read on its own, as the format reads it.
fn scalar(format: Format, text: &str) -> Option<Scalar> {
    match format {
        Format::Json => json::scalar(text),
        Format::Yaml => yaml::scalar(text),
        Format::Toml => toml_fmt::scalar(text),
    }
}

/// Applies `edits` to `text`: each replaces one value's own text and nothing else. The result parses,
/// holds the new values, and differs from the old document in nothing else; otherwise an error says why
/// and nothing is changed.
pub fn apply(
    format: Format,
    text: &str,
    edits: &[(String, Scalar)],
) -> Result<String, ContentError> {
    apply_parsed(format, text, &parse(format, text)?, edits)
}

/// [`apply`] on a document already parsed from `text`.
pub fn apply_parsed(
    format: Format,
    text: &str,
    before: &Doc,
    edits: &[(String, Scalar)],
) -> Result<String, ContentError> {
    let mut spans: Vec<(usize, usize, String)> = Vec::new();
    let mut edited = Vec::new();
    for (path, value) in edits {
        let i = before
            .find(path)?
            .ok_or_else(|| ContentError::NoSuchKey { path: path.clone() })?;
        let node = &before.nodes[i];
        let Some(old) = &node.value else {
            return Err(ContentError::NotAValue { path: path.clone() });
        };
        // The span must hold exactly the old value, read on its own.
        let (a, b) = node
            .span
            .filter(|&(a, b)| {
                text.get(a..b)
                    .and_then(|t| scalar(format, t))
                    .is_some_and(|v| doc::same(&v, old))
            })
            .ok_or_else(|| ContentError::NotPlain { path: path.clone() })?;
        if edited.iter().any(|(e, _)| *e == i) {
            return Err(ContentError::SetTwice { path: path.clone() });
        }
        spans.push((a, b, render(format, value)?));
        edited.push((i, value.clone()));
    }
    spans.sort_by_key(|s| std::cmp::Reverse(s.0));
    let mut out = text.to_owned();
    for (a, b, new) in spans {
        out.replace_range(a..b, &new);
    }
    let after = parse(format, &out).map_err(|e| ContentError::WouldNotParse(Box::new(e)))?;
    before.check_edit(&after, &edited)?;
    Ok(out)
}

#[cfg(test)]
mod tests;
