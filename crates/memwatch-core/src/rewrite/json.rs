//! JSON: validated by serde_json (which bounds the nesting), then scanned once for every value's byte
//! span, so that an edit replaces only that span.

use super::doc::{Doc, MAX_DEPTH, Node, TOP};
use super::error::ContentError;
use super::{Format, Scalar};

fn syntax(e: serde_json::Error) -> ContentError {
    ContentError::Syntax {
        format: Format::Json,
        reason: e.to_string(),
    }
}

fn to_scalar(v: &serde_json::Value) -> Option<Scalar> {
    match v {
        serde_json::Value::Bool(b) => Some(Scalar::Bool(*b)),
        serde_json::Value::Number(n) => n
            .as_i64()
            .map(Scalar::Int)
            .or_else(|| n.as_f64().map(Scalar::Float)),
        serde_json::Value::String(s) => Some(Scalar::Str(s.clone())),
        serde_json::Value::Null => Some(Scalar::Str("null".into())),
        _ => None,
    }
}

pub fn parse(text: &str) -> Result<Doc, ContentError> {
    // Syntax first, without building anything.
    serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(syntax)?;
    let mut s = Scanner {
        b: text.as_bytes(),
        text,
        i: 0,
        doc: Doc::default(),
        rooted: false,
    };
    s.value(TOP, String::new(), 0)?;
    Ok(s.doc)
}

struct Scanner<'a> {
    b: &'a [u8],
    text: &'a str,
    i: usize,
    doc: Doc,
    /// The top-level mapping or list is not a node: its entries are top-level.
    rooted: bool,
}

impl Scanner<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }
    fn string(&mut self) -> Result<String, ContentError> {
        let start = self.i;
        self.i += 1;
        while self.i < self.b.len() {
            match self.b[self.i] {
                b'\\' => self.i += 2,
                b'"' => {
                    self.i += 1;
                    return serde_json::from_str(&self.text[start..self.i]).map_err(syntax);
                }
                _ => self.i += 1,
            }
        }
        Err(ContentError::Scan("unterminated string"))
    }
    fn container(&mut self, parent: u32, key: String) -> Result<u32, ContentError> {
        if !self.rooted {
            self.rooted = true;
            return Ok(TOP);
        }
        self.doc.push(Node {
            parent,
            key,
            value: None,
            span: None,
        })
    }
    /// One value (already validated by serde_json) with everything inside it.
    fn value(&mut self, parent: u32, key: String, depth: usize) -> Result<(), ContentError> {
        if depth > MAX_DEPTH {
            return Err(ContentError::TooDeep);
        }
        self.ws();
        let start = self.i;
        match self.b.get(self.i) {
            Some(b'{') => {
                let me = self.container(parent, key)?;
                self.i += 1;
                loop {
                    self.ws();
                    match self.b.get(self.i) {
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(());
                        }
                        Some(b',') => self.i += 1,
                        Some(b'"') => {
                            let k = self.string()?;
                            self.ws();
                            if self.b.get(self.i) != Some(&b':') {
                                return Err(ContentError::Scan("expected `:`"));
                            }
                            self.i += 1;
                            self.value(me, k, depth + 1)?;
                        }
                        _ => return Err(ContentError::Scan("bad object")),
                    }
                }
            }
            Some(b'[') => {
                let me = self.container(parent, key)?;
                self.i += 1;
                let mut n = 0usize;
                loop {
                    self.ws();
                    match self.b.get(self.i) {
                        Some(b']') => {
                            self.i += 1;
                            return Ok(());
                        }
                        Some(b',') => self.i += 1,
                        Some(_) => {
                            self.value(me, n.to_string(), depth + 1)?;
                            n += 1;
                        }
                        None => return Err(ContentError::Scan("unterminated array")),
                    }
                }
            }
            Some(b'"') => {
                let s = self.string()?;
                self.doc.push(Node {
                    parent,
                    key,
                    value: Some(Scalar::Str(s)),
                    span: Some((start, self.i)),
                })?;
                Ok(())
            }
            Some(_) => {
                while self.i < self.b.len()
                    && !matches!(
                        self.b[self.i],
                        b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'
                    )
                {
                    self.i += 1;
                }
                let v: serde_json::Value =
                    serde_json::from_str(&self.text[start..self.i]).map_err(syntax)?;
                self.doc.push(Node {
                    parent,
                    key,
                    value: to_scalar(&v),
                    span: Some((start, self.i)),
                })?;
                Ok(())
            }
            None => Err(ContentError::Scan("unexpected end")),
        }
    }
}

/// The JSON text of a value.
pub fn render(value: &Scalar) -> Result<String, ContentError> {
    match value {
        Scalar::Str(x) => serde_json::to_string(x).map_err(|e| ContentError::Unwritable {
            format: Format::Json,
            value: value.to_string(),
            reason: e.to_string(),
        }),
        Scalar::Float(f) => super::doc::float_text(*f),
        other => Ok(other.to_string()),
    }
}

/// Parses a value's text on its own (to check a span).
pub fn scalar(text: &str) -> Option<Scalar> {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .as_ref()
        .and_then(to_scalar)
}
