//! Tests of rollouts (`templates::rollout`, `TemplateSet::update_with_kept`) and of what the
//! decision, drift and `/validate` make of two versions in service.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::drift::{self, PodDrift};
use crate::review::validate::{self, Verdict};
use crate::templates::rollout::{self, BUCKETS, Halt, HaltThresholds, Kept, Pins, Subject, Why};
use crate::templates::set::{InProcess, TemplateSet, TemplateSource};
use crate::test_support::{apply, opted_in, request};
use crate::workload::Workload;
use crate::*;

fn version(image: &str, rollout: &str) -> String {
    format!("default: true\n{rollout}inject:\n  sidecars:\n    - name: agent\n      image: {image}\n")
}

fn sources(text: &str) -> Vec<TemplateSource> {
    vec![TemplateSource { name: "agent".into(), text: text.into() }]
}

/// A set that served `agent:1` and then got `agent:2` with `rollout` (as a running replica sees
/// the edit), and what the kept ConfigMap then holds.
fn rolled(rollout: &str) -> (TemplateSet, Kept) {
    let (first, errors) =
        TemplateSet::default().update_with_kept(sources(&version("agent:1", "")), &Kept::default(), &InProcess);
    assert!(errors.is_empty(), "{errors:?}");
    let (second, errors) = first.update_with_kept(sources(&version("agent:2", rollout)), &Kept::default(), &InProcess);
    assert!(errors.is_empty(), "{errors:?}");
    let kept = second.kept_wanted().clone();
    (second, kept)
}

fn deployment_pod(name: &str, labels: Value) -> Value {
    let mut labels = labels;
    labels["pod-template-hash"] = json!("5d8f7c");
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": format!("{name}-5d8f7c-"),
            "labels": labels,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("{name}-5d8f7c"), "uid": "u", "controller": true}]
        },
        "spec": {"containers": [{"name": "app", "image": "app:1"}]}
    })
}

fn injected_image(engine: &Engine, pod: &Value, namespace: &NamespaceFacts) -> (String, Option<String>) {
    let decision = engine.evaluate(&request(pod.clone(), namespace.clone()));
    let Outcome::Inject(injection) = &decision.outcome else { panic!("not injected: {:?}", decision.outcome) };
    let injected = apply(pod, &injection.patch);
    let image = injected["spec"]["initContainers"][0]["image"].as_str().unwrap_or_default().to_owned();
    let why = decision.choice.and_then(|c| c.versions.first().map(|v| v.why.clone()));
    (image, why)
}

#[test]
fn a_rollout_key_is_not_part_of_the_version() {
    let plain = test_support::template("agent", &version("agent:2", ""));
    let rolled = test_support::template("agent", &version("agent:2", "rollout: {share: 25}\n"));
    assert_eq!(plain.hash, rolled.hash);
    assert_eq!(rolled.rollout.as_ref().map(|r| r.share), Some(25));
    assert!(plain.rollout.is_none());
}

#[test]
fn rollout_keys_are_checked_with_their_line() {
    let cases: &[(&str, &str)] = &[
        ("rollout: {share: 101}\n", "rollout.share must be a whole percent from 0 to 100"),
        ("rollout: {share: -1}\n", "rollout.share must be a whole percent"),
        ("rollout: {share: 2.5}\n", "rollout.share must be a whole percent"),
        ("rollout: {share: \"30\"}\n", "rollout.share must be a whole percent"),
        ("rollout: {halt: {failedPods: 2}}\n", "rollout needs a share"),
        ("rollout: {share: 5, halt: {failedPods: 0}}\n", "rollout.halt.failedPods must be a whole number, 1 or more"),
        ("rollout: {share: 5, halt: {crashes: 1}}\n", "unknown key rollout.halt.crashes"),
        ("rollout: {share: 5, canary: true}\n", "unknown key rollout.canary"),
        ("rollout: {selector: {matchLabel: {a: b}}}\n", "matchLabel"),
        ("rollout: [25]\n", "rollout must be a mapping"),
    ];
    for (rollout, expected) in cases {
        let error = Template::load("agent", &version("agent:2", rollout)).expect_err(rollout);
        assert!(error.message.contains(expected), "{rollout}: {}", error.message);
        assert_eq!(error.line, Some(2), "{rollout}");
    }
    let percent =
        test_support::template("agent", &version("agent:2", "rollout: {share: \"40%\", halt: {restarts: 5}}\n"));
    let spec = percent.rollout.expect("a rollout");
    let halt = HaltThresholds {
        failed_pods: rollout::DEFAULT_FAILED_PODS,
        restarts: 5,
        unready_seconds: rollout::DEFAULT_UNREADY_SECONDS,
    };
    assert_eq!((spec.share, spec.halt), (40, halt));
}

#[test]
fn buckets_are_the_same_everywhere_and_spread_evenly() {
    let workload = |i: usize| Workload { kind: "Deployment".into(), name: format!("web-{i}") };
    assert_eq!(rollout::bucket("agent", "shop", &workload(1)), rollout::bucket("agent", "shop", &workload(1)));
    // Another template or namespace draws again.
    let differs = (0..50)
        .filter(|i| rollout::bucket("agent", "shop", &workload(*i)) != rollout::bucket("other", "shop", &workload(*i)));
    assert!(differs.count() > 40);
    // 25% of 4,000 workloads: within 2.5 points.
    let inside = (0..4000).filter(|i| rollout::bucket("agent", "shop", &workload(*i)) < 25 * (BUCKETS / 100)).count();
    assert!((900..=1100).contains(&inside), "{inside} of 4000 in a 25% share");
}

#[test]
fn a_running_replica_rolls_from_the_version_it_served_and_keeps_it() {
    let (set, kept) = rolled("rollout: {share: 50}\n");
    let active = set.rollout("agent").expect("a rollout under way");
    let old = test_support::template("agent", &version("agent:1", ""));
    assert_eq!(active.from.hash, old.hash);
    assert_eq!(kept.records["agent"].from.as_deref(), Some(old.hash.as_str()));
    assert_eq!(kept.records["agent"].kept, vec![old.hash.clone()]);
    assert!(kept.texts[&("agent".to_owned(), old.hash.clone())].contains("agent:1"));
    // The ConfigMap's data round-trips.
    assert_eq!(Kept::from_data(&kept.to_data()), (kept.clone(), Vec::new()));
    assert!(Kept::default().merge_patch_to(&kept).is_some());
    assert_eq!(kept.merge_patch_to(&kept), None);
}

#[test]
fn a_rollout_key_written_before_the_edit_rolls_the_edit_out() {
    let (first, _) =
        TemplateSet::default().update_with_kept(sources(&version("agent:1", "")), &Kept::default(), &InProcess);
    // The operator prepares the rollout (no new version: nothing to roll out yet), then edits.
    let (prepared, _) =
        first.update_with_kept(sources(&version("agent:1", "rollout: {share: 10}\n")), &Kept::default(), &InProcess);
    assert!(prepared.rollout("agent").is_none());
    let (edited, _) =
        prepared.update_with_kept(sources(&version("agent:2", "rollout: {share: 10}\n")), &Kept::default(), &InProcess);
    let old = test_support::template("agent", &version("agent:1", "")).hash;
    assert_eq!(edited.rollout("agent").map(|a| a.from.hash.clone()), Some(old));
}

#[test]
fn a_replica_started_since_chooses_exactly_as_the_one_that_saw_the_edit() {
    let (running, kept) = rolled("rollout: {share: 50}\n");
    let (fresh, errors) = TemplateSet::default().update_with_kept(
        sources(&version("agent:2", "rollout: {share: 50}\n")),
        &kept,
        &InProcess,
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(fresh.kept_wanted(), &kept, "the restarted replica writes nothing new");
    let labels = BTreeMap::new();
    let pins = Pins::default();
    let mut hashes = BTreeMap::<String, usize>::new();
    for i in 0..200 {
        let workload = Workload { kind: "Deployment".into(), name: format!("w{i}") };
        let subject = Subject { namespace: "shop", workload: &workload, labels: &labels, pins: &pins };
        let (a, _) = running.for_pod("agent", subject).unwrap().unwrap();
        let (b, _) = fresh.for_pod("agent", subject).unwrap().unwrap();
        assert_eq!(a.hash, b.hash, "{workload:?}");
        *hashes.entry(a.hash.clone()).or_default() += 1;
    }
    assert_eq!(hashes.len(), 2, "both versions serve: {hashes:?}");
}

#[test]
fn without_a_known_earlier_version_every_pod_gets_the_new_one_and_the_record_is_left_alone() {
    let (set, errors) = TemplateSet::default().update_with_kept(
        sources(&version("agent:2", "rollout: {share: 10}\n")),
        &Kept::default(),
        &InProcess,
    );
    assert!(errors.is_empty());
    assert!(set.rollout("agent").is_none());
    assert!(set.rollout_notices()[0].contains("no version served before it is known"), "{:?}", set.rollout_notices());
    assert_eq!(set.kept_wanted(), &Kept::default());
}

#[test]
fn a_kept_text_that_is_not_its_version_is_refused() {
    let (_, mut kept) = rolled("rollout: {share: 50}\n");
    for text in kept.texts.values_mut() {
        *text = version("evil:1", "");
    }
    let (set, errors) = TemplateSet::default().update_with_kept(
        sources(&version("agent:2", "rollout: {share: 50}\n")),
        &kept,
        &InProcess,
    );
    assert!(errors[0].message.contains("is not that version"), "{errors:?}");
    assert!(set.rollout("agent").is_none());
}

#[test]
fn the_kept_configmap_forgets_the_oldest_versions_to_stay_under_its_size_limit() {
    // Five versions of about 250 KB each, every one rolled out and promoted in turn: four would
    // be kept by count, but they would not fit in one ConfigMap.
    fn large(image: &str, rollout: &str) -> String {
        format!("description: {}\n{}", image.repeat(250_000 / image.len()), version(image, rollout))
    }
    let (mut set, _) =
        TemplateSet::default().update_with_kept(sources(&large("agent:1", "")), &Kept::default(), &InProcess);
    let mut hashes = vec![set.get("agent").unwrap().hash.clone()];
    for n in 2..=5 {
        let image = format!("agent:{n}");
        let text = |rollout: &str| large(&image, rollout);
        let kept = set.kept_wanted().clone();
        let (rolling, errors) = set.update_with_kept(sources(&text("rollout: {share: 50}\n")), &kept, &InProcess);
        assert!(errors.is_empty(), "{errors:?}");
        let kept = rolling.kept_wanted().clone();
        assert!(kept.weight() <= rollout::KEPT_BYTES, "version {n}: {} bytes kept", kept.weight());
        let (promoted, _) = rolling.update_with_kept(sources(&text("")), &kept, &InProcess);
        hashes.push(promoted.get("agent").unwrap().hash.clone());
        if n == 5 {
            assert!(
                rolling.rollout_notices().iter().any(|n| n.contains(&hashes[0]) && n.contains("no longer kept")),
                "{:?}",
                rolling.rollout_notices()
            );
            let expected: Vec<String> = hashes[1..4].iter().rev().cloned().collect();
            assert_eq!(kept.records["agent"].kept, expected, "the three newest, the version rolled from first");
            assert_eq!(rolling.rollout("agent").map(|a| &a.from.hash), Some(&hashes[3]));
            assert_eq!(kept.texts.len(), 3);
        }
        set = promoted;
    }
}

#[test]
fn the_version_a_rollout_rolls_from_is_kept_whatever_it_weighs() {
    let mut kept = Kept::default();
    for (name, hash) in [("a", "1111111111111111"), ("b", "2222222222222222")] {
        kept.records.insert(
            name.into(),
            rollout::Record {
                from: Some(hash.into()),
                halted: None,
                kept: vec![hash.into(), "3333333333333333".into()],
            },
        );
        kept.texts.insert((name.into(), hash.into()), "x".repeat(1000));
        kept.texts.insert((name.into(), "3333333333333333".into()), "y".repeat(10));
    }
    let forgotten = kept.fit(100);
    assert_eq!(forgotten.len(), 2, "{forgotten:?}");
    assert!(forgotten.iter().all(|(_, hash)| hash == "3333333333333333"));
    assert_eq!(kept.records["a"].kept, vec!["1111111111111111".to_owned()]);
    assert_eq!(kept.texts.len(), 2);
    assert!(kept.clone().fit(usize::MAX).is_empty());
}

#[test]
fn promotion_keeps_the_version_the_same_and_ends_the_rollout() {
    let (set, kept) = rolled("rollout: {share: 50}\n");
    let new_hash = set.get("agent").unwrap().hash.clone();
    let (promoted, _) = set.update_with_kept(sources(&version("agent:2", "")), &kept, &InProcess);
    assert_eq!(promoted.get("agent").unwrap().hash, new_hash);
    assert!(promoted.rollout("agent").is_none());
    let record = &promoted.kept_wanted().records["agent"];
    assert_eq!((record.from.as_ref(), record.kept.len()), (None, 1), "the old version stays kept for pins");
}

#[test]
fn a_halt_serves_the_earlier_version_until_the_next_edit() {
    let (_, mut kept) = rolled("rollout: {share: 100}\n");
    let bad = test_support::template("agent", &version("agent:2", "")).hash;
    kept.records.get_mut("agent").unwrap().halted =
        Some(Halt { version: bad.clone(), reason: "2 pods failed".into(), at: "2026-11-28T00:00:00Z".into() });
    let (halted, _) = TemplateSet::default().update_with_kept(
        sources(&version("agent:2", "rollout: {share: 100}\n")),
        &kept,
        &InProcess,
    );
    let active = halted.rollout("agent").unwrap();
    assert!(active.halted.is_some() && !active.reaches_anyone());
    let engine = Engine::new(halted.clone(), Vec::new());
    let (image, why) = injected_image(&engine, &deployment_pod("web", json!({})), &opted_in("shop", &[]));
    assert_eq!(image, "agent:1");
    assert!(why.unwrap().contains("rollout halted"));
    assert!(!halted.serves("agent", &bad, &Pins::default()), "pods of the halted version are drifted");
    // `drift --in-place` takes a pod of the halted version back to the version before: its image
    // and its status, together.
    let (rolling, _) = rolled("rollout: {share: 100}\n");
    let pod = deployment_pod("web", json!({}));
    let Outcome::Inject(injection) =
        Engine::new(rolling, Vec::new()).evaluate(&request(pod.clone(), opted_in("shop", &[]))).outcome
    else {
        panic!("not injected")
    };
    let injected = apply(&pod, &injection.patch);
    let update =
        drift::in_place::in_place_update(&engine, &request(injected, opted_in("shop", &[]))).expect("an update");
    assert_eq!(update.images.iter().map(|c| c.to.as_str()).collect::<Vec<_>>(), vec!["agent:1"]);
    let old = test_support::template("agent", &version("agent:1", "")).hash;
    assert!(update.status.contains(&old) && !update.status.contains(&bad), "{}", update.status);
    // A fixed version (another edit) rolls out again from the same version.
    let (fixed, _) =
        halted.update_with_kept(sources(&version("agent:3", "rollout: {share: 100}\n")), &kept, &InProcess);
    let active = fixed.rollout("agent").unwrap();
    assert!(active.halted.is_none());
    assert_eq!(active.from.hash, test_support::template("agent", &version("agent:1", "")).hash);
}

#[test]
fn every_replica_of_a_workload_gets_one_version_and_says_why() {
    let (set, _) = rolled("rollout: {share: 50}\n");
    let engine = Engine::new(set, Vec::new());
    let namespace = opted_in("shop", &[]);
    let mut seen = BTreeMap::<String, usize>::new();
    for w in 0..40 {
        let name = format!("web-{w}");
        let (first, why) = injected_image(&engine, &deployment_pod(&name, json!({})), &namespace);
        for _ in 0..3 {
            assert_eq!(injected_image(&engine, &deployment_pod(&name, json!({})), &namespace).0, first, "{name}");
        }
        let why = why.expect("the rollout decided");
        assert!(why.contains(&format!("Deployment {name} falls at")), "{why}");
        *seen.entry(first).or_default() += 1;
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}

#[test]
fn a_selector_or_a_share_of_zero_decide_who_gets_the_new_version() {
    let (set, _) = rolled("rollout:\n  share: 0\n  selector: {matchLabels: {canary: \"true\"}}\n");
    let engine = Engine::new(set, Vec::new());
    let namespace = opted_in("shop", &[]);
    let (image, why) = injected_image(&engine, &deployment_pod("web", json!({"canary": "true"})), &namespace);
    assert_eq!((image.as_str(), why.unwrap().contains("selector")), ("agent:2", true));
    for w in 0..20 {
        assert_eq!(injected_image(&engine, &deployment_pod(&format!("w{w}"), json!({})), &namespace).0, "agent:1");
    }
}

#[test]
fn pins_hold_a_kept_version_and_a_pin_to_anything_else_is_refused() {
    let (set, _) = rolled("rollout: {share: 100}\n");
    let old = test_support::template("agent", &version("agent:1", "")).hash;
    let engine = Engine::new(set, Vec::new());
    let pinned = |pod_pin: Option<&str>, namespace_pin: Option<&str>| {
        let mut pod = deployment_pod("web", json!({}));
        if let Some(pin) = pod_pin {
            pod["metadata"]["annotations"] = json!({ names::PINS_ANNOTATION: pin });
        }
        let mut namespace = opted_in("shop", &[]);
        if let Some(pin) = namespace_pin {
            namespace.annotations.insert(names::PINS_ANNOTATION.into(), pin.into());
        }
        engine.evaluate(&request(pod, namespace))
    };
    let image_of = |decision: &Decision, pod: Value| match &decision.outcome {
        Outcome::Inject(injection) => apply(&pod, &injection.patch)["spec"]["initContainers"][0]["image"].clone(),
        other => panic!("{other:?}"),
    };
    let short = &old[..8];
    let by_namespace = pinned(None, Some(&format!("agent={short}")));
    assert_eq!(image_of(&by_namespace, deployment_pod("web", json!({}))), json!("agent:1"));
    assert!(by_namespace.choice.unwrap().versions[0].why.contains("namespace annotation"));
    // The pod's entry wins over its namespace's.
    let new = test_support::template("agent", &version("agent:2", "")).hash;
    let by_pod = pinned(Some(&format!("agent={new}")), Some(&format!("agent={short}")));
    assert!(by_pod.choice.unwrap().versions[0].why.contains("pod annotation"));
    for (pin, expected) in [
        ("agent=0000000000000000", "which is not kept: the versions kept are"),
        ("agent", "write template=<version hash>"),
        ("agent=xyz123", "write template=<version hash>"),
    ] {
        let Outcome::Denied(Denial::Pin(message)) = pinned(Some(pin), None).outcome else { panic!("{pin}: admitted") };
        assert!(message.contains(expected), "{pin}: {message}");
    }
    // A replica that has not read the kept versions yet does not refuse at /validate the pod
    // another one injected with a pinned version: a race between replicas, said in a warning.
    let mut pod = deployment_pod("web", json!({}));
    pod["metadata"]["annotations"] = json!({ names::PINS_ANNOTATION: format!("agent={old}") });
    let Outcome::Inject(injection) = engine.evaluate(&request(pod.clone(), opted_in("shop", &[]))).outcome else {
        panic!("the pinned pod is injected")
    };
    let (unaware, _) = TemplateSet::default().update_with_kept(
        sources(&version("agent:2", "rollout: {share: 100}\n")),
        &Kept::default(),
        &InProcess,
    );
    let verdict = validate::validate_pod(
        &Engine::new(unaware, Vec::new()),
        &request(apply(&pod, &injection.patch), opted_in("shop", &[])),
    );
    let Verdict::Allowed(warnings) = verdict else { panic!("refused: {verdict:?}") };
    assert!(warnings[0].contains("which is not kept"), "{warnings:?}");
    // A pod that gets no template is not refused for a malformed pin of its namespace.
    let mut none = deployment_pod("web", json!({}));
    none["metadata"]["annotations"] = json!({ names::TEMPLATES_ANNOTATION: "" });
    let mut namespace = opted_in("shop", &[]);
    namespace.annotations.insert(names::PINS_ANNOTATION.into(), "agent".into());
    let outcome = engine.evaluate(&request(none, namespace)).outcome;
    assert!(!matches!(outcome, Outcome::Denied(_)), "{outcome:?}");
}

#[test]
fn both_versions_are_up_to_date_drift_free_and_valid_while_the_rollout_is_under_way() {
    let (set, kept) = rolled("rollout: {share: 50}\n");
    let engine = Engine::new(set.clone(), Vec::new());
    let namespace = opted_in("shop", &[]);
    let mut images = BTreeMap::new();
    for w in 0..12 {
        let pod = deployment_pod(&format!("w{w}"), json!({}));
        let Outcome::Inject(injection) = engine.evaluate(&request(pod.clone(), namespace.clone())).outcome else {
            panic!("not injected")
        };
        let injected = apply(&pod, &injection.patch);
        images.insert(injected["spec"]["initContainers"][0]["image"].to_string(), ());
        assert!(matches!(engine.evaluate(&request(injected.clone(), namespace.clone())).outcome, Outcome::UpToDate(_)));
        let labels = pod::string_map(&injected, "labels").unwrap();
        let annotations = pod::string_map(&injected, "annotations").unwrap();
        assert_eq!(drift::classify(&engine, &labels, &annotations, &namespace), PodDrift::Current);
        assert_eq!(
            validate::validate_pod(&engine, &request(injected.clone(), namespace.clone())),
            Verdict::Allowed(Vec::new())
        );
        // After promotion, only the new version is current.
        let (promoted, _) = set.update_with_kept(sources(&version("agent:2", "")), &kept, &InProcess);
        let promoted = Engine::new(promoted, Vec::new());
        let drift = drift::classify(&promoted, &labels, &annotations, &namespace);
        assert_eq!(drift == PodDrift::Current, injected.to_string().contains("agent:2"), "{drift:?}");
    }
    assert_eq!(images.len(), 2);
}

#[test]
fn failures_of_injected_containers_halt_past_the_threshold() {
    let thresholds = HaltThresholds { failed_pods: 2, restarts: 3, unready_seconds: 300 };
    let now: jiff::Timestamp = "2026-11-28T12:10:00Z".parse().unwrap();
    let status = |agent: Value| json!({"containerStatuses": [{"name": "app", "restartCount": 9}], "initContainerStatuses": [agent]});
    let cases: &[(Value, Option<&str>)] = &[
        (json!({"name": "agent", "restartCount": 0, "state": {"running": {}}}), None),
        (json!({"name": "agent", "restartCount": 2, "state": {"running": {}}}), None),
        (
            json!({"name": "agent", "restartCount": 3, "state": {"running": {}}}),
            Some("container agent: restarted 3 times"),
        ),
        (
            json!({"name": "agent", "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}}),
            Some("container agent: CrashLoopBackOff (back-off 10s)"),
        ),
        (
            json!({"name": "agent", "state": {"waiting": {"reason": "ImagePullBackOff"}}}),
            Some("container agent: ImagePullBackOff"),
        ),
        (json!({"name": "agent", "state": {"waiting": {"reason": "ContainerCreating"}}}), None),
        (json!({"name": "other", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}), None),
        // Unready: past the threshold, within it, and ready.
        (
            json!({"name": "agent", "ready": false, "state": {"running": {"startedAt": "2026-11-28T12:00:00Z"}}}),
            Some("container agent: running but not ready for 600 s"),
        ),
        (json!({"name": "agent", "ready": false, "state": {"running": {"startedAt": "2026-11-28T12:08:00Z"}}}), None),
        (json!({"name": "agent", "ready": true, "state": {"running": {"startedAt": "2026-11-28T00:00:00Z"}}}), None),
    ];
    for (agent, expected) in cases {
        assert_eq!(
            rollout::container_failure(&status(agent.clone()), &["agent"], thresholds, now).as_deref(),
            *expected,
            "{agent}"
        );
    }
    let one = vec![("shop/a".to_owned(), "container agent: CrashLoopBackOff".to_owned())];
    assert_eq!(rollout::halt_reason("abc", &one, thresholds), None);
    let two = [one.clone(), vec![("shop/b".to_owned(), "container agent: restarted 4 times".to_owned())]].concat();
    let reason = rollout::halt_reason("abc", &two, thresholds).expect("halts");
    assert!(
        reason.starts_with("2 pods with version abc failed (threshold 2): shop/a: container agent: CrashLoopBackOff"),
        "{reason}"
    );
}

#[test]
fn why_names_the_workload_and_the_share() {
    let workload = Workload { kind: "Deployment".into(), name: "web".into() };
    let text = Why::OutsideShare { bucket: 9_912, share: 25 }.describe(&workload);
    assert!(text.contains("Deployment web falls at 99.12% of workloads, outside the 25%"), "{text}");
}

#[test]
fn the_enforcement_policy_admits_both_versions_while_a_rollout_is_under_way_and_only_the_new_after() {
    let enforced = |image: &str, rollout: &str| {
        format!(
            "enforced: true\n{rollout}inject:\n  sidecars:\n    - name: agent\n      image: {image}\n      args: [--fast]\n  volumes:\n    - {{name: spool, emptyDir: {{}}}}\n"
        )
    };
    let (first, _) =
        TemplateSet::default().update_with_kept(sources(&enforced("agent:1", "")), &Kept::default(), &InProcess);
    let (rolled, kept) = {
        let (set, _) = first.update_with_kept(
            sources(&enforced("agent:2", "rollout: {share: 50}\n")),
            &Kept::default(),
            &InProcess,
        );
        let kept = set.kept_wanted().clone();
        (set, kept)
    };
    let versions: Vec<&Template> = rolled.versions_in_service("agent").into_iter().map(|t| &**t).collect();
    assert_eq!(versions.len(), 2);
    let common = crate::checks::enforce::Requirements::common(&versions, true);
    let agent = &common.init_containers[0];
    assert_eq!((agent.image.as_deref(), agent.args.clone()), (None, Some(vec!["--fast".to_owned()])));
    assert_eq!(common.volumes, vec!["spool".to_owned()]);
    assert!(
        common.unchecked.iter().any(|u| u.contains("container \"agent\" image: the versions in service differ")),
        "{:?}",
        common.unchecked
    );
    // Promoted: only the new version, its image required again.
    let (promoted, _) = rolled.update_with_kept(sources(&enforced("agent:2", "")), &kept, &InProcess);
    let versions: Vec<&Template> = promoted.versions_in_service("agent").into_iter().map(|t| &**t).collect();
    assert_eq!(versions.len(), 1);
    let alone = crate::checks::enforce::Requirements::common(&versions, true);
    assert_eq!(alone.init_containers[0].image.as_deref(), Some("agent:2"));
    // A pin to the kept version before is refused for an enforced template after promotion.
    let old = test_support::template("agent", &enforced("agent:1", "")).hash;
    let engine = Engine::new(promoted, Vec::new());
    let mut pod = deployment_pod("web", json!({}));
    pod["metadata"]["annotations"] = json!({ names::PINS_ANNOTATION: format!("agent={old}") });
    let Outcome::Denied(Denial::Pin(message)) = engine.evaluate(&request(pod, opted_in("shop", &[]))).outcome else {
        panic!("a pin of an enforced template to a version out of service was admitted")
    };
    assert!(message.contains("the template is enforced, so a pin may name only a version in service"), "{message}");
}
