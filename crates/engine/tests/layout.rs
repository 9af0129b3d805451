//! The engine's layout rules, checked over its own sources (`lib.rs` included, as the module
//! `crate`): its folders are layers ([`LAYERS`]) and a module uses only modules of its own layer or
//! of layers below it, with no import circle even inside a layer (so each can be read and tested
//! with what it names); and no engine function is longer than `MAX_FUNCTION_LINES` (tests excepted:
//! a table is long by nature).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
/// The longest an engine function may be; longer ones are split along the steps they comment.
const MAX_FUNCTION_LINES: usize = 120;
/// The module `lib.rs` is: the decision (`Engine`), its types and the crate's re-exports.
const ROOT: &str = "crate";

/// The engine's layers, bottom first: a folder (or a file at the crate root) per name, each layer
/// using only itself and the layers below. A module in no layer fails the test, so a new folder is
/// placed on purpose.
const LAYERS: &[&[&str]] = &[
    // Words every step shares: resource names and labels, quantities, the pod's JSON, warnings,
    // workload kinds, the lean pod of the cluster caches.
    &["names", "quantity", "pod", "findings", "workload", "lean"],
    // The vocabulary: item kinds, the status annotation, Kubernetes' rules, env values, YAML.
    &["model"],
    // What operators write: templates, and the manifests the CLI reads them from.
    &["templates", "manifest"],
    // The injection: selection, rendering, the plan and its patch, and the facts they read.
    &["injection", "facts"],
    // A pod's claims: which the pod proves, and the pod without them.
    &["claims"],
    // What the injector writes besides patches: policies and webhook rules.
    &["emit"],
    // Checks of one rendering, and of a template before it serves.
    &["checks"],
    // The decision (`lib.rs`).
    &[ROOT],
    // Callers of the decision: drift, the reviews that recompute it, the CLI's offline commands.
    &["drift"],
    &["review"],
    &["offline"],
];

/// Each module's source without its tests and comments, by its path below the crate
/// (`claims::ownership`; a folder's `mod.rs` is the folder's module).
fn modules() -> BTreeMap<String, String> {
    let mut modules = BTreeMap::new();
    collect(Path::new(SRC), "", &mut modules);
    modules
}

fn collect(dir: &Path, prefix: &str, modules: &mut BTreeMap<String, String>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            collect(&path, &format!("{prefix}{stem}::"), modules);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") || stem.ends_with("tests") || stem == "test_support" {
            continue;
        }
        let name = match stem.as_str() {
            "lib" if prefix.is_empty() => ROOT.to_owned(),
            "mod" => prefix.trim_end_matches("::").to_owned(),
            _ => format!("{prefix}{stem}"),
        };
        let text = fs::read_to_string(&path).unwrap();
        // The inline test module is last; `lib.rs` also declares test-only modules, on one line each.
        let code = text.split("#[cfg(test)]\nmod tests {").next().unwrap_or_default();
        let code = code.replace("#[cfg(test)]\nmod", "// test-only");
        let code: Vec<&str> = code.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
        modules.insert(name, code.join("\n"));
    }
}

/// The file a module is in, for messages (`claims/ownership.rs`).
fn file_of(module: &str, modules: &BTreeMap<String, String>) -> String {
    if module == ROOT {
        return "lib.rs".to_owned();
    }
    let is_folder = modules.keys().any(|m| m.starts_with(&format!("{module}::")));
    let path = module.replace("::", "/");
    if is_folder { format!("{path}/mod.rs") } else { format!("{path}.rs") }
}

/// The engine modules a module's code names (`crate::model::status`, `super::render` from a
/// sibling, `use crate::{names, injection::{plan, render}}`, and in `lib.rs` a top module's path
/// as it stands, `injection::plan`): for each path named, the longest module path it starts with,
/// or the crate root for an item of `lib.rs` (`crate::Engine`). A module declaring its children
/// (`pub mod plan;`) is not a use.
fn uses(module: &str, code: &str, modules: &BTreeMap<String, String>) -> BTreeSet<String> {
    let parent = if module == ROOT { "" } else { module.rsplit_once("::").map_or("", |(parent, _)| parent) };
    let mut starts: Vec<(usize, String)> = Vec::new();
    for (prefix, base) in [("crate::", String::new()), ("super::", parent.to_owned())] {
        starts.extend(code.match_indices(prefix).map(|(at, _)| (at + prefix.len(), base.clone())));
    }
    // A module names its own children without a prefix (`use cel::*` in `emit/policy/mod.rs`,
    // `injection::plan` in `lib.rs`), or with `self::`.
    let own = if module == ROOT { String::new() } else { module.to_owned() };
    let children: BTreeSet<&str> = modules
        .keys()
        .filter_map(|m| match own.is_empty() {
            true => m.split("::").next(),
            false => m.strip_prefix(&format!("{own}::")).and_then(|rest| rest.split("::").next()),
        })
        .collect();
    for name in children {
        for (at, _) in code.match_indices(&format!("{name}::")) {
            let before = code[..at].chars().next_back();
            if before.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':')) {
                starts.push((at, own.clone()));
            }
        }
    }
    starts.extend(code.match_indices("self::").map(|(at, _)| (at + "self::".len(), own.clone())));
    let mut named = BTreeSet::new();
    for (at, base) in starts {
        let mut paths = Vec::new();
        use_tree(&code[at..], &base, &mut paths);
        for path in paths {
            let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
            let module = (1..=segments.len()).rev().map(|n| segments[..n].join("::")).find(|m| modules.contains_key(m));
            match module {
                Some(module) => named.insert(module),
                None if segments.is_empty() => named.insert(ROOT.to_owned()),
                None => false,
            };
        }
    }
    named.remove(module);
    named
}

/// The layer of a module: the index in [`LAYERS`] of its folder (its first segment).
fn layer_of(module: &str) -> Option<usize> {
    let top = module.split("::").next().unwrap();
    LAYERS.iter().position(|layer| layer.contains(&top))
}

/// The module paths of a use tree (`a::{b, c::{d}}` gives `a::b`, `a::c::d`), each under `base`;
/// returns how much of `text` the tree took.
fn use_tree(text: &str, base: &str, paths: &mut Vec<String>) -> usize {
    let path_len = text.find(|c: char| !(c.is_ascii_lowercase() || c == '_' || c == ':')).unwrap_or(text.len());
    let path = &text[..path_len];
    let full = if base.is_empty() { path.to_owned() } else { format!("{base}::{path}") };
    let full = full.trim_end_matches(':').to_owned();
    match text[path_len..].strip_prefix('{') {
        Some(group) => {
            let mut at = 0;
            loop {
                let rest = group[at..].trim_start();
                at = group.len() - rest.len();
                if rest.starts_with('}') || rest.is_empty() {
                    return path_len + 1 + at + 1;
                }
                at += use_tree(rest, &full, paths);
                let rest = &group[at..];
                match rest.find([',', '}']) {
                    Some(i) if rest.as_bytes()[i] == b',' => at += i + 1,
                    Some(i) => return path_len + 1 + at + i + 1,
                    None => return text.len(),
                }
            }
        }
        None => {
            paths.push(full);
            path_len
        }
    }
}

#[test]
fn no_module_of_the_engine_uses_one_that_uses_it_back() {
    let modules = modules();
    assert!(modules.len() > 20, "the engine's modules were not found in {SRC}");
    let graph: BTreeMap<&str, BTreeSet<String>> =
        modules.iter().map(|(name, code)| (name.as_str(), uses(name, code, &modules))).collect();
    // The reader sees uses through folders (else no circle could be found).
    assert!(graph["injection::plan"].contains("model::status"), "{:?}", graph["injection::plan"]);
    // And a module's own children named without a prefix (`use cel::*`).
    assert!(graph["emit::policy"].contains("emit::policy::cel"), "{:?}", graph["emit::policy"]);
    // A depth-first walk from every module; a path that comes back to a module on it is a circle.
    fn walk<'g>(at: &'g str, graph: &'g BTreeMap<&str, BTreeSet<String>>, path: &mut Vec<&'g str>) -> Option<String> {
        if let Some(start) = path.iter().position(|m| *m == at) {
            return Some([&path[start..], &[at]].concat().join(" -> "));
        }
        path.push(at);
        let found = graph[at].iter().find_map(|next| walk(next, graph, path));
        path.pop();
        found
    }
    for module in graph.keys() {
        if let Some(circle) = walk(module, &graph, &mut Vec::new()) {
            panic!("import circle: {circle}");
        }
    }
}

#[test]
fn no_module_of_the_engine_uses_a_layer_above_its_own() {
    let modules = modules();
    assert!(modules.contains_key(ROOT), "lib.rs was not read");
    let unplaced: Vec<&String> = modules.keys().filter(|m| layer_of(m).is_none()).collect();
    assert!(unplaced.is_empty(), "modules in no layer of LAYERS: {unplaced:?}");
    let mut upward = Vec::new();
    for (module, code) in &modules {
        let uses = uses(module, code, &modules);
        for used in uses.iter().filter(|used| layer_of(used) > layer_of(module)) {
            upward.push(format!("{} uses {used}, a layer above it", file_of(module, &modules)));
        }
    }
    // The reader sees the root's own paths and `crate::Engine` (else no upward use could be found).
    assert!(uses(ROOT, &modules[ROOT], &modules).contains("injection::plan"));
    assert!(uses("review::validate", &modules["review::validate"], &modules).contains(ROOT));
    assert!(upward.is_empty(), "{}", upward.join("\n"));
}

#[test]
fn no_engine_function_is_longer_than_the_limit() {
    let (mut long, mut measured) = (Vec::new(), 0);
    let modules = modules();
    for (module, code) in &modules {
        let file = file_of(module, &modules);
        let lines: Vec<&str> = code.lines().collect();
        for (start, line) in lines.iter().enumerate() {
            let trimmed = line.trim_start();
            let Some(rest) = ["pub fn ", "pub(crate) fn ", "fn "].iter().find_map(|p| trimmed.strip_prefix(p)) else {
                continue;
            };
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let indent = &line[..line.len() - trimmed.len()];
            let Some(end) = lines[start..].iter().position(|l| *l == format!("{indent}}}")) else { continue };
            let length = end + 1;
            measured += 1;
            if length > MAX_FUNCTION_LINES {
                long.push(format!("{file}: fn {name} is {length} lines (at most {MAX_FUNCTION_LINES})"));
            }
        }
    }
    assert!(measured > 300, "only {measured} functions measured: the reader misses them");
    assert!(long.is_empty(), "{}", long.join("\n"));
}

#[test]
fn a_use_tree_names_every_module_in_it() {
    let mut paths = Vec::new();
    use_tree("{names, injection::{plan, render::Rendered}, model::status::X};", "", &mut paths);
    assert_eq!(paths, ["names", "injection::plan", "injection::render", "model::status"]);
}
