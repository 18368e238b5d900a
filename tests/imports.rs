//! The import graph of each crate's top-level modules, read from the sources: neither has a cycle.
//! The pure modules (the configuration, the policy, the advice, the rewrite's planning, `memwatch
//! check`, what is sampled and measured as data and the parsers of the kernel's text) are their own
//! crate, memwatch-core, whose dependencies `cargo tree` lists: none of them is an I/O crate, so the
//! compiler keeps it pure.
//! ARCHITECTURE.md's layering is this test's claim.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

mod common;

/// What memwatch-core must never depend on, directly or through another crate: the crates that do I/O
/// (signals, files by descriptor, processes, the GPU, the network, the async runtime).
const NOT_IN_CORE: [&str; 6] = ["tokio", "nix", "rustix", "nvml-wrapper", "hyper", "libc"];
/// The source without its inline test modules (`#[cfg(test)] mod tests { … }`, to the end of the
/// file, where this codebase keeps them).
fn without_tests(text: &str) -> &str {
    match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    }
}

/// The top-level modules `text` names through `crate::…` (also inside `use crate::{a, b::c}`).
fn imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

struct Graph {
    edges: BTreeMap<String, BTreeSet<String>>,
    /// Modules whose sources name tokio.
    tokio: BTreeSet<String>,
}

fn graph(src: &Path) -> Graph {
    let mut g = Graph {
        edges: BTreeMap::new(),
        tokio: BTreeSet::new(),
    };
    let mut stack = vec![src.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let rel = path.strip_prefix(src).unwrap();
            // The binaries are their own crates.
            if rel.starts_with("bin") {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if !name.ends_with(".rs") || name == "tests.rs" || name.ends_with("_tests.rs") {
                continue;
            }
            let top = rel
                .iter()
                .next()
                .unwrap()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_owned();
            if top == "lib" || top == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            // Comments name modules without importing them.
            let code: String = without_tests(&text)
                .lines()
                .map(|l| l.split("//").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            let text = code.as_str();
            if text.contains("tokio::") {
                g.tokio.insert(top.clone());
            }
            let imported = imports(text);
            let e = g.edges.entry(top.clone()).or_default();
            e.extend(imported.into_iter().filter(|m| *m != top));
        }
    }
    g
}

/// Every module `from` reaches through imports, with the path to it.
fn reach(g: &Graph, from: &str) -> BTreeMap<String, Vec<String>> {
    let mut seen: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut queue = vec![(from.to_owned(), vec![from.to_owned()])];
    while let Some((m, path)) = queue.pop() {
        for next in g.edges.get(&m).into_iter().flatten() {
            if !seen.contains_key(next) {
                let mut p = path.clone();
                p.push(next.clone());
                seen.insert(next.clone(), p.clone());
                queue.push((next.clone(), p));
            }
        }
    }
    seen
}

#[test]
fn the_module_graph_has_no_cycle() {
    let g = graph(&common::repo().join("src"));
    assert!(
        g.edges.len() > 20,
        "too few modules read: {:?}",
        g.edges.keys()
    );
    let mut cycles = Vec::new();
    for m in g.edges.keys() {
        if let Some(path) = reach(&g, m).get(m) {
            cycles.push(path.join(" → "));
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

/// The core crate's modules have no cycle either (`policy` imports `config`, `reason` both, never the
/// other way).
#[test]
fn the_core_crates_module_graph_has_no_cycle() {
    let g = graph(&common::repo().join("crates/memwatch-core/src"));
    assert_eq!(
        g.edges.keys().map(String::as_str).collect::<Vec<_>>(),
        [
            "adapt", "advice", "audit", "check", "config", "control", "cuda_oom", "engine", "expo",
            "growth", "held", "host", "human", "job", "policy", "proc", "reason", "record",
            "rewrite", "sample", "seam", "slurm", "way_out"
        ],
        "the core's top-level modules"
    );
    assert!(g.edges["policy"].contains("config"));
    assert!(g.edges["reason"].contains("policy"));
    assert!(
        g.edges["proc"].contains("sample"),
        "the parsers share one error"
    );
    assert!(
        g.edges["seam"].contains("held"),
        "the host seam acts on the records' types"
    );
    assert!(
        g.edges["engine"].contains("seam"),
        "the engine reads and acts through the seam"
    );
    for (m, imported) in &g.edges {
        assert!(!imported.contains("engine"), "{m} imports the engine");
    }
    for m in g.edges.keys() {
        assert!(!reach(&g, m).contains_key(m), "{m} reaches itself");
    }
    assert!(g.tokio.is_empty(), "tokio named in {:?}", g.tokio);
}

/// The crates memwatch-core is built with (`cargo tree -e normal`: no dev-dependencies, no build
/// scripts' own), with the features the workspace turns on.
fn core_dependencies() -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .current_dir(common::repo())
        .args([
            "tree",
            "-p",
            "memwatch-core",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["--features", "memwatch-core/clap", "--locked", "--offline"])
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_core_crate_depends_on_no_io_crate() {
    let deps = core_dependencies();
    // What it does depend on is read, so an empty list cannot pass for a clean one.
    for needed in ["memwatch-core", "serde", "toml", "thiserror"] {
        assert!(deps.iter().any(|d| d == needed), "{needed} not in {deps:?}");
    }
    let bad: Vec<&str> = NOT_IN_CORE
        .into_iter()
        .filter(|c| deps.iter().any(|d| d == c))
        .collect();
    assert!(bad.is_empty(), "memwatch-core depends on {bad:?}: {deps:?}");
}

/// The `memwatch` crate itself depends on every crate the core must not, so the test above reads a
/// list that could hold them.
#[test]
fn the_io_crates_are_in_the_workspace() {
    let lock = std::fs::read_to_string(common::repo().join("Cargo.lock")).unwrap();
    for c in NOT_IN_CORE {
        assert!(
            lock.contains(&format!("name = \"{c}\"\n")),
            "{c} not in Cargo.lock"
        );
    }
}

/// The checks above can fail: a cycle and a reach into `act` made up in a small graph are found.
#[test]
fn the_checks_find_what_they_look_for() {
    let text = "use crate::{config::Policy, act::signal};\nfn f() { crate::job::x(); }\n\
                #[cfg(test)]\nmod tests {\n use crate::engine;\n}\n";
    let found = imports(without_tests(text));
    assert_eq!(
        found,
        ["act", "config", "job"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    let mut g = Graph {
        edges: BTreeMap::new(),
        tokio: BTreeSet::new(),
    };
    g.edges.insert("policy".into(), ["job".into()].into());
    g.edges.insert("job".into(), ["act".into()].into());
    g.edges.insert("act".into(), ["job".into()].into());
    assert_eq!(
        reach(&g, "policy").get("act"),
        Some(&vec!["policy".to_owned(), "job".into(), "act".into()])
    );
    assert!(reach(&g, "job").contains_key("job"), "job → act → job");
}
