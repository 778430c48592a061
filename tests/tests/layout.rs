//! The workspace's shape: no crate reaches itself through its
//! dependencies, dev- and build-dependencies included, so each can be
//! built and tested on top of the ones below it.

use std::collections::BTreeMap;
use std::path::Path;

/// Each workspace crate and the workspace crates it depends on, of any kind.
fn graph() -> BTreeMap<String, Vec<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |path: &Path| -> toml::Table {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        toml::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
    };
    let workspace = read(&root.join("Cargo.toml"));
    let members: Vec<String> = workspace["workspace"]["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| m.as_str().expect("a path").to_owned())
        .collect();
    let manifests: Vec<toml::Table> = members
        .iter()
        .map(|m| read(&root.join(m).join("Cargo.toml")))
        .collect();
    let names: Vec<String> = manifests
        .iter()
        .map(|t| t["package"]["name"].as_str().expect("a name").to_owned())
        .collect();
    names
        .iter()
        .zip(&manifests)
        .map(|(name, manifest)| {
            let deps = ["dependencies", "dev-dependencies", "build-dependencies"]
                .iter()
                .filter_map(|kind| manifest.get(*kind).and_then(|d| d.as_table()))
                .flat_map(|d| d.keys())
                .filter(|d| names.contains(d))
                .cloned()
                .collect();
            (name.clone(), deps)
        })
        .collect()
}

/// A path from `from` back to itself, if there is one.
fn cycle(graph: &BTreeMap<String, Vec<String>>, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![vec![from.to_owned()]];
    while let Some(path) = stack.pop() {
        for next in &graph[path.last().expect("not empty")] {
            if next == from {
                return Some([path.clone(), vec![next.clone()]].concat());
            }
            if !path.contains(next) {
                stack.push([path.clone(), vec![next.clone()]].concat());
            }
        }
    }
    None
}

#[test]
fn no_crate_depends_on_itself_through_dev_dependencies() {
    let graph = graph();
    assert!(graph.len() >= 9, "{graph:?}");
    assert!(graph["damper-tests"].contains(&"damper-sim".to_owned()));
    for name in graph.keys() {
        assert_eq!(cycle(&graph, name), None, "{name} reaches itself");
    }
}

#[test]
fn the_cycle_finder_finds_one() {
    let graph: BTreeMap<String, Vec<String>> =
        [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"])]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
            .collect();
    assert_eq!(
        cycle(&graph, "a"),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}
