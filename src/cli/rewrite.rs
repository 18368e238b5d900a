//! `memwatch rewrite FILE --set PATH=VALUE`: the daemon's own safe rewrite (format kept, comments
//! kept, atomic, with the file owner's rights), by hand.

use std::path::Path;

use super::{Failure, usage};

pub(super) fn run(file: &Path, set: &[String]) -> Result<(), Failure> {
    let format = crate::rewrite::Format::of(file).ok_or_else(|| {
        usage(anyhow::anyhow!(
            "{}: unknown format; use .json, .yaml, .yml or .toml",
            file.display()
        ))
    })?;
    let mut edits = Vec::new();
    for s in set {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| usage(anyhow::anyhow!("--set {s:?}: expected PATH=VALUE")))?;
        edits.push((k.to_owned(), crate::rewrite::Scalar::parse(v)));
    }
    let file =
        &std::path::absolute(file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    // Root rewrites a file with its owner's rights; anyone else with their own.
    let me = nix::unistd::geteuid();
    let owner = if me.is_root() {
        crate::rewrite::write::Owner::FileOwner
    } else {
        crate::rewrite::write::Owner::Uid(me.as_raw())
    };
    let out = crate::rewrite::write::rewrite(file, format, owner, &edits)?;
    for (path, old) in out.before {
        let new = edits
            .iter()
            .find(|(p, _)| *p == path)
            .map(|(_, v)| v.to_string())
            .unwrap_or_default();
        let old = old.map(|o| o.to_string()).unwrap_or_default();
        println!("{path}: {old} → {new}");
    }
    Ok(())
}
