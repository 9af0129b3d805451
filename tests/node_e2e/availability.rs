//! Availability through upgrades, crashes and edits, as pod creators see it: a load generator
//! creates pods at a steady rate through the real API server (which calls the injector through its
//! Service) while one event happens to the injector, and counts, per event, the creates that
//! failed, the pods stored without their injection, and the create latency during the event
//! against the same run's steady state.
//!
//! The pods carry a nodeSelector no node matches, so they stay Pending: admission is what is
//! measured, and the node does not have to run a thousand containers. A quarter of them come from a
//! ReplicaSet scaled up during the run (the controller retries a refused create, so its failures
//! are counted from its `FailedCreate` events).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// Pods per second the generator creates: bare ones, and one ReplicaSet-made one every fourth tick.
pub const RATE: u32 = 20;

/// One create: when it started (since the run began), how long it took, and its error.
#[derive(Clone, Debug)]
struct Create {
    at: Duration,
    took: Duration,
    error: Option<String>,
}

/// What happened during one event.
pub struct Row {
    pub event: String,
    pub creates: usize,
    pub failed: usize,
    /// Failed because the API server itself was away (event 5): not the injector's doing.
    pub api_down: usize,
    pub replica_set_refusals: u64,
    pub without_injection: usize,
    pub steady: (Duration, Duration),
    pub during: (Duration, Duration),
    /// A few distinct error messages.
    pub errors: Vec<String>,
    /// The longest stretch of creates that failed one after the other (injector errors only),
    /// from the first's start to the last's.
    pub longest_failing: Duration,
}

impl Row {
    /// The table row.
    pub fn line(&self) -> String {
        let ms = |d: Duration| format!("{:.0}", d.as_secs_f64() * 1000.0);
        format!(
            "| {} | {} | {}{} | {} | {} / {} ms | {} / {} ms |",
            self.event,
            self.creates,
            self.failed + self.replica_set_refusals as usize,
            if self.api_down > 0 {
                format!(" (+{} while the API server was down)", self.api_down)
            } else {
                String::new()
            },
            self.without_injection,
            ms(self.steady.0),
            ms(self.steady.1),
            ms(self.during.0),
            ms(self.during.1),
        )
    }
}

/// The table's header.
pub const HEADER: &str = "| event | creates | failed | without injection | p50 / p99 steady | p50 / p99 during |\n| --- | --- | --- | --- | --- | --- |";

fn quantiles(mut latencies: Vec<Duration>) -> (Duration, Duration) {
    if latencies.is_empty() {
        return (Duration::ZERO, Duration::ZERO);
    }
    latencies.sort();
    let at = |q: usize| latencies[(latencies.len() * q).div_ceil(100).saturating_sub(1)];
    (at(50), at(99))
}

/// A pod that stays Pending (no node matches it). `source` tells the bare pods from the
/// ReplicaSet's: were they alike, the ReplicaSet would adopt the bare ones and delete all it does
/// not want, a churn of API calls that slows its own pods down and hides bare pods from the count.
fn pending_pod(run: &str, source: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "load-",
            "labels": {"load-run": run, "load-source": source, "app.kubernetes.io/name": "load"}
        },
        "spec": {
            "nodeSelector": {"sidecar-injector.io/e2e-no-such-node": "true"},
            "containers": [{"name": "app", "image": "localhost/sidecar-injector-e2e/busybox:1"}]
        }
    })
}

/// Creates pods at [`RATE`] per second in `namespace` until `stop`; returns every create.
async fn generate(
    client: kube::Client,
    namespace: String,
    run: String,
    stop: Arc<AtomicBool>,
    started: Instant,
) -> (Vec<Create>, u64) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let replica_sets: Api<k8s_openapi::api::apps::v1::ReplicaSet> = Api::namespaced(client, &namespace);
    let run = Arc::new(run);
    let pod: Pod = serde_json::from_value(pending_pod(&run, "bare")).expect("a valid pod");
    let creates = Arc::new(Mutex::new(Vec::new()));
    let mut tick = tokio::time::interval(Duration::from_secs(1) / RATE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tasks = Vec::new();
    let mut n: u64 = 0;
    let mut replicas = 0;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        n += 1;
        if n.is_multiple_of(4) {
            replicas += 1;
            let (replica_sets, run) = (replica_sets.clone(), run.clone());
            let patch = json!({"spec": {"replicas": replicas}});
            tasks.push(tokio::spawn(async move {
                let _ = replica_sets
                    .patch_scale(
                        &format!("load-{run}"),
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await;
            }));
            continue;
        }
        let (pods, pod, creates) = (pods.clone(), pod.clone(), creates.clone());
        tasks.push(tokio::spawn(async move {
            let at = started.elapsed();
            let begin = Instant::now();
            let result = pods.create(&PostParams::default(), &pod).await;
            // An answer of the API server (a refusal) or no answer at all (it is away).
            let error = match result {
                Ok(_) => None,
                Err(kube::Error::Api(status)) => Some(format!("refused: {}", status.message)),
                Err(other) => Some(format!("{TRANSPORT}{other}")),
            };
            let create = Create { at, took: begin.elapsed(), error };
            creates.lock().unwrap().push(create);
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    let creates = creates.lock().unwrap().clone();
    (creates, replicas)
}

/// The prefix of a create that got no answer from the API server.
const TRANSPORT: &str = "no answer: ";

/// The ReplicaSet the generator scales up (created at zero, with the same Pending pods).
pub fn replica_set(namespace: &str, run: &str) -> String {
    let template = pending_pod(run, "replicaset");
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": format!("load-{run}"), "namespace": namespace},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": template["metadata"]["labels"]},
            "template": {"metadata": {"labels": template["metadata"]["labels"]}, "spec": template["spec"]}
        }
    })
    .to_string()
}

/// What the generator saw during one event.
pub struct Run {
    creates: Vec<Create>,
    /// Pods asked of the ReplicaSet.
    replica_set_pods: u64,
    window: (Duration, Duration),
}

/// Runs the generator for `steady`, then `event`, then `settle` more.
pub fn under_load(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    namespace: &str,
    run: &str,
    (steady, settle): (Duration, Duration),
    event: impl FnOnce() -> Result<()>,
) -> Result<Run> {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let generator =
        runtime.spawn(generate(client.clone(), namespace.to_owned(), run.to_owned(), stop.clone(), started));
    std::thread::sleep(steady);
    let event_start = started.elapsed();
    // On this thread: a process started here (the API server, restarted) is bound to the thread
    // that spawned it (PR_SET_PDEATHSIG), so the event must not run on one that ends.
    let outcome = event();
    let event_end = started.elapsed() + settle;
    std::thread::sleep(settle);
    stop.store(true, Ordering::Relaxed);
    let (creates, replica_set_pods) = runtime.block_on(generator).context("the load generator")?;
    outcome.context("the event")?;
    Ok(Run { creates, replica_set_pods, window: (event_start, event_end) })
}

/// Summarizes one event.
pub fn summarize(event: &str, run: &Run, replica_set_refusals: u64, without_injection: usize) -> Row {
    let inside = |c: &&Create| c.at >= run.window.0 && c.at <= run.window.1;
    let succeeded = |c: &&Create| c.error.is_none();
    let steady = quantiles(run.creates.iter().filter(|c| !inside(c)).filter(succeeded).map(|c| c.took).collect());
    let during = quantiles(run.creates.iter().filter(inside).filter(succeeded).map(|c| c.took).collect());
    let errors: Vec<&String> = run.creates.iter().filter_map(|c| c.error.as_ref()).collect();
    let api_down = errors.iter().filter(|e| e.starts_with(TRANSPORT)).count();
    let mut distinct: Vec<String> = Vec::new();
    for error in errors.iter().filter(|e| !e.starts_with(TRANSPORT)) {
        let short: String = error.chars().take(160).collect();
        if !distinct.contains(&short) && distinct.len() < 3 {
            distinct.push(short);
        }
    }
    let mut in_order: Vec<&Create> = run.creates.iter().collect();
    in_order.sort_by_key(|c| c.at);
    let (mut longest_failing, mut stretch_start) = (Duration::ZERO, None);
    for create in in_order {
        match create.error.as_ref().filter(|e| !e.starts_with(TRANSPORT)) {
            Some(_) => {
                let start = *stretch_start.get_or_insert(create.at);
                longest_failing = longest_failing.max(create.at - start);
            }
            None => stretch_start = None,
        }
    }
    Row {
        longest_failing,
        event: event.to_owned(),
        creates: run.creates.len() + run.replica_set_pods as usize,
        failed: errors.len() - api_down,
        api_down,
        replica_set_refusals,
        without_injection,
        steady,
        during,
        errors: distinct,
    }
}

/// How to tell the pods of a run: the label value, and the ReplicaSet's name.
fn run_name(event: &str) -> String {
    let words: Vec<String> = event
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    words.join("-")
}

/// One event under load, with its row and the stored pods of the run.
pub fn measure(
    ctx: &mut crate::scenarios::Ctx,
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    namespace: &str,
    event: &str,
    action: impl FnOnce(&mut crate::scenarios::Ctx) -> Result<()>,
) -> Result<(Row, Vec<Value>)> {
    let run = run_name(event);
    let api_server_log = ctx.plane.dir.join("kube-apiserver.log");
    let log_before = std::fs::metadata(&api_server_log).map_or(0, |m| m.len());
    ctx.apply(&replica_set(namespace, &run))?;
    let durations = (Duration::from_secs(8), Duration::from_secs(4));
    let outcome = under_load(runtime, client, namespace, &run, durations, || action(&mut *ctx))?;
    // The controller catches up with the last scale (the scale patches may arrive out of order).
    let rs = format!("load-{run}");
    let want = outcome.replica_set_pods.to_string();
    ctx.kubectl(&["-n", namespace, "scale", "replicaset", &rs, &format!("--replicas={want}")])?;
    let caught_up = crate::scenarios::eventually("the ReplicaSet's pods", Duration::from_secs(120), || {
        let have = ctx.kubectl(&["-n", namespace, "get", "replicaset", &rs, "-o", "jsonpath={.status.replicas}"])?;
        Ok((have.trim() == want).then_some(()))
    });
    if let Err(error) = caught_up {
        return Err(error.context(replica_set_diagnosis(ctx, namespace, &run)));
    }
    let events = ctx.json(&[
        "-n",
        namespace,
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={rs},reason=FailedCreate"),
    ])?;
    let refusals: u64 =
        events["items"].as_array().into_iter().flatten().map(|e| e["count"].as_u64().unwrap_or(1)).sum();
    let pods = ctx.json(&["-n", namespace, "get", "pods", "-l", &format!("load-run={run}")])?;
    let pods = pods["items"].as_array().cloned().unwrap_or_default();
    let without =
        pods.iter().filter(|p| !p["metadata"]["annotations"]["sidecar-injector.io/status"].is_string()).count();
    let mut row = summarize(event, &outcome, refusals, without);
    if row.failed + row.replica_set_refusals as usize > 0 {
        row.errors.extend(failed_open_calls(&api_server_log, log_before));
    }
    // Leave nothing for the next event to count or the API server to carry.
    ctx.kubectl(&["-n", namespace, "delete", "replicaset", &rs, "--wait=false"])?;
    ctx.kubectl(&["-n", namespace, "delete", "pods", "-l", &format!("load-run={run}"), "--wait=false"])?;
    Ok((row, pods))
}

/// Why the API server failed open on the webhook since `offset` in its log (a few distinct
/// reasons): what tells a connection closed under a request from a timeout or a refused dial.
fn failed_open_calls(log: &std::path::Path, offset: u64) -> Vec<String> {
    let text = std::fs::read(log).unwrap_or_default();
    let text = String::from_utf8_lossy(text.get(offset as usize..).unwrap_or_default());
    let mut reasons: Vec<String> = Vec::new();
    for line in text.lines().filter(|l| l.contains("failing open")) {
        let reason = format!("API server: {}", line.split_once("failing open").map_or(line, |(_, r)| r).trim());
        if !reasons.contains(&reason) && reasons.len() < 3 {
            reasons.push(reason);
        }
    }
    reasons
}

/// What the ReplicaSet and its controller say, for a ReplicaSet that did not catch up.
fn replica_set_diagnosis(ctx: &crate::scenarios::Ctx, namespace: &str, run: &str) -> String {
    let rs = &format!("load-{run}");
    let object = ctx
        .kubectl(&["-n", namespace, "get", "replicaset", rs, "-o", "jsonpath={.spec.replicas} {.status}"])
        .unwrap_or_else(|e| format!("({e:#})"));
    let pods = ctx
        .kubectl(&[
            "-n",
            namespace,
            "get",
            "pods",
            "-l",
            &format!("load-run={run},load-source=replicaset"),
            "--no-headers",
        ])
        .map(|text| text.lines().count().to_string())
        .unwrap_or_else(|e| format!("({e:#})"));
    let controller = ctx.plane.components.iter().find(|p| p.log.ends_with("kube-controller-manager.log"));
    let lines = controller
        .map(|p| {
            let text = std::fs::read_to_string(&p.log).unwrap_or_default();
            let mine: Vec<&str> = text.lines().filter(|l| l.contains(rs)).collect();
            mine[mine.len().saturating_sub(8)..].join("\n")
        })
        .unwrap_or_default();
    format!(
        "ReplicaSet {rs}: spec.replicas and status {object}; its pods in the namespace: {pods}; the controller manager on it:\n{lines}"
    )
}
