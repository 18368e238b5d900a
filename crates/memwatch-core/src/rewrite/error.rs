//! Why a config's text cannot be read or edited, and why a profile cannot be built: typed, so a
//! caller can tell a file it must leave alone (a syntax error, an ambiguous key) from a request it
//! must refuse (a key the file lacks), and each says what, and where in the file (the dotted key,
//! or the parser's line and column). `write::RewriteError::Content` adds the file's path.

use super::Format;
use super::doc::{MAX_DEPTH, MAX_NODES};

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Format::Json => "JSON",
            Format::Yaml => "YAML",
            Format::Toml => "TOML",
        })
    }
}

/// Why a document does not parse, or an edit does not fit it. Nothing was written in any case.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ContentError {
    /// The format's parser refused the text; its words carry the line and column.
    #[error("not valid {format}: {reason}")]
    Syntax {
        /// The format.
        format: Format,
        /// The parser's words.
        reason: String,
    },
    /// Valid, but built of what memwatch does not read (YAML: several documents, complex keys, an
    /// alias before its anchor).
    #[error("not accepted as {format}: {why}")]
    NotAccepted {
        /// The format.
        format: Format,
        /// What is in the way.
        #[source]
        why: Box<ContentError>,
    },
    /// Nested deeper than memwatch reads.
    #[error("nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// More values than memwatch reads (a training config holds a few hundred).
    #[error(
        "holds more than {MAX_NODES} values; memwatch reads training configs of at most that many{}",
        if *through_aliases { " (YAML aliases expand to that many)" } else { "" }
    )]
    TooManyValues {
        /// Whether YAML aliases, each expanded, made them so many.
        through_aliases: bool,
    },
    /// A YAML stream of more than one document.
    #[error("holds more than one YAML document; memwatch rewrites single-document files")]
    SeveralDocuments,
    /// A mapping or a list used as a YAML key.
    #[error("complex mapping keys (a mapping or list as a key) are not supported")]
    ComplexKey,
    /// A YAML alias before its anchor.
    #[error("an alias refers to an anchor not defined before it")]
    UndefinedAlias,
    /// The JSON scanner found what serde_json had accepted malformed (a bug, never a write).
    #[error("JSON scan: {0}")]
    Scan(&'static str),
    /// The dotted path names more than one entry.
    #[error(
        "`{path}` names more than one entry (duplicate keys, or a key that holds a dot); edit it by hand"
    )]
    Ambiguous {
        /// The dotted path.
        path: String,
    },
    /// A key on the way to the path appears more than once where it sits.
    #[error("`{path}`: the key `{key}` appears more than once where it sits; edit it by hand")]
    DuplicateKey {
        /// The dotted path asked for.
        path: String,
        /// The duplicated key, dotted from the top.
        key: String,
    },
    /// The file lacks the key.
    #[error("key `{path}` is not in the file (memwatch changes existing keys only)")]
    NoSuchKey {
        /// The dotted path.
        path: String,
    },
    /// The path names a table or a list.
    #[error("`{path}` is a table or a list, not a value")]
    NotAValue {
        /// The dotted path.
        path: String,
    },
    /// The value's text is not one plain value memwatch can replace in place.
    #[error(
        "`{path}` is not a plain one-line value (an alias, a tagged or block value); edit it by hand"
    )]
    NotPlain {
        /// The dotted path.
        path: String,
    },
    /// One edit set the same key twice.
    #[error("`{path}` is set twice")]
    SetTwice {
        /// The dotted path.
        path: String,
    },
    /// A float every format cannot write (NaN, an infinity).
    #[error("{0} is not a finite number")]
    NotFinite(f64),
    /// A value the format cannot write.
    #[error("cannot write {value} as {format}: {reason}")]
    Unwritable {
        /// The format.
        format: Format,
        /// The value, as shown.
        value: String,
        /// The serializer's words.
        reason: String,
    },
    /// The edited text no longer parses.
    #[error("the edited file would not parse ({0}); nothing written")]
    WouldNotParse(Box<ContentError>),
    /// The edited text has other nodes than the file.
    #[error("the edit would change the file's structure ({after} values instead of {before})")]
    StructureChanged {
        /// Values in the file.
        before: usize,
        /// Values in the edited text.
        after: usize,
    },
    /// The edit would change a value it was not asked to.
    #[error("the edit would also change `{path}`; nothing written")]
    AlsoChanges {
        /// The dotted path of that value.
        path: String,
    },
}

/// Why a profile (`--profile`, `--key KNOB=path`) cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// No such built-in profile.
    #[error("unknown profile {0:?}: use deepspeed, hf, accelerate or generic")]
    Unknown(String),
    /// A `--key` without `=`.
    #[error("--key {0:?}: expected KNOB=dotted.path")]
    NoEquals(String),
    /// A `--key` naming no knob memwatch knows.
    #[error(
        "--key {0:?}: unknown knob; use batch, accumulation, workers, pin_memory, seq_len, world_size or zero_stage"
    )]
    UnknownKnob(String),
    /// A `--key` with an empty path.
    #[error("--key {0:?}: empty path")]
    EmptyPath(String),
    /// The generic profile without any `--key`.
    #[error("the generic profile needs --key KNOB=path for each knob memwatch may change")]
    NoKnobs,
}
