//! The Kubernetes manifest (deploy/kubernetes/memwatch.yaml), read for the tests that check it and
//! the one that runs its pod.

use yaml_rust2::{Yaml, YamlLoader};

/// Its documents.
pub fn docs() -> Vec<Yaml> {
    let text =
        std::fs::read_to_string(super::repo().join("deploy/kubernetes/memwatch.yaml")).unwrap();
    YamlLoader::load_from_str(&text).expect("the manifest is YAML")
}

/// Its document of `kind`.
pub fn of_kind<'a>(docs: &'a [Yaml], kind: &str) -> &'a Yaml {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind))
        .unwrap_or_else(|| panic!("no {kind} in the manifest"))
}
