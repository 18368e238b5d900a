//! TOML: parsed by toml_edit with spans; an edit replaces the value's own span.

use toml_edit::{Item, Table, Value};

use super::Scalar;
use super::doc::{Doc, MAX_DEPTH, MAX_NODES, Node, TOP};
use super::error::ContentError;

struct Walk {
    doc: Doc,
}

impl Walk {
    fn node(
        &mut self,
        parent: u32,
        key: &str,
        value: Option<Scalar>,
        span: Option<(usize, usize)>,
    ) -> Result<u32, ContentError> {
        self.doc.push(Node {
            parent,
            key: key.to_owned(),
            value,
            span,
        })
    }

    fn table(&mut self, me: u32, t: &Table, depth: usize) -> Result<(), ContentError> {
        for (k, item) in t.iter() {
            self.item(me, k, item, depth + 1)?;
        }
        Ok(())
    }

    fn item(
        &mut self,
        parent: u32,
        key: &str,
        item: &Item,
        depth: usize,
    ) -> Result<(), ContentError> {
        if depth > MAX_DEPTH {
            return Err(ContentError::TooDeep);
        }
        match item {
            Item::None => Ok(()),
            Item::Table(t) => {
                let me = self.node(parent, key, None, None)?;
                self.table(me, t, depth)
            }
            Item::ArrayOfTables(a) => {
                let me = self.node(parent, key, None, None)?;
                for (i, t) in a.iter().enumerate() {
                    let each = self.node(me, &i.to_string(), None, None)?;
                    self.table(each, t, depth + 1)?;
                }
                Ok(())
            }
            Item::Value(v) => self.value(parent, key, v, depth),
        }
    }

    fn value(
        &mut self,
        parent: u32,
        key: &str,
        v: &Value,
        depth: usize,
    ) -> Result<(), ContentError> {
        if depth > MAX_DEPTH {
            return Err(ContentError::TooDeep);
        }
        let scalar = match v {
            Value::Boolean(b) => Scalar::Bool(*b.value()),
            Value::Integer(i) => Scalar::Int(*i.value()),
            Value::Float(f) => Scalar::Float(*f.value()),
            Value::String(s) => Scalar::Str(s.value().clone()),
            Value::Datetime(d) => Scalar::Str(d.value().to_string()),
            Value::Array(a) => {
                let me = self.node(parent, key, None, None)?;
                for (i, v) in a.iter().enumerate() {
                    self.value(me, &i.to_string(), v, depth + 1)?;
                }
                return Ok(());
            }
            Value::InlineTable(t) => {
                let me = self.node(parent, key, None, None)?;
                for (k, v) in t.iter() {
                    self.value(me, k, v, depth + 1)?;
                }
                return Ok(());
            }
        };
        // Dates keep their own syntax: not edited in place.
        let span = match v {
            Value::Datetime(_) => None,
            _ => v.span().map(|r| (r.start, r.end)),
        };
        self.node(parent, key, Some(scalar), span)?;
        Ok(())
    }
}

pub fn parse(text: &str) -> Result<Doc, ContentError> {
    // Every value follows `=`, `,` or `[`, and a key path's parts are split by `.`: a bound on what
    // toml_edit would build, checked before it builds anything.
    let marks = text
        .bytes()
        .filter(|b| matches!(b, b'=' | b',' | b'[' | b'{' | b'.'))
        .count();
    if marks > 4 * MAX_NODES {
        return Err(ContentError::TooManyValues {
            through_aliases: false,
        });
    }
    let doc = toml_edit::Document::parse(text).map_err(|e| {
        let message = e.message().trim_end();
        ContentError::Syntax {
            format: super::Format::Toml,
            // Where: the line of the span toml_edit points at.
            reason: match e.span() {
                Some(r) => {
                    let line = text.get(..r.start).map_or(0, |t| t.matches('\n').count()) + 1;
                    format!("line {line}: {message}")
                }
                None => message.to_owned(),
            },
        }
    })?;
    let mut w = Walk {
        doc: Doc::default(),
    };
    w.table(TOP, doc.as_table(), 0)?;
    Ok(w.doc)
}

/// The TOML text of a value.
pub fn render(value: &Scalar) -> Result<String, ContentError> {
    Ok(match value {
        Scalar::Bool(b) => b.to_string(),
        Scalar::Int(i) => i.to_string(),
        Scalar::Float(f) => super::doc::float_text(*f)?,
        Scalar::Str(s) => Value::from(s.as_str()).decorated("", "").to_string(),
    })
}

/// Parses a value's text on its own (to check a span).
pub fn scalar(text: &str) -> Option<Scalar> {
    let doc = parse(&format!("v = {text}")).ok()?;
    match doc.nodes.as_slice() {
        [n] if n.key == "v" => n.value.clone(),
        _ => None,
    }
}
