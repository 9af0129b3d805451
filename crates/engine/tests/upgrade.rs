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

mod common;

use std::fs;
use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use sidecar_injector_engine::claims::strip::strip_injection;
use sidecar_injector_engine::model::native;
use sidecar_injector_engine::model::status::InjectionStatus;
use sidecar_injector_engine::review::validate::{Verdict, validate_pod};
use sidecar_injector_engine::{Engine, Outcome, PodRequest, TemplateSet, manifest, names, workload};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/upgrade");

fn templates(dir: &str) -> TemplateSet {
    common::load_templates(&Path::new(ROOT).join("templates").join(dir))
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
        let args = common::case_args(case);
        let engine = Engine::new(templates(&args.templates), vec![names::INJECTOR_NAMESPACE.to_owned()]);
        let text = fs::read_to_string(case.join("injected.yaml")).unwrap();
        for (index, document) in manifest::read(&text).unwrap().iter().enumerate() {
            let Some(pod) = workload::pod_of(document) else { continue };
            let Some(status) =
                pod["metadata"]["annotations"].get(names::STATUS_ANNOTATION).and_then(Value::as_str).map(str::to_owned)
            else {
                continue;
            };
            let at = format!("{} document {}", case.file_name().unwrap().to_string_lossy(), index + 1);
            let namespace = workload::namespace_of(document).unwrap_or(&args.facts.namespace);
            let facts = args.facts.namespace_facts(namespace);
            let cluster = args.facts.cluster_for(&pod);
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
                    // Since the recorded release, a native sidecar is written with the default
                    // resizePolicy (what the kubelet does without one); nothing else differs.
                    let mut pod = pod.clone();
                    let init =
                        pod.pointer_mut("/spec/initContainers").and_then(Value::as_array_mut).into_iter().flatten();
                    for sidecar in init.filter(|c| c["restartPolicy"] == "Always" && c.get("resizePolicy").is_none()) {
                        sidecar["resizePolicy"] = native::default_resize_policy();
                    }
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
