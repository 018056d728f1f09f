//! A check of the crate's layering: the graph of its top-level modules (who names whom with
//! `crate::module`) has no cycle, and [`crate::meta`] (the metadata client) names no module but
//! `error`. Read from the source files, so a new back-reference fails this test rather than a
//! review.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level module → the top-level modules its files name as `crate::<module>`.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("read src/") {
        let path = entry.expect("dir entry").path();
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("utf-8 name")
            .to_string();
        if name == "lib" || name == "module_graph" {
            continue;
        }
        let deps = graph.entry(name.clone()).or_default();
        for file in rust_files(&path) {
            let text = std::fs::read_to_string(&file).expect("read source");
            for dep in crate_paths(&text) {
                if dep != name {
                    deps.insert(dep);
                }
            }
        }
    }
    graph
}

fn rust_files(path: &Path) -> Vec<PathBuf> {
    if path.is_dir() {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(path).expect("read module dir") {
            out.extend(rust_files(&entry.expect("dir entry").path()));
        }
        out
    } else if path.extension().is_some_and(|e| e == "rs") {
        vec![path.to_path_buf()]
    } else {
        Vec::new()
    }
}

/// The lower-case names after `crate::` outside comments (`crate::FileSystem`, a re-export at
/// the root, is no module).
fn crate_paths(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let ident: String = rest
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !ident.is_empty() {
                out.insert(ident);
            }
        }
    }
    out
}

/// A cycle in `graph`, if there is one, as the modules along it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for dep in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(dep, graph, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn top_level_modules_have_no_cycle() {
    let graph = module_graph(&src_dir());
    assert!(
        graph.contains_key("write") && graph.contains_key("read"),
        "{graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("module cycle {}: {graph:?}", cycle.join(" -> "));
    }
}

#[test]
fn the_metadata_client_is_a_leaf() {
    let graph = module_graph(&src_dir());
    let deps = &graph["meta"];
    let allowed: BTreeSet<String> = ["error".to_string()].into();
    assert!(deps.is_subset(&allowed), "meta names {deps:?}");
}

#[test]
fn a_back_reference_is_found() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("filesystem".to_string(), ["write".to_string()].into()),
        ("write".to_string(), ["filesystem".to_string()].into()),
    ]
    .into();
    assert_eq!(
        find_cycle(&graph),
        Some(vec![
            "filesystem".into(),
            "write".into(),
            "filesystem".into()
        ])
    );
    assert_eq!(
        crate_paths("use crate::filesystem::FsInner; // crate::read\nuse crate::FileSystem;"),
        ["filesystem".to_string()].into()
    );
}
