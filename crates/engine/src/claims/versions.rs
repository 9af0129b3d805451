//! Which template version a status annotation names: the one in service, one the template set
//! remembers (`TemplateSet::version`), or one rebuilt from the text in service. The last is for
//! pods injected with a version this process never loaded (the offline CLI knows only the
//! ConfigMap's text; a replica forgets what was replaced before it started): when the template
//! changed only images since, that version is the text in service with the new images put back to
//! the ones the pod's claimed containers have. It is accepted only when its content hash is the one
//! the claim names, so the pod cannot make it up: text that hashes to the claimed hash is the
//! version the pod was injected with, whatever the pod says.

use std::borrow::Borrow;
use std::sync::Arc;

use serde_json::Value;

use crate::injection::render::RenderedTemplate;
use crate::model::kinds::{CONTAINER_LISTS, VOLUMES};
use crate::model::status::{InjectionStatus, ItemKind, TemplateRef};
use crate::model::yaml::{SourceNode, SourceValue};
use crate::pod;
use crate::templates::compiler::content_hash;
use crate::templates::set::TemplateSet;
use crate::templates::template::Template;

/// How many (new image, old image) pairs a rebuild tries subsets of (2^n - 1 subsets, 6 texts each).
const MOST_IMAGE_PAIRS: usize = 3;

/// The largest template text a rebuild is tried on: each try hashes the whole text again, and a
/// pod's claim (which anyone creating pods writes) decides how often.
const MOST_REBUILT_BYTES: usize = 64 * 1024;

/// For each of the claim's template references, whether it is the first to name its template. A
/// pod has one version of a template: only that reference is rendered (or rebuilt), so a claim
/// naming one template thousands of times with made-up hashes costs one rendering, not thousands.
pub fn first_of_each_name(claim: &InjectionStatus) -> Vec<bool> {
    let mut seen = std::collections::BTreeSet::new();
    claim.templates.iter().map(|t| seen.insert(t.name.as_str())).collect()
}

/// The template version `claimed` names, for a pod with `claim`: remembered by `templates`, or
/// rebuilt from the version in service (`render_now` renders that for the pod without its claimed
/// items). `None` when it is neither.
pub fn claimed_version<R: Borrow<RenderedTemplate>>(
    templates: &TemplateSet,
    claimed: &TemplateRef,
    pod: &Value,
    claim: &InjectionStatus,
    render_now: impl FnOnce(&Template) -> Option<R>,
) -> Option<Arc<Template>> {
    if let Some(version) = templates.version(&claimed.name, &claimed.hash) {
        return Some(version.clone());
    }
    let current = templates.get(&claimed.name)?;
    if current.source.len() > MOST_REBUILT_BYTES {
        return None;
    }
    let rendered = render_now(current)?;
    rebuilt_with_images(current, &claimed.hash, &image_pairs(pod, claim, &claimed.name, rendered.borrow()))
}

/// Whether the claim says `template` injected the container of that name: the template renders
/// it (the caller checks) and it is not among the template's skipped items (where another
/// template, or the pod, had a container of that name first).
pub(crate) fn injected_by(claim: &InjectionStatus, template: &str, container: &str) -> bool {
    !claim.skipped.iter().any(|s| {
        s.template == template && s.name == container && matches!(s.kind, ItemKind::Sidecar | ItemKind::InitContainer)
    })
}

/// The container of that name a rendering has (an init container or a sidecar).
pub(crate) fn container_in<'r>(rendered: &'r RenderedTemplate, name: &str) -> Option<&'r Value> {
    rendered
        .init_containers
        .iter()
        .chain(&rendered.sidecars)
        .find(|c| c.get("name").and_then(Value::as_str) == Some(name))
}

/// The image a rendering gives the container of that name.
pub(crate) fn image_of<'r>(rendered: &'r RenderedTemplate, name: &str) -> Option<&'r str> {
    container_in(rendered, name).and_then(|c| c.get("image")).and_then(Value::as_str)
}

/// For each claimed container of `template` its new rendering has with another image, and each
/// claimed image volume (an agent delivered as an image, with no container that names it) it
/// renders with another reference: (new image, the pod's).
fn image_pairs(
    pod: &Value,
    claim: &InjectionStatus,
    template: &str,
    rendered: &RenderedTemplate,
) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    let mut pair = |new: Option<&str>, had: Option<&str>| {
        if let (Some(new), Some(had)) = (new, had)
            && new != had
            && !pairs.iter().any(|(n, o)| n == new && o == had)
        {
            pairs.push((new.to_owned(), had.to_owned()));
        }
    };
    for list in &CONTAINER_LISTS {
        for name in (list.claimed)(claim).iter().filter(|name| injected_by(claim, template, name)) {
            let had = pod::container(pod, name).and_then(|c| c.get("image")).and_then(Value::as_str);
            pair(image_of(rendered, name), had);
        }
    }
    let skipped = |name: &str| {
        claim.skipped.iter().any(|s| s.template == template && s.name == name && s.kind == ItemKind::Volume)
    };
    for name in claim.image_volumes.iter().filter(|name| !skipped(name)) {
        let in_pod = pod.get("spec").and_then(|s| s.get("volumes")).and_then(Value::as_array);
        // The rendering has the image form where the claim records it (the callers render the
        // forms the claim records).
        let in_pod = in_pod.map_or(&[][..], Vec::as_slice);
        pair(image_reference(rendered.pod_list(VOLUMES), name), image_reference(in_pod, name));
    }
    pairs
}

/// The image an image volume of that name among `volumes` mounts.
fn image_reference<'v>(volumes: &'v [Value], name: &str) -> Option<&'v str> {
    let volume = volumes.iter().find(|v| v.get("name").and_then(Value::as_str) == Some(name))?;
    volume.get("image")?.get("reference")?.as_str()
}

/// The earlier version of `current` whose content hash is `hash`, when it is `current` with the
/// new images in its text put back to the old ones: the whole image strings, or only the part
/// after the repository (a tag or digest kept in `values:`), or only the part that differs (a
/// version number inside a tag). `None` when no such text has that hash. The hash is what proves
/// it: text that hashes to what the pod names is the version the pod was injected with.
fn rebuilt_with_images(current: &Template, hash: &str, pairs: &[(String, String)]) -> Option<Arc<Template>> {
    if pairs.is_empty() {
        return None;
    }
    let root = SourceNode::parse(&current.source).ok()?;
    let candidates: [Substitution; 3] = [|new, old| (new.to_owned(), old.to_owned()), after_repository, differing_part];
    // The pairs of other templates' containers may be among them (a pod's claim does not say
    // which template injected which container): every subset is tried, the largest first.
    let pairs = &pairs[..pairs.len().min(MOST_IMAGE_PAIRS)];
    let mut subsets: Vec<Vec<&(String, String)>> = (1..1u32 << pairs.len())
        .map(|bits| pairs.iter().enumerate().filter(|(i, _)| bits & (1 << i) != 0).map(|(_, p)| p).collect())
        .collect();
    subsets.sort_by_key(|subset| std::cmp::Reverse(subset.len()));
    for subset in subsets {
        // Each part as a whole value first (`values: {tag: "1.3"}`), then inside longer text.
        for (candidate, whole) in candidates.into_iter().flat_map(|c| [(c, true), (c, false)]) {
            let substitutions: Vec<(String, String)> = subset.iter().map(|(new, old)| candidate(new, old)).collect();
            if substitutions.iter().any(|(new, _)| new.is_empty()) {
                continue;
            }
            let mut text = root.clone();
            let mut growth = MOST_REBUILT_BYTES;
            if !substitute(&mut text, &substitutions, whole, &mut growth) {
                continue;
            }
            if content_hash(&text) == hash {
                let version = Template::load(&current.name, &text.to_json().to_string()).ok()?;
                return (version.hash == hash).then(|| Arc::new(version));
            }
        }
    }
    None
}

/// Which parts of a (new image, old image) pair to put back in a template's text.
type Substitution = fn(&str, &str) -> (String, String);

/// Both images from the first character after their common repository (`registry/agent:` of
/// `registry/agent:1.2` and `registry/agent:1.3`): the tag or digest.
fn after_repository(new: &str, old: &str) -> (String, String) {
    let common = common_prefix(new, old);
    let start = new[..common].rfind([':', '@']).map_or(0, |i| i + 1);
    (new[start..].to_owned(), old[start..].to_owned())
}

/// The part of both images between their common beginning and end, widened to whole words of the
/// reference (`1.3` of `agent:1.3-alpine` and `agent:1.2-alpine`... as `1.3`).
fn differing_part(new: &str, old: &str) -> (String, String) {
    const DELIMITERS: [char; 6] = [':', '@', '/', '-', '_', '+'];
    let prefix = common_prefix(new, old);
    let start = new[..prefix].rfind(DELIMITERS).map_or(0, |i| i + 1);
    let suffix: usize =
        new.chars().rev().zip(old.chars().rev()).take_while(|(a, b)| a == b).map(|(a, _)| a.len_utf8()).sum();
    let suffix = suffix.min(new.len() - start).min(old.len() - start);
    let end_new = new.len() - suffix;
    let widen = |text: &str, end: usize| text[end..].find(DELIMITERS).map_or(text.len(), |i| end + i);
    let (end_new, end_old) = (widen(new, end_new), widen(old, old.len() - suffix));
    (new[start..end_new].to_owned(), old[start..end_old].to_owned())
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .take_while(|((_, x), y)| x == y)
        .map(|((i, x), _)| i + x.len_utf8())
        .last()
        .unwrap_or(0)
}

/// Replaces, in the string values of the tree (and in every number written the same way, as a
/// tag `1.3` is), each `new` by its `old`: values that are `new` (`whole`), or every occurrence.
/// `false` (the text half done) when that would add more than `growth` bytes.
fn substitute(node: &mut SourceNode, substitutions: &[(String, String)], whole: bool, growth: &mut usize) -> bool {
    // The old images come from the pod: what they may add to the text is bounded, so that a huge
    // image in a claimed container cannot make a short one in the template's text expand without end.
    let mut grow = |by: usize| match growth.checked_sub(by) {
        Some(left) => {
            *growth = left;
            true
        }
        None => false,
    };
    match &mut node.value {
        SourceValue::String(text) => {
            if let Some((_, old)) = substitutions.iter().find(|(new, _)| new == text) {
                if !grow(old.len()) {
                    return false;
                }
                *text = old.clone();
            } else if !whole {
                for (new, old) in substitutions {
                    let count = text.matches(new.as_str()).count();
                    if count > 0 {
                        if !grow(count.saturating_mul(old.len())) {
                            return false;
                        }
                        *text = text.replace(new.as_str(), old);
                    }
                }
            }
            true
        }
        SourceValue::Number(number) => {
            if let Some((_, old)) = substitutions.iter().find(|(new, _)| *new == number.to_string()) {
                if !grow(old.len()) {
                    return false;
                }
                node.value = match old.parse::<serde_json::Number>() {
                    Ok(number) if number.to_string() == *old => SourceValue::Number(number),
                    _ => SourceValue::String(old.clone()),
                };
            }
            true
        }
        SourceValue::Seq(items) => items.iter_mut().all(|item| substitute(item, substitutions, whole, growth)),
        SourceValue::Map(entries) => {
            entries.iter_mut().all(|entry| substitute(&mut entry.value, substitutions, whole, growth))
        }
        SourceValue::Null | SourceValue::Bool(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::status::TemplateRef;
    use crate::test_support::{engine, template};

    #[test]
    fn a_version_is_rebuilt_only_when_its_hash_says_so_and_the_text_is_small() {
        let text = |image: &str, padding: usize| {
            format!(
                "description: \"{}\"\ndefault: true\ninject:\n  sidecars:\n    - {{name: proxy, image: \"{image}\"}}\n",
                "x".repeat(padding)
            )
        };
        for (padding, rebuilt) in [(0, true), (MOST_REBUILT_BYTES, false)] {
            let old = template("mesh", &text("proxy:1.0", padding));
            let now = engine(&[("mesh", &text("proxy:1.1", padding))]);
            let claim = InjectionStatus {
                templates: vec![TemplateRef { name: "mesh".into(), hash: old.hash.clone() }],
                containers: vec!["proxy".into()],
                ..InjectionStatus::default()
            };
            let pod =
                |image: &str| json!({"spec": {"containers": [{"name": "app"}, {"name": "proxy", "image": image}]}});
            let rendered = |t: &Template| {
                let image = if t.hash == old.hash { "proxy:1.0" } else { "proxy:1.1" };
                Some(RenderedTemplate {
                    sidecars: vec![json!({"name": "proxy", "image": image})],
                    ..Default::default()
                })
            };
            let found = claimed_version(&now.templates, &claim.templates[0], &pod("proxy:1.0"), &claim, rendered);
            assert_eq!(found.map(|t| t.hash.clone()), rebuilt.then(|| old.hash.clone()), "{padding} bytes of padding");
            // Another image in the pod is not that version: its text does not hash to the claim.
            let other = claimed_version(&now.templates, &claim.templates[0], &pod("proxy:0.9"), &claim, rendered);
            assert!(other.is_none());
        }
    }

    #[test]
    fn a_huge_image_in_the_pod_cannot_blow_the_text_up() {
        // A one-character part of the template's image, many times in its text, and a pod image
        // of 1 MiB: put back everywhere it would be hundreds of MiB.
        let text = format!(
            "default: true\nvalues: {{{}}}\n",
            (0..1000).map(|i| format!("k{i}: \"3\"")).collect::<Vec<_>>().join(", ")
        );
        let root = SourceNode::parse(&text).unwrap();
        let huge = "x".repeat(1024 * 1024);
        let mut budget = MOST_REBUILT_BYTES;
        assert!(!substitute(&mut root.clone(), &[("3".into(), huge)], true, &mut budget));
        let mut budget = MOST_REBUILT_BYTES;
        assert!(substitute(&mut root.clone(), &[("3".into(), "2".into())], true, &mut budget), "a real tag fits");
    }

    #[test]
    fn the_changed_part_of_an_image_is_found_at_word_boundaries() {
        let cases = [
            ("agent:1.3", "agent:1.2", ("1.3", "1.2"), ("1.3", "1.2")),
            ("r.io/agent:1.3-alpine", "r.io/agent:1.2-alpine", ("1.3-alpine", "1.2-alpine"), ("1.3", "1.2")),
            ("agent:1.13", "agent:1.12", ("1.13", "1.12"), ("1.13", "1.12")),
            ("agent@sha256:aa", "agent@sha256:bb", ("aa", "bb"), ("aa", "bb")),
            ("new/agent:1", "old/agent:1", ("new/agent:1", "old/agent:1"), ("new", "old")),
        ];
        for (new, old, after, differing) in cases {
            let pair = |(a, b): (&str, &str)| (a.to_owned(), b.to_owned());
            assert_eq!(after_repository(new, old), pair(after), "{new} {old}");
            assert_eq!(differing_part(new, old), pair(differing), "{new} {old}");
        }
    }
}
