//! CEL text: literals of strings and JSON values, conditions (`any`, label selectors, a
//! template's selection and targets), JSON pointer segments and patch operations, as the policy
//! program writes them.

use serde_json::Value;

use crate::model::kinds::PodListKind;
use crate::model::status::ItemKind;
use crate::templates::template::{AppTargets, Template, TemplateSelector};

/// A CEL string literal (JSON's escapes are CEL's).
pub(super) fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}

/// A CEL literal of a JSON value; members of maps and lists are `dyn` so that mixed types pass
/// the type checker. (Public for the benchmark's constant-patch policy.)
pub fn json_lit(value: &Value) -> String {
    match value {
        Value::String(s) => lit(s),
        Value::Array(items) => {
            format!("[{}]", items.iter().map(|i| format!("dyn({})", json_lit(i))).collect::<Vec<_>>().join(", "))
        }
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter().map(|(k, v)| format!("{}: dyn({})", lit(k), json_lit(v))).collect::<Vec<_>>().join(", ")
        ),
        other => other.to_string(),
    }
}

/// A CEL literal of a string's JSON text (quotes included), for the status annotation.
pub(super) fn json_text_lit(s: &str) -> String {
    lit(&serde_json::to_string(s).expect("strings serialize"))
}

/// A CEL list of scalars of one type (no `dyn`: `in` compares them as they are).
pub(super) fn scalars_lit(values: impl IntoIterator<Item = Value>) -> String {
    format!("[{}]", values.into_iter().map(|v| json_lit(&v)).collect::<Vec<_>>().join(", "))
}

/// `a || b || ...`, `false` when empty.
pub(super) fn any(terms: impl IntoIterator<Item = String>) -> String {
    let terms: Vec<String> = terms.into_iter().collect();
    if terms.is_empty() { "false".to_owned() } else { format!("({})", terms.join(" || ")) }
}

/// A JSON pointer segment.
pub(super) fn pointer(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// The CEL condition of a label selector over the labels map `labels`.
pub(super) fn selector_cel(selector: &TemplateSelector, labels: &str) -> String {
    let s = &selector.label_selector;
    let mut terms = Vec::new();
    for (k, v) in s.match_labels.iter().flatten() {
        terms.push(format!("({k} in {labels} && {labels}[{k}] == {v})", k = lit(k), v = lit(v)));
    }
    for e in s.match_expressions.iter().flatten() {
        let k = lit(&e.key);
        let values = scalars_lit(e.values.iter().flatten().map(|v| Value::String(v.clone())));
        terms.push(match e.operator.as_str() {
            "In" => format!("({k} in {labels} && {labels}[{k}] in {values})"),
            "NotIn" => format!("(!({k} in {labels}) || !({labels}[{k}] in {values}))"),
            "Exists" => format!("({k} in {labels})"),
            // DoesNotExist (the selector was checked when the template loaded).
            _ => format!("!({k} in {labels})"),
        });
    }
    if terms.is_empty() { "true".to_owned() } else { format!("({})", terms.join(" && ")) }
}

/// When a template is selected for a pod the policy sees.
pub(super) fn selection(template: &Template) -> String {
    let pod = template.pod_selector.as_ref().map(|s| selector_cel(s, "variables.podLabels"));
    let ns = template.namespace_selector.as_ref().map(|s| selector_cel(s, "variables.namespaceLabels"));
    let terms: Vec<String> = pod.into_iter().chain(ns).collect();
    if terms.is_empty() { "true".to_owned() } else { terms.join(" && ") }
}

pub(super) fn kind_name(kind: ItemKind) -> String {
    serde_json::to_value(kind).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// `prefix + text + suffix`, or `""` when `text` (CEL) is empty. (CEL in admission policies has
/// no `cel.bind`; a one-element list binds the value instead.)
pub(super) fn wrap_nonempty(text: &str, prefix: &str, suffix: &str) -> String {
    format!("[{text}].filter(w, w != \"\").map(w, {} + w + {}).join(\"\")", lit(prefix), lit(suffix))
}

/// `,"field":[...]` from conditional JSON strings, or nothing when none holds.
pub(super) fn list_part(field: &str, entries: &[(String, String)]) -> String {
    let list = entries.iter().map(|(cond, json)| format!("({cond} ? {json} : \"\")")).collect::<Vec<_>>().join(", ");
    wrap_nonempty(&format!("[{list}].filter(x, x != \"\").join(\",\")"), &format!(",\"{field}\":["), "]")
}

pub(super) fn patch_op(path: &str, value: &str) -> String {
    format!("JSONPatch{{op: \"add\", path: {path}, value: {value}}}")
}

pub(super) fn when_and(when: &Option<String>) -> String {
    when.as_ref().map(|w| format!(" && {w}")).unwrap_or_default()
}

pub(super) fn targets_cel(targets: &AppTargets) -> String {
    let names = |list: &[String]| scalars_lit(list.iter().map(|n| Value::String(n.clone())));
    let mut terms = Vec::new();
    if let Some(only) = &targets.only {
        terms.push(format!("c.name in {}", names(only)));
    }
    if !targets.except.is_empty() {
        terms.push(format!("!(c.name in {})", names(&targets.except)));
    }
    if terms.is_empty() { "true".to_owned() } else { format!("({})", terms.join(" && ")) }
}

/// The variable holding the identities of the pod's items of a kind of spec list
/// (`volumesKeys`).
pub(super) fn pod_list_keys(kind: &PodListKind) -> String {
    format!("{}Keys", kind.field)
}
