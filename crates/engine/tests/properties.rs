//! Property tests of the injection over generated pods and templates:
//! - the patch of a pod without a status only adds (and writes the injector's own label/annotation);
//! - every field the pod had is still there with its value after the patch;
//! - injecting the patched pod again yields no patch (idempotence);
//! - re-injecting an injection made with other templates equals injecting the original pod;
//! - whatever status annotation a pod carries (copied, edited, forged), nothing of the pod that an
//!   earlier injection did not provably add is ever removed or changed;
//! - an in-place update after a template edit exists when the edit changed only images, and gives
//!   exactly what injecting the author's pod with the new versions gives;
//! - a pod that meets its namespace's enforced Pod Security level still meets it injected;
//! - a value `sizing:` computes is the app's value times the fraction, rounded up and bounded;
//! - what the nodes declare changes only the `node_feature_missing` warning, never the patch.
//!
//! Deterministic in `make test`: every property runs [`FIXED_CASES`] cases from [`FIXED_SEED`],
//! the same cases on every run, after every regression persisted in
//! `properties.proptest-regressions`. `make props` runs `PROPS_CASES` new random cases of each
//! (`PROPS_SEED` replays a run; each property prints its seed, cases and time). A case that fails
//! there is persisted to that file by proptest: commit it with the fix.

use std::collections::BTreeSet;
use std::sync::Arc;

use json_patch::PatchOperation;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;
use serde_json::{Map, Value, json};
use sidecar_injector_engine::checks::pod_security::Policy;
use sidecar_injector_engine::drift::in_place::in_place_update;
use sidecar_injector_engine::injection::image_volumes::ImageVolumeSupport;
use sidecar_injector_engine::injection::pod_resources;
use sidecar_injector_engine::model::compare::first_difference;
use sidecar_injector_engine::model::kinds::{
    APP_LIST_COUNT, APP_LISTS, CONTAINER_LISTS, MAPS, POD_LIST_COUNT, POD_LISTS, Placement, VOLUMES,
};
use sidecar_injector_engine::model::status::InjectionStatus;
use sidecar_injector_engine::review::validate::{Verdict, validate_pod_update};
use sidecar_injector_engine::templates::set::InProcess;
use sidecar_injector_engine::{
    ClusterFacts, Denial, Engine, NamespaceFacts, OutOfScope, Outcome, PodRequest, TemplateSet, TemplateSource,
    WarningCode, manifest,
};

/// The seed of `make test`'s cases.
const FIXED_SEED: u64 = 0x51de_ca12_1a7e_2026;
/// Cases per property in `make test`.
const FIXED_CASES: u32 = 256;

/// The run's configuration: the fixed cases, or with `PROPS_CASES` that many random ones from
/// one seed per run (printed, so `PROPS_SEED` can replay it).
fn config() -> ProptestConfig {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let number = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<u64>().ok());
    let Some(cases) = number("PROPS_CASES") else {
        return ProptestConfig {
            cases: FIXED_CASES,
            rng_seed: RngSeed::Fixed(FIXED_SEED),
            ..ProptestConfig::default()
        };
    };
    let seed = *SEED.get_or_init(|| {
        let seed = number("PROPS_SEED").unwrap_or_else(|| {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            (now.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32)
        });
        eprintln!("props: {cases} random cases per property, PROPS_SEED={seed}");
        seed
    });
    ProptestConfig {
        cases: u32::try_from(cases).unwrap_or(u32::MAX),
        rng_seed: RngSeed::Fixed(seed),
        // Shrinking a failure found among many cases may take long; it is what makes it readable.
        max_shrink_time: 600_000,
        ..ProptestConfig::default()
    }
}

#[path = "common/generate.rs"]
mod generate;
use generate::*;

fn sources(templates: &[String]) -> impl Iterator<Item = TemplateSource> + '_ {
    templates.iter().enumerate().map(|(i, text)| TemplateSource { name: format!("t{i}"), text: text.clone() })
}

fn engine(templates: &[String]) -> Engine {
    let (set, errors) = TemplateSet::load(sources(templates));
    assert!(errors.is_empty(), "{errors:?}");
    Engine::new(set, Vec::new())
}

/// The engine after a template edit: `new` replaces `old.templates`, as the webhook's hot reload does.
fn edited(old: &Engine, new: &[String]) -> Engine {
    let (set, errors) = old.templates.update(sources(new), &InProcess);
    assert!(errors.is_empty(), "{errors:?}");
    Engine::new(set, Vec::new())
}

/// `after` is `before` with at most items of app-container lists appended (what injection adds to
/// an app container, or the API-token mount to an injected one).
fn unchanged_but_for_additions(before: &Value, after: &Value) -> bool {
    let (Some(b), Some(a)) = (before.as_object(), after.as_object()) else { return before == after };
    let lists: Vec<&str> = APP_LISTS.iter().map(|kind| kind.field).collect();
    b.iter().all(|(k, v)| match (lists.contains(&k.as_str()), v, a.get(k)) {
        (true, Value::Array(items), Some(Value::Array(now))) => items.iter().all(|i| now.contains(i)),
        (_, v, now) => now == Some(v),
    }) && a.keys().all(|k| b.contains_key(k) || lists.contains(&k.as_str()))
}

/// A status annotation as a pod might carry it: names drawn from the pod's own items and the
/// templates', hashes current or made up.
/// Claimed sidecars, init containers, identities of each kind of spec list, of each kind of
/// app-container list, whether the hashes are current, and keys. And whether it claims a padding
/// of the pod-level resources, and its claimed volumes as image volumes.
type Claim = (
    Vec<&'static str>,
    Vec<&'static str>,
    Vec<Vec<&'static str>>,
    Vec<Vec<&'static str>>,
    bool,
    Vec<&'static str>,
    (bool, bool),
);

fn claim() -> impl Strategy<Value = Claim> {
    (
        names(),
        names(),
        proptest::collection::vec(names(), POD_LIST_COUNT),
        proptest::collection::vec(names(), APP_LIST_COUNT),
        any::<bool>(),
        proptest::sample::subsequence(KEYS.to_vec(), 0..=2),
        (any::<bool>(), any::<bool>()),
    )
}

fn with_claim(
    pod: &Value,
    engine: &Engine,
    (containers, init, pod_lists, app_lists, current, keys, (padded, image_volumes)): Claim,
) -> Value {
    let templates: Vec<Value> = engine
        .templates
        .iter()
        .map(
            |t| json!({"name": &*t.name, "hash": if current { t.hash.clone() } else { "0000000000000000".to_owned() }}),
        )
        .collect();
    // Each kind of app-container list claims the identities its sample items have.
    let additions: Map<String, Value> = APP_LISTS
        .iter()
        .zip(&app_lists)
        .map(|(kind, ids)| {
            let identities = ids.iter().filter_map(|id| kind.identity(&(kind.sample)(id)).map(|i| i.into_owned()));
            (kind.field.to_owned(), identities.collect())
        })
        .collect();
    let app: Map<String, Value> = pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap().to_owned(), Value::Object(additions.clone())))
        .collect();
    // Claimed containers as each placement records them; a claimed sidecar is claimed both ways.
    let mut placed = InjectionStatus::default();
    let placements =
        [(&init, "i-", &[Placement::Init][..]), (&containers, "c-", &[Placement::Sidecar, Placement::NativeSidecar])];
    for (names, prefix, placements) in placements {
        for (name, placement) in names.iter().flat_map(|n| placements.iter().map(move |p| (n, p))) {
            placement.record(&mut placed, &format!("{prefix}{name}"));
        }
    }
    let mut status = serde_json::to_value(&placed).unwrap();
    status.as_object_mut().unwrap().extend(json!({
        "templates": templates,
        "labels": keys,
        "annotations": keys,
        "appContainers": app,
        "podResources": if padded { json!({"requests": {"cpu": "50m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}}) } else { Value::Null },
    }).as_object().unwrap().clone());
    // Each kind of spec list claims the identities its sample items have.
    for (kind, names) in POD_LISTS.iter().zip(pod_lists) {
        let identities: Vec<String> =
            names.iter().filter_map(|name| kind.identity(&(kind.sample)(name)).map(str::to_owned)).collect();
        if kind.index == VOLUMES.index && image_volumes {
            status["imageVolumes"] = json!(identities);
        }
        status[kind.field] = json!(identities);
    }
    let mut pod = pod.clone();
    let metadata = pod["metadata"].as_object_mut().unwrap();
    let annotations = metadata.entry("annotations").or_insert(json!({}));
    annotations["sidecar-injector.io/status"] = Value::String(status.to_string());
    pod
}

/// The opted-in namespace of every generated pod.
fn shop() -> NamespaceFacts {
    NamespaceFacts::known("shop", [("sidecar-injector.io/inject".into(), "enabled".into())].into(), Default::default())
}

fn evaluate(engine: &Engine, pod: &Value, native: bool) -> Outcome {
    engine
        .evaluate(&PodRequest {
            pod: Arc::new(pod.clone()),
            namespace: shop(),
            cluster: cluster(native),
            workload: None,
        })
        .outcome
}

/// A recent cluster (native sidecars, image volumes, no runtime known to apply a subPath in one),
/// or an old one (neither).
fn cluster(recent: bool) -> ClusterFacts {
    match recent {
        true => ClusterFacts::api_server(true),
        false => ClusterFacts {
            image_volumes: ImageVolumeSupport::of_api_server(Some((1, 28))),
            ..ClusterFacts::api_server(false)
        },
    }
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
    #![proptest_config(config())]

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
        // Pod-level resources: the patched pod is one the API server accepts, and taking the
        // injection back gives the author's values exactly.
        let text = out["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap();
        let status = sidecar_injector_engine::model::status::InjectionStatus::parse(text).unwrap();
        if let Some(level) = pod_resources::PodLevel::of(&out) {
            let list = |field: &str| out["spec"][field].as_array().map(|l| l.iter().collect::<Vec<_>>()).unwrap_or_default();
            prop_assert_eq!(pod_resources::violations(&level, &(list("initContainers"), list("containers"))), Vec::<String>::new());
            let stripped = sidecar_injector_engine::claims::strip::strip_injection(&out, &status);
            prop_assert_eq!(&stripped["spec"]["resources"], &pod["spec"]["resources"], "strip gives back the author's pod-level values");
        }
        // Everything else the pod had is still there, unchanged (lists of named items matched by name).
        let mut compared = out.clone();
        if let Some(resources) = pod["spec"].get("resources") {
            compared["spec"]["resources"] = resources.clone();
        }
        let mut original = pod.clone();
        if let Some(labels) = original["metadata"].get_mut("labels").and_then(Value::as_object_mut) {
            labels.remove("sidecar-injector.io/injected");
        }
        prop_assert_eq!(first_difference(&original, &compared), None);
        let names_before: BTreeSet<String> = CONTAINER_LISTS.iter()
            .flat_map(|l| pod["spec"][l.field].as_array().cloned().unwrap_or_default())
            .map(|c| c["name"].as_str().unwrap().to_owned()).collect();
        let names_after: Vec<String> = CONTAINER_LISTS.iter()
            .flat_map(|l| out["spec"][l.field].as_array().cloned().unwrap_or_default())
            .map(|c| c["name"].as_str().unwrap().to_owned()).collect();
        prop_assert!(names_before.iter().all(|n| names_after.contains(n)));
        let unique: BTreeSet<&String> = names_after.iter().collect();
        prop_assert_eq!(unique.len(), names_after.len(), "container names stay unique");

        prop_assert!(matches!(evaluate(&engine, &out, native), Outcome::UpToDate(_)), "injecting again changes nothing");

        // A mount the injection added binds to the volume its template defines, never to the
        // pod's own volume of that name (the templates' volumes are emptyDirs, image volumes or
        // their emptyDir fallbacks; the pods' never are).
        let template_volumes: BTreeSet<String> = templates.iter()
            .flat_map(|t| manifest::read(t).unwrap_or_default())
            .flat_map(|t| t["inject"]["volumes"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v["name"].as_str().map(str::to_owned))
            .collect();
        let mounts = |pod: &Value| -> Vec<(String, Value)> {
            CONTAINER_LISTS.iter()
                .flat_map(|l| pod["spec"][l.field].as_array().cloned().unwrap_or_default())
                .flat_map(|c| {
                    let name = c["name"].as_str().unwrap_or_default().to_owned();
                    c["volumeMounts"].as_array().cloned().unwrap_or_default().into_iter().map(move |m| (name.clone(), m))
                })
                .collect()
        };
        let before = mounts(&pod);
        for (container, mount) in mounts(&out).into_iter().filter(|m| !before.contains(m)) {
            let volume = mount["name"].as_str().unwrap_or_default();
            if !template_volumes.contains(volume) { continue; }
            let bound = out["spec"]["volumes"].as_array().and_then(|v| v.iter().find(|v| v["name"] == volume));
            prop_assert!(bound.is_some_and(|v| v.get("emptyDir").is_some() || v.get("image").is_some()),
                "container {} mounts {} onto {:?}, not its template's volume", container, mount, bound);
        }
        // The same for every other kind containers refer to (a resource claim): what an added
        // container refers to is its template's item, never the pod's of that identity.
        for kind in POD_LISTS.iter().filter(|k| !k.referenced_by.is_empty() && k.index != VOLUMES.index) {
            let template_items: Vec<Value> = templates.iter()
                .flat_map(|t| manifest::read(t).unwrap_or_default())
                .flat_map(|t| t["inject"][kind.field].as_array().cloned().unwrap_or_default())
                .collect();
            let before: BTreeSet<String> = CONTAINER_LISTS.iter()
                .flat_map(|l| pod["spec"][l.field].as_array().cloned().unwrap_or_default())
                .filter_map(|c| c["name"].as_str().map(str::to_owned)).collect();
            let added = CONTAINER_LISTS.iter()
                .flat_map(|l| out["spec"][l.field].as_array().cloned().unwrap_or_default())
                .filter(|c| !before.contains(c["name"].as_str().unwrap_or_default()));
            for container in added {
                for identity in kind.referred_to_by(&container) {
                    let bound = out["spec"][kind.field].as_array().and_then(|items| kind.find(items, identity));
                    prop_assert!(bound.is_some_and(|item| template_items.contains(item)),
                        "container {} refers to {} {:?}, bound to {:?}, not its template's", container["name"], kind.field, identity, bound);
                }
            }
        }
    }

    #[test]
    fn re_injection_equals_injecting_the_original(
        pod in pod(),
        old in proptest::collection::vec(template(), 1..=2),
        new in proptest::collection::vec(template(), 1..=2),
        native in any::<bool>(),
    ) {
        let old_engine = engine(&old);
        let new_engine = edited(&old_engine, &new);
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

    /// An engine that never saw the version a pod was injected with (a replica started since, the
    /// CLI) still proves its claim after an edit that changed nothing the pod holds (a
    /// description) or only images (the agents' image volumes and their fallbacks' copying init
    /// containers, in whichever form the pod got them): re-admitting it is exactly a fresh
    /// injection of the author's pod, with no claim doubted.
    #[test]
    fn an_edit_a_pod_cannot_see_or_of_images_only_keeps_its_claims_proven(
        pod in pod(),
        old in proptest::collection::vec(template(), 1..=2),
        images in any::<bool>(),
        native in any::<bool>(),
    ) {
        let old_engine = engine(&old);
        let injected = match evaluate(&old_engine, &pod, native) {
            outcome @ Outcome::Inject(_) => patched(&pod, outcome).0,
            _ => return Ok(()),
        };
        let new: Vec<String> = old.iter().map(|text| match images {
            true => text.replace("agent-", "agent2-"),
            false => format!("description: edited\n{text}"),
        }).collect();
        let new_engine = engine(&new);
        let expected = match evaluate(&new_engine, &pod, native) {
            outcome @ Outcome::Inject(_) => patched(&pod, outcome).0,
            other => panic!("{other:?}"),
        };
        let decision = new_engine.evaluate(&PodRequest {
            pod: Arc::new(injected.clone()),
            namespace: shop(),
            cluster: cluster(native),
            workload: None,
        });
        let doubts: Vec<_> = decision.warnings.iter().filter(|w| w.code == WarningCode::ClaimDoubted).collect();
        prop_assert!(doubts.is_empty(), "{:?}", doubts);
        let reinjected = match decision.outcome {
            outcome @ Outcome::Inject(_) => patched(&injected, outcome).0,
            Outcome::UpToDate(_) => injected.clone(),
            other => panic!("{other:?}"),
        };
        prop_assert_eq!(normalize(&reinjected), normalize(&expected));
    }

    /// A copy of an injected pod whose status records another padding of the pod-level resources
    /// (scaled, or dropped) proves nothing: re-admitting it keeps the pod's values as they are,
    /// never padding them again for sidecars already in the pod.
    #[test]
    fn a_forged_padding_never_pads_again(
        pod in pod(),
        templates in proptest::collection::vec(template(), 1..=3),
        native in any::<bool>(),
        factor in proptest::sample::select(vec![0i128, 2, 3, -1]),
    ) {
        let engine = engine(&templates);
        let (injected, _) = patched(&pod, evaluate(&engine, &pod, native));
        let text = injected["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap_or("{}");
        let mut status: Value = serde_json::from_str(text).unwrap();
        let Some(padding) = status.get_mut("podResources").filter(|p| p.is_object()) else { return Ok(()) };
        // Each recorded amount scaled (0: a claim of nothing), or the record dropped (-1).
        match factor {
            -1 => *padding = Value::Null,
            factor => {
                let amounts = padding.as_object_mut().unwrap().iter_mut().filter(|(k, _)| *k == "requests" || *k == "limits");
                for map in amounts.filter_map(|(_, map)| map.as_object_mut()) {
                    for amount in map.values_mut() {
                        let nanos = sidecar_injector_engine::quantity::parse(amount.as_str().unwrap()).unwrap();
                        *amount = json!(sidecar_injector_engine::quantity::format(nanos * factor, amount.as_str().unwrap()));
                    }
                }
            }
        }
        let mut forged = injected.clone();
        forged["metadata"]["annotations"]["sidecar-injector.io/status"] = json!(status.to_string());
        let readmitted = match evaluate(&engine, &forged, native) {
            outcome @ Outcome::Inject(_) => patched(&forged, outcome).0,
            Outcome::UpToDate(_) => forged.clone(),
            other => panic!("{other:?}"),
        };
        prop_assert_eq!(&readmitted["spec"]["resources"], &injected["spec"]["resources"], "the pod's values are kept as they are");
    }

    /// After a template edit, an in-place update (`drift --in-place`) exists where the edit
    /// changed only the value every sidecar's image is, on a replica that served the old version
    /// and (when the old text can be rebuilt) in the CLI; and whenever one is made, the pod is
    /// exactly what injecting its author's pod with the new versions gives, up to date by
    /// re-admission and accepted as an UPDATE by `/validate`.
    #[test]
    fn an_in_place_update_gives_exactly_the_new_injection(
        pod in pod(),
        old in proptest::collection::vec(template(), 1..=2),
        images in proptest::collection::vec("[a-z]{1,4}(:[0-9]\\.[0-9])?", 2),
        other in proptest::option::of(template()),
        native in any::<bool>(),
    ) {
        let old_engine = engine(&old);
        let (injected, _) = patched(&pod, evaluate(&old_engine, &pod, native));
        let mut new: Vec<String> = old.iter().zip(&images).map(|(text, image)| {
            let mut doc = manifest::read(text).unwrap().remove(0);
            doc["values"]["v"] = json!(image);
            manifest::write(&[doc])
        }).collect();
        let images_only = other.is_none();
        if let Some(other) = other {
            new[0] = other;
        }
        let replica = edited(&old_engine, &new);
        let cli = engine(&new);
        let expected = match evaluate(&replica, &pod, native) {
            outcome @ Outcome::Inject(_) => patched(&pod, outcome).0,
            outcome => panic!("{outcome:?}"),
        };
        let stale = expected["metadata"]["annotations"]["sidecar-injector.io/status"]
            != injected["metadata"]["annotations"]["sidecar-injector.io/status"];
        let request = PodRequest {
            pod: Arc::new(injected.clone()),
            namespace: shop(),
            cluster: ClusterFacts::api_server(native),
            workload: None,
        };
        for (engine, which) in [(&replica, "replica"), (&cli, "cli")] {
            let update = match in_place_update(engine, &request) {
                Ok(update) => update,
                Err(why) => {
                    let expected_refusal = !stale || !images_only || (which == "cli" && why.contains("changed more than images since"));
                    prop_assert!(expected_refusal, "{}: {}", which, why);
                    continue;
                }
            };
            let mut updated = injected.clone();
            json_patch::patch(&mut updated, &update.patch()).expect("the update applies");
            prop_assert_eq!(normalize(&updated), normalize(&expected), "{}", which);
            prop_assert!(matches!(evaluate(engine, &updated, native), Outcome::UpToDate(_)), "{}", which);
            let checked = PodRequest { pod: Arc::new(updated), ..request.clone() };
            prop_assert_eq!(validate_pod_update(engine, &injected, &checked).verdict, Verdict::Allowed(Vec::new()), "{}", which);
        }
    }

    #[test]
    fn a_status_claim_never_costs_the_pod_anything_it_did_not_provably_get_from_us(
        pod in pod(),
        templates in proptest::collection::vec(template(), 1..=2),
        claim in claim(),
        injected_first in any::<bool>(),
        native in any::<bool>(),
    ) {
        let engine = engine(&templates);
        // Either a pod that really was injected, then given a rewritten claim, or a fresh pod with
        // a forged one.
        let base = match (injected_first, evaluate(&engine, &pod, native)) {
            (true, outcome @ Outcome::Inject(_)) => patched(&pod, outcome).0,
            _ => pod.clone(),
        };
        let claimed = with_claim(&base, &engine, claim);
        let decision = engine.evaluate(&PodRequest {
            pod: Arc::new(claimed.clone()),
            namespace: NamespaceFacts::known("shop", [("sidecar-injector.io/inject".into(), "enabled".into())].into(), Default::default()),
            cluster: ClusterFacts::api_server(native),
            workload: None,
        });
        let Outcome::Inject(injection) = decision.outcome else { return Ok(()) };
        let mut out = claimed.clone();
        json_patch::patch(&mut out, &injection.patch).expect("the patch applies");
        let removed = &injection.removed;
        // Every item of the input is still there and unchanged, unless the injection says it removed it.
        let containers = CONTAINER_LISTS.iter().map(|list| (list.field, "name", (list.claimed)(removed)));
        let pod_lists = POD_LISTS.iter().map(|kind| (kind.field, kind.key, (kind.claimed)(removed)));
        for (list, key, gone) in containers.chain(pod_lists) {
            for item in claimed["spec"][list].as_array().into_iter().flatten() {
                let name = item[key].as_str().unwrap();
                if gone.iter().any(|g| g == name) { continue; }
                let kept = out["spec"][list].as_array().and_then(|l| l.iter().find(|i| i[key] == name));
                prop_assert!(kept.is_some(), "{} {} was removed", list, name);
                prop_assert!(unchanged_but_for_additions(item, kept.unwrap()), "{} {} was changed: {} -> {}", list, name, item, kept.unwrap());
            }
        }
        for container in claimed["spec"]["containers"].as_array().unwrap() {
            let name = container["name"].as_str().unwrap();
            let Some(after) = out["spec"]["containers"].as_array().unwrap().iter().find(|c| c["name"] == name) else { continue };
            let gone = removed.app_containers.get(name);
            for kind in &APP_LISTS {
                for item in container[kind.field].as_array().into_iter().flatten() {
                    let identity = kind.identity(item).unwrap().into_owned();
                    if gone.is_some_and(|g| (kind.claimed)(g).contains(&identity)) { continue; }
                    prop_assert!(after[kind.field].as_array().is_some_and(|l| l.contains(item)),
                        "{} {} of {} was removed or changed", kind.field, identity, name);
                }
            }
        }
        for kind in &MAPS {
            let gone = (kind.claimed)(removed);
            for (key, value) in claimed["metadata"][kind.field].as_object().into_iter().flatten() {
                if MAPS.iter().any(|k| k.own_key == key) || gone.contains(key) { continue; }
                prop_assert_eq!(&out["metadata"][kind.field][key], value, "{} {} was changed or removed", kind.field, key);
            }
        }
        // Pod-level resources never go below what the author wrote, whatever padding is claimed.
        if let (Some(author), Some(now)) = (pod_resources::PodLevel::of(&pod), pod_resources::PodLevel::of(&out)) {
            for (field, mine, theirs) in [("requests", &author.requests, &now.requests), ("limits", &author.limits, &now.limits)] {
                for (resource, (text, value)) in mine {
                    let after = theirs.get(resource).map(|(_, v)| *v).unwrap_or_default();
                    prop_assert!(after >= *value, "{} {} went from the author's {} to {:?}", field, resource, text, theirs.get(resource));
                }
            }
        }
        // And what was removed is only ever something the injection had really added to `base`.
        if !injected_first {
            prop_assert!(CONTAINER_LISTS.iter().all(|list| (list.claimed)(removed).is_empty())
                && POD_LISTS.iter().all(|kind| (kind.claimed)(removed).is_empty())
                && MAPS.iter().all(|kind| (kind.claimed)(removed).is_empty())
                && removed.app_containers.is_empty(),
                "a forged claim on a pod never injected removed {:?}", removed);
        }
    }
}

/// A template that merges `fragment` into `JAVA_TOOL_OPTIONS` (appending) or `PATH` (prepending).
fn merging_template(name: &str, fragment: &str, append: bool) -> String {
    let how = if append { "append: \" \"" } else { "prepend: \":\"" };
    let value = serde_json::to_string(fragment).unwrap();
    format!(
        "default: true\ninject:\n  appContainers:\n    env:\n      - name: {name}\n        value: {value}\n        merge: {{{how}}}\n"
    )
}

/// An app container's env in any form the variables can take: literal values (any text, `$(...)`
/// references and separators included), `valueFrom`, repeated names, and maybe an `envFrom`.
fn author_container() -> impl Strategy<Value = Value> {
    let entry = (
        // `AGENT_KEY`: a key the enforced template's envFrom source provides (`keys:`).
        proptest::sample::select(vec!["JAVA_TOOL_OPTIONS", "PATH", "OTHER", "AGENT_KEY"]),
        proptest::option::of(prop_oneof![
            proptest::string::string_regex("[-a-z:/ =$()A-Z_.]{0,24}").unwrap(),
            // The shapes that decide what the kubelet runs with: the enforced value, entries that
            // extend a value, and escaped references that only look like one.
            proptest::sample::select(vec![
                "enforced",
                "$(OTHER)-off",
                "$$(OTHER)",
                "$$(JAVA_TOOL_OPTIONS) -Xmx1g",
                "$(JAVA_TOOL_OPTIONS) -Xmx1g",
                "-javaagent:/a.jar",
                "$(PATH)",
            ])
            .prop_map(str::to_owned),
        ]),
    )
        .prop_map(|(name, value)| match value {
            Some(value) => json!({"name": name, "value": value}),
            None => json!({"name": name, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}),
        });
    (proptest::collection::vec(entry, 0..=4), any::<bool>()).prop_map(|(env, env_from)| {
        let mut container = json!({"name": "app", "image": "app:1"});
        if !env.is_empty() {
            container["env"] = Value::Array(env);
        }
        if env_from {
            container["envFrom"] = json!([{"configMapRef": {"name": "app-env"}}]);
        }
        container
    })
}

/// The app container's env, absent when empty.
fn env_of(pod: &Value) -> Value {
    normalize(&pod["spec"]["containers"][0])["env"].clone()
}

/// Stands, in [`kubelet_env`], for what the pod spec cannot show (a `valueFrom`).
const HIDDEN: &str = "\u{1}";

/// The environment the kubelet gives `container`, as far as the spec shows it (Kubernetes'
/// `makeEnvironmentVariables` and `expansion.Expand`, written here from their documentation as
/// the properties' judge): each `env` entry in order, `$(NAME)` replaced by the value defined so
/// far (left as written when none; `$$` is `$`), a later entry of a name replacing an earlier one.
/// `envFrom` keys are unknown here, so a name only they define stays unexpanded.
fn kubelet_env(container: &Value) -> std::collections::BTreeMap<String, String> {
    let mut defined: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    for entry in container["env"].as_array().into_iter().flatten() {
        let value = match (entry.get("value").and_then(Value::as_str), entry.get("valueFrom")) {
            (Some(text), _) => {
                let (mut out, mut chars) = (String::new(), text.char_indices().peekable());
                while let Some((at, c)) = chars.next() {
                    let rest = &text[at + 1..];
                    match (c, rest.chars().next()) {
                        ('$', Some('$')) => {
                            out.push('$');
                            chars.next();
                        }
                        ('$', Some('(')) if rest.contains(')') => {
                            let name = &rest[1..rest.find(')').unwrap()];
                            match defined.get(name) {
                                Some(value) => out.push_str(value),
                                None => out.push_str(&format!("$({name})")),
                            }
                            for _ in 0..name.chars().count() + 2 {
                                chars.next();
                            }
                        }
                        (c, _) => out.push(c),
                    }
                }
                out
            }
            (None, Some(_)) => HIDDEN.to_owned(),
            (None, None) => String::new(),
        };
        defined.insert(entry["name"].as_str().unwrap().to_owned(), value);
    }
    defined
}

/// Whether `value` holds `fragment` as one of its `separator`-delimited parts.
fn holds(value: Option<&String>, separator: &str, fragment: &str) -> bool {
    value.is_some_and(|v| v.split(separator).any(|part| part == fragment))
}

proptest! {
    #![proptest_config(config())]

    /// For any author value: the injection keeps the author's entries first and untouched,
    /// stripping it (`/validate`'s view) or taking it back (re-injection with a template that no
    /// longer merges) gives back exactly the author's env, a template change leaves exactly one
    /// fragment, and injecting twice adds nothing.
    #[test]
    fn merging_env_never_loses_or_duplicates_and_strips_back_to_the_authors_value(
        container in author_container(),
        fragments in proptest::collection::vec("[-a-z/:.=]{1,12}", 3),
        append in any::<bool>(),
        planted in proptest::option::of(any::<proptest::sample::Index>()),
    ) {
        let name = if append { "JAVA_TOOL_OPTIONS" } else { "PATH" };
        let mut container = container;
        // The fragment already in one of the entries, maybe one a later entry of its name replaces.
        if let (Some(at), Some(env)) = (planted, container["env"].as_array_mut()) {
            let len = env.len();
            env[at.index(len)] = json!({"name": name, "value": fragments[0]});
        }
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [container]}});
        let author_env = env_of(&pod);
        let v1 = engine(&[merging_template(name, &fragments[0], append)]);
        let injected = match evaluate(&v1, &pod, true) {
            outcome @ Outcome::Inject(_) => patched(&pod, outcome).0,
            other => panic!("{other:?}"),
        };
        let env = injected["spec"]["containers"][0]["env"].as_array().cloned().unwrap_or_default();
        let before = author_env.as_array().cloned().unwrap_or_default();
        prop_assert_eq!(&env[..before.len()], &before[..], "the author's entries come first, untouched");
        prop_assert!(env.len() <= before.len() + 1, "at most one entry added");
        // What the container runs with: the agent loaded, and loaded once where the author's
        // value (the last entry of the name wins) already held it.
        let separator = if append { " " } else { ":" };
        let (author_value, value) = (kubelet_env(&pod["spec"]["containers"][0]), kubelet_env(&injected["spec"]["containers"][0]));
        prop_assert!(value.get(name).is_some_and(|v| v.contains(fragments[0].as_str())), "the agent is not loaded: {:?}", value.get(name));
        if holds(author_value.get(name), separator, &fragments[0]) {
            prop_assert_eq!(env.len(), before.len(), "the author's value {:?} holds the fragment already: loaded twice", author_value.get(name));
        }
        prop_assert!(matches!(evaluate(&v1, &injected, true), Outcome::UpToDate(_)), "injecting again adds nothing");

        let text = injected["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap();
        let status = sidecar_injector_engine::model::status::InjectionStatus::parse(text).unwrap();
        let stripped = sidecar_injector_engine::claims::strip::strip_injection(&injected, &status);
        prop_assert_eq!(env_of(&stripped), author_env.clone(), "strip(inject(v)) == v");

        let v2 = edited(&v1, &[merging_template(name, &fragments[1], append)]);
        let reinjected = match evaluate(&v2, &injected, true) {
            outcome @ Outcome::Inject(_) => patched(&injected, outcome).0,
            Outcome::UpToDate(_) => injected.clone(), // the same fragment twice: the same template
            other => panic!("{other:?}"),
        };
        let fresh = patched(&pod, evaluate(&v2, &pod, true)).0;
        prop_assert_eq!(env_of(&reinjected), env_of(&fresh), "re-injection equals a fresh injection");

        let gone = edited(&v2, &["default: true\ninject:\n  labels: {merged: none}\n".to_owned()]);
        let taken_back = match evaluate(&gone, &reinjected, true) {
            outcome @ Outcome::Inject(_) => patched(&reinjected, outcome).0,
            other => panic!("{other:?}"),
        };
        prop_assert_eq!(env_of(&taken_back), author_env, "taking the injection back gives back exactly the author's env");
    }
}

/// An enforced template that sets `OTHER` and merges `fragment` into `JAVA_TOOL_OPTIONS`.
fn enforced_env_template(fragment: &str) -> String {
    let value = serde_json::to_string(fragment).unwrap();
    format!(
        "default: true\nenforced: true\ninject:\n  appContainers:\n    envFrom:\n      - {{configMapRef: {{name: agent-env}}, keys: [AGENT_KEY]}}\n    env:\n      - {{name: OTHER, value: enforced}}\n      - name: JAVA_TOOL_OPTIONS\n        value: {value}\n        merge: {{append: \" \"}}\n"
    )
}

/// Whether the container runs with what the enforced template mandates: `OTHER` is the
/// template's value, `JAVA_TOOL_OPTIONS` holds the fragment, and `AGENT_KEY` comes from the
/// template's envFrom source (no env entry replaces it).
fn runs_enforced_env(pod: &Value, fragment: &str) -> Result<(), String> {
    let container = &pod["spec"]["containers"][0];
    let env = kubelet_env(container);
    let sources = container["envFrom"].as_array().cloned().unwrap_or_default();
    if env.contains_key("AGENT_KEY") || !sources.iter().any(|s| s["configMapRef"]["name"] == "agent-env") {
        return Err(format!("AGENT_KEY is not the template's envFrom source's: {}, envFrom {sources:?}", env_of(pod)));
    }
    match (env.get("OTHER").map(String::as_str), env.get("JAVA_TOOL_OPTIONS")) {
        (Some("enforced"), Some(java)) if java.contains(fragment) => Ok(()),
        (other, java) => {
            Err(format!("the container runs with OTHER={other:?}, JAVA_TOOL_OPTIONS={java:?}: {}", env_of(pod)))
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// Whatever env entries a pod repeats, and whatever it appends after an injection (a copy
    /// that keeps the status), a pod that an enforced template's env is admitted to runs with
    /// it: the variable it sets has its value, the variable it merges into holds its fragment.
    /// Anything else is refused.
    #[test]
    fn an_admitted_pod_runs_with_the_enforced_env(
        container in author_container(),
        appended in author_container(),
        fragment in fragment(" "),
    ) {
        let engine = engine(&[enforced_env_template(&fragment)]);
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [container]}});
        let admitted = |pod: &Value| -> Option<Value> {
            match evaluate(&engine, pod, true) {
                outcome @ Outcome::Inject(_) => Some(patched(pod, outcome).0),
                Outcome::UpToDate(_) => Some(pod.clone()),
                _ => None,
            }
        };
        let Some(injected) = admitted(&pod) else { return Ok(()) };
        prop_assert_eq!(runs_enforced_env(&injected, &fragment), Ok(()), "admitted: {}", env_of(&pod));
        // A copy of the injected pod, status and all, with entries appended.
        let mut copy = injected.clone();
        let tail = appended["env"].as_array().cloned().unwrap_or_default();
        let env = copy["spec"]["containers"][0]["env"].as_array().cloned().unwrap_or_default();
        copy["spec"]["containers"][0]["env"] = Value::Array(env.into_iter().chain(tail).collect());
        if let Some(readmitted) = admitted(&copy) {
            prop_assert_eq!(runs_enforced_env(&readmitted, &fragment), Ok(()), "re-admitted: {}", env_of(&copy));
        }
    }
}

/// The names of a list of containers.
fn names_of(containers: &[Value]) -> Vec<String> {
    containers.iter().filter_map(|c| c["name"].as_str()).map(str::to_owned).collect()
}

/// The host names (lower case) each IP of a pod's `hostAliases` maps.
fn host_names(pod: &Value) -> Vec<(String, Vec<String>)> {
    let aliases = pod["spec"]["hostAliases"].as_array().cloned().unwrap_or_default();
    aliases
        .iter()
        .map(|a| {
            let names = a["hostnames"].as_array().into_iter().flatten();
            (
                a["ip"].as_str().unwrap_or_default().to_owned(),
                names.filter_map(Value::as_str).map(str::to_ascii_lowercase).collect(),
            )
        })
        .collect()
}

proptest! {
    #![proptest_config(config())]

    /// Wherever a pod puts exact copies of an enforced template's init containers and native
    /// sidecars among its own, and whatever host alias it adds for one of the template's host
    /// names, an admitted pod runs the template's containers that run first before every init
    /// container of the author's, and no alias of the author's maps a host name the template
    /// maps. Anything else is refused.
    #[test]
    fn an_admitted_pod_runs_enforced_init_containers_first_and_keeps_their_host_names(
        template in template(),
        copies in proptest::collection::vec((any::<bool>(), any::<proptest::sample::Index>()), 0..4),
        shadow in any::<bool>(),
        native in any::<bool>(),
    ) {
        let enforced = format!("enforced: true\n{template}");
        let engine = engine(std::slice::from_ref(&enforced));
        // A pod with an init container of its own that copies may follow (and no item of the
        // generator's names, which an enforced template would refuse first).
        let authors = vec![json!({"name": "own-setup", "image": "setup:1"})];
        let pod = json!({"metadata": {"name": "p"}, "spec": {"initContainers": authors, "containers": [{"name": "main", "image": "main:1"}]}});
        let injected = match evaluate(&engine, &pod, native) {
            outcome @ Outcome::Inject(_) => patched(&pod, outcome).0,
            _ => return Ok(()),
        };
        let author_names = names_of(&authors);
        let added: Vec<Value> = injected["spec"]["initContainers"].as_array().cloned().unwrap_or_default()
            .into_iter().filter(|c| !author_names.contains(&c["name"].as_str().unwrap_or_default().to_owned())).collect();
        // What the template puts after the pod's own init containers: its `position: last` ones.
        let doc = manifest::read(&template).unwrap().remove(0);
        let last: Vec<String> = doc["inject"]["initContainers"].as_array().into_iter().flatten()
            .filter(|c| c["position"] == "last").filter_map(|c| c["name"].as_str()).map(str::to_owned).collect();
        let mut crafted = pod.clone();
        let mut inits = authors.clone();
        for ((take, at), container) in copies.iter().zip(&added) {
            if *take {
                inits.insert(at.index(inits.len() + 1), container.clone());
            }
        }
        crafted["spec"]["initContainers"] = Value::Array(inits);
        // The template's aliases, as it writes them (the generator's are literal).
        let templates_names = host_names(&json!({"spec": {"hostAliases": doc["inject"]["hostAliases"]}}));
        if let Some(name) = templates_names.iter().flat_map(|(_, names)| names).next().filter(|_| shadow) {
            let mut aliases = crafted["spec"]["hostAliases"].as_array().cloned().unwrap_or_default();
            aliases.push(json!({"ip": "127.0.0.1", "hostnames": [name.to_uppercase()]}));
            crafted["spec"]["hostAliases"] = Value::Array(aliases);
        }
        let decided = evaluate(&engine, &crafted, native);
        let admitted = match decided {
            outcome @ Outcome::Inject(_) => patched(&crafted, outcome).0,
            Outcome::UpToDate(_) => crafted.clone(),
            _ => return Ok(()),
        };
        let order = names_of(admitted["spec"]["initContainers"].as_array().map_or(&[][..], Vec::as_slice));
        let added_names = names_of(&added);
        for (at, name) in order.iter().enumerate() {
            if added_names.contains(name) && !last.contains(name) {
                let before = order[..at].iter().find(|n| author_names.contains(n));
                prop_assert!(before.is_none(), "the template's {} runs after the author's {:?}: {:?}", name, before, order);
            }
        }
        let template_ips: Vec<&String> = templates_names.iter().map(|(ip, _)| ip).collect();
        for (ip, names) in host_names(&admitted).iter().filter(|(ip, _)| !template_ips.contains(&ip)) {
            for (theirs, mapped) in &templates_names {
                prop_assert!(!names.iter().any(|n| mapped.contains(n)), "the pod's alias {} maps a name the template maps to {}: {:?}", ip, theirs, names);
            }
        }
    }
}

/// Fragment parts as agents' options and paths look, separators included (`:` and ` ` split
/// fragments themselves, so a part may already hold what another fragment adds).
const PARTS: [&str; 6] = ["-javaagent:/a.jar", "-Dx=1", "/otel", "=", "/otel:/lib", "-Xss1m -Dy"];

/// A fragment: one to three parts joined by the merge's separator.
fn fragment(separator: &'static str) -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(PARTS.to_vec()), 1..=3).prop_map(move |p| p.join(separator))
}

/// A template edit of a fragment as operators make them: shortened (a part dropped), extended,
/// reordered, replaced, or the same.
fn edit(old: String, separator: &'static str) -> impl Strategy<Value = String> {
    let parts: Vec<String> = old.split(separator).map(str::to_owned).collect();
    let count = parts.len();
    (0..5u8, 0..count, fragment(separator)).prop_map(move |(how, at, other)| {
        let mut parts = parts.clone();
        match how {
            0 if count > 1 => {
                parts.remove(at);
            }
            1 => parts.insert(at, other),
            2 => parts.reverse(),
            3 => return other,
            _ => {}
        }
        parts.join(separator)
    })
}

/// Where the app's own value of the merged variable comes from: nothing visible, `envFrom`, a
/// literal (maybe holding one of the fragments, or parts of them), `valueFrom`; with and without
/// other variables around it.
fn app_value(name: &'static str, separator: &'static str, fragments: Vec<String>) -> impl Strategy<Value = Value> {
    let literal = proptest::collection::vec(
        proptest::sample::select(
            fragments.into_iter().chain(PARTS.iter().map(|p| (*p).to_owned())).collect::<Vec<_>>(),
        ),
        0..=2,
    )
    .prop_map(move |parts| parts.join(separator));
    (0..4u8, literal, any::<bool>(), any::<bool>()).prop_map(move |(form, literal, env_from, other)| {
        let mut env = Vec::new();
        if other {
            env.push(json!({"name": "OTHER", "value": "1"}));
        }
        match form {
            1 => env.push(json!({"name": name, "value": literal})),
            2 => env.push(json!({"name": name, "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}})),
            _ => {}
        }
        let mut container = json!({"name": "app", "image": "app:1", "env": env});
        if env_from || form == 3 {
            container["envFrom"] = json!([{"configMapRef": {"name": "app-env"}}]);
        }
        normalize(&container)
    })
}

/// A merge, three successive versions of its fragment (each an edit of the one before) and an
/// app container.
fn fragment_edits() -> impl Strategy<Value = (bool, Vec<String>, Value)> {
    any::<bool>()
        .prop_flat_map(|append| {
            let separator = if append { " " } else { ":" };
            (Just(append), fragment(separator))
        })
        .prop_flat_map(|(append, first)| {
            let separator = if append { " " } else { ":" };
            (Just(append), Just(first.clone()), edit(first, separator))
        })
        .prop_flat_map(|(append, first, second)| {
            let separator = if append { " " } else { ":" };
            (Just(append), Just(first), Just(second.clone()), edit(second, separator))
        })
        .prop_flat_map(|(append, first, second, third)| {
            let (name, separator) = if append { ("JAVA_TOOL_OPTIONS", " ") } else { ("PATH", ":") };
            let fragments = vec![first, second, third];
            (Just(append), Just(fragments.clone()), app_value(name, separator, fragments))
        })
}

proptest! {
    #![proptest_config(config())]

    /// The family of the re-injection bug that dropped a merged entry (a fragment edited so that
    /// the old fragment held the new one): for every edit of a fragment, and every form of the
    /// app's own value, re-injecting an injected pod gives what a fresh injection of the author's
    /// pod gives, through a chain of edits, and stripping gives back the author's env.
    #[test]
    fn re_injection_after_any_fragment_edit_equals_a_fresh_injection((append, fragments, container) in fragment_edits()) {
        let name = if append { "JAVA_TOOL_OPTIONS" } else { "PATH" };
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [container]}});
        let author_env = env_of(&pod);
        let mut engine = engine(&[merging_template(name, &fragments[0], append)]);
        let mut current = patched(&pod, evaluate(&engine, &pod, true)).0;
        for fragment in &fragments[1..] {
            engine = edited(&engine, &[merging_template(name, fragment, append)]);
            current = match evaluate(&engine, &current, true) {
                outcome @ Outcome::Inject(_) => patched(&current, outcome).0,
                Outcome::UpToDate(_) => current,
                other => panic!("{other:?}"),
            };
            let fresh = patched(&pod, evaluate(&engine, &pod, true)).0;
            prop_assert_eq!(env_of(&current), env_of(&fresh), "re-injection after editing the fragment to {:?}", fragment);
            prop_assert!(matches!(evaluate(&engine, &current, true), Outcome::UpToDate(_)), "injecting again adds nothing");
            let text = current["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap();
            let status = sidecar_injector_engine::model::status::InjectionStatus::parse(text).unwrap();
            let stripped = sidecar_injector_engine::claims::strip::strip_injection(&current, &status);
            prop_assert_eq!(env_of(&stripped), author_env.clone(), "strip gives back the author's env");
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// In a namespace that enforces a Pod Security level, a pod that meets the level still meets
    /// it injected (the templates that would break it are left out, or an enforced one refuses
    /// the pod in the API server's words), and the decision is idempotent.
    #[test]
    fn an_injection_never_makes_a_pod_fail_the_pod_security_level_it_met(
        pod in prop_oneof![pod_with_security_fields(), restricted_pod()],
        templates in proptest::collection::vec(secured_template(), 1..=3),
        level in proptest::sample::select(vec!["baseline", "restricted"]),
    ) {
        let engine = engine(&templates);
        let mut namespace = shop();
        namespace.labels.insert("pod-security.kubernetes.io/enforce".into(), level.into());
        let policy = Policy::enforce_of(&namespace.labels, 37);
        let request = |pod: &Value| PodRequest {
            pod: Arc::new(pod.clone()),
            namespace: namespace.clone(),
            cluster: cluster(true),
            workload: None,
        };
        let met = policy.violations(&pod).is_empty();
        match engine.evaluate(&request(&pod)).outcome {
            Outcome::Inject(injection) => {
                let mut out = pod.clone();
                json_patch::patch(&mut out, &injection.patch).unwrap();
                if met {
                    prop_assert_eq!(policy.violations(&out), Vec::new(), "{}", injection.status.reason.unwrap_or_default());
                }
                // Idempotent (but where the API server's limits left the pod as written: see
                // `patches_only_add_keep_everything_and_are_idempotent` for those).
                if !matches!(injection.skipped_as, Some(OutOfScope::WouldBeInvalid { .. })) {
                    let again = engine.evaluate(&request(&out)).outcome;
                    prop_assert!(matches!(again, Outcome::UpToDate(_)), "injecting again changes nothing: {:?}", again);
                }
            }
            Outcome::Denied(Denial::WouldBeInvalid { template, reasons }) if reasons.iter().any(|r| r.contains("PodSecurity")) => {
                prop_assert!(met, "refused for Pod Security where the pod failed the level on its own");
                prop_assert!(engine.templates.get(&template).is_some_and(|t| t.enforced), "{} is not enforced", template);
            }
            _ => {}
        }
    }
}

/// An app container's quantity as people write it: a YAML number of cores, millicores, or
/// binary and decimal units.
fn app_quantity() -> impl Strategy<Value = Value> {
    prop_oneof![
        (1u32..64).prop_map(|n| json!(n)),
        (1u32..5000).prop_map(|m| json!(format!("{m}m"))),
        (1u32..4096).prop_map(|mi| json!(format!("{mi}Mi"))),
        (1u32..16).prop_map(|gi| json!(format!("{gi}Gi"))),
        (1u32..2000).prop_map(|m| json!(format!("{m}M"))),
        (1u32..1000).prop_map(|h| json!(format!("0.{h:03}"))),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// A sized value is the smallest multiple of `round` that is at least the app's sum (or
    /// largest) times the fraction, then held between min and max; a request never exceeds the
    /// container's limit; it is written as Kubernetes writes it (it reads back to itself).
    /// Checked by multiplication, against the engine's division.
    #[test]
    fn a_sized_value_is_the_app_value_times_the_fraction_rounded_up_and_bounded(
        apps in proptest::collection::vec((proptest::option::of(app_quantity()), proptest::option::of(app_quantity())), 1..4),
        from in proptest::sample::select(vec!["sum", "max"]),
        fraction in (1u32..3000).prop_map(|f| format!("{}.{:03}", f / 1000, f % 1000)),
        round in proptest::sample::select(vec!["1m", "5m", "1", "1Mi", "16Mi", "1k"]),
        bounds in (proptest::option::of(app_quantity()), proptest::option::of(app_quantity())),
    ) {
        use sidecar_injector_engine::model::sizing::Sizing;
        use sidecar_injector_engine::quantity;
        let nanos = |v: &Value| quantity::of(v).unwrap();
        let app: Vec<Value> = apps.iter().enumerate().map(|(i, (request, limit))| {
            let mut resources = json!({});
            if let Some(request) = request { resources["requests"] = json!({"cpu": request}); }
            if let Some(limit) = limit { resources["limits"] = json!({"cpu": limit}); }
            json!({"name": format!("app-{i}"), "resources": resources})
        }).collect();
        let mut rule = json!({"from": from, "fraction": fraction, "round": round});
        let (min, max) = match bounds {
            (Some(a), Some(b)) if nanos(&a) > nanos(&b) => (Some(b), Some(a)),
            other => other,
        };
        if let Some(min) = &min { rule["min"] = min.clone(); }
        if let Some(max) = &max { rule["max"] = max.clone(); }
        let sizing = Sizing::parse(&json!({"requests": {"cpu": rule}})).unwrap();
        let template_limit = 40 * 1_000_000_000i128;
        let mut container = json!({"name": "agent", "resources": {"limits": {"cpu": "40"}}});
        sizing.apply(&mut container, &app).unwrap();
        let written = container["resources"]["requests"]["cpu"].as_str().map(str::to_owned);
        // The app's value: requests default to limits; containers with neither count nothing.
        let values: Vec<i128> = apps.iter().filter_map(|(r, l)| r.as_ref().or(l.as_ref()).map(nanos)).collect();
        let Some(written) = written else {
            prop_assert!(values.is_empty() && min.is_none(), "nothing written though there was something to size from");
            return Ok(());
        };
        let value = quantity::parse(&written).unwrap();
        prop_assert_eq!(quantity::format(value, &written), written.clone(), "written as stored");
        if values.is_empty() {
            prop_assert_eq!(Some(value), min.as_ref().map(|min| nanos(min).min(template_limit)));
            return Ok(());
        }
        let app_value = match from { "sum" => values.iter().sum::<i128>(), _ => *values.iter().max().unwrap() };
        let fraction_nanos = quantity::parse(&fraction).unwrap();
        let round_nanos = quantity::parse(round).unwrap();
        let target = app_value * fraction_nanos; // in nano-units × 10^9
        // The rounded value before the bounds: the smallest multiple of round ≥ target.
        let mut expected = {
            let mut k = target / (round_nanos * 1_000_000_000);
            while k * round_nanos * 1_000_000_000 < target { k += 1; }
            while k > 0 && (k - 1) * round_nanos * 1_000_000_000 >= target { k -= 1; }
            k * round_nanos
        };
        if let Some(min) = &min { expected = expected.max(nanos(min)); }
        if let Some(max) = &max { expected = expected.min(nanos(max)); }
        expected = expected.min(template_limit);
        prop_assert_eq!(value, expected, "{} of {:?} × {} round {} min {:?} max {:?}", from, values, fraction, round, min, max);
    }
}

proptest! {
    #![proptest_config(config())]

    /// What the nodes the pod can run on declare decides only the `node_feature_missing`
    /// warning: the decision is otherwise the one for unknown nodes, and the warning comes exactly
    /// when an injected container restarts the whole pod on exit and no such node offers that.
    #[test]
    fn what_the_nodes_declare_changes_only_the_warning(
        pod in pod(),
        template in template(),
        restart_all in any::<proptest::sample::Index>(),
        nodes in proptest::collection::vec((proptest::option::of(any::<bool>()), 30u32..38), 1..4),
        scheduler_reads in any::<bool>(),
    ) {
        use sidecar_injector_engine::injection::node_features::{FeatureReach, NodeFeature, NodeFeatures};
        // One sidecar of the template (if it has any) restarts the whole pod on exit code 42.
        let mut doc: Value = manifest::read(&template).unwrap().remove(0);
        let sidecars = doc["inject"]["sidecars"].as_array_mut().unwrap();
        let with_rule = (!sidecars.is_empty()).then(|| restart_all.index(sidecars.len()));
        if let Some(index) = with_rule {
            sidecars[index]["restartPolicyRules"] =
                json!([{"action": "RestartAllContainers", "exitCodes": {"operator": "In", "values": [42]}}]);
        }
        let engine = engine(&[manifest::write(&[doc.clone()])]);
        // Each node declares the feature, declares others only, or nothing (by its kubelet).
        let features = nodes.iter().map(|(declares, minor)| {
            let declared: Option<Vec<String>> = declares.map(|yes| match yes {
                true => vec![NodeFeature::RestartAllContainers.declared_as().to_owned()],
                false => vec!["ExtendWebSocketsToKubelet".to_owned()],
            });
            NodeFeatures::of(declared.as_deref(), Some((1, *minor)))
        });
        let reach = FeatureReach::of(features, scheduler_reads);
        let decide = |reach: FeatureReach| {
            engine.evaluate(&PodRequest {
                pod: Arc::new(pod.clone()),
                namespace: shop(),
                cluster: ClusterFacts { node_features: reach, ..cluster(true) },
                workload: None,
            })
        };
        let (known, unknown) = (decide(reach), decide(FeatureReach::UNKNOWN));
        let missing = |d: &sidecar_injector_engine::Decision| d.warnings.iter().filter(|w| w.code == WarningCode::NodeFeatureMissing).count();
        prop_assert_eq!(missing(&unknown), 0);
        let others = |d: &sidecar_injector_engine::Decision| {
            d.warnings.iter().filter(|w| w.code != WarningCode::NodeFeatureMissing).cloned().collect::<Vec<_>>()
        };
        prop_assert_eq!(others(&known), others(&unknown));
        // The same outcome, but for the injection's warnings (of which the node one).
        let without_warnings = |d: &sidecar_injector_engine::Decision| match &d.outcome {
            Outcome::Inject(injection) => format!("{:?}", Outcome::Inject(sidecar_injector_engine::Injection { warnings: Vec::new(), ..injection.clone() })),
            other => format!("{other:?}"),
        };
        prop_assert_eq!(without_warnings(&known), without_warnings(&unknown));
        // The warning: exactly when the sidecar with the rule is injected and no node offers it.
        let injected_with_rule = match (&known.outcome, with_rule) {
            (Outcome::Inject(injection), Some(index)) => {
                let name = doc["inject"]["sidecars"][index]["name"].as_str().unwrap();
                injection.status.containers.iter().chain(&injection.status.init_containers).any(|n| n == name)
            }
            _ => false,
        };
        let expected = usize::from(injected_with_rule && !reach.offers(NodeFeature::RestartAllContainers));
        prop_assert_eq!(missing(&known), expected, "{:?}", reach);
    }
}

/// The pod as a replica of Deployment `w<workload>` makes it (no name yet, its ReplicaSet as
/// owner), under `name_seed` to tell replicas apart.
fn replica_of(pod: &Value, workload: u32, name_seed: u32) -> Value {
    let mut pod = pod.clone();
    let metadata = pod["metadata"].as_object_mut().unwrap();
    metadata.remove("name");
    metadata.insert("generateName".into(), json!(format!("w{workload}-5d8f7c-{name_seed}")));
    metadata.insert(
        "ownerReferences".into(),
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("w{workload}-5d8f7c"), "uid": "u", "controller": true}]),
    );
    let labels = metadata.entry("labels").or_insert_with(|| json!({}));
    labels["pod-template-hash"] = json!("5d8f7c");
    pod
}

proptest! {
    #![proptest_config(config())]

    /// While a template's new version rolls out (`rollout: {share}` on the edit, the version
    /// before remembered as a running replica remembers it), a pod gets exactly what one of the
    /// two versions alone would inject — the same one for every replica of its workload — and
    /// with two versions in service its injection re-admits up to date and is not drifted.
    #[test]
    fn two_versions_in_service_each_inject_as_alone_and_every_replica_agrees(
        pod in pod(),
        old in template(),
        new in template(),
        share in 0u8..=100,
        workload in 0u32..10_000,
        native in any::<bool>(),
    ) {
        let old_engine = engine(std::slice::from_ref(&old));
        let new_engine = engine(std::slice::from_ref(&new));
        let (old_hash, new_hash) = (old_engine.templates.get("t0").unwrap().hash.clone(), new_engine.templates.get("t0").unwrap().hash.clone());
        let rolled = edited(&old_engine, &[format!("rollout: {{share: {share}}}\n{new}")]);
        let pod = replica_of(&pod, workload, 1);
        let decision = rolled.evaluate(&PodRequest { pod: Arc::new(pod.clone()), namespace: shop(), cluster: cluster(native), workload: None });
        let chosen = match decision.choice.as_ref().and_then(|c| c.versions.first()) {
            Some(version) => version.hash.clone(),
            // Out of scope, or the versions are one (the edit changed nothing).
            None => {
                prop_assert!(old_hash == new_hash || decision.choice.is_none() || decision.choice.as_ref().is_some_and(|c| c.selected().next().is_none()));
                return Ok(());
            }
        };
        let alone = match chosen == old_hash {
            true => &old_engine,
            false => { prop_assert_eq!(&chosen, &new_hash); &new_engine }
        };
        let expected = evaluate(alone, &pod, native);
        prop_assert_eq!(format!("{:?}", decision.outcome), format!("{expected:?}"));
        // Another replica of the workload gets the same version.
        let sibling = rolled.evaluate(&PodRequest { pod: Arc::new(replica_of(&pod, workload, 2)), namespace: shop(), cluster: cluster(native), workload: None });
        prop_assert_eq!(sibling.choice.unwrap().versions.first().map(|v| v.hash.clone()), Some(chosen));
        if let Outcome::Inject(_) = expected {
            let (injected, _) = patched(&pod, decision.outcome);
            let again = evaluate(&rolled, &injected, native);
            prop_assert!(matches!(again, Outcome::UpToDate(_)), "{:?}", again);
            let labels = sidecar_injector_engine::pod::string_map(&injected, "labels").unwrap();
            let annotations = sidecar_injector_engine::pod::string_map(&injected, "annotations").unwrap();
            let drift = sidecar_injector_engine::drift::classify(&rolled, &labels, &annotations, &shop());
            prop_assert!(!matches!(drift, sidecar_injector_engine::drift::PodDrift::Stale { .. }), "{:?}", drift);
        }
    }
}
