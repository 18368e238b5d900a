//! Property run over the JSON, YAML and TOML rewriters: random documents (adversarial keys: dots,
//! `~`, numbers, duplicates; odd strings and extreme numbers) rendered with every value's byte span
//! known, and random edits of one to three paths. For every edit, either a refusal, or:
//! - every byte outside the edited values' spans is identical;
//! - an independent parser (serde_json, yaml-rust2's loader, toml) reads the result as the original
//!   document with exactly the edited values replaced;
//! - a path that names more than one entry, or no value, is always refused.
//!
//! Cases per format: PROPTEST_CASES (default 3 000 here; BENCHMARKS.md reports a longer run).

use memwatch::rewrite::{Format, Scalar, apply};
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3_000)
}

/// A key: its text, and for YAML whether it is written plain (then `~`, `1`, `true` are not strings).
#[derive(Debug, Clone)]
struct Key {
    text: String,
    plain: bool,
}

#[derive(Debug, Clone)]
enum Node {
    Leaf(Scalar),
    List(Vec<Node>),
    Map(Vec<(Key, Node)>),
}

fn scalar() -> impl Strategy<Value = Scalar> {
    prop_oneof![
        any::<bool>().prop_map(Scalar::Bool),
        any::<i64>().prop_map(Scalar::Int),
        (-1000i64..1000).prop_map(Scalar::Int),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Scalar::Float),
        prop_oneof![Just(2.0), Just(0.1), Just(-0.0), Just(1e-7), Just(3e300)]
            .prop_map(Scalar::Float),
        prop_oneof![
            "[a-z]{0,6}",
            "[ -~]{0,8}",
            "\\PC{0,4}",
            Just("null".to_owned()),
            Just("~".to_owned()),
            Just("true".to_owned()),
            Just("1".to_owned()),
            Just("a\nb\t\"q\"\\".to_owned()),
            Just("#x".to_owned()),
        ]
        .prop_map(Scalar::Str),
    ]
}

fn key() -> impl Strategy<Value = Key> {
    (
        prop_oneof![
            Just("a".to_owned()),
            Just("b".to_owned()),
            Just("lr".to_owned()),
            Just("a.b".to_owned()),
            Just("~".to_owned()),
            Just("1".to_owned()),
            Just("true".to_owned()),
            Just("null".to_owned()),
            Just("x y".to_owned()),
            Just("é".to_owned()),
            "[a-c]{1,2}",
        ],
        any::<bool>(),
    )
        .prop_map(|(text, plain)| Key { text, plain })
}

fn tree() -> impl Strategy<Value = Node> {
    let leaf = scalar().prop_map(Node::Leaf);
    leaf.prop_recursive(4, 40, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Node::List),
            prop::collection::vec((key(), inner), 0..5).prop_map(Node::Map),
        ]
    })
}

/// A top-level map.
fn document() -> impl Strategy<Value = Vec<(Key, Node)>> {
    prop::collection::vec((key(), tree()), 1..6)
}

/// A string in double quotes, escaped so that JSON, YAML and TOML all read it back.
fn quoted(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn scalar_text(v: &Scalar) -> String {
    match v {
        Scalar::Bool(b) => b.to_string(),
        Scalar::Int(i) => i.to_string(),
        // `{:?}` keeps a dot or an exponent: 2.0, 1e-7, 3e300.
        Scalar::Float(f) => format!("{f:?}"),
        Scalar::Str(s) => quoted(s),
    }
}

/// One rendered value: its dotted path (as memwatch names it) and its byte span.
#[derive(Debug, Clone)]
struct Leaf {
    path: String,
    keys: Vec<RKey>,
    span: (usize, usize),
    /// A key on its way appears twice among its siblings (by memwatch's name for it).
    duplicated: bool,
}

/// A key as the independent parsers see it.
#[derive(Debug, Clone, PartialEq)]
enum RKey {
    Str(String),
    Index(usize),
    Null,
    Int(i64),
    Bool(bool),
}

fn rkey(format: Format, k: &Key) -> RKey {
    if format == Format::Yaml && k.plain {
        match k.text.as_str() {
            "~" | "null" => return RKey::Null,
            "true" => return RKey::Bool(true),
            t => {
                if let Ok(i) = t.parse() {
                    return RKey::Int(i);
                }
            }
        }
    }
    RKey::Str(k.text.clone())
}

/// Whether a key may be written plain in YAML here (the rest are quoted).
fn plain_ok(k: &Key) -> bool {
    k.plain
        && k.text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '~' || c == '_')
}

struct Render {
    format: Format,
    out: String,
    leaves: Vec<Leaf>,
    /// How many keys on the current path are duplicated among their siblings.
    duplicated: usize,
}

impl Render {
    fn key_text(&self, k: &Key) -> String {
        match self.format {
            Format::Yaml if plain_ok(k) => k.text.clone(),
            _ => quoted(&k.text),
        }
    }

    fn leaf(&mut self, v: &Scalar, path: &[String], keys: &[RKey]) {
        let start = self.out.len();
        self.out.push_str(&scalar_text(v));
        self.leaves.push(Leaf {
            path: path.join("."),
            keys: keys.to_vec(),
            span: (start, self.out.len()),
            duplicated: self.duplicated > 0,
        });
    }

    /// A value in flow style (JSON everywhere; YAML flow; TOML inline).
    fn flow(&mut self, n: &Node, path: &mut Vec<String>, keys: &mut Vec<RKey>) {
        match n {
            Node::Leaf(v) => self.leaf(v, path, keys),
            Node::List(items) => {
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(", ");
                    }
                    path.push(i.to_string());
                    keys.push(RKey::Index(i));
                    self.flow(item, path, keys);
                    path.pop();
                    keys.pop();
                }
                self.out.push(']');
            }
            Node::Map(entries) => {
                self.out.push('{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        self.out.push_str(", ");
                    }
                    let dup = entries.iter().filter(|(o, _)| o.text == k.text).count() > 1;
                    self.duplicated += usize::from(dup);
                    let kt = self.key_text(k);
                    self.out.push_str(&kt);
                    self.out.push_str(if self.format == Format::Toml {
                        " = "
                    } else {
                        ": "
                    });
                    path.push(k.text.clone());
                    keys.push(rkey(self.format, k));
                    self.flow(v, path, keys);
                    path.pop();
                    keys.pop();
                    self.duplicated -= usize::from(dup);
                }
                self.out.push('}');
            }
        }
    }

    /// The document: a JSON object over several lines, a YAML block map of flow values, TOML
    /// `key = value` lines.
    fn document(format: Format, entries: &[(Key, Node)]) -> Render {
        let mut r = Render {
            format,
            out: String::new(),
            leaves: Vec::new(),
            duplicated: 0,
        };
        if format == Format::Json {
            r.out.push_str("{\n");
        }
        for (i, (k, v)) in entries.iter().enumerate() {
            let kt = r.key_text(k);
            match format {
                Format::Json => {
                    r.out.push_str(&format!("  {kt}: "));
                }
                Format::Yaml => r.out.push_str(&format!("{kt}: ")),
                Format::Toml => r.out.push_str(&format!("{kt} = ")),
            }
            let (mut path, mut keys) = (vec![k.text.clone()], vec![rkey(format, k)]);
            let dup = entries.iter().filter(|(o, _)| o.text == k.text).count() > 1;
            r.duplicated += usize::from(dup);
            r.flow(v, &mut path, &mut keys);
            r.duplicated -= usize::from(dup);
            if format == Format::Json && i + 1 < entries.len() {
                r.out.push(',');
            }
            r.out.push_str("  # a comment\n");
            if format == Format::Json {
                // JSON has no comments: take it back out.
                let n = r.out.len() - "  # a comment\n".len();
                r.out.truncate(n);
                r.out.push('\n');
            }
        }
        if format == Format::Json {
            r.out.push_str("}\n");
        }
        r
    }
}

/// A value as an independent parser reads it.
#[derive(Debug, Clone, PartialEq)]
enum RV {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    List(Vec<RV>),
    Map(Vec<(RKey, RV)>),
}

fn from_json(v: &serde_json::Value) -> RV {
    match v {
        serde_json::Value::Null => RV::Null,
        serde_json::Value::Bool(b) => RV::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) if !n.is_f64() => RV::Int(i),
            _ => RV::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => RV::Str(s.clone()),
        serde_json::Value::Array(a) => RV::List(a.iter().map(from_json).collect()),
        serde_json::Value::Object(m) => RV::Map(
            m.iter()
                .map(|(k, v)| (RKey::Str(k.clone()), from_json(v)))
                .collect(),
        ),
    }
}

fn yaml_key(y: &yaml_rust2::Yaml) -> RKey {
    use yaml_rust2::Yaml;
    match y {
        Yaml::Null => RKey::Null,
        Yaml::Boolean(b) => RKey::Bool(*b),
        Yaml::Integer(i) => RKey::Int(*i),
        Yaml::String(s) => RKey::Str(s.clone()),
        other => RKey::Str(format!("{other:?}")),
    }
}

fn from_yaml(y: &yaml_rust2::Yaml) -> RV {
    use yaml_rust2::Yaml;
    match y {
        Yaml::Null => RV::Null,
        Yaml::Boolean(b) => RV::Bool(*b),
        Yaml::Integer(i) => RV::Int(*i),
        Yaml::Real(s) => RV::Float(s.parse().unwrap_or(f64::NAN)),
        Yaml::String(s) => RV::Str(s.clone()),
        Yaml::Array(a) => RV::List(a.iter().map(from_yaml).collect()),
        Yaml::Hash(h) => RV::Map(h.iter().map(|(k, v)| (yaml_key(k), from_yaml(v))).collect()),
        other => RV::Str(format!("{other:?}")),
    }
}

fn from_toml(v: &toml::Value) -> RV {
    match v {
        toml::Value::Boolean(b) => RV::Bool(*b),
        toml::Value::Integer(i) => RV::Int(*i),
        toml::Value::Float(f) => RV::Float(*f),
        toml::Value::String(s) => RV::Str(s.clone()),
        toml::Value::Array(a) => RV::List(a.iter().map(from_toml).collect()),
        toml::Value::Table(t) => RV::Map(
            t.iter()
                .map(|(k, v)| (RKey::Str(k.clone()), from_toml(v)))
                .collect(),
        ),
        toml::Value::Datetime(d) => RV::Str(d.to_string()),
    }
}

/// The document as the format's independent parser reads it; `None` when it does not parse.
fn reference(format: Format, text: &str) -> Option<RV> {
    match format {
        Format::Json => serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .map(|v| from_json(&v)),
        Format::Yaml => yaml_rust2::YamlLoader::load_from_str(text)
            .ok()
            .and_then(|d| d.into_iter().next())
            .map(|d| from_yaml(&d)),
        Format::Toml => text
            .parse::<toml::Table>()
            .ok()
            .map(|t| from_toml(&toml::Value::Table(t))),
    }
}

fn slot<'a>(v: &'a mut RV, keys: &[RKey]) -> Option<&'a mut RV> {
    let Some((first, rest)) = keys.split_first() else {
        return Some(v);
    };
    let next = match (v, first) {
        (RV::List(items), RKey::Index(i)) => items.get_mut(*i)?,
        // The last entry of a duplicated key is the one parsers keep.
        (RV::Map(entries), k) => entries
            .iter_mut()
            .rev()
            .find(|(ek, _)| ek == k)
            .map(|(_, v)| v)?,
        _ => return None,
    };
    slot(next, rest)
}

fn as_rv(v: &Scalar) -> RV {
    match v {
        Scalar::Bool(b) => RV::Bool(*b),
        Scalar::Int(i) => RV::Int(*i),
        Scalar::Float(f) => RV::Float(*f),
        Scalar::Str(s) => RV::Str(s.clone()),
    }
}

/// Whether `out` is `text` with the bytes of `spans` (sorted, disjoint) replaced by something.
fn only_spans_changed(text: &str, out: &str, spans: &[(usize, usize)]) -> bool {
    fn go(text: &str, out: &str, spans: &[(usize, usize)], from: usize, at: usize) -> bool {
        let Some(((s, e), rest)) = spans.split_first() else {
            return out.get(at..) == text.get(from..);
        };
        let fixed = &text[from..*s];
        if out.get(at..at + fixed.len()) != Some(fixed) {
            return false;
        }
        let at = at + fixed.len();
        // The replacement ends where the next fixed run begins: try each place it does.
        let next_fixed = match rest.first() {
            Some((s2, _)) => &text[*e..*s2],
            None => &text[*e..],
        };
        (at..=out.len())
            .filter(|&j| out.is_char_boundary(j) && out[j..].starts_with(next_fixed))
            .any(|j| go(text, out, rest, *e, j))
    }
    go(text, out, spans, 0, 0)
}

/// Checks one edit; `true` when it was made (not refused).
fn check(
    format: Format,
    entries: Vec<(Key, Node)>,
    picks: Vec<(usize, Scalar)>,
    missing: bool,
) -> bool {
    let r = Render::document(format, &entries);
    let text = r.out;
    // A document the reference rejects (duplicate TOML keys, say) must be refused too; but YAML's
    // duplicate keys, which yaml-rust2's loader rejects, are read (PyYAML keeps the last), and only
    // an edit through them is refused (checked below).
    let Some(before) = reference(format, &text) else {
        if format == Format::Yaml {
            return false;
        }
        assert!(
            apply(format, &text, &[("a".into(), Scalar::Int(1))]).is_err(),
            "{format:?}: the reference parser refuses this, the rewriter does not:\n{text}"
        );
        return false;
    };
    if r.leaves.is_empty() {
        return false;
    }
    let mut edits: Vec<(String, Scalar)> = Vec::new();
    let mut targets: Vec<&Leaf> = Vec::new();
    for (i, v) in picks {
        let leaf = &r.leaves[i % r.leaves.len()];
        if edits.iter().any(|(p, _)| *p == leaf.path) {
            continue;
        }
        edits.push((leaf.path.clone(), v));
        targets.push(leaf);
    }
    if missing {
        edits.push(("no.such.key".into(), Scalar::Int(1)));
    }
    let result = apply(format, &text, &edits);
    let ambiguous = targets
        .iter()
        .any(|t| t.duplicated || r.leaves.iter().filter(|l| l.path == t.path).count() > 1);
    let Ok(out) = result else {
        return false;
    };
    assert!(
        !missing,
        "{format:?}: a missing path was not refused\n{text}"
    );
    assert!(
        !ambiguous,
        "{format:?}: an ambiguous path was edited: {edits:?}\n{text}\n→\n{out}"
    );
    let mut spans: Vec<(usize, usize)> = targets.iter().map(|t| t.span).collect();
    spans.sort();
    assert!(
        only_spans_changed(&text, &out, &spans),
        "{format:?}: bytes outside {spans:?} changed for {edits:?}\n{text}\n→\n{out}"
    );
    let mut expected = before;
    for (t, (_, v)) in targets.iter().zip(&edits) {
        let s = slot(&mut expected, &t.keys)
            .unwrap_or_else(|| panic!("{format:?}: {:?} not in the reference\n{text}", t.keys));
        *s = as_rv(v);
    }
    let after = reference(format, &out)
        .unwrap_or_else(|| panic!("{format:?}: the result does not parse\n{text}\n→\n{out}"));
    assert_eq!(
        after, expected,
        "{format:?}: {edits:?} changed something else\n{text}\n→\n{out}"
    );
    true
}

fn run(format: Format) {
    let mut runner = TestRunner::new(RunnerConfig {
        cases: cases(),
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let executions = std::cell::Cell::new(0u64);
    let edited = std::cell::Cell::new(0u64);
    let strategy = (
        document(),
        prop::collection::vec((any::<usize>(), scalar()), 1..4),
        prop::bool::weighted(0.05),
    );
    runner
        .run(&strategy, |(doc, picks, missing)| {
            executions.set(executions.get() + 1);
            if check(format, doc, picks, missing) {
                edited.set(edited.get() + 1);
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{format:?}: {e}"));
    eprintln!(
        "{format:?} rewriter: {} executions, {} edits made and checked, the rest refused",
        executions.get(),
        edited.get()
    );
    // Most documents have a unique path to edit: a rewriter that refused everything would fail here.
    assert!(
        edited.get() * 4 > executions.get(),
        "{} of {} edited",
        edited.get(),
        executions.get()
    );
}

#[test]
fn json_edits_change_exactly_the_requested_values() {
    run(Format::Json);
}

#[test]
fn yaml_edits_change_exactly_the_requested_values() {
    run(Format::Yaml);
}

#[test]
fn toml_edits_change_exactly_the_requested_values() {
    run(Format::Toml);
}
