//! The scale run (`make scale`, not part of `make test`): 10,000 pods in 1,000 opted-in namespaces
//! with the drift watch on and 200 templates in service, beside 500 nodes as large as real ones
//! (not KWOK's: their status is posted here, once a minute each, as kubelets do), and the figures
//! the injector must meet: resident memory against the pods it caches (fitted as a line: fixed +
//! per pod) and what the node pool adds to it, time to sync pods and nodes after a start, the drift
//! gauge against a recount from the API, the cost of an admission with that cache against an
//! injector with no pod cache and with the node pool against an injector without one (alternating
//! rounds, one run), what the injector's start costs the API server (LIST calls and bytes, watch
//! event bytes), and a churn phase: pods created and deleted at a steady rate, half through the
//! injector and half through a null webhook with the same configuration, with the injector's CPU
//! and RSS sampled through it.

// The harness calls libc (signals, rlimits, mounts, an allocator) where `unsafe` is the only way.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sidecar_injector::engine::ClusterFacts;
use sidecar_injector::engine::injection::nodes::{NodeFacts, NodeObject, NodePool};
use tokio::sync::Semaphore;

// `nullwebhook` reaches these two through its parent (`super::controlplane`, `super::fixtures`),
// as it does in `benches/server.rs`.
use crate::controlplane::{self, INJECTOR_HTTPS_PORT, Injector, curl};
#[path = "../common/fixtures.rs"]
mod fixtures;
#[allow(dead_code)]
#[path = "../common/nullwebhook.rs"]
mod nullwebhook;
use crate::scenarios::{Ctx, edit_tag_and_wait, pod, webhook_client};

/// The size of the run: `make scale PODS=… NAMESPACES=… NODES=… CHURN_MINUTES=… CHURN_RATE=…`
/// (defaults: the 10,000-pod run whose figures docs/performance.md has carried since the first
/// scale run, 500 nodes and 2 minutes of churn at 100 pods/s: about 4 minutes in all).
struct Size {
    pods: usize,
    namespaces: usize,
    nodes: usize,
    churn_minutes: f64,
    /// Pods created per second in the churn phase (and as many deleted).
    churn_rate: f64,
}

impl Size {
    fn read() -> Result<Size> {
        fn read<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
            match std::env::var(name) {
                Ok(text) if !text.is_empty() => {
                    text.parse().map_err(|_| anyhow::anyhow!("{name}={text} is not a number"))
                }
                _ => Ok(default),
            }
        }
        let size = Size {
            pods: read("SIDECAR_INJECTOR_SCALE_PODS", 10_000)?,
            namespaces: read("SIDECAR_INJECTOR_SCALE_NAMESPACES", 1_000)?,
            nodes: read("SIDECAR_INJECTOR_SCALE_NODES", 500)?,
            churn_minutes: read("SIDECAR_INJECTOR_SCALE_CHURN_MINUTES", 2.0)?,
            churn_rate: read("SIDECAR_INJECTOR_SCALE_CHURN_RATE", 100.0)?,
        };
        let (pods, namespaces) = (size.pods, size.namespaces);
        ensure!(namespaces > 0 && pods >= namespaces, "PODS ({pods}) must be at least NAMESPACES ({namespaces}) > 0");
        ensure!(size.churn_minutes >= 0.0 && size.churn_rate > 0.0, "CHURN_MINUTES ≥ 0 and CHURN_RATE > 0");
        Ok(size)
    }
}

/// The scale run's time budget: 30 minutes at the default size, 12 ms more per pod beyond 10,000,
/// 60 ms per node beyond 500 and the churn phase's minutes beyond 2.
pub fn time_budget() -> Duration {
    let Ok(size) = Size::read() else { return Duration::from_secs(1800) };
    let beyond = |value: f64, default: f64| (value - default).max(0.0);
    let extra = 0.012 * beyond(size.pods as f64, 10_000.0)
        + 0.06 * beyond(size.nodes as f64, 500.0)
        + 60.0 * beyond(size.churn_minutes, 2.0);
    Duration::from_secs(1800) + Duration::from_secs_f64(extra)
}

/// Pods created through the webhook; beyond these, pods are created already injected (the
/// injection a dry run gave) in namespaces not yet opted in, so that the API server does not call
/// the webhook: 140,000 injections one by one would take half an hour on 2 cores and measure
/// nothing the first 10,000 do not.
const WEBHOOK_PODS: usize = 10_000;
/// Templates in service (the 4 shipped ones plus look-alikes whose podSelector no scale pod
/// matches, so each is considered, and refused, for every pod and every drift count).
const TEMPLATES: usize = 200;
/// RSS goal once the pod cache has synced, whatever the size.
const GOAL_RSS_MIB: f64 = 96.0;
const GOAL_READY: Duration = Duration::from_secs(2);
const GOAL_SYNCED: Duration = Duration::from_secs(30);
const GOAL_RATIO: f64 = 1.1;
/// The churn phase's RSS slope goal, asserted when the phase lasts at least
/// [`SLOPE_ASSERTED_FROM_MINUTES`] (a shorter one is too noisy: printed only).
const GOAL_SLOPE_MIB_PER_10_MIN: f64 = 1.0;
const SLOPE_ASSERTED_FROM_MINUTES: f64 = 10.0;

/// The churn's create latency against the null webhook's: at the size the goal is set for (the
/// largest cluster Kubernetes supports) its ratio is held to [`GOAL_RATIO`]; below it, the
/// difference of the medians to [`GOAL_ADDED_MEDIAN_MS`].
const LATENCY_RATIO_FROM_PODS: usize = 150_000;
const GOAL_ADDED_MEDIAN_MS: f64 = 3.0;
/// Pods the scale run creates are never scheduled (no scheduler has this name): they only have to
/// exist for the watch, and the simulated nodes would not hold 150,000 of them.
const NO_SCHEDULER: &str = "sidecar-injector-e2e-none";

/// The label of the nodes the run creates (beside the e2e plane's few KWOK nodes, which stay).
const NODE_LABEL: &str = "scale.sidecar-injector.io/node";
const ZONES: [&str; 4] = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d"];
/// Kubelet versions, mixed as in an upgrade in progress and a provider's build; all of them
/// 1.29 or newer, so native sidecars are chosen for every pod whatever nodes decide. About 2% of
/// the nodes report no readable version (`""`, `unknown`) besides.
const KUBELETS: [&str; 4] = ["v1.37.1", "v1.36.4", "v1.35.2", "v1.34.3-eks-abcdef"];
/// How often each node posts a status update. A kubelet posts one 10 s after something changed,
/// and at least every 5 minutes; in a 5,000-node cluster churning 100 pods/s every node gets a pod
/// about every 50 s, which changes its status: about one update a minute per node, spread evenly
/// (NODES/60 a second).
const NODE_STATUS_PERIOD: Duration = Duration::from_secs(60);
const NODE_CREATES_IN_FLIGHT: usize = 32;
const NODE_UPDATES_IN_FLIGHT: usize = 16;

/// Namespaces of each side of the churn phase: the injector's (`scale-*`, spread over the run's)
/// and the null webhook's (`churn-null-*`, opted in and labelled [`NULL_LABEL`]).
const CHURN_NAMESPACES: usize = 10;
const NULL_LABEL: &str = "scale.sidecar-injector.io/churn";
/// How long a churn pod lives: each is deleted this long after its creation, so deletions run at
/// the creation rate.
const CHURN_POD_LIFETIME: Duration = Duration::from_secs(30);
const CHURN_CREATES_IN_FLIGHT: usize = 64;
const CHURN_SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// The goals, each printed where it is measured: a missed one fails the run at its end, once
/// every figure has been printed.
#[derive(Default)]
struct Goals {
    missed: Vec<String>,
}

impl Goals {
    fn check(&mut self, met: bool, what: impl FnOnce() -> String) {
        if !met {
            let what = what();
            println!("      MISSED: {what}");
            self.missed.push(what);
        }
    }

    fn verdict(self) -> Result<()> {
        ensure!(self.missed.is_empty(), "{} goal(s) missed: {}", self.missed.len(), self.missed.join("; "));
        Ok(())
    }
}

/// A memory figure of the injector's process from `/proc/PID/status` (`VmRSS`, `VmHWM`), in KiB.
fn rss_kib(injector: &Injector, field: &str) -> Result<f64> {
    let pid = injector.process.pid().context("the injector is not running")?;
    proc_rss_kib(pid, field)
}

fn proc_rss_kib(pid: u32, field: &str) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with(&format!("{field}:"))).with_context(|| format!("no {field}"))?;
    Ok(line.split_whitespace().nth(1).with_context(|| format!("{field} value"))?.parse()?)
}

/// The CPU time the process has used (user + system), in clock ticks.
fn cpu_ticks(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // After the command name (in parentheses, which may hold spaces): state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')').context("/proc/PID/stat")?.1.split_whitespace().collect();
    Ok(fields.get(11).context("utime")?.parse::<f64>()? + fields.get(12).context("stime")?.parse::<f64>()?)
}

fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        // From +0.0: `f64`'s `sum` of no samples is -0.0, printed "-0".
        .fold(0.0, |total, sample| total + sample)
}

async fn wait_for_pods_watched(injector: &Injector, count: usize, limit: Duration) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if gauge(&injector.metrics(), "sidecar_injector_pods_watched") as usize >= count {
            return Ok(start.elapsed());
        }
        ensure!(start.elapsed() < limit, "the injector's pod cache did not reach {count} pods within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The cluster's nodes as the injector should know them: all of them, and those whose kubelet
/// version can be read (the ones its pool keeps).
#[derive(Clone, Copy)]
struct NodeCount {
    all: usize,
    readable: usize,
}

/// Waits until `sidecar_injector_nodes_watched` counts every node (set once the pool built from
/// them is in service).
async fn wait_for_nodes_known(injector: &Injector, nodes: NodeCount, limit: Duration) -> Result<Duration> {
    let start = Instant::now();
    loop {
        let known = gauge(&injector.metrics(), "sidecar_injector_nodes_watched") as usize;
        if known == nodes.all {
            return Ok(start.elapsed());
        }
        ensure!(start.elapsed() < limit, "the injector knew {known} of the {} nodes after {limit:?}", nodes.all);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the API server has served so far (all clients), from its metrics.
#[derive(Clone, Copy, Default)]
struct Traffic {
    lists: f64,
    /// LIST response bytes of pods, of nodes, of everything else.
    list_bytes: [f64; 3],
    pod_events: f64,
    node_events: f64,
    /// Node writes (PATCH, PUT, APPLY; status included).
    node_writes: f64,
    /// Node watches open now (a gauge: every one gets every node event).
    node_watchers: f64,
}

impl Traffic {
    fn since(&self, before: &Traffic) -> Traffic {
        let list_bytes = [0, 1, 2].map(|i| self.list_bytes[i] - before.list_bytes[i]);
        Traffic {
            lists: self.lists - before.lists,
            list_bytes,
            pod_events: self.pod_events - before.pod_events,
            node_events: self.node_events - before.node_events,
            node_writes: self.node_writes - before.node_writes,
            node_watchers: self.node_watchers,
        }
    }
}

fn apiserver_metrics(ctx: &Ctx) -> String {
    let token = "e2e-admin-token";
    curl(&format!("{}/metrics", ctx.plane.url), Some(&ctx.plane.dir.join("ca.crt")), Some(token)).unwrap_or_default()
}

/// The sum of the samples in `text` (Prometheus' text format) whose line starts with `prefix`
/// and passes `filter`.
fn metric_sum(text: &str, prefix: &str, filter: &dyn Fn(&str) -> bool) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix) && filter(l))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        // From +0.0: `f64`'s `sum` of no samples is -0.0, printed "-0".
        .fold(0.0, |total, sample| total + sample)
}

/// The API server's LIST calls and bytes, watch event bytes and node writes so far.
fn apiserver_traffic(ctx: &Ctx) -> Traffic {
    let text = apiserver_metrics(ctx);
    let sum = |prefix: &str, filter: &dyn Fn(&str) -> bool| metric_sum(&text, prefix, filter);
    let list = |l: &str| l.contains("verb=\"LIST\"");
    let (pods, nodes) = (|l: &str| l.contains("resource=\"pods\""), |l: &str| l.contains("resource=\"nodes\""));
    let writes = |l: &str| ["PATCH", "PUT", "APPLY"].iter().any(|v| l.contains(&format!("verb=\"{v}\"")));
    Traffic {
        lists: sum("apiserver_request_total{", &list),
        list_bytes: [
            sum("apiserver_response_sizes_sum{", &|l| list(l) && pods(l)),
            sum("apiserver_response_sizes_sum{", &|l| list(l) && nodes(l)),
            sum("apiserver_response_sizes_sum{", &|l| list(l) && !pods(l) && !nodes(l)),
        ],
        pod_events: sum("apiserver_watch_events_sizes_sum{", &pods),
        node_events: sum("apiserver_watch_events_sizes_sum{", &nodes),
        node_writes: sum("apiserver_request_total{", &|l| nodes(l) && writes(l)),
        node_watchers: sum("apiserver_longrunning_requests{", &|l| nodes(l) && l.contains("verb=\"WATCH\"")),
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Median, mean and 99th percentile.
fn spread(values: &mut [f64]) -> (f64, f64, f64) {
    if values.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    values.sort_by(f64::total_cmp);
    let at = |p: f64| values[((values.len() as f64 * p) as usize).min(values.len() - 1)];
    (at(0.5), values.iter().sum::<f64>() / values.len() as f64, at(0.99))
}

/// One pod of the run: `app-{index}`, never scheduled.
fn scale_pod(name: &str) -> Value {
    let mut p = pod(name, json!({"app": "scale"}), json!({}));
    p["spec"]["automountServiceAccountToken"] = json!(false);
    p["spec"]["schedulerName"] = json!(NO_SCHEDULER);
    p
}

/// Creates `items` (namespace, pod) with `concurrency` creates in flight.
async fn create_pods(ctx: &Ctx, items: Vec<(String, Value)>, concurrency: usize) -> Result<()> {
    let client = ctx.client.clone();
    let results: Vec<Result<()>> = futures::stream::iter(items)
        .map(|(namespace, value)| {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            async move {
                let p: Pod = serde_json::from_value(value)?;
                pods.create(&PostParams::default(), &p).await.with_context(|| format!("a pod in {namespace}"))?;
                Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Every pod's metadata, in pages (one response of 150,000 pods would be a quarter of a GiB).
async fn all_pod_metadata(ctx: &Ctx) -> Result<Vec<kube::api::PartialObjectMeta<Pod>>> {
    let mut all = Vec::new();
    pod_metadata_pages(ctx, 5_000, |page| all.extend(page)).await?;
    Ok(all)
}

/// Every pod's metadata in pages of `page`, as the injector's paged start asks for them (no
/// resourceVersion, so the first page is a consistent read, then the continue tokens), handed to
/// `each` page by page. Returns the number of pages.
async fn pod_metadata_pages(
    ctx: &Ctx,
    page: u32,
    mut each: impl FnMut(Vec<kube::api::PartialObjectMeta<Pod>>),
) -> Result<usize> {
    let api = Api::<Pod>::all(ctx.client.clone());
    let mut params = ListParams::default().limit(page);
    let mut pages = 0;
    loop {
        let list = api.list_metadata(&params).await?;
        pages += 1;
        each(list.items);
        match list.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => params = params.continue_token(&next),
            None => return Ok(pages),
        }
    }
}

/// Every object of `api` matching `params`, in pages of 500.
async fn list_all<K>(api: &Api<K>, params: ListParams) -> Result<Vec<K>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut all = Vec::new();
    let mut params = params.limit(500);
    loop {
        let page = api.list(&params).await?;
        all.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => params = params.continue_token(&next),
            None => return Ok(all),
        }
    }
}

/// The cluster's nodes (KWOK's and the run's), and those the injector's pool keeps, read as it
/// reads them.
async fn node_count(ctx: &Ctx) -> Result<NodeCount> {
    let nodes = list_all(&Api::<NodeObject>::all(ctx.client.clone()), ListParams::default()).await?;
    Ok(NodeCount { all: nodes.len(), readable: NodePool::new(nodes.iter().map(NodeFacts::of)).len() })
}

/// The ConfigMap of look-alike templates that brings the templates in service to [`TEMPLATES`].
fn look_alike_templates(shipped: usize) -> Value {
    let data: serde_json::Map<String, Value> = (0..TEMPLATES.saturating_sub(shipped))
        .map(|i| {
            let template = format!(
                "default: true\npodSelector: {{matchLabels: {{scale-template: t{i}}}}}\ninject:\n  labels: {{look-alike-{i}: \"1\"}}\n"
            );
            (format!("look-alike-{i:03}.yaml"), json!(template))
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "scale-look-alikes", "namespace": "sidecar-injector",
            "labels": {"sidecar-injector.io/templates": "true"}},
        "data": data})
}

/// Brings the templates in service to [`TEMPLATES`]: the shipped ones and look-alikes.
async fn templates_in_service(ctx: &Ctx, injector: &Injector) -> Result<()> {
    let shipped = gauge(&injector.metrics(), "sidecar_injector_templates_loaded") as usize;
    let look_alikes = look_alike_templates(shipped);
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["apply", "-f", "-"], Some(&look_alikes.to_string()))?;
    let start = Instant::now();
    while (gauge(&injector.metrics(), "sidecar_injector_templates_loaded") as usize) < TEMPLATES {
        ensure!(start.elapsed() < Duration::from_secs(120), "{TEMPLATES} templates not in service within 2 min");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// `sidecar-injector inject` with the templates the cluster serves and the cluster's version, as
/// a user would pre-inject manifests: its pods are what the webhook would have made of them (the
/// pods of the first namespace, opted in from the start, go through the webhook all the same,
/// which refuses a status annotation that does not match a re-rendering). The nodes decide as
/// the API server's version does: every readable kubelet of the run is 1.29 or newer.
struct OfflineInjector {
    binary: std::path::PathBuf,
    templates: std::path::PathBuf,
    version: String,
    input: std::path::PathBuf,
}

impl OfflineInjector {
    async fn new(ctx: &Ctx) -> Result<OfflineInjector> {
        let templates = ctx.plane.dir.join("scale-templates");
        std::fs::create_dir_all(&templates)?;
        let configmaps =
            Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(ctx.client.clone(), "sidecar-injector")
                .list(&ListParams::default().labels("sidecar-injector.io/templates=true"))
                .await?;
        for configmap in configmaps {
            for (key, text) in configmap.data.unwrap_or_default() {
                std::fs::write(templates.join(key), text)?;
            }
        }
        let info = ctx.client.apiserver_version().await?;
        let version = format!("{}.{}", info.major, info.minor.trim_end_matches('+'));
        let input = ctx.plane.dir.join("scale-pods.json");
        Ok(OfflineInjector { binary: ctx.binary.clone(), templates, version, input })
    }

    /// The pods, injected.
    fn inject(&self, pods: &[Value]) -> Result<Vec<Value>> {
        std::fs::write(&self.input, json!({"apiVersion": "v1", "kind": "List", "items": pods}).to_string())?;
        let output = std::process::Command::new(&self.binary)
            .args([
                "inject",
                "--namespace-labels",
                "sidecar-injector.io/inject=enabled",
                "--kube-version",
                &self.version,
            ])
            .arg("--templates")
            .arg(&self.templates)
            .arg("-f")
            .arg(&self.input)
            .output()?;
        ensure!(output.status.success(), "sidecar-injector inject: {}", String::from_utf8_lossy(&output.stderr));
        let text = String::from_utf8(output.stdout)?;
        let documents = sidecar_injector::engine::manifest::read(&text)?;
        let injected: Vec<Value> =
            documents.into_iter().flat_map(|d| d["items"].as_array().cloned().unwrap_or_default()).collect();
        ensure!(injected.len() == pods.len(), "inject gave {} pods for {}", injected.len(), pods.len());
        ensure!(
            injected.iter().all(|p| p["metadata"]["annotations"]["sidecar-injector.io/status"].is_string()),
            "inject left a pod uninjected"
        );
        Ok(injected)
    }
}

/// The scale run.
pub async fn scale(ctx: &mut Ctx) -> Result<()> {
    let size = Size::read()?;
    let mut goals = Goals::default();
    let webhook_pods = size.pods.min(WEBHOOK_PODS);
    println!(
        "      size: {} pods in {} namespaces ({webhook_pods} through the webhook), {TEMPLATES} templates, {} nodes; churn: {} min at {} pods/s",
        size.pods, size.namespaces, size.nodes, size.churn_minutes, size.churn_rate
    );
    ctx.stop_injector();
    let injector =
        Injector::start(&ctx.plane, &ctx.binary, &[("SIDECAR_INJECTOR__CLUSTER__DRIFT_INTERVAL_SECONDS", "1")])?;
    wait_for_pods_watched(&injector, 0, Duration::from_secs(10)).await?;
    templates_in_service(ctx, &injector).await?;
    let baseline_pods = gauge(&injector.metrics(), "sidecar_injector_pods_watched") as usize;

    // Namespaces, nodes (their status updates run from here to the end of the churn phase), pods.
    let names = create_namespaces(ctx, &injector, size.namespaces).await?;
    let heartbeats = create_nodes(ctx, &injector, size.nodes).await?;
    let node_count = node_count(ctx).await?;
    create_scale_pods(ctx, &injector, &names, size.pods, baseline_pods, &mut goals).await?;

    // Start afresh, with paged lists and then with streaming lists.
    drop(injector);
    let everything = baseline_pods + size.pods;
    let fresh = restarts(ctx, everything, node_count, &mut goals).await?;

    // The drift gauge against a recount from the API, after an edit makes every injected pod stale.
    edit_tag_and_wait(ctx, &names[0], "3.2.99", Duration::from_secs(10)).await?;
    let current = ctx.dry_run_pod(&names[0], pod("probe", json!({}), json!({}))).await?;
    let current_hash = crate::scenarios::status(&current)
        .and_then(|s| s.templates.into_iter().find(|t| t.name == "log-shipper"))
        .map(|t| t.hash)
        .context("the probe was not injected")?;
    drift_agrees(ctx, &fresh, &current_hash, "after an edit made every pod stale").await?;

    admission_with_pod_cache(ctx, &names[1 % names.len()], size.pods, &mut goals).await?;
    if size.nodes > 0 {
        admission_with_nodes(ctx, &names[1 % names.len()], size.nodes, everything, &mut goals).await?;
        pool_cost(ctx).await?;
    }
    if size.churn_minutes > 0.0 {
        churn(ctx, &fresh, &names, &size, everything, &mut goals).await?;
        drift_agrees(ctx, &fresh, &current_hash, "after the churn, its pods all deleted").await?;
    }
    if let Some(heartbeats) = heartbeats {
        heartbeats.finish(size.nodes).await?;
        print_node_watch_restarts(ctx);
    }
    ctx.injector = Some(fresh);
    goals.verdict()
}

/// What the API server did to the node watchers over the run, by its own counters (it does not
/// say which clients): watchers closed for not keeping up, and the streaming lists of every Node
/// that watchers (re)started with.
fn print_node_watch_restarts(ctx: &Ctx) {
    let text = apiserver_metrics(ctx);
    let nodes = |prefix: &str| metric_sum(&text, prefix, &|l| l.contains("resource=\"nodes\""));
    println!(
        "      node watchers the API server closed for not keeping up: {:.0}; streaming lists of the nodes: {:.0} ({:.0} Nodes sent as their initial events)",
        nodes("apiserver_terminated_watchers_total{"),
        nodes("apiserver_watch_list_duration_seconds_count{"),
        nodes("apiserver_init_events_total{")
    );
}

/// A namespace with its default ServiceAccount made here rather than waiting for the controller
/// manager's 20 requests a second.
async fn create_namespace(ctx: &Ctx, name: &str, labels: Value) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
    Api::<Namespace>::all(ctx.client.clone()).create(&PostParams::default(), &ns).await?;
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}}))?;
    match Api::<ServiceAccount>::namespaced(ctx.client.clone(), name).create(&PostParams::default(), &account).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// The run's namespaces, not opted in yet (but the first); prints the namespace cache's share of
/// the injector's RSS.
async fn create_namespaces(ctx: &Ctx, injector: &Injector, count: usize) -> Result<Vec<String>> {
    let rss_before = rss_kib(injector, "VmRSS")?;
    let names: Vec<String> = (0..count).map(|i| format!("scale-{i:05}")).collect();
    let start = Instant::now();
    let results: Vec<Result<()>> = futures::stream::iter(names.iter().enumerate())
        .map(|(i, name)| async move {
            let labels = if i == 0 { json!({"sidecar-injector.io/inject": "enabled"}) } else { json!({}) };
            create_namespace(ctx, name, labels).await
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect::<Result<()>>()?;
    let ns_start = Instant::now();
    while (gauge(&injector.metrics(), "sidecar_injector_namespaces_watched") as usize) < count {
        ensure!(ns_start.elapsed() < Duration::from_secs(60), "the namespace cache did not reach {count}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let share = rss_kib(injector, "VmRSS")? - rss_before;
    println!(
        "      {count} namespaces created in {:.1} s; the namespace cache's share of the RSS: {:.1} MiB ({:.2} KiB per namespace)",
        start.elapsed().as_secs_f64(),
        share / 1024.0,
        share / count as f64
    );
    Ok(names)
}

/// Creates the run's pods in batches, the RSS measured after each; prints the fit and checks the
/// RSS at full size.
async fn create_scale_pods(
    ctx: &Ctx,
    injector: &Injector,
    names: &[String],
    total: usize,
    baseline_pods: usize,
    goals: &mut Goals,
) -> Result<()> {
    let namespace_count = names.len();
    let webhook_pods = total.min(WEBHOOK_PODS);
    // Pod k: namespace k mod N, name app-(k div N); the last `webhook_pods` through the webhook,
    // the others injected by `sidecar-injector inject` with the cluster's templates.
    let pod_at = |k: usize| {
        let mut p = scale_pod(&format!("app-{}", k / namespace_count));
        p["metadata"]["namespace"] = json!(names[k % namespace_count]);
        p
    };
    let offline = OfflineInjector::new(ctx).await?;
    let bulk = total - webhook_pods;
    let mut bounds: Vec<(usize, usize, bool)> = Vec::new();
    let bulk_batches = bulk.div_ceil(15_000);
    for b in 0..bulk_batches {
        bounds.push((b * bulk / bulk_batches, (b + 1) * bulk / bulk_batches, false));
    }
    for b in 0..5 {
        bounds.push((bulk + b * webhook_pods / 5, bulk + (b + 1) * webhook_pods / 5, true));
    }

    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let mut samples = vec![(baseline_pods as f64, rss_kib(injector, "VmRSS")?)];
    let (mut bulk_time, mut webhook_time) = (Duration::ZERO, Duration::ZERO);
    let mut opted_in = false;
    for (from, to, through_webhook) in bounds {
        if through_webhook && !opted_in {
            // Every namespace opts in; from here on the API server calls the webhook.
            let start = Instant::now();
            let results: Vec<Result<()>> = futures::stream::iter(names.iter().skip(1))
                .map(|name| {
                    let namespaces = namespaces.clone();
                    async move {
                        let patch = json!({"metadata": {"labels": {"sidecar-injector.io/inject": "enabled"}}});
                        namespaces.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
                        Ok(())
                    }
                })
                .buffer_unordered(32)
                .collect()
                .await;
            results.into_iter().collect::<Result<()>>()?;
            println!("      {} namespaces opted in in {:.1} s", namespace_count - 1, start.elapsed().as_secs_f64());
            opted_in = true;
        }
        let started = Instant::now();
        let pods: Vec<Value> = (from..to).map(pod_at).collect();
        let pods = if through_webhook { pods } else { offline.inject(&pods)? };
        let items: Vec<(String, Value)> =
            pods.into_iter().map(|p| (p["metadata"]["namespace"].as_str().unwrap_or_default().to_owned(), p)).collect();
        create_pods(ctx, items, if through_webhook { 16 } else { 64 }).await?;
        *(if through_webhook { &mut webhook_time } else { &mut bulk_time }) += started.elapsed();
        let count = baseline_pods + to;
        wait_for_pods_watched(injector, count, Duration::from_secs(120)).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        samples.push((count as f64, rss_kib(injector, "VmRSS")?));
    }
    if bulk > 0 {
        println!(
            "      {bulk} pods created already injected in {:.1} s ({:.0} pods/s)",
            bulk_time.as_secs_f64(),
            bulk as f64 / bulk_time.as_secs_f64()
        );
    }
    println!(
        "      {webhook_pods} pods created through the webhook in {:.1} s ({:.0} pods/s)",
        webhook_time.as_secs_f64(),
        webhook_pods as f64 / webhook_time.as_secs_f64()
    );
    rss_fit(&samples, total, goals);
    Ok(())
}

/// Least squares over the (pods, RSS) samples: RSS = fixed + per_pod * pods; checks the last.
fn rss_fit(samples: &[(f64, f64)], total: usize, goals: &mut Goals) {
    let (fixed, per_pod) = least_squares(samples);
    let worst = samples.iter().map(|(x, y)| (y - (fixed + per_pod * x)).abs()).fold(0.0, f64::max);
    for (pods, rss) in samples {
        println!("      RSS with {pods:>7} pods cached: {:.1} MiB", rss / 1024.0);
    }
    println!(
        "      fit: RSS = {:.1} MiB + {:.3} KiB per pod (largest deviation from the line {:.1} MiB)",
        fixed / 1024.0,
        per_pod,
        worst / 1024.0
    );
    let last = samples.last().map(|s| s.1 / 1024.0).unwrap_or_default();
    println!("      at {total} pods: {last:.1} MiB (goal ≤ {GOAL_RSS_MIB} MiB)");
    goals.check(last <= GOAL_RSS_MIB, || {
        format!("RSS {last:.1} MiB at {total} pods is over the goal of {GOAL_RSS_MIB} MiB")
    });
}

/// (intercept, slope) of the least-squares line through the points.
fn least_squares(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (sxx, sxy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x * x, b + x * y));
    let slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    ((sy - slope * sx) / n, slope)
}

/// The nodes' names.
fn node_name(i: usize) -> String {
    format!("scale-node-{i:05}")
}

/// A hash of `x` (splitmix64): the nodes' identifiers and digests, the same in every run.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `len` hex digits derived from `seed`.
fn hex(seed: u64, len: usize) -> String {
    let mut text = String::new();
    let mut k = 0;
    while text.len() < len {
        text += &format!("{:016x}", mix(seed.wrapping_mul(0x1000_0000_01B3).wrapping_add(k)));
        k += 1;
    }
    text.truncate(len);
    text
}

fn uuid(seed: u64) -> String {
    let h = hex(seed, 32);
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// Now, as the API server writes times (RFC 3339, whole seconds).
fn timestamp() -> String {
    jiff::Timestamp::now().round(jiff::Unit::Second).map(|t| t.to_string()).unwrap_or_default()
}

/// A node's five conditions, all well, with this heartbeat (and transition time, on creation).
fn node_conditions(heartbeat: &str, transition: Option<&str>) -> Value {
    let conditions = [
        ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ("NetworkUnavailable", "False", "RouteCreated", "RouteController created a route"),
    ];
    let conditions: Vec<Value> = conditions
        .iter()
        .map(|(kind, status, reason, message)| {
            let mut condition = json!({"type": kind, "status": status, "lastHeartbeatTime": heartbeat,
                "reason": reason, "message": message});
            if let Some(transition) = transition {
                condition["lastTransitionTime"] = json!(transition);
            }
            condition
        })
        .collect();
    Value::Array(conditions)
}

/// The volumes in use on node `i` at its `round`th status update (one changes at every update).
fn volumes_in_use(i: usize, round: usize) -> Value {
    let volume = |k: usize| format!("kubernetes.io/csi/ebs.csi.aws.com^vol-0{}", hex((i * 100_000 + k) as u64, 16));
    json!([volume(round), volume(round + 1)])
}

/// The images on node `i`: the cluster's own and 34–50 of an image catalog shared between nodes,
/// each under its digest and its tag, as kubelets report them.
fn node_images(i: usize) -> Value {
    let ecr = "602401143452.dkr.ecr.us-east-1.amazonaws.com";
    let system = [
        (format!("{ecr}/eks/pause"), "3.10".to_owned()),
        (format!("{ecr}/eks/kube-proxy"), "v1.37.1-minimal-eksbuild.2".into()),
        (format!("{ecr}/eks/coredns"), "v1.12.4-eksbuild.1".into()),
        (format!("{ecr}/amazon-k8s-cni"), "v1.20.4-eksbuild.1".into()),
        (format!("{ecr}/eks/aws-ebs-csi-driver"), "v1.48.0".into()),
        ("quay.io/prometheus/node-exporter".into(), "v1.9.1".into()),
    ];
    let apps = (0..34 + i % 17).map(|j| {
        let c = (i * 7 + j * 13) % 400;
        let repo = format!("123456789012.dkr.ecr.us-east-1.amazonaws.com/team-{:02}/service-{c:03}", c % 40);
        (repo, format!("v{}.{}.{}", c % 7, c % 13, c % 5))
    });
    let images: Vec<Value> = system
        .into_iter()
        .chain(apps)
        .map(|(repo, tag)| {
            let seed = format!("{repo}:{tag}")
                .bytes()
                .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
            json!({"names": [format!("{repo}@sha256:{}", hex(seed, 64)), format!("{repo}:{tag}")],
                "sizeBytes": 5_000_000 + mix(seed) % 900_000_000})
        })
        .collect();
    Value::Array(images)
}

/// Node `i` as a kubelet registers it on a cloud provider: about 20 labels, 5 annotations, its
/// provider ID and pod CIDR, and a status of 10–20 KiB (capacity, conditions, addresses, node
/// info, 40–56 images). Not managed by KWOK (no `kwok.x-k8s.io/node` annotation).
fn scale_node(i: usize, now: &str) -> Value {
    let name = node_name(i);
    let zone = ZONES[i % ZONES.len()];
    let arch = if i % 5 == 4 { "arm64" } else { "amd64" };
    let types: &[&str] = if arch == "arm64" {
        &["m7g.2xlarge", "c7g.4xlarge"]
    } else {
        &["m6i.2xlarge", "m6i.4xlarge", "c6i.4xlarge", "r6i.2xlarge"]
    };
    let instance_type = types[(i / ZONES.len()) % types.len()];
    let pool = format!("pool-{}", i % 10);
    let capacity_type = if i.is_multiple_of(3) { "SPOT" } else { "ON_DEMAND" };
    let kubelet = match i % 100 {
        7 => "",
        57 => "unknown",
        _ => KUBELETS[(i / 3) % KUBELETS.len()],
    };
    let runtime = if i.is_multiple_of(2) { "containerd://2.1.4" } else { "containerd://2.2.1" };
    let instance = format!("i-0{}", hex(i as u64, 16));
    let ip = format!("10.{}.{}.{}", 16 + (i >> 16) % 16, (i >> 8) % 256, i % 256);
    let dns = format!("ip-{}.ec2.internal", ip.replace('.', "-"));
    let labels = json!({
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": arch,
        "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": arch,
        "node.kubernetes.io/instance-type": instance_type, "beta.kubernetes.io/instance-type": instance_type,
        "topology.kubernetes.io/zone": zone, "failure-domain.beta.kubernetes.io/zone": zone,
        "topology.kubernetes.io/region": "us-east-1", "failure-domain.beta.kubernetes.io/region": "us-east-1",
        "topology.ebs.csi.aws.com/zone": zone, "topology.k8s.aws/zone-id": format!("use1-az{}", i % 4 + 1),
        "eks.amazonaws.com/nodegroup": pool, "eks.amazonaws.com/capacityType": capacity_type,
        "eks.amazonaws.com/nodegroup-image": format!("ami-0{}", hex(i as u64 % 10, 16)),
        "eks.amazonaws.com/sourceLaunchTemplateId": format!("lt-0{}", hex(i as u64 % 10 + 100, 16)),
        "eks.amazonaws.com/sourceLaunchTemplateVersion": "3", "k8s.io/cloud-provider-aws": hex(1, 32),
        NODE_LABEL: "true",
    });
    let annotations = json!({
        "node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true",
        "alpha.kubernetes.io/provided-node-ip": ip,
        "csi.volume.kubernetes.io/nodeid": format!("{{\"ebs.csi.aws.com\":\"{instance}\"}}"),
        "node.kubernetes.io/instance-id": instance,
    });
    let resources = json!({"cpu": "8", "memory": "32386544Ki", "pods": "110", "ephemeral-storage": "104845292Ki",
        "hugepages-1Gi": "0", "hugepages-2Mi": "0", "attachable-volumes-aws-ebs": "25"});
    let cidr = format!("10.{}.{}.0/24", 128 + (i >> 8) % 64, i % 256);
    json!({"apiVersion": "v1", "kind": "Node",
    "metadata": {"name": name, "labels": labels, "annotations": annotations},
    "spec": {"podCIDR": cidr, "podCIDRs": [cidr], "providerID": format!("aws:///{zone}/{instance}")},
    "status": {
        "capacity": resources, "allocatable": resources,
        "conditions": node_conditions(now, Some(now)),
        "addresses": [{"type": "InternalIP", "address": ip}, {"type": "InternalDNS", "address": dns},
            {"type": "Hostname", "address": dns}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": hex(i as u64 + 1_000_000, 32), "systemUUID": uuid(i as u64 + 2_000_000),
            "bootID": uuid(i as u64 + 3_000_000), "kernelVersion": format!("6.12.{}-amzn2023.{arch}", 40 + i % 3),
            "osImage": "Amazon Linux 2023.8.20251020", "containerRuntimeVersion": runtime,
            "kubeletVersion": kubelet, "kubeProxyVersion": kubelet, "operatingSystem": "linux",
            "architecture": arch},
        "images": node_images(i),
        "volumesInUse": volumes_in_use(i, 0),
    }})
}

/// Creates the run's nodes, checks what the API server stored and that the injector has them,
/// prints their size, how long it took and the node pool's share of the injector's RSS; starts
/// their status updates (`None` without nodes).
async fn create_nodes(ctx: &Ctx, injector: &Injector, count: usize) -> Result<Option<Heartbeats>> {
    if count == 0 {
        return Ok(None);
    }
    let rss_before = rss_kib(injector, "VmRSS")?;
    let api: Api<Node> = Api::all(ctx.client.clone());
    let now = timestamp();
    let started = Instant::now();
    let results: Vec<Result<bool>> = futures::stream::iter(0..count)
        .map(|i| {
            let (api, value) = (api.clone(), scale_node(i, &now));
            async move {
                let node: Node = serde_json::from_value(value.clone())?;
                let created = api.create(&PostParams::default(), &node).await.with_context(|| node_name(i))?;
                if created.status.and_then(|s| s.images).is_some_and(|images| !images.is_empty()) {
                    return Ok(true);
                }
                // The API server dropped the status on create: post it as a kubelet does.
                let status = json!({"status": value["status"]});
                api.patch_status(&node_name(i), &PatchParams::default(), &Patch::Merge(&status)).await?;
                Ok(false)
            }
        })
        .buffer_unordered(NODE_CREATES_IN_FLIGHT)
        .collect()
        .await;
    let kept_on_create = results.into_iter().collect::<Result<Vec<bool>>>()?.into_iter().filter(|k| *k).count();
    let took = started.elapsed();
    let created = Instant::now();

    // What the API server stored, as a GET returns it (managed fields included).
    let stored = list_all(&api, ListParams::default().labels(&format!("{NODE_LABEL}=true"))).await?;
    let sizes: Vec<usize> = stored.iter().map(|n| serde_json::to_vec(n).map_or(0, |v| v.len())).collect();
    let with_status = stored.iter().filter(|n| n.status.as_ref().and_then(|s| s.images.as_ref()).is_some()).count();
    ensure!(stored.len() == count && with_status == count, "{with_status} of {count} nodes stored with their status");
    let mut kubelets: BTreeMap<String, usize> = BTreeMap::new();
    for node in &stored {
        let info = node.status.as_ref().and_then(|s| s.node_info.as_ref());
        *kubelets.entry(info.map(|i| format!("{:?}", i.kubelet_version)).unwrap_or_default()).or_default() += 1;
    }
    let kubelets: Vec<String> = kubelets.iter().map(|(version, n)| format!("{version} ×{n}")).collect();
    drop(stored);

    let nodes = node_count(ctx).await?;
    wait_for_nodes_known(injector, nodes, Duration::from_secs(120)).await?;
    let known = created.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let share = rss_kib(injector, "VmRSS")? - rss_before;
    println!(
        "      {count} nodes created in {:.1} s ({:.0}/s, {NODE_CREATES_IN_FLIGHT} at a time), none managed by KWOK; status stored on create for {kept_on_create} (the others posted to the status subresource)",
        took.as_secs_f64(),
        count as f64 / took.as_secs_f64()
    );
    println!(
        "      stored Node JSON: {:.1} KiB on average ({:.1}–{:.1} KiB); kubelets: {}",
        sizes.iter().sum::<usize>() as f64 / count as f64 / 1024.0,
        sizes.iter().min().copied().unwrap_or_default() as f64 / 1024.0,
        sizes.iter().max().copied().unwrap_or_default() as f64 / 1024.0,
        kubelets.join(", ")
    );
    println!(
        "      the injector's nodes: {} with a readable kubelet (its pool) of {} with the plane's own, all of them known {:.1} s after the last create (by sidecar_injector_nodes_watched; at most: looked at once they were read back); their share of the RSS: {:.1} MiB ({:.2} KiB per node)",
        nodes.readable,
        nodes.all,
        known.as_secs_f64(),
        share / 1024.0,
        share / count as f64
    );
    Ok(Some(Heartbeats::start(ctx.client.clone(), count)))
}

/// The run's nodes posting status updates in the background, [`NODE_STATUS_PERIOD`] apart for
/// each node, spread evenly; stopped when dropped.
struct Heartbeats {
    stop: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<HeartbeatCount>>,
}

struct HeartbeatCount {
    sent: usize,
    failed: usize,
    first_error: Option<String>,
    took: Duration,
}

impl Heartbeats {
    fn start(client: kube::Client, nodes: usize) -> Heartbeats {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(post_node_status(client, nodes, stop.clone()));
        Heartbeats { stop, task: Some(task) }
    }

    /// Stops them and prints the rate achieved.
    async fn finish(mut self, nodes: usize) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let count = self.task.take().context("stopped twice")?.await?;
        println!(
            "      node status updates: {} in {:.0} s ({:.2}/s; asked: {nodes} nodes once every {} s = {:.2}/s), {} failed{}",
            count.sent,
            count.took.as_secs_f64(),
            count.sent as f64 / count.took.as_secs_f64(),
            NODE_STATUS_PERIOD.as_secs(),
            nodes as f64 / NODE_STATUS_PERIOD.as_secs_f64(),
            count.failed,
            count.first_error.map(|e| format!(" (first: {e})")).unwrap_or_default()
        );
        ensure!(count.failed * 100 <= count.sent, "{} of {} node status updates failed", count.failed, count.sent);
        Ok(())
    }
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Posts node status updates as kubelets do (a strategic merge patch of the status subresource:
/// every condition's heartbeat, and a volume in use that changed), one node after the other,
/// until `stop`.
async fn post_node_status(client: kube::Client, nodes: usize, stop: Arc<AtomicBool>) -> HeartbeatCount {
    let api: Api<Node> = Api::all(client);
    let every = NODE_STATUS_PERIOD.div_f64(nodes as f64);
    let in_flight = Arc::new(Semaphore::new(NODE_UPDATES_IN_FLIGHT));
    let failed = Arc::new(AtomicUsize::new(0));
    let first_error: Arc<Mutex<Option<String>>> = Arc::default();
    let started = tokio::time::Instant::now();
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep_until(started + every.mul_f64(sent as f64)).await;
        let Ok(permit) = in_flight.clone().acquire_owned().await else { break };
        let (api, failed, first_error) = (api.clone(), failed.clone(), first_error.clone());
        let (node, round) = (sent % nodes, sent / nodes);
        tokio::spawn(async move {
            let now = timestamp();
            let patch = json!({"status": {"conditions": node_conditions(&now, None), "volumesInUse": volumes_in_use(node, round + 1)}});
            if let Err(error) =
                api.patch_status(&node_name(node), &PatchParams::default(), &Patch::Strategic(&patch)).await
            {
                failed.fetch_add(1, Ordering::Relaxed);
                first_error.lock().unwrap().get_or_insert(format!("{}: {error}", node_name(node)));
            }
            drop(permit);
        });
        sent += 1;
    }
    let _ = in_flight.acquire_many(NODE_UPDATES_IN_FLIGHT as u32).await;
    let first_error = first_error.lock().unwrap().take();
    HeartbeatCount { sent, failed: failed.load(Ordering::Relaxed), first_error, took: started.elapsed() }
}

/// What one start of the injector with the full cluster costs and takes.
struct Start {
    ready: Duration,
    pods_synced: Duration,
    nodes_known: Duration,
    rss_mib: f64,
    peak_mib: f64,
    traffic: Traffic,
}

impl Start {
    fn synced(&self) -> Duration {
        self.pods_synced.max(self.nodes_known)
    }
}

/// Starts an injector (drift counted every second) and measures its start.
async fn measured_start(ctx: &Ctx, pods: usize, nodes: NodeCount, env: &[(&str, &str)]) -> Result<(Injector, Start)> {
    let before = apiserver_traffic(ctx);
    let started = Instant::now();
    let mut env = env.to_vec();
    env.push(("SIDECAR_INJECTOR__CLUSTER__DRIFT_INTERVAL_SECONDS", "1"));
    let mut injector = Injector::spawn(&ctx.plane, &ctx.binary, &env)?;
    injector.wait_ready()?;
    let ready = started.elapsed();
    let (pods_synced, nodes_known) = tokio::join!(
        wait_for_pods_watched(&injector, pods, Duration::from_secs(300)),
        wait_for_nodes_known(&injector, nodes, Duration::from_secs(300))
    );
    let (pods_synced, nodes_known) = (ready + pods_synced?, ready + nodes_known?);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = apiserver_traffic(ctx);
    let start = Start {
        ready,
        pods_synced,
        nodes_known,
        rss_mib: rss_kib(&injector, "VmRSS")? / 1024.0,
        peak_mib: rss_kib(&injector, "VmHWM")? / 1024.0,
        traffic: after.since(&before),
    };
    Ok((injector, start))
}

/// Restarts with paged lists and then with streaming lists: time to be ready and to sync pods and
/// nodes, memory, and what the start costs the API server; between them, the time the API server
/// alone takes to serve the paged start's pod list. Returns the second injector.
async fn restarts(ctx: &Ctx, pods: usize, nodes: NodeCount, goals: &mut Goals) -> Result<Injector> {
    let (paged_injector, paged) =
        measured_start(ctx, pods, nodes, &[("SIDECAR_INJECTOR__CLUSTER__STREAMING_LISTS", "false")]).await?;
    drop(paged_injector);
    // What of the paged sync is the API server's: the same requests from a bare client, in the
    // injector's pages and in kube's default 500 and larger ones.
    for page in [500, sidecar_injector::cluster::POD_PAGE_SIZE, 5_000] {
        let started = Instant::now();
        let pages = pod_metadata_pages(ctx, page, drop).await?;
        let took = started.elapsed();
        println!(
            "      the API server alone, every pod's metadata in pages of {page} as the paged start asks for them: {pages} pages in {:.2} s ({:.0} ms a page)",
            took.as_secs_f64(),
            took.as_secs_f64() * 1000.0 / pages as f64
        );
    }
    let (fresh, streaming) = measured_start(ctx, pods, nodes, &[]).await?;
    let mib = |bytes: f64| bytes / 1024.0 / 1024.0;
    for (how, start) in [("paged lists", &paged), ("streaming lists", &streaming)] {
        let traffic = &start.traffic;
        println!(
            "      restart with {how}: ready in {:.2} s, {pods} pods synced in {:.2} s, {} nodes ({} readable) in {:.2} s, RSS {:.1} MiB (peak {:.1} MiB); API server: {:.0} LIST calls, {:.1} MiB of LIST responses (pods {:.1}, nodes {:.1}, other {:.1}), {:.1} MiB of pod watch events",
            start.ready.as_secs_f64(),
            start.pods_synced.as_secs_f64(),
            nodes.all,
            nodes.readable,
            start.nodes_known.as_secs_f64(),
            start.rss_mib,
            start.peak_mib,
            traffic.lists,
            mib(traffic.list_bytes.iter().sum()),
            mib(traffic.list_bytes[0]),
            mib(traffic.list_bytes[1]),
            mib(traffic.list_bytes[2]),
            mib(traffic.pod_events)
        );
        // The API server's metrics do not tell one watcher's events from another's, so the
        // injector's own share is not printed as a figure: with streaming lists its initial
        // events are the Nodes once, the same objects the paged start's node LIST carried.
        println!(
            "        and {:.1} MiB of node watch events to the {:.0} node watchers together (each gets every status update){}",
            mib(traffic.node_events),
            traffic.node_watchers,
            if how == "streaming lists" {
                format!(
                    ", the injector's initial events among them: every Node once, {:.1} MiB as the paged start's node LIST served them",
                    mib(paged.traffic.list_bytes[1])
                )
            } else {
                String::new()
            }
        );
    }
    for (how, start) in [("paged", &paged), ("streaming", &streaming)] {
        goals.check(start.ready <= GOAL_READY, || format!("{how}: ready after {:?}, goal {GOAL_READY:?}", start.ready));
        goals.check(start.synced() <= GOAL_SYNCED, || {
            format!("{how}: synced after {:?}, goal {GOAL_SYNCED:?}", start.synced())
        });
        goals.check(start.rss_mib <= GOAL_RSS_MIB, || {
            format!("{how}: RSS {:.1} MiB after the sync, goal {GOAL_RSS_MIB}", start.rss_mib)
        });
    }
    Ok(fresh)
}

/// The drift gauge against a recount from the API: pods in `scale-*` whose log-shipper injection
/// is stale (its hash is not `current_hash`), counted by the injector's
/// `sidecar_injector_drifted_pods{template="log-shipper",state="stale"}` series of those
/// namespaces and by listing every pod. Both count pods, one per pod: the churn pods carry two
/// templates, so a sum over templates would count a pod twice.
async fn drift_agrees(ctx: &Ctx, injector: &Injector, current_hash: &str, when: &str) -> Result<()> {
    let all = all_pod_metadata(ctx).await?;
    let recount = all
        .iter()
        .filter(|p| p.metadata.namespace.as_deref().is_some_and(|n| n.starts_with("scale-")))
        .filter(|p| {
            let status = p.metadata.annotations.as_ref().and_then(|a| a.get("sidecar-injector.io/status"));
            let status: Option<Value> = status.and_then(|s| serde_json::from_str(s).ok());
            status.is_some_and(|s| {
                s["templates"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|t| t["name"] == "log-shipper" && t["hash"] != current_hash)
            })
        })
        .count();
    let start = Instant::now();
    let gauge_sum = loop {
        let metrics = injector.metrics();
        let sum: f64 = metrics
            .lines()
            .filter(|l| {
                l.starts_with("sidecar_injector_drifted_pods{namespace=\"scale-")
                    && l.contains("template=\"log-shipper\"")
                    && l.contains("state=\"stale\"")
            })
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        if sum as usize == recount || start.elapsed() > Duration::from_secs(30) {
            break sum;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "      drift gauge {when}: {gauge_sum:.0} stale pods in scale-* (recount from the API: {recount}), {:.1} s after the recount",
        start.elapsed().as_secs_f64()
    );
    ensure!(gauge_sum as usize == recount, "{when}: drift gauge {gauge_sum} != recount {recount}");
    Ok(())
}

/// An AdmissionReview of `pod` created in `namespace`, as the benchmarks send it.
fn review(namespace: &str, pod: Value) -> Value {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "scale", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": namespace, "operation": "CREATE", "userInfo": {"username": "bench"},
        "object": pod}})
}

/// Rounds of [`ROUND_REQUESTS`] requests to each side of an admission comparison; the first
/// round is not counted.
const ROUNDS: usize = 20;
const ROUND_REQUESTS: usize = 100;

/// The median time (µs) of `review` answered by each of two injectors, in alternating rounds.
async fn alternate(client: &reqwest::Client, ports: [u16; 2], review: &Value) -> Result<[f64; 2]> {
    let mut times = [Vec::new(), Vec::new()];
    let mut uid = 0;
    for round in 0..ROUNDS {
        for (side, port) in ports.iter().enumerate() {
            let url = format!("https://127.0.0.1:{port}/mutate");
            for _ in 0..ROUND_REQUESTS {
                uid += 1;
                let mut review = review.clone();
                review["request"]["uid"] = json!(format!("scale-{uid}"));
                let body = review.to_string();
                let sent = Instant::now();
                let response = client.post(&url).header("content-type", "application/json").body(body).send().await?;
                ensure!(response.status() == 200);
                response.bytes().await?;
                if round > 0 {
                    times[side].push(sent.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
    }
    let [mut first, mut second] = times;
    Ok([median(&mut first), median(&mut second)])
}

/// A second injector on the next port with one watch (`setting`) off, to compare admissions with.
fn injector_without(ctx: &Ctx, setting: &str) -> Result<(Injector, u16)> {
    let second_port = INJECTOR_HTTPS_PORT + 1;
    let port = second_port.to_string();
    let injector = Injector::start(
        &ctx.plane,
        &ctx.binary,
        &[("SIDECAR_INJECTOR__SERVER__HTTPS_PORT", port.as_str()), (setting, "false")],
    )?;
    Ok((injector, second_port))
}

/// Admission cost with the full pod index against an injector without one, alternating.
async fn admission_with_pod_cache(ctx: &Ctx, namespace: &str, pods: usize, goals: &mut Goals) -> Result<()> {
    let (empty, second_port) = injector_without(ctx, "SIDECAR_INJECTOR__CLUSTER__WATCH_PODS")?;
    let client = webhook_client(ctx, Some(&ctx.plane.webhook_client))?;
    let review = review(namespace, pod("bench", json!({"app": "scale"}), json!({})));
    let [big, small] = alternate(&client, [INJECTOR_HTTPS_PORT, second_port], &review).await?;
    println!(
        "      admission with {pods} pods cached: median {big:.0} µs; without a pod cache: {small:.0} µs; ratio {:.2} (goal ≤ {GOAL_RATIO}; {} alternating rounds of {ROUND_REQUESTS})",
        big / small,
        ROUNDS - 1
    );
    goals.check(big / small <= GOAL_RATIO, || {
        format!("admission with the full pod cache costs {:.2}× (goal ≤ {GOAL_RATIO})", big / small)
    });
    drop(empty);
    Ok(())
}

/// The two pods the node pool is measured with: one without node constraints (decided by the
/// oldest kubelet of all, kept by the pool) and the worst realistic one, whose required node
/// affinity matches half the nodes (the pool's index gives the most nodes to combine).
fn node_test_pods() -> [(&'static str, Value); 2] {
    let plain = nullwebhook::bench_pod("bench-");
    let mut affinity = plain.clone();
    affinity["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONES[0], ZONES[1]]},
            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}});
    [("without node constraints", plain), ("with required node affinity matching half the nodes", affinity)]
}

/// The patch an injector answers for `review`.
async fn patch_of(client: &reqwest::Client, port: u16, review: &Value) -> Result<String> {
    let url = format!("https://127.0.0.1:{port}/mutate");
    let answer: Value = client.post(url).json(review).send().await?.json().await?;
    ensure!(answer["response"]["allowed"] == true, "refused: {answer}");
    Ok(answer["response"]["patch"].as_str().unwrap_or_default().to_owned())
}

/// Admission cost with the node pool against an injector without one
/// (`cluster.watch_nodes=false`, which decides by the API server's version), alternating, for
/// both [`node_test_pods`]. Stricter than against a pool of 1 node, which costs at least what no
/// pool costs. Both injectors must answer the same patch (the same work).
async fn admission_with_nodes(ctx: &Ctx, namespace: &str, nodes: usize, pods: usize, goals: &mut Goals) -> Result<()> {
    let (without, second_port) = injector_without(ctx, "SIDECAR_INJECTOR__CLUSTER__WATCH_NODES")?;
    // Its pod index synced, so that it does not spend the comparison syncing.
    wait_for_pods_watched(&without, pods, Duration::from_secs(300)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let client = webhook_client(ctx, Some(&ctx.plane.webhook_client))?;
    for (what, pod) in node_test_pods() {
        let review = review(namespace, pod);
        let with_pool = patch_of(&client, INJECTOR_HTTPS_PORT, &review).await?;
        ensure!(
            with_pool == patch_of(&client, second_port, &review).await?,
            "a pod {what}: the injector with {nodes} nodes and the one without a node pool answer different patches"
        );
        let [with, without] = alternate(&client, [INJECTOR_HTTPS_PORT, second_port], &review).await?;
        println!(
            "      admission of a pod {what}: median {with:.0} µs with {nodes} nodes in the pool; {without:.0} µs without a node pool (the API server's version decides: stricter than against 1 node, which costs at least as much as none); ratio {:.2}, {:+.0} µs (goal ≤ {GOAL_RATIO}; {} alternating rounds of {ROUND_REQUESTS}; the same patch from both)",
            with / without,
            with - without,
            ROUNDS - 1
        );
        goals.check(with / without <= GOAL_RATIO, || {
            format!("admission of a pod {what} with {nodes} nodes costs {:.2}× (goal ≤ {GOAL_RATIO})", with / without)
        });
    }
    drop(without);
    Ok(())
}

/// The node pool's own cost per decision (`NodePool::facts_for`), with the cluster's nodes read
/// as the injector reads them and with 1 node, timed in this process (hot in the cache, unlike
/// in the injector, where a decision also reads the pod and the templates).
async fn pool_cost(ctx: &Ctx) -> Result<()> {
    let nodes = list_all(&Api::<NodeObject>::all(ctx.client.clone()), ListParams::default()).await?;
    let info = ctx.client.apiserver_version().await?;
    let api_server = ClusterFacts::from_version(&info.major, &info.minor).context("the API server's version")?;
    let pool = NodePool::new(nodes.iter().map(NodeFacts::of));
    let one = NodePool::new(nodes.iter().map(NodeFacts::of).filter(|n| n.kubelet.is_some()).take(1));
    let per_decision = |pool: &NodePool, pod: &Value| {
        let start = Instant::now();
        let mut decisions = 0u32;
        while decisions < 100 || start.elapsed() < Duration::from_millis(500) {
            std::hint::black_box(pool.facts_for(std::hint::black_box(pod), api_server));
            decisions += 1;
        }
        start.elapsed().as_secs_f64() * 1e6 / f64::from(decisions)
    };
    let build = if cfg!(debug_assertions) {
        "; a debug build of this test, unlike the injector: `make scale` builds it optimized"
    } else {
        ""
    };
    for (what, pod) in node_test_pods() {
        println!(
            "      the pool's own cost per decision for a pod {what}: {:.2} µs with {} nodes, {:.2} µs with 1 node (NodePool::facts_for in the test process{build})",
            per_decision(&pool, &pod),
            pool.len(),
            per_decision(&one, &pod)
        );
    }
    Ok(())
}

/// The pod of the churn phase: the typical Deployment pod as its ReplicaSet creates it, never
/// scheduled, without the API token mount (so the null webhook's one patch fits every one).
fn churn_pod() -> Value {
    let mut pod = nullwebhook::bench_pod("churn-7d9f8b6c5-");
    pod["spec"]["schedulerName"] = json!(NO_SCHEDULER);
    pod
}

/// The two sides of the churn phase.
struct ChurnSides {
    /// Namespaces served by the injector.
    ours: Vec<String>,
    /// Namespaces served by the null webhook.
    null: Vec<String>,
    /// Stopped when dropped.
    webhook: nullwebhook::NullWebhook,
}

/// Registers the null webhook with the very entries the injector's pod webhooks have (copied from
/// the cluster: rules, selectors, match conditions, policies, timeouts), pointed at it and limited
/// to the namespaces labelled [`NULL_LABEL`]`=null`.
async fn register_null_webhooks(ctx: &Ctx, webhook: &nullwebhook::NullWebhook) -> Result<()> {
    let mutating: MutatingWebhookConfiguration =
        Api::all(ctx.client.clone()).get("sidecar-injector").await.context("the injector's mutating webhooks")?;
    let validating: ValidatingWebhookConfiguration =
        Api::all(ctx.client.clone()).get("sidecar-injector").await.context("the injector's validating webhooks")?;
    let (mutating, validating) = (serde_json::to_value(mutating)?, serde_json::to_value(validating)?);
    let entries = |configuration: &Value, path: &str| -> Vec<Value> {
        let for_pods =
            |entry: &&Value| {
                entry["rules"].as_array().into_iter().flatten().any(|rule| {
                    rule["resources"].as_array().is_some_and(|resources| resources.contains(&json!("pods")))
                })
            };
        let entries = configuration["webhooks"].as_array().into_iter().flatten().filter(for_pods);
        entries
            .map(|entry| {
                let mut entry = entry.clone();
                let name = entry["name"].as_str().unwrap_or_default().to_owned();
                entry["name"] = json!(format!("{}.null.example.com", name.split('.').next().unwrap_or_default()));
                entry["clientConfig"] =
                    json!({"url": format!("https://127.0.0.1:{}{path}", webhook.port), "caBundle": webhook.ca_bundle});
                let only_null = json!({"key": NULL_LABEL, "operator": "In", "values": ["null"]});
                match entry["namespaceSelector"]["matchExpressions"].as_array_mut() {
                    Some(expressions) => expressions.push(only_null),
                    None => entry["namespaceSelector"]["matchExpressions"] = json!([only_null]),
                }
                entry
            })
            .collect()
    };
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
         "metadata": {"name": "scale-null"}, "webhooks": entries(&mutating, "/mutate")},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "metadata": {"name": "scale-null"}, "webhooks": entries(&validating, "/validate")},
    ]});
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["apply", "-f", "-"], Some(&list.to_string()))?;
    Ok(())
}

/// Admission requests the injector has answered, on any endpoint.
fn injector_requests(injector: &Injector) -> f64 {
    gauge(&injector.metrics(), "sidecar_injector_admission_requests_total")
}

/// The churn phase's namespaces and null webhook: [`CHURN_NAMESPACES`] of the run's namespaces
/// for the injector, as many new ones for the null webhook (opted in, so the
/// ValidatingAdmissionPolicy checks their pods too, and which the injector's webhooks no longer
/// see); checks that a pod gets the same injection on both sides.
async fn churn_sides(ctx: &Ctx, injector: &Injector, names: &[String]) -> Result<ChurnSides> {
    let count = CHURN_NAMESPACES.min(names.len());
    let ours: Vec<String> = (0..count).map(|i| names[i * names.len() / count].clone()).collect();
    let null: Vec<String> = (0..count).map(|i| format!("churn-null-{i:02}")).collect();
    for name in &null {
        create_namespace(ctx, name, json!({"sidecar-injector.io/inject": "enabled", NULL_LABEL: "null"})).await?;
    }
    // The injector's patch for the churn pod in the first of its namespaces (the log shipper's
    // tag names the namespace: the same length in all of them).
    let https = webhook_client(ctx, Some(&ctx.plane.webhook_client))?;
    let patch = nullwebhook::injector_patch(&https, &ours[0], churn_pod()).await?;
    let webhook = nullwebhook::start(&ctx.plane, &ctx.plane.dir.join("churn-null"), &patch, false)?;
    register_null_webhooks(ctx, &webhook).await?;
    nullwebhook::not_for_the_injector(&ctx.plane, NULL_LABEL, &["null"])?;
    nullwebhook::wait_for_injection(&ctx.client, &null[0], churn_pod(), "the null webhook").await?;
    // Until a pod there no longer reaches the injector, then the same pod on both sides.
    let start = Instant::now();
    let null_side = loop {
        let before = injector_requests(injector);
        let dry = ctx.dry_run_pod(&null[0], churn_pod()).await?;
        if injector_requests(injector) == before && crate::scenarios::status(&dry).is_some() {
            break dry;
        }
        ensure!(start.elapsed() < Duration::from_secs(30), "the injector's webhooks still see {}", null[0]);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let ours_side = ctx.dry_run_pod(&ours[0], churn_pod()).await?;
    let shape = |pod: &Pod| (pod.metadata.labels.clone(), pod.metadata.annotations.clone(), pod.spec.clone());
    ensure!(shape(&ours_side) == shape(&null_side), "the null webhook's pod differs from the injector's");
    Ok(ChurnSides { ours, null, webhook })
}

/// One churn pod: which side, its create's latency or error, whether it came back injected, and
/// when it was deleted (or why not).
struct Churned {
    ours: bool,
    created: std::result::Result<(Instant, Duration), String>,
    injected: bool,
    deleted: Option<std::result::Result<Instant, String>>,
    /// Delete calls that got a server error (etcd timing out under the load) and were made again,
    /// as a controller would.
    delete_retries: u32,
}

/// The share of the churn rate that counts as sustained (the rates are measured from first to last).
const SUSTAINED_SHARE: f64 = 0.95;

/// How many times a churn pod's delete is made again after a server error.
const CHURN_DELETE_RETRIES: u32 = 5;

/// Deletes `name`, again after a server error (a 5xx: etcd timing out when the machine is
/// saturated), as a controller would; a retry that finds the pod gone counts as deleted (the
/// failed call may have deleted it). Returns when it was deleted and how many calls were retried.
async fn delete_churn_pod(api: &Api<Pod>, name: &str) -> (std::result::Result<Instant, String>, u32) {
    let mut retries = 0;
    loop {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => return (Ok(Instant::now()), retries),
            Err(kube::Error::Api(status)) if retries > 0 && status.code == 404 => return (Ok(Instant::now()), retries),
            Err(kube::Error::Api(status)) if status.code >= 500 && retries < CHURN_DELETE_RETRIES => {
                retries += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(error) => return (Err(format!("{name}: {error}")), retries),
        }
    }
}

/// Creates `rate` pods a second for `minutes`, alternating the sides pod by pod, each deleted
/// [`CHURN_POD_LIFETIME`] after its creation; returns once the last is deleted, with the most
/// creates that were in flight at once.
async fn churn_pods(ctx: &Ctx, sides: &ChurnSides, rate: f64, minutes: f64) -> Result<(Vec<Churned>, usize)> {
    let total = (rate * minutes * 60.0).round() as usize;
    let every = Duration::from_secs_f64(1.0 / rate);
    let creates = Arc::new(Semaphore::new(CHURN_CREATES_IN_FLIGHT));
    let deletes = Arc::new(Semaphore::new(CHURN_CREATES_IN_FLIGHT));
    let mut tasks = tokio::task::JoinSet::new();
    let started = tokio::time::Instant::now();
    let mut most_in_flight = 0;
    for k in 0..total {
        tokio::time::sleep_until(started + every.mul_f64(k as f64)).await;
        let permit = creates.clone().acquire_owned().await?;
        most_in_flight = most_in_flight.max(CHURN_CREATES_IN_FLIGHT - creates.available_permits());
        let ours = k % 2 == 0;
        let namespaces = if ours { &sides.ours } else { &sides.null };
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespaces[(k / 2) % namespaces.len()]);
        let deletes = deletes.clone();
        tasks.spawn(async move {
            let pod: Pod = serde_json::from_value(churn_pod()).expect("a valid pod");
            let sent = Instant::now();
            let created = api.create(&PostParams::default(), &pod).await;
            let latency = sent.elapsed();
            drop(permit);
            let pod = match created {
                Ok(pod) => pod,
                Err(error) => {
                    return Churned {
                        ours,
                        created: Err(error.to_string()),
                        injected: false,
                        deleted: None,
                        delete_retries: 0,
                    };
                }
            };
            let injected = crate::scenarios::status(&pod).is_some();
            tokio::time::sleep_until((sent + CHURN_POD_LIFETIME).into()).await;
            let _permit = deletes.acquire_owned().await;
            let name = pod.metadata.name.unwrap_or_default();
            let (deleted, delete_retries) = delete_churn_pod(&api, &name).await;
            Churned { ours, created: Ok((sent, latency)), injected, deleted: Some(deleted), delete_retries }
        });
    }
    let mut churned = Vec::with_capacity(total);
    while let Some(result) = tasks.join_next().await {
        churned.push(result?);
    }
    Ok((churned, most_in_flight))
}

/// Every [`CHURN_SAMPLE_EVERY`] until `stop`: seconds since the start, the process's CPU over the
/// interval (cores) and its RSS (MiB).
fn sample_process(pid: u32, mut stop: tokio::sync::watch::Receiver<bool>) -> tokio::task::JoinHandle<Vec<[f64; 3]>> {
    tokio::spawn(async move {
        // SAFETY: sysconf has no preconditions.
        let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let started = Instant::now();
        let (mut at, mut ticks) = (Instant::now(), cpu_ticks(pid).unwrap_or_default());
        let mut samples = Vec::new();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(CHURN_SAMPLE_EVERY) => {}
                _ = stop.changed() => break,
            }
            let (now, now_ticks) = (Instant::now(), cpu_ticks(pid).unwrap_or_default());
            let cores = (now_ticks - ticks) / ticks_per_second / (now - at).as_secs_f64();
            let rss = proc_rss_kib(pid, "VmRSS").unwrap_or_default() / 1024.0;
            samples.push([started.elapsed().as_secs_f64(), cores, rss]);
            (at, ticks) = (now, now_ticks);
        }
        samples
    })
}

/// The API server's time in each webhook, by webhook name: (seconds, calls).
fn webhook_times(ctx: &Ctx) -> BTreeMap<String, (f64, f64)> {
    let mut times: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in apiserver_metrics(ctx).lines() {
        let Some(rest) = line.strip_prefix("apiserver_admission_webhook_admission_duration_seconds_") else {
            continue;
        };
        let name = rest.split("name=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or_default().to_owned();
        let value: f64 = line.rsplit_once(' ').and_then(|(_, v)| v.parse().ok()).unwrap_or_default();
        let entry = times.entry(name).or_default();
        if rest.starts_with("sum{") {
            entry.0 += value;
        } else if rest.starts_with("count{") {
            entry.1 += value;
        }
    }
    times
}

/// The churn phase, at full size while the nodes post their status: pods created and deleted at
/// the churn rate, half through the injector and half through the null webhook; create latency on
/// both sides, the API server's time per webhook call, the injector's CPU and RSS; then the pod
/// index back to the run's pods.
async fn churn(
    ctx: &Ctx,
    injector: &Injector,
    names: &[String],
    size: &Size,
    pods: usize,
    goals: &mut Goals,
) -> Result<()> {
    let sides = churn_sides(ctx, injector, names).await?;
    let pid = injector.process.pid().context("the injector is not running")?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (webhooks_before, traffic_before) = (webhook_times(ctx), apiserver_traffic(ctx));
    let processes = [
        ("injector", Some(pid)),
        ("null webhook", sides.webhook.process.pid()),
        ("kube-apiserver", ctx.plane.apiserver.as_ref().and_then(|p| p.pid())),
        ("etcd", ctx.plane.etcd.pid()),
        ("this test process", Some(std::process::id())),
    ];
    let cpu = || processes.map(|(_, pid)| pid.and_then(|pid| cpu_ticks(pid).ok()).unwrap_or(f64::NAN));
    let cpu_before = cpu();
    let sampler = sample_process(pid, stopped);
    let started = Instant::now();
    let (churned, most_in_flight) = churn_pods(ctx, &sides, size.churn_rate, size.churn_minutes).await?;
    let took = started.elapsed();
    let _ = stop.send(true);
    let samples = sampler.await?;
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cores: Vec<String> = processes
        .iter()
        .zip(cpu().iter().zip(cpu_before))
        .map(|((name, _), (after, before))| {
            format!("{name} {:.2}", (after - before) / ticks_per_second / took.as_secs_f64())
        })
        .collect();
    println!(
        "      churn: CPU over the phase (cores of the machine's {}): {}; at most {most_in_flight} creates in flight (of {CHURN_CREATES_IN_FLIGHT} allowed)",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cores.join(", ")
    );
    let (webhooks_after, traffic) = (webhook_times(ctx), apiserver_traffic(ctx).since(&traffic_before));
    let webhooks: Vec<String> = webhooks_after
        .iter()
        .filter(|(name, _)| name.contains("sidecar-injector.io") || name.contains("null.example.com"))
        .filter_map(|(name, (sum, count))| {
            let (sum_before, count_before) = webhooks_before.get(name).copied().unwrap_or_default();
            let calls = count - count_before;
            (calls > 0.0).then(|| format!("{name} {:.2} ms ({calls:.0} calls)", (sum - sum_before) * 1000.0 / calls))
        })
        .collect();
    println!(
        "      churn: API server's mean time per webhook call: {}; node writes at the API server {:.1}/s (the status updates, and the controller-manager marking the nodes that miss a heartbeat), node watch events {:.2} MiB/s per watcher ({:.0} node watchers, the injector's among them)",
        webhooks.join(", "),
        traffic.node_writes / took.as_secs_f64(),
        traffic.node_events / took.as_secs_f64() / 1024.0 / 1024.0 / traffic.node_watchers.max(1.0),
        traffic.node_watchers
    );
    churn_report(&churned, &samples, size, goals)?;
    let back = Instant::now();
    loop {
        let watched = gauge(&injector.metrics(), "sidecar_injector_pods_watched") as usize;
        if watched == pods {
            break;
        }
        ensure!(
            back.elapsed() < Duration::from_secs(60),
            "the pod index holds {watched} pods after the churn, not {pods}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "      churn: the pod index back to {pods} pods {:.1} s after the last delete",
        back.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Prints the churn phase's rates, failures, latencies per side and the injector's samples, and
/// checks the goals.
fn churn_report(churned: &[Churned], samples: &[[f64; 3]], size: &Size, goals: &mut Goals) -> Result<()> {
    let created: Vec<(bool, Instant, Duration)> =
        churned.iter().filter_map(|c| c.created.as_ref().ok().map(|(at, took)| (c.ours, *at, *took))).collect();
    let deleted: Vec<Instant> = churned.iter().filter_map(|c| c.deleted.as_ref()?.as_ref().ok().copied()).collect();
    let create_errors: Vec<&String> = churned.iter().filter_map(|c| c.created.as_ref().err()).collect();
    let delete_errors: Vec<&String> = churned.iter().filter_map(|c| c.deleted.as_ref()?.as_ref().err()).collect();
    let uninjected = churned.iter().filter(|c| c.created.is_ok() && !c.injected).count();
    let rate = |times: &mut Vec<Instant>| {
        times.sort();
        match (times.first(), times.last()) {
            (Some(first), Some(last)) if last > first => (times.len() - 1) as f64 / (*last - *first).as_secs_f64(),
            _ => f64::NAN,
        }
    };
    let (create_rate, delete_rate) = (rate(&mut created.iter().map(|c| c.1).collect()), rate(&mut deleted.clone()));
    let retried = churned.iter().filter(|c| c.delete_retries > 0).count();
    println!(
        "      churn: {} pods asked over {:.1} min at {}/s: created at {create_rate:.1}/s, deleted at {delete_rate:.1}/s ({} s after their creation); deletes made again after a server error: {retried}; failed: {} creates, {} uninjected, {} deletes{}",
        churned.len(),
        size.churn_minutes,
        size.churn_rate,
        CHURN_POD_LIFETIME.as_secs(),
        create_errors.len(),
        uninjected,
        delete_errors.len(),
        create_errors.first().or(delete_errors.first()).map(|e| format!(" (first: {e})")).unwrap_or_default()
    );
    let latencies = |ours: bool| -> Vec<f64> {
        created.iter().filter(|c| c.0 == ours).map(|c| c.2.as_secs_f64() * 1000.0).collect()
    };
    let ((ours_median, ours_mean, ours_p99), (null_median, null_mean, null_p99)) =
        (spread(&mut latencies(true)), spread(&mut latencies(false)));
    // The ratio goal is the full-size cluster's. In a small one a create takes 10-20 ms and our
    // two webhooks' decisions (1-1.5 ms over the null webhook's answers, steady from run to run)
    // moved the ratio of medians between 1.08 and 1.13 with how fast the cluster happened to be:
    // there the difference is held instead, so a slower decision still fails the default run.
    let (ratio, added) = (ours_median / null_median, ours_median - null_median);
    let latency_goal = if size.pods >= LATENCY_RATIO_FROM_PODS {
        (ratio <= GOAL_RATIO, format!("ratio {ratio:.2}, goal ≤ {GOAL_RATIO}"))
    } else {
        (
            added <= GOAL_ADDED_MEDIAN_MS,
            format!(
                "{added:+.2} ms, goal ≤ {GOAL_ADDED_MEDIAN_MS} ms below PODS={LATENCY_RATIO_FROM_PODS}; ratio {ratio:.2}"
            ),
        )
    };
    println!(
        "      churn: create latency, ours / null webhook with the same configuration: median {ours_median:.2} / {null_median:.2} ms ({}), mean {ours_mean:.2} / {null_mean:.2} ms ({:.2}), p99 {ours_p99:.2} / {null_p99:.2} ms ({:.2})",
        latency_goal.1,
        ours_mean / null_mean,
        ours_p99 / null_p99
    );
    let compact: Vec<String> = samples.iter().map(|[_, cores, rss]| format!("{cores:.2}/{rss:.1}")).collect();
    let mean_cores = samples.iter().map(|s| s[1]).sum::<f64>() / samples.len().max(1) as f64;
    let after_a_minute: Vec<(f64, f64)> = samples.iter().filter(|s| s[0] > 60.0).map(|s| (s[0], s[2])).collect();
    let slope = if after_a_minute.len() >= 2 { least_squares(&after_a_minute).1 * 600.0 } else { f64::NAN };
    let asserted = size.churn_minutes >= SLOPE_ASSERTED_FROM_MINUTES;
    println!(
        "      churn: injector CPU (cores) / RSS (MiB) every {} s: {}; mean {mean_cores:.2} cores; RSS slope after the first minute {slope:+.2} MiB per 10 minutes (goal ≤ {GOAL_SLOPE_MIB_PER_10_MIN}; {})",
        CHURN_SAMPLE_EVERY.as_secs(),
        compact.join(" "),
        if asserted {
            "asserted"
        } else {
            "printed only: asserted from CHURN_MINUTES=10 on, a shorter phase is too noisy"
        }
    );
    ensure!(create_errors.is_empty(), "{} churn pod creates failed: {:?}", create_errors.len(), create_errors.first());
    ensure!(uninjected == 0, "{uninjected} churn pods were created without their injection");
    ensure!(delete_errors.is_empty(), "{} churn pod deletes failed: {:?}", delete_errors.len(), delete_errors.first());
    // The rate is the machine's (the API server and etcd share its 2 cores with everything
    // else): a miss is reported with the rest of the goals, the checks after the churn still run.
    let sustained = SUSTAINED_SHARE * size.churn_rate;
    goals.check(create_rate >= sustained && delete_rate >= sustained && retried == 0, || {
        format!(
            "churn: the machine sustained {create_rate:.1} creates/s and {delete_rate:.1} deletes/s of the {}/s asked ({retried} deletes made again after a server error)",
            size.churn_rate
        )
    });
    goals.check(latency_goal.0, || format!("churn: median create latency ours / null webhook: {}", latency_goal.1));
    goals.check(!asserted || slope <= GOAL_SLOPE_MIB_PER_10_MIN, || {
        format!("churn: the injector's RSS grows {slope:.2} MiB per 10 minutes (goal ≤ {GOAL_SLOPE_MIB_PER_10_MIN})")
    });
    Ok(())
}
