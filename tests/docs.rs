//! The documentation cannot drift from the code or from itself: every relative link and `#anchor`
//! in the README and `docs/` leads somewhere, every setting of the config struct is in the settings
//! page's reference block (and nothing else is), and every metric the server exports is in the
//! metrics page's table (and nothing else is). Names are compared, not prose.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;

/// The Markdown files: the README and every page under `docs/`.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir("docs")
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The lines outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The anchor a code forge gives a heading: lower case, punctuation dropped, spaces as hyphens,
/// repeats numbered.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in prose(text) {
        let Some(heading) = line.strip_prefix('#').map(|h| h.trim_start_matches('#')) else { continue };
        if !heading.starts_with(' ') {
            continue;
        }
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut candidate = slug.clone();
        let mut n = 0;
        while seen.contains(&candidate) {
            n += 1;
            candidate = format!("{slug}-{n}");
        }
        seen.insert(candidate);
    }
    seen
}

/// The targets of `[text](target)` links in prose, inline code left out.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose(text) {
        // Inline code spans are not links.
        let plain: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            found.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    found
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').map_or((target.as_str(), None), |(p, a)| (p, Some(a)));
            let file = if path.is_empty() { page.clone() } else { page.parent().unwrap_or(Path::new("")).join(path) };
            if !file.exists() {
                broken.push(format!("{}: {target}: no such file", page.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                let known = anchors(&std::fs::read_to_string(&file).unwrap_or_default());
                if !known.contains(anchor) {
                    broken.push(format!("{}: {target}: no such heading in {}", page.display(), file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_anchor_rules_are_a_code_forges() {
    let text =
        "# Top\n## Why was my pod *not* injected?\n```sh\n# not a heading\n```\n## `cluster.mode`: auto\n## Top\n";
    let expected: BTreeSet<String> =
        ["top", "why-was-my-pod-not-injected", "clustermode-auto", "top-1"].map(String::from).into();
    assert_eq!(anchors(text), expected);
    assert_eq!(links("see [a](b.md#c), `[x](y)` and [d](#e)"), vec!["b.md#c", "#e"]);
}

/// Dotted paths of every leaf of a JSON value.
fn leaves(value: &Value, path: &str, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, child) in map {
                let path = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                leaves(child, &path, out);
            }
        }
        _ => {
            out.insert(path.to_owned());
        }
    }
}

#[test]
fn every_setting_is_documented_and_nothing_else() {
    let mut code = BTreeSet::new();
    leaves(&serde_json::to_value(sidecar_injector::config::Settings::default()).unwrap(), "", &mut code);
    let page = std::fs::read_to_string("docs/settings.md").unwrap();
    let block = page.split("```yaml\n").nth(1).and_then(|b| b.split("\n```").next()).expect("a yaml block");
    let documents = sidecar_injector::engine::manifest::read(block).expect("the settings block is YAML");
    let mut documented = BTreeSet::new();
    leaves(&documents[0], "", &mut documented);
    let missing: Vec<_> = code.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&code).collect();
    assert!(missing.is_empty() && unknown.is_empty(), "undocumented: {missing:?}; documented but unknown: {unknown:?}");
}

#[test]
fn every_metric_is_documented_and_nothing_else() {
    let exported: BTreeSet<String> = common::metrics::exported().into_keys().collect();
    let page = std::fs::read_to_string("docs/metrics.md").unwrap();
    let documented: BTreeSet<String> = prose(&page)
        .into_iter()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split(['`', '{']).next())
        .filter(|name| name.starts_with("sidecar_injector_"))
        .map(str::to_owned)
        .collect();
    let missing: Vec<_> = exported.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&exported).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "undocumented: {missing:?}; documented but not exported: {unknown:?}"
    );
}

/// The serialized names of a struct's fields in `crates/engine/src/model/status.rs` (its
/// `rename_all = "camelCase"`), read from the source so that a field added tomorrow is counted.
fn status_fields(source: &str, name: &str) -> Vec<String> {
    let body = source.split(&format!("pub struct {name} {{")).nth(1).expect("the struct").split("\n}").next().unwrap();
    body.lines()
        .filter_map(|line| line.trim().strip_prefix("pub ")?.split_once(':').map(|(field, _)| field.to_owned()))
        .map(|field| {
            let mut parts = field.split('_');
            let first = parts.next().unwrap().to_owned();
            parts.fold(first, |out, part| out + &part[..1].to_uppercase() + &part[1..])
        })
        .collect()
}

#[test]
fn every_field_of_the_status_annotation_is_in_how_it_works() {
    let source = std::fs::read_to_string("crates/engine/src/model/status.rs").unwrap();
    let page = std::fs::read_to_string("docs/how-it-works.md").unwrap();
    let section = page.split("## The status annotation").nth(1).expect("the status section");
    let section = section.split("\n## ").next().unwrap();
    let mut missing = Vec::new();
    for name in ["InjectionStatus", "AppContainerAdditions", "Padding"] {
        let fields = status_fields(&source, name);
        assert!(fields.len() >= 3, "{name}: fields not found: {fields:?}");
        missing
            .extend(fields.into_iter().filter(|f| !section.contains(&format!("`{f}`"))).map(|f| format!("{name}.{f}")));
    }
    assert!(missing.is_empty(), "docs/how-it-works.md's status annotation section misses {missing:?}");
}
