//! The API server as the oracle (`make oracle`; a fixed seed set in `make e2e`).
//!
//! The engine predicts what Kubernetes will do with the pods it writes: that a patched pod is
//! valid, that the pod-level resources it pads are what the API server stores. Nothing else in
//! the tests holds those predictions against Kubernetes itself, so defects of the kind "the engine
//! thinks a number is no quantity" or "the padding is below a sidecar's own limit" were found by
//! people. Here the property generator's pods and templates (`crates/engine/tests/common/generate.rs`,
//! the same cases the properties run on) are injected by the engine, and every pod it would write
//! is created with **server-side dry-run** on the e2e API server, through its whole admission chain,
//! in a namespace with no Pod Security label and one at `enforce: privileged`. Each injected pod
//! the API server accepts is then tried in namespaces at `enforce: baseline` and `restricted`:
//! `checks::pod_security` must predict Pod Security Admission's verdict, and its refusal word for
//! word. The namespaces are not opted in, so our own webhook and policies stay out of the judgement.
//!
//! A failure is a case where:
//! - the engine injects and the API server refuses the injected pod (while it accepts the author's);
//! - the engine predicts that the API server would refuse the injected pod (and leaves the pod as
//!   written) and the API server accepts the pod the injection would have made;
//! - a quantity the engine computes (a padded pod-level value, a container's value `sizing:`
//!   computes from the app's) is not stored as written (the
//!   engine's canonical form differs from Kubernetes'), or any other quantity of the injected pod
//!   (a template's own, in the containers it appends; the pod's own) is stored as another value;
//! - Pod Security Admission's verdict on the injected pod differs from `checks::pod_security`'s;
//! - decided for a namespace that enforces `baseline` or `restricted` (the engine leaves out the
//!   templates that would break the level), the pod the engine writes is refused where the
//!   author's is admitted, or its verdict is not the one predicted.
//!
//! Cases whose author pod the API server refuses say nothing about the engine: they are counted
//! and the first reason printed, so a generator that drifts from valid pods shows. The count of
//! cases, refusals and cases per second is printed; `SIDECAR_INJECTOR_ORACLE_CASES` (default
//! [`FIXED_CASES`] from [`FIXED_SEED`]) and `SIDECAR_INJECTOR_ORACLE_SEED` (a new one, printed,
//! when cases are asked for) choose the run.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use json_patch::PatchOperation;
use proptest::prop_oneof;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};
use sidecar_injector_engine::checks::pod_security::{self, Level, Policy};
use sidecar_injector_engine::injection::image_volumes::ImageVolumeSupport;
use sidecar_injector_engine::injection::plan::Injection;
use sidecar_injector_engine::injection::select::OutOfScope;
use sidecar_injector_engine::quantity;
use sidecar_injector_engine::{ClusterFacts, Engine, NamespaceFacts, Outcome, PodRequest, TemplateSet, TemplateSource};

#[allow(dead_code)]
#[path = "../../crates/engine/tests/common/generate.rs"]
mod generate;

use crate::scenarios::Ctx;

/// Cases in `make e2e` (a couple of seconds).
pub const FIXED_CASES: u64 = 300;
/// The seed of `make e2e`'s cases.
pub const FIXED_SEED: u64 = 0x0a9c_1e5e_ed20_2611;

/// The scenario's time limit: a second for every 20 cases beyond the fixed set, at least the
/// suite's three minutes (a dry run takes a few milliseconds; the engine's decision less).
pub fn time_budget() -> std::time::Duration {
    let cases = std::env::var("SIDECAR_INJECTOR_ORACLE_CASES").ok().and_then(|v| v.trim().parse::<u64>().ok());
    std::time::Duration::from_secs(180 + cases.unwrap_or(FIXED_CASES) / 20)
}

/// The namespaces the cases are created in: no Pod Security label, and `privileged`.
const NAMESPACES: [(&str, &[(&str, &str)]); 2] =
    [("oracle-plain", &[]), ("oracle-privileged", &[("pod-security.kubernetes.io/enforce", "privileged")])];

/// The namespaces each injected pod the API server accepts is tried in again, to hold
/// `checks::pod_security`'s verdict (and its words) against Pod Security Admission's.
const POD_SECURITY_NAMESPACES: [(&str, Level); 2] =
    [("oracle-baseline", Level::Baseline), ("oracle-restricted", Level::Restricted)];

/// One drawn case: templates, a pod, and whether the cluster facts are a recent cluster's.
#[derive(Debug)]
struct Case {
    templates: Vec<String>,
    pod: Value,
    recent: bool,
}

/// What the run found, printed at its end.
#[derive(Default)]
struct Tally {
    cases: u64,
    injected: u64,
    accepted: u64,
    author_refused: u64,
    first_author_refusal: Option<String>,
    not_injected: u64,
    predicted_invalid: u64,
    /// Pod Security verdicts (accepted, or refused in the same words) that agree.
    pod_security_agreed: u64,
    /// Of those, refusals.
    pod_security_refused: u64,
    /// Decisions in namespaces that enforce a level, each held against the API server's verdict.
    level_decisions: u64,
    /// Of those, the ones where the engine left templates out to keep the level.
    level_left_out: u64,
    /// Values `sizing:` computed, each stored text for text.
    sized: usize,
    failures: Vec<String>,
}

pub async fn s37_api_server_oracle(ctx: &mut Ctx) -> Result<()> {
    let number = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<u64>().ok());
    let cases = number("SIDECAR_INJECTOR_ORACLE_CASES").unwrap_or(FIXED_CASES);
    // The fixed seed unless cases were asked for (`make oracle`): then a new one, printed.
    let seed = match (number("SIDECAR_INJECTOR_ORACLE_SEED"), number("SIDECAR_INJECTOR_ORACLE_CASES")) {
        (Some(seed), _) => seed,
        (None, None) => FIXED_SEED,
        (None, Some(_)) => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            now.as_nanos() as u64 ^ u64::from(std::process::id())
        }
    };
    for (name, labels) in NAMESPACES {
        ctx.namespace(name, labels).await?;
    }
    for (name, level) in POD_SECURITY_NAMESPACES {
        ctx.namespace(name, &[("pod-security.kubernetes.io/enforce", level.name())]).await?;
    }
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(Config::default(), TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    // Templates with and without Pod Security fields, and pods of every shape and ones that meet
    // `restricted`, so that the decisions for namespaces at a level leave templates out.
    let strategy = (
        proptest::collection::vec(prop_oneof![generate::template(), generate::secured_template()], 1..=3),
        prop_oneof![generate::pod_with_security_fields(), generate::restricted_pod()],
        proptest::bool::ANY,
    )
        .prop_map(|(templates, pod, recent)| Case { templates, pod, recent });
    let started = Instant::now();
    let mut tally = Tally::default();
    for index in 0..cases {
        let case = strategy.new_tree(&mut runner).map_err(|e| anyhow::anyhow!("drawing a case: {e}"))?.current();
        let namespace = NAMESPACES[(index % 2) as usize].0;
        judge(ctx, &case, index, namespace, &mut tally).await?;
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "  oracle: {} cases in {seconds:.1} s ({:.1}/s, seed {seed}): {} injected, {} accepted by the API server, {} disagreements; {} not injected by the engine, {} predicted invalid (each refused by the API server too); {} Pod Security verdicts at baseline and restricted agree ({} refusals, in the same words); {} decisions for namespaces at baseline and restricted judged by the API server as predicted ({} with templates left out); {} sized container values stored as computed; {} author pods refused{}",
        tally.cases,
        tally.cases as f64 / seconds.max(0.001),
        tally.injected,
        tally.accepted,
        tally.failures.len(),
        tally.not_injected,
        tally.predicted_invalid,
        tally.pod_security_agreed,
        tally.pod_security_refused,
        tally.level_decisions,
        tally.level_left_out,
        tally.sized,
        tally.author_refused,
        tally.first_author_refusal.as_deref().map(|r| format!(" (first: {r})")).unwrap_or_default(),
    );
    if !tally.failures.is_empty() {
        let shown: Vec<&String> = tally.failures.iter().take(3).collect();
        bail!(
            "{} case(s) where the API server disagrees with the engine; the first:\n{}",
            tally.failures.len(),
            shown.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n---\n")
        );
    }
    if tally.author_refused * 10 > tally.cases {
        bail!("over a tenth of the generated author pods are refused: the generator no longer makes valid pods");
    }
    Ok(())
}

/// Runs one case: the engine's decision, then the API server's verdict on the author's pod and on
/// the pod the engine would write.
async fn judge(ctx: &Ctx, case: &Case, index: u64, namespace: &str, tally: &mut Tally) -> Result<()> {
    tally.cases += 1;
    let sources =
        case.templates.iter().enumerate().map(|(i, text)| TemplateSource { name: format!("t{i}"), text: text.clone() });
    let (set, errors) = TemplateSet::load(sources);
    if !errors.is_empty() {
        bail!("case {index}: the generated templates do not load: {errors:?}");
    }
    let engine = Engine::new(set, Vec::new());
    let mut pod = case.pod.clone();
    pod["metadata"]["name"] = json!(format!("oracle-{index}"));
    pod["metadata"]["namespace"] = json!(namespace);
    with_mounted_volumes(&mut pod);
    let facts = NamespaceFacts::known(
        namespace,
        [("sidecar-injector.io/inject".into(), "enabled".into())].into(),
        Default::default(),
    );
    let cluster = match case.recent {
        true => ClusterFacts::api_server(true),
        false => ClusterFacts {
            image_volumes: ImageVolumeSupport::of_api_server(Some((1, 28))),
            ..ClusterFacts::api_server(false)
        },
    };
    let request = PodRequest { pod: Arc::new(pod.clone()), namespace: facts, cluster, workload: None };
    let outcome = engine.evaluate(&request).outcome;
    // A predicted refusal: the pod is left as written (with a status saying why, or none).
    let predicted = match &outcome {
        Outcome::OutOfScope(OutOfScope::WouldBeInvalid { reasons, refused_patch })
        | Outcome::Inject(Injection {
            skipped_as: Some(OutOfScope::WouldBeInvalid { reasons, refused_patch }), ..
        }) => Some((reasons.clone(), refused_patch.clone())),
        _ => None,
    };
    let injection = match outcome {
        Outcome::Inject(injection) => Some(injection),
        _ => None,
    };
    if injection.is_none() && predicted.is_none() {
        tally.not_injected += 1;
        return Ok(());
    }
    let author_stored = match dry_run(ctx, namespace, &pod).await? {
        Ok(stored) => stored,
        Err(refusal) => {
            tally.author_refused += 1;
            tally.first_author_refusal.get_or_insert(refusal);
            return Ok(());
        }
    };
    judge_levels(ctx, (&engine, &request), (&pod, &author_stored), tally, index).await?;
    if let Some((reasons, refused_patch)) = predicted {
        // The prediction, judged: the pod the injection would have made must really be refused.
        let mut refused = pod.clone();
        json_patch::patch(&mut refused, &refused_patch)
            .with_context(|| format!("case {index}: the refused patch applies"))?;
        match dry_run(ctx, namespace, &refused).await? {
            Err(_) => tally.predicted_invalid += 1,
            Ok(_) => tally.failures.push(format!(
                "the engine predicted a refusal the API server does not make ({}):
case {index} (namespace {namespace}, recent cluster: {}):
templates:
{}
pod: {}
the pod not injected: {refused}",
                reasons.join("; "),
                case.recent,
                case.templates.join("---\n"),
                case.pod,
            )),
        }
    }
    let Some(injection) = injection else { return Ok(()) };
    tally.injected += 1;
    let mut injected = pod.clone();
    json_patch::patch(&mut injected, &injection.patch).with_context(|| format!("case {index}: the patch applies"))?;
    let describe = || {
        format!(
            "case {index} (namespace {namespace}, recent cluster: {}):\ntemplates:\n{}\npod: {}\ninjected: {}",
            case.recent,
            case.templates.join("---\n"),
            case.pod,
            injected
        )
    };
    match dry_run(ctx, namespace, &injected).await? {
        Err(refusal) => {
            tally.failures.push(format!("the API server refused the injected pod: {refusal}\n{}", describe()))
        }
        Ok(stored) => {
            tally.accepted += 1;
            judge_pod_security(ctx, &injected, &stored, tally, &describe).await?;
            // What the engine computes (pod-level padding) must be what the API server stores,
            // text for text; every other quantity of the injected pod (a template's own, in the
            // sidecars the patch appends, the pod's own) passes through, equal in value. The API
            // server keeps the order of containers, so a quantity is found at its own pointer.
            let mut computed: Vec<String> = quantities_written(&injection.patch)
                .into_iter()
                .map(|(path, _)| path)
                .filter(|path| path.starts_with("/spec/resources/"))
                .collect();
            // So are the values a container's `sizing:` computes from the app's.
            computed.extend(sized_paths(&injected, &injection.notes.sized));
            tally.sized +=
                computed.iter().filter(|p| p.contains("/resources/") && !p.starts_with("/spec/resources/")).count();
            for (path, written) in quantities_in(&injected) {
                let kept = stored.pointer(&path);
                let same = match computed.contains(&path) {
                    true => kept == Some(&written),
                    false => kept.is_some_and(|kept| kept == &written || quantity::equal(kept, &written)),
                };
                if !same {
                    tally.failures.push(format!(
                        "the quantity at {path} is written {written} and stored {}\n{}",
                        kept.map_or("(absent)".to_owned(), Value::to_string),
                        describe()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Where the values `sizing:` computed are in the injected pod, from the injection's notes
/// (`<template>: container <name>: <field>.<resource> = <value> (...)`).
fn sized_paths(injected: &Value, notes: &[String]) -> Vec<String> {
    let mut paths = Vec::new();
    for note in notes {
        let Some((_, rest)) = note.split_once(": container ") else { continue };
        let Some((name, rest)) = rest.split_once(": ") else { continue };
        let Some((at, _)) = rest.split_once(" = ") else { continue };
        let Some((field, resource)) = at.split_once('.') else { continue };
        for list in ["initContainers", "containers"] {
            let containers = injected["spec"][list].as_array().into_iter().flatten();
            if let Some(index) = containers.enumerate().find(|(_, c)| c["name"] == name).map(|(i, _)| i) {
                paths.push(format!(
                    "/spec/{list}/{index}/resources/{field}/{}",
                    resource.replace('~', "~0").replace('/', "~1")
                ));
            }
        }
    }
    paths
}

/// The injected pod in a namespace at each Pod Security level: the API server accepts it exactly
/// when `checks::pod_security` finds nothing (on the pod as stored: admission sees it defaulted),
/// and refuses it in the words `Policy::message` gives.
async fn judge_pod_security(
    ctx: &Ctx,
    injected: &Value,
    stored: &Value,
    tally: &mut Tally,
    describe: &dyn Fn() -> String,
) -> Result<()> {
    for (namespace, level) in POD_SECURITY_NAMESPACES {
        let mut pod = injected.clone();
        pod["metadata"]["namespace"] = json!(namespace);
        let violations = pod_security::violations(stored, level, pod_security::LATEST_MINOR);
        let policy = Policy { level, minor: pod_security::LATEST_MINOR, version_label: "latest".into() };
        let predicted = (!violations.is_empty()).then(|| policy.message(&violations));
        match (dry_run(ctx, namespace, &pod).await?, predicted) {
            (Ok(_), None) => tally.pod_security_agreed += 1,
            (Err(refusal), Some(words)) if refusal.contains(&words) => {
                tally.pod_security_agreed += 1;
                tally.pod_security_refused += 1;
            }
            (verdict, predicted) => tally.failures.push(format!(
                "Pod Security {}: the API server says {verdict:?}, checks::pod_security predicts {predicted:?}\n{}",
                level.name(),
                describe()
            )),
        }
    }
    Ok(())
}

/// The engine's decision for the pod in namespaces that enforce `baseline` and `restricted` (the
/// decision judges Pod Security: it leaves out templates that would break the level), held against
/// the API server's verdict on the pod it writes: accepted exactly when `checks::pod_security`
/// finds nothing, refused in its words otherwise; and never refused where the author's pod is
/// admitted (`author_stored`: the pod as the API server stores it, defaulted, which admission sees).
async fn judge_levels(
    ctx: &Ctx,
    (engine, request): (&Engine, &PodRequest),
    (pod, author_stored): (&Value, &Value),
    tally: &mut Tally,
    index: u64,
) -> Result<()> {
    for (namespace, level) in POD_SECURITY_NAMESPACES {
        let labels = [
            ("sidecar-injector.io/inject".to_owned(), "enabled".to_owned()),
            ("pod-security.kubernetes.io/enforce".to_owned(), level.name().to_owned()),
        ];
        let facts = NamespaceFacts::known(namespace, labels.into(), Default::default());
        let mut pod = pod.clone();
        pod["metadata"]["namespace"] = json!(namespace);
        let request = PodRequest { pod: Arc::new(pod.clone()), namespace: facts, ..request.clone() };
        let (written, left_out) = match engine.evaluate(&request).outcome {
            Outcome::Inject(injection) => {
                let mut written = pod.clone();
                json_patch::patch(&mut written, &injection.patch)
                    .with_context(|| format!("case {index}: the patch applies"))?;
                let left_out = injection.status.reason.as_deref().is_some_and(|r| r.contains("Pod Security"));
                (written, left_out)
            }
            // Nothing written: the author's pod is what the API server judges.
            _ => (pod.clone(), false),
        };
        tally.level_decisions += 1;
        tally.level_left_out += u64::from(left_out);
        let policy = Policy { level, minor: pod_security::LATEST_MINOR, version_label: "latest".into() };
        let author_passes = pod_security::violations(author_stored, level, pod_security::LATEST_MINOR).is_empty();
        // What admission sees is the pod defaulted: the prediction is made on the written pod as
        // the API server stores it where the level does not refuse it (a namespace without one).
        let mut unlevelled = written.clone();
        unlevelled["metadata"]["namespace"] = json!(NAMESPACES[0].0);
        let stored = match dry_run(ctx, NAMESPACES[0].0, &unlevelled).await? {
            Ok(stored) => stored,
            Err(refusal) => {
                tally.failures.push(format!(
                    "case {index}: decided for {namespace}, the written pod is refused even without a level: {refusal}\nwritten: {written}"
                ));
                continue;
            }
        };
        let violations = pod_security::violations(&stored, level, pod_security::LATEST_MINOR);
        let predicted = (!violations.is_empty()).then(|| policy.message(&violations));
        match (dry_run(ctx, namespace, &written).await?, predicted) {
            (Ok(_), None) => {}
            (Err(_), Some(_)) if author_passes => tally.failures.push(format!(
                "case {index}: decided for {namespace}, the written pod breaks {} where the author's meets it\nwritten: {written}",
                level.name()
            )),
            (Err(refusal), Some(words)) if refusal.contains(&words) => {}
            (verdict, predicted) => tally.failures.push(format!(
                "case {index}: decided for {namespace}: the API server says {verdict:?}, the engine predicts {predicted:?}\nwritten: {written}"
            )),
        }
    }
    Ok(())
}

/// The generator's app containers mount volumes by names (`own`, `injected`) that the properties
/// never need to exist; the API server does: each missing one becomes an emptyDir of the pod.
fn with_mounted_volumes(pod: &mut Value) {
    let spec = &mut pod["spec"];
    let mut mounted: Vec<String> = ["containers", "initContainers"]
        .iter()
        .flat_map(|list| spec[*list].as_array().into_iter().flatten())
        .flat_map(|c| c["volumeMounts"].as_array().into_iter().flatten())
        .filter_map(|m| m["name"].as_str().map(str::to_owned))
        .collect();
    mounted.sort();
    mounted.dedup();
    let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
    let missing = mounted.into_iter().filter(|name| !volumes.iter().any(|v| v["name"] == json!(name)));
    let added: Vec<Value> = missing.map(|name| json!({"name": name, "emptyDir": {}})).collect();
    if !added.is_empty() {
        spec["volumes"] = Value::Array(volumes.into_iter().chain(added).collect());
    }
}

/// Server-side dry-run of a pod as raw JSON (no typed round trip, which would itself reject or
/// rewrite what the engine wrote): `Ok(Ok(stored))`, or `Ok(Err(the API server's message))`.
async fn dry_run(ctx: &Ctx, namespace: &str, pod: &Value) -> Result<Result<Value, String>> {
    let params = kube::api::PostParams { dry_run: true, ..Default::default() };
    let request = kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/pods"))
        .create(&params, serde_json::to_vec(pod)?)
        .context("building the dry-run request")?;
    match ctx.client.request::<Value>(request).await {
        Ok(stored) => Ok(Ok(stored)),
        Err(kube::Error::Api(status)) => Ok(Err(format!("{} ({})", status.message, status.code))),
        Err(other) => Err(other).context("the dry-run request"),
    }
}

/// Every quantity (a value under `requests` or `limits`, or under `resources` where `in_resources`)
/// in `value` at `path`, by its JSON pointer.
fn walk(path: String, value: &Value, in_resources: bool, out: &mut Vec<(String, Value)>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                let inside = in_resources || matches!(key.as_str(), "requests" | "limits");
                let escaped = key.replace('~', "~0").replace('/', "~1");
                walk(format!("{path}/{escaped}"), item, inside, out);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(format!("{path}/{i}"), item, in_resources, out);
            }
        }
        quantity if in_resources => out.push((path, quantity.clone())),
        _ => {}
    }
}

/// Every quantity of a pod's spec (containers', init containers', pod-level), by its JSON pointer.
fn quantities_in(pod: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    walk("/spec".to_owned(), &pod["spec"], false, &mut out);
    out
}

/// Every quantity (a string under a `requests`, `limits` or pod-level `resources`) that the patch
/// adds or replaces, by its JSON pointer.
fn quantities_written(patch: &[PatchOperation]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for operation in patch {
        let (path, value) = match operation {
            PatchOperation::Add(add) => (add.path.to_string(), &add.value),
            PatchOperation::Replace(replace) => (replace.path.to_string(), &replace.value),
            _ => continue,
        };
        // Appended items (`/-`) have no pointer of their own here (`quantities_in` finds them).
        if path.ends_with("/-") {
            continue;
        }
        let in_resources = path.contains("/resources");
        walk(path, value, in_resources, &mut out);
    }
    out
}
