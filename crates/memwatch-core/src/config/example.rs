//! The documented example configuration, rendered from the defaults and [`DOCS`](super::DOCS).

use std::fmt::Write as _;

use super::{Config, docs};

/// Why the example configuration cannot be rendered: the defaults and [`DOCS`](super::DOCS) disagree.
#[derive(Debug, thiserror::Error)]
pub enum ExampleError {
    /// A setting with no text in [`DOCS`](super::DOCS).
    #[error(
        "setting `{0}` has no documentation in config::DOCS (a resource's table: config::policy::RESOURCE_DOCS)"
    )]
    Undocumented(String),
    /// A text in [`DOCS`](super::DOCS) for a key that is not a setting.
    #[error("config::DOCS or RESOURCE_DOCS documents `{0}`, which is not a setting")]
    Stale(String),
    /// The defaults do not serialize as TOML.
    #[error("the defaults as TOML: {0}")]
    Serialize(#[from] toml::ser::Error),
}

fn doc(key: &str) -> Result<&'static str, ExampleError> {
    let generic = match key.split('.').collect::<Vec<_>>().as_slice() {
        ["policy", _, field] => format!("policy.*.{field}"),
        _ => String::new(),
    };
    docs::every()
        .find(|(k, _)| *k == key)
        .or_else(|| docs::every().find(|(k, _)| *k == generic))
        .map(|(_, d)| *d)
        .ok_or_else(|| ExampleError::Undocumented(key.to_owned()))
}

fn comment(out: &mut String, text: &str) {
    for line in text.lines() {
        let _ = writeln!(out, "# {line}");
    }
}

/// Renders the example configuration from the defaults and [`DOCS`](super::DOCS). Fails if a setting is undocumented
/// or a documented key no longer exists.
pub fn example_toml() -> Result<String, ExampleError> {
    let defaults = Config::default();
    let table = toml::Table::try_from(&defaults)?;
    // Settings unset by default, shown commented out with the value they then take.
    let unset = [(
        "control.runtime_dir",
        toml::Value::String(defaults.control.runtime_dir().display().to_string()),
    )];
    let mut out = String::from(
        "# memwatch configuration. Every setting is shown with its default value.\n\
         # Default location: /etc/memwatch/memwatch.toml (or pass --config PATH).\n\
         # This file is generated from the defaults by `memwatch config example`.\n",
    );
    let mut seen = Vec::new();
    emit(&mut out, "", &table, &unset, &mut seen)?;
    let used = |k: &str| {
        seen.iter()
            .any(|s| s == k || (k.starts_with("policy.*.") && s.ends_with(&k[8..])))
    };
    if let Some((stale, _)) = docs::every().find(|(k, _)| !used(k)) {
        return Err(ExampleError::Stale((*stale).to_owned()));
    }
    Ok(out)
}

/// Writes `table`'s plain keys, then each sub-table under its `[header]`, recursively.
fn emit(
    out: &mut String,
    prefix: &str,
    table: &toml::Table,
    unset: &[(&str, toml::Value)],
    seen: &mut Vec<String>,
) -> Result<(), ExampleError> {
    let dotted = |k: &str| {
        if prefix.is_empty() {
            k.to_owned()
        } else {
            format!("{prefix}.{k}")
        }
    };
    for (key, value) in table.iter().filter(|(_, v)| !v.is_table()) {
        let name = dotted(key);
        if prefix.is_empty() {
            out.push('\n');
        }
        comment(out, doc(&name)?);
        let _ = writeln!(out, "{key} = {value}");
        seen.push(name);
    }
    for (name, value) in unset {
        let Some(key) = name.strip_prefix(prefix).and_then(|k| k.strip_prefix('.')) else {
            continue;
        };
        if prefix.is_empty() || key.contains('.') {
            continue;
        }
        comment(out, doc(name)?);
        let _ = writeln!(out, "# {key} = {value}");
        seen.push((*name).to_owned());
    }
    for (key, value) in table.iter() {
        let Some(inner) = value.as_table() else {
            continue;
        };
        let name = dotted(key);
        out.push('\n');
        comment(out, doc(&name)?);
        let _ = writeln!(out, "[{name}]");
        seen.push(name.clone());
        emit(out, &name, inner, unset, seen)?;
    }
    Ok(())
}
