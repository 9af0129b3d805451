//! Property tests of the injection over generated pods and templates:
//! - the patch of a pod without a status only adds (and writes the injector's own label/annotation);
//! - every field the pod had is still there with its value after the patch;
//! - injecting the patched pod again yields no patch (idempotence);
//! - re-injecting an injection made with other templates equals injecting the original pod.

use std::collections::BTreeSet;
use std::sync::Arc;

use json_patch::PatchOperation;
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use sidecar_injector::engine::validate::first_difference;
use sidecar_injector::engine::{
    ClusterFacts, Engine, NamespaceFacts, Outcome, PodRequest, TemplateSet, TemplateSource, yaml,
};

const NAMES: [&str; 5] = ["a", "b", "app", "logs", "proxy"];
const KEYS: [&str; 4] = ["team", "tier", "example.com/x", "sidecar-injector.io/extra"];
const PATHS: [&str; 3] = ["/var/log", "/etc/conf", "/data"];

fn names() -> impl Strategy<Value = Vec<&'static str>> {
    proptest::sample::subsequence(NAMES.to_vec(), 0..=NAMES.len())
}

fn string_map() -> impl Strategy<Value = Map<String, Value>> {
    proptest::collection::btree_map(proptest::sample::select(KEYS.to_vec()), "[a-z]{0,3}", 0..=3)
        .prop_map(|m| m.into_iter().map(|(k, v)| (k.to_owned(), Value::from(v))).collect())
}

fn named(list: &[&str], prefix: &str) -> Value {
    Value::Array(list.iter().map(|n| json!({"name": format!("{prefix}{n}"), "image": format!("{n}:1")})).collect())
}

/// A pod with unique container names, optional maps and lists, and fields no type knows about.
fn pod() -> impl Strategy<Value = Value> {
    (
        proptest::option::of(string_map()),
        proptest::option::of(string_map()),
        proptest::sample::subsequence(NAMES.to_vec(), 1..=3),
        proptest::option::of(names()),
        proptest::option::of(names()),
        proptest::collection::vec((names(), proptest::sample::subsequence(PATHS.to_vec(), 0..=2)), 3),
    )
        .prop_map(|(labels, annotations, containers, init, volumes, per_container)| {
            let mut metadata = Map::new();
            metadata.insert("name".into(), json!("p"));
            if let Some(labels) = labels {
                metadata.insert("labels".into(), Value::Object(labels));
            }
            if let Some(annotations) = annotations {
                metadata.insert("annotations".into(), Value::Object(annotations));
            }
            let mut containers = named(&containers, "c-");
            for (container, (env, paths)) in containers.as_array_mut().unwrap().iter_mut().zip(per_container) {
                container["env"] =
                    Value::Array(env.iter().map(|n| json!({"name": n.to_uppercase(), "value": "pod"})).collect());
                container["volumeMounts"] = Value::Array(
                    paths.iter().enumerate().map(|(i, p)| json!({"name": format!("m{i}"), "mountPath": p})).collect(),
                );
                container["x-unknown"] = json!({"kept": true});
            }
            let mut spec = Map::new();
            spec.insert("containers".into(), containers);
            if let Some(init) = init {
                spec.insert("initContainers".into(), named(&init, "i-"));
            }
            if let Some(volumes) = volumes {
                spec.insert(
                    "volumes".into(),
                    Value::Array(volumes.iter().map(|n| json!({"name": n, "emptyDir": {}})).collect()),
                );
            }
            spec.insert("x-future".into(), json!([1, 2]));
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
        })
}

/// A template using every section, with names drawn from the same pools as the pod's so that
/// conflicts happen often.
fn template() -> impl Strategy<Value = String> {
    (
        string_map(),
        string_map(),
        names(),
        names(),
        names(),
        names(),
        proptest::sample::subsequence(PATHS.to_vec(), 0..=2),
        proptest::sample::select(vec!["native", "container", "auto"]),
        "[a-z]{1,4}",
    )
        .prop_map(|(labels, annotations, init, sidecars, volumes, env, mounts, mode, value)| {
            let doc = json!({
                "default": true,
                "sidecarMode": mode,
                "values": {"v": value},
                "inject": {
                    "labels": labels,
                    "annotations": annotations,
                    "initContainers": named(&init, "i-"),
                    "sidecars": Value::Array(sidecars.iter().map(|n| json!({
                        "name": format!("c-{n}"),
                        "image": "{{ values.v }}",
                        "args": ["{{ pod.metadata.name }}", "{{ namespace.name }}"],
                    })).collect()),
                    "volumes": Value::Array(volumes.iter().map(|n| json!({"name": n, "emptyDir": {}})).collect()),
                    "appContainers": {
                        "env": Value::Array(env.iter().map(|n| json!({"name": n.to_uppercase(), "value": "{{ values.v }}"})).collect()),
                        "volumeMounts": Value::Array(mounts.iter().map(|p| json!({"name": "a", "mountPath": p})).collect()),
                    },
                },
            });
            yaml::to_yaml_documents(&[doc])
        })
}

fn engine(templates: &[String]) -> Engine {
    let sources =
        templates.iter().enumerate().map(|(i, text)| TemplateSource { name: format!("t{i}"), text: text.clone() });
    let (set, errors) = TemplateSet::load(sources);
    assert!(errors.is_empty(), "{errors:?}");
    Engine::new(set, Vec::new())
}

fn evaluate(engine: &Engine, pod: &Value, native: bool) -> Outcome {
    let namespace = NamespaceFacts::known(
        "shop",
        [("sidecar-injector.io/inject".into(), "enabled".into())].into(),
        Default::default(),
    );
    engine
        .evaluate(&PodRequest {
            pod: Arc::new(pod.clone()),
            namespace,
            cluster: ClusterFacts { native_sidecars: native },
        })
        .outcome
}

fn patched(pod: &Value, outcome: Outcome) -> (Value, Vec<PatchOperation>) {
    let Outcome::Inject(injection) = outcome else { panic!("expected an injection, got {outcome:?}") };
    let mut out = pod.clone();
    json_patch::patch(&mut out, &injection.patch).expect("the patch applies");
    (out, injection.patch)
}

/// Empty maps and lists are the same as absent ones to Kubernetes.
fn normalize(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), normalize(v)))
                .filter(|(_, v)| {
                    !matches!(v, Value::Object(m) if m.is_empty()) && !matches!(v, Value::Array(a) if a.is_empty())
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn patches_only_add_keep_everything_and_are_idempotent(
        pod in pod(),
        templates in proptest::collection::vec(template(), 1..=3),
        native in any::<bool>(),
    ) {
        let engine = engine(&templates);
        let (out, patch) = patched(&pod, evaluate(&engine, &pod, native));
        for op in &patch {
            let path = op.path().to_string();
            let own = path.ends_with("sidecar-injector.io~1status") || path.ends_with("sidecar-injector.io~1injected");
            prop_assert!(matches!(op, PatchOperation::Add(_)) || own, "{op:?}");
        }
        // Everything the pod had is still there, unchanged (lists of named items matched by name).
        let mut original = pod.clone();
        if let Some(labels) = original["metadata"].get_mut("labels").and_then(Value::as_object_mut) {
            labels.remove("sidecar-injector.io/injected");
        }
        prop_assert_eq!(first_difference(&original, &out, ""), None);
        let names_before: BTreeSet<String> = ["containers", "initContainers"].iter()
            .flat_map(|l| pod["spec"][*l].as_array().cloned().unwrap_or_default())
            .map(|c| c["name"].as_str().unwrap().to_owned()).collect();
        let names_after: Vec<String> = ["containers", "initContainers"].iter()
            .flat_map(|l| out["spec"][*l].as_array().cloned().unwrap_or_default())
            .map(|c| c["name"].as_str().unwrap().to_owned()).collect();
        prop_assert!(names_before.iter().all(|n| names_after.contains(n)));
        let unique: BTreeSet<&String> = names_after.iter().collect();
        prop_assert_eq!(unique.len(), names_after.len(), "container names stay unique");

        prop_assert!(matches!(evaluate(&engine, &out, native), Outcome::UpToDate(_)), "injecting again changes nothing");
    }

    #[test]
    fn re_injection_equals_injecting_the_original(
        pod in pod(),
        old in proptest::collection::vec(template(), 1..=2),
        new in proptest::collection::vec(template(), 1..=2),
        native in any::<bool>(),
    ) {
        let (old_engine, new_engine) = (engine(&old), engine(&new));
        let (injected_old, _) = patched(&pod, evaluate(&old_engine, &pod, native));
        let expected = match evaluate(&new_engine, &pod, native) {
            outcome @ Outcome::Inject(_) => patched(&pod, outcome).0,
            Outcome::UpToDate(_) => return Ok(()),
            other => panic!("{other:?}"),
        };
        let reinjected = match evaluate(&new_engine, &injected_old, native) {
            outcome @ Outcome::Inject(_) => patched(&injected_old, outcome).0,
            Outcome::UpToDate(_) => injected_old.clone(),
            other => panic!("{other:?}"),
        };
        prop_assert_eq!(normalize(&reinjected), normalize(&expected));
    }
}
