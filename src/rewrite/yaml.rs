//! YAML: block mappings edited line by line (the value's own span, comments kept); the whole document is
//! parsed with yaml-rust2 to read values and to check every edit.

use yaml_rust2::{Yaml, YamlLoader};

use super::{Leaves, Scalar};

fn flatten(prefix: &str, y: &Yaml, out: &mut Leaves) {
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_owned()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match y {
        Yaml::Hash(h) => {
            for (k, v) in h {
                let key = match k {
                    Yaml::String(s) => s.clone(),
                    Yaml::Integer(i) => i.to_string(),
                    Yaml::Boolean(b) => b.to_string(),
                    _ => continue,
                };
                flatten(&join(&key), v, out);
            }
        }
        Yaml::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| flatten(&join(&i.to_string()), v, out)),
        Yaml::Integer(i) => {
            out.insert(prefix.to_owned(), Scalar::Int(*i));
        }
        Yaml::Real(r) => {
            out.insert(
                prefix.to_owned(),
                r.parse()
                    .map(Scalar::Float)
                    .unwrap_or_else(|_| Scalar::Str(r.clone())),
            );
        }
        Yaml::Boolean(b) => {
            out.insert(prefix.to_owned(), Scalar::Bool(*b));
        }
        Yaml::String(s) => {
            out.insert(prefix.to_owned(), Scalar::Str(s.clone()));
        }
        Yaml::Null => {
            out.insert(prefix.to_owned(), Scalar::Str("null".into()));
        }
        _ => {}
    }
}

pub fn leaves(text: &str) -> Result<Leaves, String> {
    let docs = YamlLoader::load_from_str(text).map_err(|e| format!("not valid YAML: {e}"))?;
    let mut out = Leaves::new();
    if let Some(d) = docs.first() {
        flatten("", d, &mut out);
    }
    Ok(out)
}

/// The byte range of the plain scalar after `key:` on the line at `path`, found by indentation.
fn locate(text: &str, path: &str) -> Option<(usize, usize)> {
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let body = line.trim_end_matches(['\n', '\r']);
        let trimmed = body.trim_start();
        let indent = body.len() - trimmed.len();
        if !trimmed.is_empty() && !trimmed.starts_with('#') && !trimmed.starts_with('-') {
            while stack.last().is_some_and(|(i, _)| *i >= indent) {
                stack.pop();
            }
            if let Some(colon) = trimmed.find(':') {
                let key = trimmed[..colon]
                    .trim()
                    .trim_matches(|c| c == '"' || c == '\'')
                    .to_owned();
                let full: Vec<&str> = stack
                    .iter()
                    .map(|(_, k)| k.as_str())
                    .chain([key.as_str()])
                    .collect();
                let rest = &trimmed[colon + 1..];
                if full.join(".") == path {
                    let vstart = rest.len() - rest.trim_start().len();
                    let value = &rest[vstart..];
                    let end = value.find(" #").unwrap_or(value.len());
                    let v = value[..end].trim_end();
                    if v.is_empty() || v.starts_with(['[', '{', '|', '>', '&', '*', '!']) {
                        return None;
                    }
                    let a = offset + indent + colon + 1 + vstart;
                    return Some((a, a + v.len()));
                }
                stack.push((indent, key));
            }
        }
        offset += line.len();
    }
    None
}

pub fn set(text: &str, path: &str, value: &Scalar) -> Result<String, String> {
    let (a, b) = locate(text, path)
        .ok_or_else(|| format!("`{path}` is not a plain value on its own line; edit it by hand"))?;
    let new = match value {
        Scalar::Str(s) => format!("{s:?}"),
        other => other.to_string(),
    };
    Ok(format!("{}{new}{}", &text[..a], &text[b..]))
}
