//! TOML through toml_edit, which keeps comments and formatting.

use toml_edit::{DocumentMut, Item, Value};

use super::{Leaves, Scalar};

fn flatten(prefix: &str, item: &Item, out: &mut Leaves) {
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_owned()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match item {
        Item::Table(t) => t.iter().for_each(|(k, v)| flatten(&join(k), v, out)),
        Item::ArrayOfTables(a) => a.iter().enumerate().for_each(|(i, t)| {
            t.iter()
                .for_each(|(k, v)| flatten(&format!("{}.{k}", join(&i.to_string())), v, out))
        }),
        Item::Value(v) => value(prefix, v, out),
        Item::None => {}
    }
}

fn value(prefix: &str, v: &Value, out: &mut Leaves) {
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_owned()
        } else {
            format!("{prefix}.{k}")
        }
    };
    let s = match v {
        Value::Boolean(b) => Scalar::Bool(*b.value()),
        Value::Integer(i) => Scalar::Int(*i.value()),
        Value::Float(f) => Scalar::Float(*f.value()),
        Value::String(s) => Scalar::Str(s.value().clone()),
        Value::Datetime(d) => Scalar::Str(d.value().to_string()),
        Value::Array(a) => {
            return a
                .iter()
                .enumerate()
                .for_each(|(i, v)| value(&join(&i.to_string()), v, out));
        }
        Value::InlineTable(t) => return t.iter().for_each(|(k, v)| value(&join(k), v, out)),
    };
    out.insert(prefix.to_owned(), s);
}

pub fn leaves(text: &str) -> Result<Leaves, String> {
    let doc: DocumentMut = text
        .parse()
        .map_err(|e: toml_edit::TomlError| format!("not valid TOML: {}", e.message()))?;
    let mut out = Leaves::new();
    flatten("", doc.as_item(), &mut out);
    Ok(out)
}

pub fn set(text: &str, path: &str, scalar: &Scalar) -> Result<String, String> {
    let mut doc: DocumentMut = text
        .parse()
        .map_err(|e: toml_edit::TomlError| format!("not valid TOML: {}", e.message()))?;
    let mut item: &mut Item = doc.as_item_mut();
    for key in path.split('.') {
        item = match item {
            Item::Table(t) => t.get_mut(key),
            _ => None,
        }
        .ok_or_else(|| format!("key `{path}` not found (or inside an inline table or array)"))?;
    }
    let Item::Value(v) = item else {
        return Err(format!("`{path}` is a table, not a value"));
    };
    let decor = v.decor().clone();
    *v = match scalar {
        Scalar::Bool(b) => Value::from(*b),
        Scalar::Int(i) => Value::from(*i),
        Scalar::Float(f) => Value::from(*f),
        Scalar::Str(s) => Value::from(s.as_str()),
    };
    *v.decor_mut() = decor;
    Ok(doc.to_string())
}
