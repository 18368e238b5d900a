//! Training-config rewrites: change a few values in a JSON, YAML or TOML file by dotted path, touching
//! nothing else, and write it back safely.
//!
//! Each format edits the value's own text span (TOML through toml_edit), so comments, key order and
//! formatting of everything else stay byte for byte. Every edit is then checked by parsing the old and the
//! new text in full: the new file must parse, the edited paths must hold the new values, and every other
//! value must be unchanged. Otherwise nothing is written.

mod json;
pub mod profile;
mod toml_fmt;
pub mod write;
mod yaml;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The file formats memwatch can rewrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Json,
    Yaml,
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
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl Scalar {
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Scalar::Int(i) => u64::try_from(*i).ok(),
            Scalar::Float(f) if f.fract() == 0.0 && *f >= 0.0 => Some(*f as u64),
            _ => None,
        }
    }
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

/// Every leaf of a document by dotted path (arrays by index), as comparable text.
pub type Leaves = BTreeMap<String, Scalar>;

/// Reads `path` (dotted) from `text`.
pub fn get(format: Format, text: &str, path: &str) -> Result<Option<Scalar>, String> {
    Ok(leaves(format, text)?.remove(path))
}

/// All leaves of the document, or why it does not parse.
pub fn leaves(format: Format, text: &str) -> Result<Leaves, String> {
    match format {
        Format::Json => json::leaves(text),
        Format::Yaml => yaml::leaves(text),
        Format::Toml => toml_fmt::leaves(text),
    }
}

/// Applies `edits` to `text`. The result parses, holds the new values, and differs in nothing else.
pub fn apply(format: Format, text: &str, edits: &[(String, Scalar)]) -> Result<String, String> {
    let before = leaves(format, text)?;
    let mut out = text.to_owned();
    for (path, value) in edits {
        if !before.contains_key(path) {
            return Err(format!(
                "key `{path}` is not in the file (memwatch changes existing keys only)"
            ));
        }
        out = match format {
            Format::Json => json::set(&out, path, value)?,
            Format::Yaml => yaml::set(&out, path, value)?,
            Format::Toml => toml_fmt::set(&out, path, value)?,
        };
    }
    let after = leaves(format, &out)
        .map_err(|e| format!("the edited file would not parse ({e}); nothing written"))?;
    let mut expected = before;
    for (path, value) in edits {
        expected.insert(path.clone(), value.clone());
    }
    if after != expected {
        let diff: Vec<&String> = after
            .keys()
            .chain(expected.keys())
            .filter(|k| after.get(*k) != expected.get(*k))
            .collect();
        return Err(format!(
            "the edit would also change {diff:?}; nothing written"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: &str = r#"{
  // not valid JSON, so not here
}"#;

    #[test]
    fn json_keeps_everything_else() {
        let text = "{\n  \"train_micro_batch_size_per_gpu\": 32,\n  \"gradient_accumulation_steps\":2 ,\n  \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"none\"}},\n  \"list\": [1, 2.50, \"x\"],\n  \"fp16\": {\"enabled\": true}\n}\n";
        let out = apply(
            Format::Json,
            text,
            &[
                ("train_micro_batch_size_per_gpu".into(), Scalar::Int(16)),
                ("gradient_accumulation_steps".into(), Scalar::Int(4)),
            ],
        )
        .unwrap();
        assert_eq!(out, text.replace(": 32,", ": 16,").replace(":2 ,", ":4 ,"));
        assert_eq!(
            get(Format::Json, &out, "zero_optimization.stage").unwrap(),
            Some(Scalar::Int(2))
        );
        assert!(apply(Format::Json, text, &[("nope".into(), Scalar::Int(1))]).is_err());
        assert!(leaves(Format::Json, JSON).is_err());
    }

    #[test]
    fn yaml_keeps_comments_and_layout() {
        let text = "# accelerate config\ncompute_environment: LOCAL_MACHINE\ndeepspeed_config:\n  gradient_accumulation_steps: 4   # tuned by hand\n  zero_stage: 2\nper_device_train_batch_size: 8\ndataloader_pin_memory: true\nlist:\n  - 1\n  - two\n";
        let out = apply(
            Format::Yaml,
            text,
            &[
                (
                    "deepspeed_config.gradient_accumulation_steps".into(),
                    Scalar::Int(8),
                ),
                ("per_device_train_batch_size".into(), Scalar::Int(4)),
                ("dataloader_pin_memory".into(), Scalar::Bool(false)),
            ],
        )
        .unwrap();
        assert_eq!(
            out,
            text.replace("steps: 4   #", "steps: 8   #")
                .replace("size: 8", "size: 4")
                .replace("memory: true", "memory: false")
        );
    }

    #[test]
    fn toml_keeps_comments_and_layout() {
        let text = "# trainer\n[train]\nbatch_size = 32 # per device\naccum = 2\n\n[data]\nworkers = 8\npin_memory = true\n";
        let out = apply(
            Format::Toml,
            text,
            &[
                ("train.batch_size".into(), Scalar::Int(16)),
                ("data.pin_memory".into(), Scalar::Bool(false)),
            ],
        )
        .unwrap();
        assert_eq!(
            out,
            text.replace("= 32 #", "= 16 #")
                .replace("= true", "= false")
        );
    }

    #[test]
    fn unparsable_files_are_refused() {
        assert!(
            apply(
                Format::Json,
                "{\"a\": 1,,}",
                &[("a".into(), Scalar::Int(2))]
            )
            .is_err()
        );
        assert!(
            apply(
                Format::Yaml,
                "a: [1, 2\nb: 3\n",
                &[("b".into(), Scalar::Int(2))]
            )
            .is_err()
        );
        assert!(apply(Format::Toml, "a = = 1", &[("a".into(), Scalar::Int(2))]).is_err());
    }
}
