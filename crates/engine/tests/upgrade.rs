//! Upgrades must not notice the engine: pods injected by an earlier release, with the templates they
//! were injected from, are served by this engine as they were.
//!
//! `upgrade/cases/*/injected.yaml` holds what the release before the engine redesign wrote into
//! pods (`upgrade/record.sh`, run once with that release's binary; never regenerated), from frozen
//! copies of the shipped and golden templates under `upgrade/templates/`, whose hashes that release
//! printed beside them (`*.hashes`). For every template the engine must compute the same hash, and
//! for every injected pod it must:
//! - call it up to date (no patch, no stale version: nothing for drift to roll);
//! - let `/validate` allow it;
//! - strip exactly the injection, and injecting the stripped pod again must give the stored pod.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use sidecar_injector_engine::checks::validate::{Verdict, strip_injection, validate_pod};
use sidecar_injector_engine::claims::status::InjectionStatus;
use sidecar_injector_engine::{
    ClusterFacts, Engine, NamespaceFacts, Outcome, PodRequest, TemplateSet, TemplateSource, manifest, names, workload,
};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/upgrade");

/// The CLI flags a case was recorded with (`args`, one per line).
#[derive(Default)]
struct Args {
    templates: String,
    namespace: Option<String>,
    namespace_labels: Option<BTreeMap<String, String>>,
    namespace_annotations: BTreeMap<String, String>,
    kube_version: Option<String>,
}

/// `k=v,k2=v2`, where an item without `=` continues the previous value (as the CLI reads it).
fn key_values(text: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let mut last = String::new();
    for part in text.split(',') {
        match part.split_once('=') {
            Some((key, value)) => {
                map.insert(key.to_owned(), value.to_owned());
                last = key.to_owned();
            }
            None => map.get_mut(&last).expect("an item continues a value").push_str(&format!(",{part}")),
        }
    }
    map
}

fn args_of(case: &Path) -> Args {
    let mut args = Args::default();
    for line in fs::read_to_string(case.join("args")).unwrap().lines().filter(|l| !l.trim().is_empty()) {
        let (flag, value) = line.split_once('=').unwrap_or_else(|| panic!("{line}: not --flag=value"));
        match flag {
            "--templates" => args.templates = value.to_owned(),
            "--namespace" => args.namespace = Some(value.to_owned()),
            "--namespace-labels" => args.namespace_labels = Some(key_values(value)),
            "--namespace-annotations" => args.namespace_annotations = key_values(value),
            "--kube-version" => args.kube_version = Some(value.to_owned()),
            other => panic!("{}: flag {other} is not read by this test", case.display()),
        }
    }
    args
}

fn templates(dir: &str) -> TemplateSet {
    let mut sources: Vec<TemplateSource> = fs::read_dir(Path::new(ROOT).join("templates").join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|path| TemplateSource {
            name: path.file_stem().unwrap().to_string_lossy().into_owned(),
            text: fs::read_to_string(&path).unwrap(),
        })
        .collect();
    sources.sort_by(|a, b| a.name.cmp(&b.name));
    let (set, errors) = TemplateSet::load(sources);
    assert!(errors.is_empty(), "{dir}: {errors:?}");
    set
}

#[test]
fn the_engine_gives_the_recorded_hashes() {
    let mut checked = 0;
    for entry in fs::read_dir(Path::new(ROOT).join("templates")).unwrap() {
        let path = entry.unwrap().path();
        let Some(dir) = path.file_name().unwrap().to_str().unwrap().strip_suffix(".hashes") else { continue };
        let set = templates(dir);
        let recorded = fs::read_to_string(&path).unwrap();
        for line in recorded.lines() {
            let (name, hash) = line.split_once(' ').unwrap();
            let template = set.get(name).unwrap_or_else(|| panic!("{dir}: no template {name}"));
            assert_eq!(
                template.hash, hash,
                "{dir}/{name}: the hash changed, so every pod injected from it turns stale"
            );
            checked += 1;
        }
        assert_eq!(recorded.lines().count(), set.len(), "{dir}: every template has a recorded hash");
    }
    assert!(checked >= 12, "the recorded hashes are missing ({checked})");
}

#[test]
fn pods_injected_by_the_previous_release_are_up_to_date_validate_and_reinject_the_same() {
    let mut cases: Vec<_> = fs::read_dir(Path::new(ROOT).join("cases")).unwrap().map(|e| e.unwrap().path()).collect();
    cases.sort();
    let mut failures = Vec::new();
    let mut pods = 0;
    for case in &cases {
        let args = args_of(case);
        let engine = Engine::new(templates(&args.templates), vec![names::INJECTOR_NAMESPACE.to_owned()]);
        let cluster = args
            .kube_version
            .as_deref()
            .map_or_else(ClusterFacts::default, |v| ClusterFacts::from_version_string(v).unwrap());
        let text = fs::read_to_string(case.join("injected.yaml")).unwrap();
        for (index, document) in manifest::read(&text).unwrap().iter().enumerate() {
            let Some(pod) = workload::pod_of(document) else { continue };
            let Some(status) =
                pod["metadata"]["annotations"].get(names::STATUS_ANNOTATION).and_then(Value::as_str).map(str::to_owned)
            else {
                continue;
            };
            let at = format!("{} document {}", case.file_name().unwrap().to_string_lossy(), index + 1);
            let namespace =
                workload::namespace_of(document).or(args.namespace.as_deref()).unwrap_or("default").to_owned();
            let facts = match &args.namespace_labels {
                Some(labels) => NamespaceFacts::known(&namespace, labels.clone(), args.namespace_annotations.clone()),
                None => NamespaceFacts {
                    annotations: args.namespace_annotations.clone(),
                    ..NamespaceFacts::unknown(&namespace)
                },
            };
            let request = |pod: Value| PodRequest {
                pod: Arc::new(pod),
                namespace: facts.clone(),
                cluster,
                workload: workload::Workload::of_document(document),
            };
            pods += 1;
            match engine.evaluate(&request(pod.clone())).outcome {
                Outcome::UpToDate(_) => {}
                other => failures.push(format!("{at}: not up to date: {other:?}")),
            }
            if let Verdict::Denied(message) = validate_pod(&engine, &request(pod.clone())) {
                failures.push(format!("{at}: /validate denies it: {message}"));
            }
            let stripped = strip_injection(&pod, &InjectionStatus::parse(&status).unwrap());
            match engine.evaluate(&request(stripped.clone())).outcome {
                Outcome::Inject(injection) => {
                    let mut again = stripped;
                    json_patch::patch(&mut again, &injection.patch).unwrap();
                    if again != pod {
                        failures.push(format!(
                            "{at}: re-injecting the stripped pod gives\n{}\ninstead of\n{}",
                            serde_json::to_string_pretty(&again).unwrap(),
                            serde_json::to_string_pretty(&pod).unwrap()
                        ));
                    }
                }
                other => failures.push(format!("{at}: the stripped pod is not injected: {other:?}")),
            }
        }
    }
    assert!(pods >= 30, "the recorded pods are missing ({pods})");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
