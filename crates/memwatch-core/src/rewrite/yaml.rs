//! YAML: read from yaml-rust2's event stream into a bounded [`Doc`].
//!
//! yaml-rust2's own loader expands aliases without limit (a 502-byte "billion laughs" file takes
//! gigabytes); here every alias copy counts against [`MAX_NODES`](super::doc::MAX_NODES), so a bomb
//! is refused after a few MiB. Each scalar's span is found from the parser's start mark; an edit
//! replaces that span only, and the span is checked before use.

use std::collections::HashMap;

use yaml_rust2::Yaml;
use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use super::doc::{Doc, MAX_DEPTH, Node, TOP};
use super::error::ContentError;
use super::{Format, Scalar};

enum Frame {
    Map {
        node: u32,
        key: Option<String>,
        flow: bool,
        anchor: usize,
        start: usize,
    },
    Seq {
        node: u32,
        n: usize,
        flow: bool,
        anchor: usize,
        start: usize,
    },
}

impl Frame {
    fn flow(&self) -> bool {
        match self {
            Frame::Map { flow, .. } | Frame::Seq { flow, .. } => *flow,
        }
    }
}

/// Converts the parser's character offsets to byte offsets, walking forward.
struct Offsets<'a> {
    text: &'a str,
    ascii: bool,
    chars: usize,
    bytes: usize,
}

impl Offsets<'_> {
    fn byte(&mut self, chars: usize) -> usize {
        if self.ascii {
            return chars.min(self.text.len());
        }
        if chars < self.chars {
            (self.chars, self.bytes) = (0, 0);
        }
        for c in self.text[self.bytes..].chars() {
            if self.chars == chars {
                break;
            }
            self.chars += 1;
            self.bytes += c.len_utf8();
        }
        self.bytes
    }
}

struct Receiver<'a> {
    doc: Doc,
    stack: Vec<Frame>,
    /// Anchor id → the range of nodes it defined.
    anchors: HashMap<usize, (usize, usize)>,
    offsets: Offsets<'a>,
    documents: usize,
    root_done: bool,
    error: Option<ContentError>,
}

fn value_of(v: &str, style: TScalarStyle) -> Scalar {
    if style != TScalarStyle::Plain {
        return Scalar::Str(v.to_owned());
    }
    match Yaml::from_str(v) {
        Yaml::Integer(i) => Scalar::Int(i),
        y @ Yaml::Real(_) => y
            .as_f64()
            .map(Scalar::Float)
            .unwrap_or_else(|| Scalar::Str(v.to_owned())),
        Yaml::Boolean(b) => Scalar::Bool(b),
        Yaml::Null => Scalar::Str("null".into()),
        _ => Scalar::Str(v.to_owned()),
    }
}

/// The byte span of a one-line scalar starting at `at`, or `None` where it cannot be edited in place.
fn span_of(
    text: &str,
    at: usize,
    v: &str,
    style: TScalarStyle,
    flow: bool,
) -> Option<(usize, usize)> {
    let rest = text.get(at..)?;
    let line = &rest[..rest.find('\n').unwrap_or(rest.len())];
    let b = line.as_bytes();
    let end = match style {
        TScalarStyle::Plain => {
            let mut end = line.len();
            for (i, w) in b.windows(2).enumerate() {
                if matches!(w[0], b' ' | b'\t') && w[1] == b'#' {
                    end = end.min(i);
                    break;
                }
            }
            if flow {
                end = end.min(line.find([',', ']', '}']).unwrap_or(line.len()));
            }
            let raw = line[..end].trim_end_matches([' ', '\t', '\r']);
            if raw != v {
                return None;
            }
            raw.len()
        }
        TScalarStyle::DoubleQuoted | TScalarStyle::SingleQuoted => {
            let q = if style == TScalarStyle::DoubleQuoted {
                b'"'
            } else {
                b'\''
            };
            if b.first() != Some(&q) {
                return None;
            }
            let mut i = 1;
            loop {
                match b.get(i)? {
                    b'\\' if q == b'"' => i += 2,
                    c if *c == q => {
                        if q == b'\'' && b.get(i + 1) == Some(&b'\'') {
                            i += 2;
                        } else {
                            break i + 1;
                        }
                    }
                    _ => i += 1,
                }
            }
        }
        TScalarStyle::Literal | TScalarStyle::Folded => return None,
    };
    Some((at, at + end))
}

impl Receiver<'_> {
    fn depth_ok(&self) -> Result<(), ContentError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(ContentError::TooDeep);
        }
        Ok(())
    }

    /// Where the next node goes: its parent and key; `None` when the event is a mapping key.
    fn place(&mut self) -> Option<(u32, String)> {
        match self.stack.last_mut() {
            None => Some((TOP, String::new())),
            Some(Frame::Map { node, key, .. }) => key.take().map(|k| (*node, k)),
            Some(Frame::Seq { node, n, .. }) => {
                *n += 1;
                Some((*node, (*n - 1).to_string()))
            }
        }
    }

    fn set_key(&mut self, k: String) {
        if let Some(Frame::Map { key, .. }) = self.stack.last_mut() {
            *key = Some(k);
        }
    }

    fn container(&mut self, anchor: usize, mark: Marker, map: bool) -> Result<(), ContentError> {
        self.depth_ok()?;
        let Some((parent, key)) = self.place() else {
            return Err(ContentError::ComplexKey);
        };
        let start = self.doc.nodes.len();
        let node = if parent == TOP && !self.root_done {
            self.root_done = true;
            TOP
        } else {
            self.doc.push(Node {
                parent,
                key,
                value: None,
                span: None,
            })?
        };
        let at = self.offsets.byte(mark.index());
        let opens_flow = matches!(self.offsets.text.as_bytes().get(at), Some(b'[' | b'{'));
        let flow = opens_flow || self.stack.last().is_some_and(Frame::flow);
        self.stack.push(if map {
            Frame::Map {
                node,
                key: None,
                flow,
                anchor,
                start,
            }
        } else {
            Frame::Seq {
                node,
                n: 0,
                flow,
                anchor,
                start,
            }
        });
        Ok(())
    }

    fn end(&mut self) {
        if let Some(Frame::Map { anchor, start, .. } | Frame::Seq { anchor, start, .. }) =
            self.stack.pop()
            && anchor != 0
        {
            self.anchors.insert(anchor, (start, self.doc.nodes.len()));
        }
    }

    fn scalar(
        &mut self,
        v: String,
        style: TScalarStyle,
        anchor: usize,
        tagged: bool,
        mark: Marker,
    ) -> Result<(), ContentError> {
        let Some((parent, key)) = self.place() else {
            self.set_key(v);
            return Ok(());
        };
        self.root_done = true;
        let at = self.offsets.byte(mark.index());
        let flow = self.stack.last().is_some_and(Frame::flow);
        let span = if tagged || anchor != 0 {
            None
        } else {
            span_of(self.offsets.text, at, &v, style, flow)
        };
        let value = if tagged {
            Scalar::Str(v)
        } else {
            value_of(&v, style)
        };
        let i = self.doc.push(Node {
            parent,
            key,
            value: Some(value),
            span,
        })? as usize;
        if anchor != 0 {
            self.anchors.insert(anchor, (i, i + 1));
        }
        Ok(())
    }

    fn alias(&mut self, id: usize) -> Result<(), ContentError> {
        let &(s, e) = self.anchors.get(&id).ok_or(ContentError::UndefinedAlias)?;
        let Some((parent, key)) = self.place() else {
            self.set_key("\0alias".into());
            return Ok(());
        };
        self.root_done = true;
        let base = self.doc.nodes.len();
        for j in s..e {
            let n = &self.doc.nodes[j];
            let copy = if j == s {
                Node {
                    parent,
                    key: key.clone(),
                    value: n.value.clone(),
                    span: None,
                }
            } else {
                Node {
                    // Inside the copied range every parent is a node of the range.
                    parent: if (n.parent as usize) >= s && (n.parent as usize) < e {
                        (n.parent as usize - s + base) as u32
                    } else {
                        parent
                    },
                    key: n.key.clone(),
                    value: n.value.clone(),
                    span: None,
                }
            };
            self.doc.push(copy).map_err(|e| match e {
                ContentError::TooManyValues { .. } => ContentError::TooManyValues {
                    through_aliases: true,
                },
                e => e,
            })?;
        }
        Ok(())
    }

    fn on(&mut self, ev: Event, mark: Marker) -> Result<(), ContentError> {
        match ev {
            Event::DocumentStart => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(ContentError::SeveralDocuments);
                }
            }
            Event::MappingStart(anchor, _) => self.container(anchor, mark, true)?,
            Event::SequenceStart(anchor, _) => self.container(anchor, mark, false)?,
            Event::MappingEnd | Event::SequenceEnd => self.end(),
            Event::Scalar(v, style, anchor, tag) => {
                self.scalar(v, style, anchor, tag.is_some(), mark)?
            }
            Event::Alias(id) => self.alias(id)?,
            _ => {}
        }
        Ok(())
    }
}

impl MarkedEventReceiver for Receiver<'_> {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.error.is_none()
            && let Err(e) = self.on(ev, mark)
        {
            self.error = Some(e);
        }
    }
}

pub fn parse(text: &str) -> Result<Doc, ContentError> {
    let mut r = Receiver {
        doc: Doc::default(),
        stack: Vec::new(),
        anchors: HashMap::new(),
        offsets: Offsets {
            text,
            ascii: text.is_ascii(),
            chars: 0,
            bytes: 0,
        },
        documents: 0,
        root_done: false,
        error: None,
    };
    let mut parser = Parser::new_from_str(text);
    // After the first error the receiver builds nothing more; the parser only scans the rest.
    let result = parser.load(&mut r, true);
    if let Some(e) = r.error {
        return Err(ContentError::NotAccepted {
            format: Format::Yaml,
            why: Box::new(e),
        });
    }
    result.map_err(|e| ContentError::Syntax {
        format: Format::Yaml,
        reason: e.to_string(),
    })?;
    Ok(r.doc)
}

/// The YAML text of a value (strings double-quoted, with JSON's escapes, which YAML shares).
pub fn render(value: &Scalar) -> Result<String, ContentError> {
    super::json::render(value)
}

/// Parses a value's text on its own (to check a span).
pub fn scalar(text: &str) -> Option<Scalar> {
    let doc = parse(text).ok()?;
    match doc.nodes.as_slice() {
        [n] if n.parent == TOP => n.value.clone(),
        _ => None,
    }
}
