//! The Prometheus text exposition format (0.0.4): families of samples with HELP and TYPE, label
//! values escaped, numbers as Prometheus reads them. The one writer every `/metrics` series goes
//! through: the sample's own (`Sample::series`, each part beside its type) and the daemon's and
//! jobs' (`memwatch::http`). It writes to a `String`; serving it is `memwatch`'s.

use std::fmt::Write as _;

/// A family's type.
#[derive(Clone, Copy)]
pub enum Kind {
    /// A value that goes up and down.
    Gauge,
    /// A count that only goes up (its name ends in `_total`).
    Counter,
}

/// Collects the samples of one family, then writes HELP, TYPE and the samples, or nothing if empty.
pub struct Family<'a> {
    out: &'a mut String,
    name: &'static str,
    help: &'static str,
    kind: Kind,
    lines: String,
}

impl Family<'_> {
    /// A sample of the family with these labels.
    #[inline]
    pub fn add(&mut self, labels: &[(&str, &str)], value: f64) -> &mut Self {
        self.lines.push_str(self.name);
        if !labels.is_empty() {
            self.lines.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.lines.push(',');
                }
                let _ = write!(self.lines, "{k}=\"");
                escape(&mut self.lines, v);
                self.lines.push('"');
            }
            self.lines.push('}');
        }
        self.lines.push(' ');
        number(&mut self.lines, value);
        self.lines.push('\n');
        self
    }

    /// A sample, if there is a value: absent is left out, never written as 0.
    #[inline]
    pub fn opt(&mut self, labels: &[(&str, &str)], value: Option<f64>) -> &mut Self {
        if let Some(v) = value {
            self.add(labels, v);
        }
        self
    }
}

impl Drop for Family<'_> {
    fn drop(&mut self) {
        if self.lines.is_empty() {
            return;
        }
        let kind = match self.kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        };
        let _ = writeln!(self.out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(self.out, "# TYPE {} {kind}", self.name);
        self.out.push_str(&self.lines);
    }
}

#[inline]
fn escape(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[inline]
fn number(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

/// Writes families into `out`.
pub struct Writer {
    /// The text so far.
    pub out: String,
}

impl Writer {
    /// A writer appending to `out`.
    #[inline]
    pub fn new(out: String) -> Self {
        Writer { out }
    }

    /// A family of that name, type and help text: written when it is dropped, with nothing if it
    /// has no sample.
    pub fn family(&mut self, name: &'static str, kind: Kind, help: &'static str) -> Family<'_> {
        Family {
            out: &mut self.out,
            name,
            help,
            kind,
            lines: String::new(),
        }
    }
    /// A gauge family.
    #[inline]
    pub fn gauge(&mut self, name: &'static str, help: &'static str) -> Family<'_> {
        self.family(name, Kind::Gauge, help)
    }
    /// A counter family.
    #[inline]
    pub fn counter(&mut self, name: &'static str, help: &'static str) -> Family<'_> {
        self.family(name, Kind::Counter, help)
    }
}

/// A count of bytes as a sample's value (the text format's numbers are floats).
#[inline]
pub fn bytes(v: u64) -> f64 {
    v as f64
}
