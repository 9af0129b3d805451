//! Reading the parts of a pod's raw JSON that the engine looks at. The engine works on the JSON as
//! submitted (never on typed structs) so that fields unknown to our Kubernetes types survive; these
//! helpers turn a malformed pod into a [`PodShapeError`] naming the field instead of a panic.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

/// A pod whose JSON does not have the shape Kubernetes requires, with the offending field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodShapeError {
    /// Dotted path of the field, e.g. `spec.containers[2].env`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for PodShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for PodShapeError {}

pub(crate) fn shape_error(field: impl Into<String>, message: impl Into<String>) -> PodShapeError {
    PodShapeError { field: field.into(), message: message.into() }
}

/// A string map such as `metadata.labels`; absent or null is empty.
pub fn string_map(pod: &Value, section: &str) -> Result<BTreeMap<String, String>, PodShapeError> {
    let field = format!("metadata.{section}");
    match pod.get("metadata").and_then(|m| m.get(section)) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                _ => Err(shape_error(format!("{field}.{k}"), "must be a string")),
            })
            .collect(),
        Some(_) => Err(shape_error(field, "must be a map of strings")),
    }
}

/// A list such as `spec.containers`; `None` when absent or null.
pub(crate) fn list<'p>(pod: &'p Value, field: &str) -> Result<Option<&'p Vec<Value>>, PodShapeError> {
    match pod.get("spec").and_then(|s| s.get(field)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items)),
        Some(_) => Err(shape_error(format!("spec.{field}"), "must be a list")),
    }
}

/// The container or init container named `name` (a malformed list holds none).
pub(crate) fn container<'p>(pod: &'p Value, name: &str) -> Option<&'p Value> {
    ["containers", "initContainers"]
        .into_iter()
        .filter_map(|field| list(pod, field).ok().flatten())
        .flatten()
        .find(|c| c.get("name").and_then(Value::as_str) == Some(name))
}

/// The `name` of each item of a list (containers, volumes, env vars), in order; the error names
/// the first item without a string name. The field path is only formatted on error: this runs for
/// every env var of every container.
pub(crate) fn names(items: Option<&Vec<Value>>, field: impl Fn() -> String) -> Result<Vec<&str>, PodShapeError> {
    keys(items, "name", field)
}

/// The string at `key` of each item of a list (`name`, `mountPath`), in order.
pub(crate) fn keys<'p>(
    items: Option<&'p Vec<Value>>,
    key: &str,
    field: impl Fn() -> String,
) -> Result<Vec<&'p str>, PodShapeError> {
    items
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, item)| match item.get(key) {
            Some(Value::String(value)) => Ok(value.as_str()),
            _ => Err(shape_error(format!("{}[{i}].{key}", field()), "must be a string")),
        })
        .collect()
}

/// The pod's name for messages: `name`, else `generateName*`, else `<unnamed>`.
pub fn display_name(pod: &Value) -> String {
    let metadata = pod.get("metadata");
    match (
        metadata.and_then(|m| m.get("name")).and_then(Value::as_str),
        metadata.and_then(|m| m.get("generateName")).and_then(Value::as_str),
    ) {
        (Some(name), _) if !name.is_empty() => name.to_owned(),
        (_, Some(prefix)) if !prefix.is_empty() => format!("{prefix}*"),
        _ => "<unnamed>".to_owned(),
    }
}
