//! JSON: a small scanner that finds each value's byte span by path, so an edit replaces only that span.

use super::{Leaves, Scalar};

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

fn flatten(prefix: &str, v: &serde_json::Value, out: &mut Leaves) {
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_owned()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match v {
        serde_json::Value::Object(m) => m.iter().for_each(|(k, v)| flatten(&join(k), v, out)),
        serde_json::Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| flatten(&join(&i.to_string()), v, out)),
        leaf => {
            if let Some(s) = to_scalar(leaf) {
                out.insert(prefix.to_owned(), s);
            }
        }
    }
}

pub fn leaves(text: &str) -> Result<Leaves, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let mut out = Leaves::new();
    flatten("", &v, &mut out);
    Ok(out)
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
}

impl Scanner<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && self.b[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn string(&mut self) -> Result<String, String> {
        let start = self.i;
        self.i += 1;
        while self.i < self.b.len() {
            match self.b[self.i] {
                b'\\' => self.i += 2,
                b'"' => {
                    self.i += 1;
                    let raw =
                        std::str::from_utf8(&self.b[start..self.i]).map_err(|e| e.to_string())?;
                    return serde_json::from_str(raw).map_err(|e| e.to_string());
                }
                _ => self.i += 1,
            }
        }
        Err("unterminated string".into())
    }
    /// Skips one value, returning its span; records the span of `target` when found.
    fn value(
        &mut self,
        path: &str,
        target: &str,
        found: &mut Option<(usize, usize)>,
    ) -> Result<(), String> {
        self.ws();
        let start = self.i;
        match self.b.get(self.i) {
            Some(b'{') => {
                self.i += 1;
                loop {
                    self.ws();
                    match self.b.get(self.i) {
                        Some(b'}') => {
                            self.i += 1;
                            break;
                        }
                        Some(b',') => self.i += 1,
                        Some(b'"') => {
                            let key = self.string()?;
                            self.ws();
                            if self.b.get(self.i) != Some(&b':') {
                                return Err("expected `:`".into());
                            }
                            self.i += 1;
                            let p = if path.is_empty() {
                                key
                            } else {
                                format!("{path}.{key}")
                            };
                            self.value(&p, target, found)?;
                        }
                        _ => return Err("bad object".into()),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut n = 0;
                loop {
                    self.ws();
                    match self.b.get(self.i) {
                        Some(b']') => {
                            self.i += 1;
                            break;
                        }
                        Some(b',') => self.i += 1,
                        Some(_) => {
                            let p = if path.is_empty() {
                                n.to_string()
                            } else {
                                format!("{path}.{n}")
                            };
                            self.value(&p, target, found)?;
                            n += 1;
                        }
                        None => return Err("unterminated array".into()),
                    }
                }
            }
            Some(b'"') => {
                self.string()?;
            }
            Some(_) => {
                while self.i < self.b.len()
                    && !matches!(self.b[self.i], b',' | b'}' | b']')
                    && !self.b[self.i].is_ascii_whitespace()
                {
                    self.i += 1;
                }
            }
            None => return Err("unexpected end".into()),
        }
        if path == target {
            *found = Some((start, self.i));
        }
        Ok(())
    }
}

pub fn set(text: &str, path: &str, value: &Scalar) -> Result<String, String> {
    let mut s = Scanner {
        b: text.as_bytes(),
        i: 0,
    };
    let mut found = None;
    s.value("", path, &mut found)?;
    let (a, b) = found.ok_or_else(|| format!("key `{path}` not found"))?;
    let new = match value {
        Scalar::Str(x) => serde_json::to_string(x).map_err(|e| e.to_string())?,
        other => other.to_string(),
    };
    Ok(format!("{}{new}{}", &text[..a], &text[b..]))
}
