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

/// What a check of one rendered item finds: a value of the wrong type (`Err`, with its field
/// path), or the fields the type does not have (`Ok`, every one of them, in the item's order).
pub type Checked = Result<Vec<String>, String>;

/// [`conforms`] for a pod `Volume`. The item kinds' table (`kinds`) names these plain functions
/// rather than `conforms::<T>`: a generic function named in a table that another crate reads is
/// instantiated again in that crate, and the binary carried a second copy of `Volume`'s
/// deserializer (half a megabyte) until they were plain.
pub fn volume(item: &Value) -> Checked {
    conforms::<k8s_openapi::api::core::v1::Volume>(item)
}

/// [`conforms`] for a `LocalObjectReference` (an image pull secret); see [`volume`].
pub fn local_object_reference(item: &Value) -> Checked {
    conforms::<k8s_openapi::api::core::v1::LocalObjectReference>(item)
}

/// [`conforms`] for a pod `HostAlias`; see [`volume`].
pub fn host_alias(item: &Value) -> Checked {
    conforms::<k8s_openapi::api::core::v1::HostAlias>(item)
}

/// [`conforms`] for a pod `PodResourceClaim`; see [`volume`].
pub fn pod_resource_claim(item: &Value) -> Checked {
    conforms::<k8s_openapi::api::core::v1::PodResourceClaim>(item)
}

/// [`conforms`] for a pod `PodSchedulingGate`; see [`volume`].
pub fn pod_scheduling_gate(item: &Value) -> Checked {
    conforms::<k8s_openapi::api::core::v1::PodSchedulingGate>(item)
}

/// [`conforms`] for an `EnvVar`; see [`volume`].
pub fn env_var(item: &Value) -> Checked {
    conforms::<k8s_openapi::api::core::v1::EnvVar>(item)
}

/// [`conforms`] for an `EnvFromSource`; see [`volume`].
pub fn env_from_source(item: &Value) -> Checked {
    conforms::<k8s_openapi::api::core::v1::EnvFromSource>(item)
}

/// [`conforms`] for a `VolumeMount`; see [`volume`].
pub fn volume_mount(item: &Value) -> Checked {
    conforms::<k8s_openapi::api::core::v1::VolumeMount>(item)
}

/// Reads `item` as a `T`: an error names the field path of a value of the wrong type; `Ok` names
/// every field `T` does not have, as `ports[1].protocl` (k8s-openapi ignores unknown fields;
/// `serde_ignored` reports each one it skips, so no type needs to be written back).
pub fn conforms<T: serde::de::DeserializeOwned>(item: &Value) -> Checked {
    let mut unknown = Vec::new();
    match read::<T>(item, &mut unknown) {
        Ok(()) => Ok(unknown),
        Err(error) => Err(match locate::<T>(item, &error) {
            path if path.is_empty() => error,
            path => format!("{path}: {error}"),
        }),
    }
}

/// Reads `item` as a `T`, noting each field it does not have in `unknown`. The one place a
/// `T` is deserialized: every instantiation of a k8s-openapi type's deserializer is tens of
/// kilobytes of the binary (`Volume`'s is over 180), so the error's path is found by reading
/// again ([`locate`]) rather than by a path-tracking deserializer wrapped around this one.
fn read<T: serde::de::DeserializeOwned>(item: &Value, unknown: &mut Vec<String>) -> Result<(), String> {
    let mut note = |path: serde_ignored::Path<'_>| unknown.push(field_path(&path));
    T::deserialize(serde_ignored::Deserializer::new(item, &mut note)).map(drop).map_err(|e| e.to_string())
}

/// Most reads [`locate`] makes, so that a template with a long list inside one item still fails
/// in bounded time (with the path found so far).
const MOST_LOCATING_READS: usize = 256;

/// Most bytes of items [`locate`] reads in all: a large item (rendered output may reach
/// `render::MAX_TEMPLATE_OUTPUT`) gets fewer reads.
const MOST_LOCATING_BYTES: usize = 16 * 1024 * 1024;

/// The field path of `error` in `item` (empty: the item itself). serde's error names no path, so
/// it is found from the outside: the field (or list entry) whose removal changes the error holds
/// it, and the search goes on inside it. Only the load check of an item that fails comes here.
fn locate<T: serde::de::DeserializeOwned>(item: &Value, error: &str) -> String {
    let mut scratch = item.clone();
    let mut steps: Vec<Step> = Vec::new();
    let size = serde_json::to_vec(item).map_or(usize::MAX, |bytes| bytes.len().max(1));
    let most_reads = (MOST_LOCATING_BYTES / size).clamp(1, MOST_LOCATING_READS);
    let mut reads = 0;
    'descend: loop {
        let candidates: Vec<Step> = match node(&mut scratch, &steps) {
            Some(Value::Object(fields)) => fields.keys().cloned().map(Step::Field).collect(),
            Some(Value::Array(entries)) => (0..entries.len()).map(Step::Entry).collect(),
            _ => break,
        };
        for step in candidates {
            reads += 1;
            if reads > most_reads {
                break 'descend;
            }
            let taken = step.take(node(&mut scratch, &steps));
            let changed = read::<T>(&scratch, &mut Vec::new()).err().as_deref() != Some(error);
            step.put_back(node(&mut scratch, &steps), taken);
            if changed {
                steps.push(step);
                continue 'descend;
            }
        }
        break;
    }
    steps.iter().enumerate().fold(String::new(), |path, (i, step)| match step {
        Step::Field(key) if i == 0 => key.clone(),
        Step::Field(key) => format!("{path}.{key}"),
        Step::Entry(index) => format!("{path}[{index}]"),
    })
}

/// One step of [`locate`]'s way into an item.
enum Step {
    Field(String),
    Entry(usize),
}

impl Step {
    /// Removes this field or entry from `parent`.
    fn take(&self, parent: Option<&mut Value>) -> Option<Value> {
        match (self, parent?) {
            (Step::Field(key), Value::Object(fields)) => fields.remove(key),
            (Step::Entry(index), Value::Array(entries)) => Some(entries.remove(*index)),
            _ => None,
        }
    }

    /// Puts back what [`Step::take`] removed, where it was.
    fn put_back(&self, parent: Option<&mut Value>, taken: Option<Value>) {
        match (self, parent, taken) {
            (Step::Field(key), Some(Value::Object(fields)), Some(value)) => drop(fields.insert(key.clone(), value)),
            (Step::Entry(index), Some(Value::Array(entries)), Some(value)) => entries.insert(*index, value),
            _ => {}
        }
    }
}

/// The value `steps` lead to inside `value`.
fn node<'v>(value: &'v mut Value, steps: &[Step]) -> Option<&'v mut Value> {
    steps.iter().try_fold(value, |value, step| match step {
        Step::Field(key) => value.get_mut(key),
        Step::Entry(index) => value.get_mut(*index),
    })
}

/// A path as Kubernetes writes field paths: `resources.limitz`, `ports[1].protocl`.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => match field_path(parent) {
            parent if parent.is_empty() => key.clone(),
            parent => format!("{parent}.{key}"),
        },
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, Volume};
    use serde_json::json;

    #[test]
    fn errors_name_the_path_of_the_value_that_is_wrong() {
        // (item, the error conforms::<Container> gives)
        let cases = [
            (
                json!({"name": "a", "ports": [{"containerPort": 1}, {"containerPort": "80x"}]}),
                "ports[1].containerPort: invalid type: string \"80x\", expected i32",
            ),
            (
                json!({"name": "a", "env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": 7}}}]}),
                "env[0].valueFrom.fieldRef.fieldPath: invalid type: integer `7`, expected a string",
            ),
            (
                json!({"name": "a", "command": ["sh", false]}),
                "command[1]: invalid type: boolean `false`, expected a string",
            ),
            // The item itself.
            (json!("a string"), "invalid type: string \"a string\", expected Container"),
        ];
        for (item, expected) in cases {
            assert_eq!(conforms::<Container>(&item), Err(expected.to_owned()), "{item}");
        }
        let volume = json!({"name": "v", "emptyDir": {"sizeLimit": "1Gi", "medium": ["Memory"]}});
        assert_eq!(
            conforms::<Volume>(&volume).unwrap_err(),
            "emptyDir.medium: invalid type: sequence, expected a string"
        );
    }

    #[test]
    fn unknown_fields_are_named_and_a_long_search_stops() {
        let item = json!({"name": "a", "ports": [{"containerPort": 1, "protocl": "TCP"}], "resourcse": {}});
        // Every one of them, not only the first (a listed one must not hide an unlisted typo).
        assert_eq!(conforms::<Container>(&item), Ok(vec!["ports[0].protocl".to_owned(), "resourcse".to_owned()]));
        // The entry at fault is past the bound on reads: the error comes back with the path found so far.
        let mut args: Vec<Value> = (0..1000).map(|i| json!(i.to_string())).collect();
        args.push(json!(1));
        let error = conforms::<Container>(&json!({"name": "a", "args": args})).unwrap_err();
        assert_eq!(error, "args: invalid type: integer `1`, expected a string");
        // A large item gets fewer reads: a megabyte argument leaves room for 16, not 256.
        let mut args = vec![json!("x".repeat(1024 * 1024))];
        args.extend((0..30).map(|i| json!(i.to_string())));
        args.push(json!(1));
        let error = conforms::<Container>(&json!({"name": "a", "args": args.clone()})).unwrap_err();
        assert_eq!(error, "args: invalid type: integer `1`, expected a string");
        args.truncate(5);
        args.push(json!(1));
        let error = conforms::<Container>(&json!({"name": "a", "args": args})).unwrap_err();
        assert_eq!(error, "args[5]: invalid type: integer `1`, expected a string");
    }
}
