//! Strip: the pod as its author wrote it, from the pod and what the injection says it added.
//!
//! Callers pass a status whose items the pod proves (`ownership`) or one a check already trusts
//! (`/validate` after its own checks): strip removes exactly what the status names, so a forged
//! claim must never reach it unproven.

use serde_json::Value;

use crate::injection::env_merge;
use crate::model::kinds::{APP_LISTS, CONTAINER_LISTS, ENV, POD_LISTS};
use crate::model::status::InjectionStatus;
use crate::names;

/// The pod as it was before the injection the status describes.
pub fn strip_injection(pod: &Value, status: &InjectionStatus) -> Value {
    let mut pod = pod.clone();
    // The pod-level resources as the author wrote them: the padding taken back.
    if let Some(padding) = &status.pod_resources
        && let Some(authors) = crate::injection::pod_resources::PodLevel::of(&pod).and_then(|now| now.with(padding, -1))
        && let Some(Value::Object(resources)) = pod.get_mut("spec").and_then(|s| s.get_mut("resources"))
    {
        use crate::injection::pod_resources::Field;
        for (field, map) in [(Field::Requests, &authors.requests), (Field::Limits, &authors.limits)] {
            if let Some(Value::Object(values)) = resources.get_mut(field.key()) {
                values.extend(map.keys().filter_map(|r| Some((r.clone(), authors.written(field, r)?))));
            }
        }
    }
    let retain_unnamed = |list: Option<&mut Value>, key: &str, names: &[String]| {
        if let Some(Value::Array(items)) = list {
            items.retain(|item| !item.get(key).and_then(Value::as_str).is_some_and(|n| names.iter().any(|x| x == n)));
        }
    };
    if let Some(spec) = pod.get_mut("spec") {
        // A list the injection emptied was added whole by it (`injection::plan` removes it whole).
        let containers = CONTAINER_LISTS.iter().map(|k| (k.field, "name", (k.claimed)(status), k.may_empty));
        let lists = POD_LISTS.iter().map(|k| (k.field, k.key, (k.claimed)(status), true));
        for (field, key, names, may_empty) in containers.chain(lists) {
            retain_unnamed(spec.get_mut(field), key, names);
            if may_empty && spec.get(field).and_then(Value::as_array).is_some_and(Vec::is_empty) {
                spec.as_object_mut().map(|s| s.remove(field));
            }
        }
        if let Some(Value::Array(containers)) = spec.get_mut("containers") {
            for container in containers {
                let name = container.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
                let Some(additions) = status.app_containers.get(&name) else {
                    continue;
                };
                for kind in &APP_LISTS {
                    if let Some(Value::Array(items)) = container.get_mut(kind.field) {
                        let added = (kind.claimed)(additions);
                        items.retain(|item| !kind.identity(item).is_some_and(|i| added.iter().any(|a| *a == i)));
                    }
                }
                if let Some(Value::Array(env)) = container.get_mut(ENV.field) {
                    // Each merged entry once, the last of its value (the author's own come first).
                    for key in &additions.env_merges {
                        if let Some(at) = env.iter().rposition(|e| env_merge::key(e).as_ref() == Some(key)) {
                            env.remove(at);
                        }
                    }
                }
            }
        }
    }
    if let Some(Value::Object(metadata)) = pod.get_mut("metadata") {
        if let Some(Value::Object(labels)) = metadata.get_mut("labels") {
            labels.remove(names::INJECTED_LABEL);
            for key in &status.labels {
                labels.remove(key);
            }
        }
        if let Some(Value::Object(annotations)) = metadata.get_mut("annotations") {
            annotations.remove(names::STATUS_ANNOTATION);
            for key in &status.annotations {
                annotations.remove(key);
            }
        }
    }
    pod
}
