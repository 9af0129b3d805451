//! Whether a rendered item is what Kubernetes accepts in its place: read as its k8s-openapi type,
//! a value of the wrong type is an error naming the field path, and a field the type does not have
//! is found too (k8s-openapi ignores unknown fields, as the API server drops them), the way
//! `kubectl`'s strict field validation finds it. No other module of the engine is needed here, so
//! the load check and the item kinds' descriptions both use it.

use serde_json::Value;

/// The Kubernetes version whose types the load check reads rendered items as (the k8s-openapi
/// feature this crate is built with). A field newer than this is unknown to the check: a template
/// lists it in `uncheckedFields` (docs/templates.md).
pub const CHECKED_KUBERNETES_VERSION: &str = "1.37";

/// Reads `item` as a `T`: an error names the field path of a value of the wrong type; `Ok(Some)`
/// names the first field `T` does not have (k8s-openapi ignores unknown fields, so they are the
/// fields that reading and writing the item back loses).
pub fn conforms<T: serde::de::DeserializeOwned + serde::Serialize>(item: &Value) -> Result<Option<String>, String> {
    let typed: T = serde_path_to_error::deserialize(item).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." { inner } else { format!("{path}: {inner}") }
    })?;
    let known = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    Ok(first_unknown_field(item, &known, ""))
}

/// The first field of `item` (a null counts as absent) missing from `known`, as a path like
/// `resources.limitz` or `ports[1].containerPortt`.
fn first_unknown_field(item: &Value, known: &Value, path: &str) -> Option<String> {
    let join = |key: &str| if path.is_empty() { key.to_owned() } else { format!("{path}.{key}") };
    match (item, known) {
        (Value::Object(fields), Value::Object(known)) => {
            fields.iter().filter(|(_, value)| !value.is_null()).find_map(|(key, value)| match known.get(key) {
                None => Some(join(key)),
                Some(known) => first_unknown_field(value, known, &join(key)),
            })
        }
        (Value::Array(items), Value::Array(known)) => items
            .iter()
            .zip(known)
            .enumerate()
            .find_map(|(index, (item, known))| first_unknown_field(item, known, &format!("{path}[{index}]"))),
        _ => None,
    }
}
