//! A parsed config as a flat list of nodes in document order, each with its key, its parent and (for
//! scalars) the byte span of its text. The three formats produce it; edits, lookups and the check that
//! nothing else changed work on it alone.

use super::Scalar;
use super::error::ContentError;

/// At most this many nodes (values and containers, alias copies included) per document. Training
/// configs hold hundreds; the bound keeps a hostile file (a YAML alias bomb, a million-element list)
/// from costing more than a few MiB to read.
pub const MAX_NODES: usize = 100_000;
/// At most this deep.
pub const MAX_DEPTH: usize = 128;

/// No parent: a top-level node.
pub const TOP: u32 = u32::MAX;

/// One key or list item of a parsed document.
#[derive(Debug, Clone)]
pub struct Node {
    /// Its parent's index, or `TOP`.
    pub parent: u32,
    /// The key in its mapping, or the index in its list.
    pub key: String,
    /// The value, for a scalar; `None` for a mapping or a list.
    pub value: Option<Scalar>,
    /// Where the scalar's own text is, when it can be replaced in place.
    pub span: Option<(usize, usize)>,
}

/// The document's nodes, in order.
#[derive(Debug, Clone, Default)]
pub struct Doc {
    /// Every node, in document order.
    pub nodes: Vec<Node>,
}

impl Doc {
    /// Adds a node, within the bounds.
    pub fn push(&mut self, node: Node) -> Result<u32, ContentError> {
        if self.nodes.len() >= MAX_NODES {
            return Err(ContentError::TooManyValues {
                through_aliases: false,
            });
        }
        self.nodes.push(node);
        Ok((self.nodes.len() - 1) as u32)
    }

    /// Whether node `i` sits at the dotted `path`.
    fn at_path(&self, i: usize, path: &str) -> bool {
        let mut rest = path;
        let mut i = i as u32;
        loop {
            let node = &self.nodes[i as usize];
            let Some(head) = rest.strip_suffix(node.key.as_str()) else {
                return false;
            };
            if node.parent == TOP {
                return head.is_empty();
            }
            let Some(head) = head.strip_suffix('.') else {
                return false;
            };
            rest = head;
            i = node.parent;
        }
    }

    /// The one node at the dotted `path`: `Ok(None)` when there is none, an error when the path is
    /// ambiguous (a key that holds a dot, duplicate keys, `1` and `"1"`, …).
    pub fn find(&self, path: &str) -> Result<Option<usize>, ContentError> {
        let mut hits = (0..self.nodes.len()).filter(|&i| self.at_path(i, path));
        let first = hits.next();
        if first.is_some() && hits.next().is_some() {
            return Err(ContentError::Ambiguous { path: path.into() });
        }
        if let Some(hit) = first {
            // A duplicated key anywhere on the way makes the entry one that parsers may not read
            // (most keep the last of duplicates): the edit could land where nothing looks.
            let mut i = hit as u32;
            while i != TOP {
                let node = &self.nodes[i as usize];
                if self
                    .nodes
                    .iter()
                    .enumerate()
                    .any(|(j, n)| j != i as usize && n.parent == node.parent && n.key == node.key)
                {
                    return Err(ContentError::DuplicateKey {
                        path: path.into(),
                        key: self.dotted(i as usize),
                    });
                }
                i = node.parent;
            }
        }
        Ok(first)
    }

    /// The scalar at `path`, if there is exactly one.
    pub fn get(&self, path: &str) -> Result<Option<Scalar>, ContentError> {
        Ok(self.find(path)?.and_then(|i| self.nodes[i].value.clone()))
    }

    /// Checks that `after` is this document with exactly the nodes `edited` changed, to their new
    /// values, and nothing else.
    pub fn check_edit(&self, after: &Doc, edited: &[(usize, Scalar)]) -> Result<(), ContentError> {
        if after.nodes.len() != self.nodes.len() {
            return Err(ContentError::StructureChanged {
                before: self.nodes.len(),
                after: after.nodes.len(),
            });
        }
        for (i, (a, b)) in self.nodes.iter().zip(&after.nodes).enumerate() {
            let expected = edited
                .iter()
                .find(|(e, _)| *e == i)
                .map(|(_, v)| Some(v))
                .unwrap_or(a.value.as_ref());
            let same_value = match (expected, &b.value) {
                (Some(x), Some(y)) => same(x, y),
                (None, None) => true,
                _ => false,
            };
            if a.parent != b.parent || a.key != b.key || !same_value {
                return Err(ContentError::AlsoChanges {
                    path: self.dotted(i),
                });
            }
        }
        Ok(())
    }

    /// Node `i`'s dotted path.
    pub fn dotted(&self, i: usize) -> String {
        let mut keys = Vec::new();
        let mut i = i as u32;
        while i != TOP {
            let n = &self.nodes[i as usize];
            keys.push(n.key.as_str());
            i = n.parent;
        }
        keys.reverse();
        keys.join(".")
    }
}

/// Equal values; floats by bits, so that NaN equals NaN and 0.0 differs from -0.0.
pub fn same(a: &Scalar, b: &Scalar) -> bool {
    match (a, b) {
        (Scalar::Float(x), Scalar::Float(y)) => {
            x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
        }
        _ => a == b,
    }
}

/// A float as text that every format reads back as a float: `2.0`, `1.0e-5`.
pub fn float_text(f: f64) -> Result<String, ContentError> {
    if !f.is_finite() {
        return Err(ContentError::NotFinite(f));
    }
    let s = format!("{f:?}");
    Ok(if s.contains('.') {
        s
    } else if let Some(e) = s.find('e') {
        format!("{}.0{}", &s[..e], &s[e..])
    } else {
        format!("{s}.0")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_keep_a_point() {
        assert_eq!(float_text(2.0).unwrap(), "2.0");
        assert_eq!(float_text(0.0003).unwrap(), "0.0003");
        assert_eq!(float_text(1e-7).unwrap(), "1.0e-7");
        assert_eq!(float_text(1.5e300).unwrap(), "1.5e300");
        assert!(float_text(f64::NAN).is_err());
    }
}
