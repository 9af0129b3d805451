//! The engine's layout rules, checked over its own sources: no import circles between its modules
//! (a module uses only modules below it, so each can be read and tested with what it names), and
//! no engine function longer than `MAX_FUNCTION_LINES` (tests excepted: a table is long by nature).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
/// The longest an engine function may be; longer ones are split along the steps they comment.
const MAX_FUNCTION_LINES: usize = 120;
/// Functions still over the limit, with their length now: they may only shrink (the engine issue's
/// remaining split).
const LONG_FUNCTIONS: [(&str, &str, usize); 3] =
    [("inject.rs", "plan", 377), ("ownership.rs", "assess", 166), ("policy.rs", "new", 344)];

/// Each module's source without its tests and comments.
fn modules() -> BTreeMap<String, String> {
    let mut modules = BTreeMap::new();
    for entry in fs::read_dir(SRC).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if path.extension().is_none_or(|e| e != "rs")
            || name == "lib"
            || name.ends_with("tests")
            || name == "test_support"
        {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let code: Vec<&str> = code.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
        modules.insert(name, code.join("\n"));
    }
    modules
}

/// The engine modules a module's code names (`super::x`, `crate::x`, `use super::{x, y}`).
fn uses(code: &str, modules: &BTreeMap<String, String>) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for prefix in ["super::", "crate::"] {
        for (at, _) in code.match_indices(prefix) {
            let rest = &code[at + prefix.len()..];
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(group) => group.split('}').next().unwrap_or_default().split(',').collect(),
                None => vec![rest],
            };
            for name in names {
                let name: String = name.trim().chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
                if modules.contains_key(&name) {
                    named.insert(name);
                }
            }
        }
    }
    named
}

#[test]
fn no_module_of_the_engine_uses_one_that_uses_it_back() {
    let modules = modules();
    assert!(modules.len() > 20, "the engine's modules were not found in {SRC}");
    let graph: BTreeMap<&str, BTreeSet<String>> =
        modules.iter().map(|(name, code)| (name.as_str(), uses(code, &modules))).collect();
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
    let mut long = Vec::new();
    for (file, code) in modules() {
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
            let file = format!("{file}.rs");
            let allowed = LONG_FUNCTIONS
                .iter()
                .find(|(f, n, _)| *f == file && *n == name)
                .map_or(MAX_FUNCTION_LINES, |(_, _, now)| *now);
            if length > allowed {
                long.push(format!("{file}: fn {name} is {length} lines (at most {allowed})"));
            }
        }
    }
    assert!(long.is_empty(), "{}", long.join("\n"));
}
