//! The engine's layout rules, checked over its own sources: no import circles between its modules
//! (a module uses only modules below it, so each can be read and tested with what it names), and
//! no engine function longer than `MAX_FUNCTION_LINES` (tests excepted: a table is long by nature).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
/// The longest an engine function may be; longer ones are split along the steps they comment.
const MAX_FUNCTION_LINES: usize = 120;

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
        if path.extension().is_none_or(|e| e != "rs")
            || stem == "lib"
            || stem.ends_with("tests")
            || stem == "test_support"
        {
            continue;
        }
        let name = if stem == "mod" { prefix.trim_end_matches("::").to_owned() } else { format!("{prefix}{stem}") };
        let text = fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let code: Vec<&str> = code.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
        modules.insert(name, code.join("\n"));
    }
}

/// The file a module is in, for messages (`claims/ownership.rs`).
fn file_of(module: &str, modules: &BTreeMap<String, String>) -> String {
    let is_folder = modules.keys().any(|m| m.starts_with(&format!("{module}::")));
    let path = module.replace("::", "/");
    if is_folder { format!("{path}/mod.rs") } else { format!("{path}.rs") }
}

/// The engine modules a module's code names (`crate::claims::status`, `super::render` from a
/// sibling, `use crate::{names, injection::{plan, render}}`): for each path named, the longest
/// module path it starts with. A folder's module declaring its children (`pub mod plan;`) is not a
/// use.
fn uses(module: &str, code: &str, modules: &BTreeMap<String, String>) -> BTreeSet<String> {
    let parent = module.rsplit_once("::").map_or("", |(parent, _)| parent);
    let mut named = BTreeSet::new();
    for (prefix, base) in [("crate::", String::new()), ("super::", parent.to_owned())] {
        for (at, _) in code.match_indices(prefix) {
            let mut paths = Vec::new();
            use_tree(&code[at + prefix.len()..], &base, &mut paths);
            for path in paths {
                let segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
                if let Some(module) =
                    (1..=segments.len()).rev().map(|n| segments[..n].join("::")).find(|m| modules.contains_key(m))
                {
                    named.insert(module);
                }
            }
        }
    }
    named
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
    assert!(graph["injection::plan"].contains("claims::status"), "{:?}", graph["injection::plan"]);
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
    use_tree("{names, injection::{plan, render::Rendered}, claims::status::X};", "", &mut paths);
    assert_eq!(paths, ["names", "injection::plan", "injection::render", "claims::status"]);
}
