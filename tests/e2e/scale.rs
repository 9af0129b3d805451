//! The scale run (`make scale`, not part of `make test`): 10,000 pods in 1,000 opted-in namespaces
//! on KWOK's simulated nodes, with the drift watch on, and the figures the injector must meet:
//! resident memory against the pods it caches (fitted as a line: fixed + per pod), time to sync
//! after a start, the drift gauge against a recount from the API, the cost of an admission with
//! that cache against an injector with no pod cache (alternating rounds, one run), and what the
//! injector's start costs the API server (LIST calls and bytes).

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::controlplane::{INJECTOR_HTTPS_PORT, Injector, curl};
use crate::scenarios::{Ctx, edit_tag_and_wait, pod, webhook_client};

/// The size of the run: `make scale PODS=… NAMESPACES=…` (defaults: the 10,000-pod run whose
/// figures docs/performance.md has carried since the first scale run).
fn size() -> Result<(usize, usize)> {
    let read = |name: &str, default: usize| -> Result<usize> {
        match std::env::var(name) {
            Ok(text) if !text.is_empty() => text.parse().with_context(|| format!("{name}={text}")),
            _ => Ok(default),
        }
    };
    let (pods, namespaces) =
        (read("SIDECAR_INJECTOR_SCALE_PODS", 10_000)?, read("SIDECAR_INJECTOR_SCALE_NAMESPACES", 1_000)?);
    ensure!(namespaces > 0 && pods >= namespaces, "PODS ({pods}) must be at least NAMESPACES ({namespaces}) > 0");
    Ok((pods, namespaces))
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
/// Pods the scale run creates are never scheduled (no scheduler has this name): they only have to
/// exist for the watch, and the simulated nodes would not hold 150,000 of them.
const NO_SCHEDULER: &str = "sidecar-injector-e2e-none";

/// A memory figure of the injector's process from `/proc/PID/status` (`VmRSS`, `VmHWM`), in KiB.
fn rss_kib(injector: &Injector, field: &str) -> Result<f64> {
    let pid = injector.process.pid().context("the injector is not running")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with(&format!("{field}:"))).with_context(|| format!("no {field}"))?;
    Ok(line.split_whitespace().nth(1).with_context(|| format!("{field} value"))?.parse()?)
}

fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
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

/// The API server's LIST calls, LIST response bytes and pod watch event bytes so far (all clients).
fn apiserver_traffic(ctx: &Ctx) -> (f64, f64, f64) {
    let token = "e2e-admin-token";
    let text = curl(&format!("{}/metrics", ctx.plane.url), Some(&ctx.plane.dir.join("ca.crt")), Some(token))
        .unwrap_or_default();
    let sum = |prefix: &str, filter: &str| {
        text.lines()
            .filter(|l| l.starts_with(prefix) && l.contains(filter))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>()
    };
    (
        sum("apiserver_request_total{", "verb=\"LIST\""),
        sum("apiserver_response_sizes_sum{", "verb=\"LIST\""),
        sum("apiserver_watch_events_sizes_sum{", "resource=\"pods\""),
    )
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
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
    let api = Api::<Pod>::all(ctx.client.clone());
    let mut all = Vec::new();
    let mut params = ListParams::default().limit(5_000);
    loop {
        let page = api.list_metadata(&params).await?;
        all.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => params = params.continue_token(&next),
            None => return Ok(all),
        }
    }
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

/// `sidecar-injector inject` with the templates the cluster serves and the cluster's version, as
/// a user would pre-inject manifests: its pods are what the webhook would have made of them (the
/// pods of the first namespace, opted in from the start, go through the webhook all the same,
/// which refuses a status annotation that does not match a re-rendering).
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

/// What one start of the injector with the full cluster costs and takes.
struct Start {
    ready: Duration,
    synced: Duration,
    rss_mib: f64,
    peak_mib: f64,
    lists: f64,
    list_mib: f64,
    watch_mib: f64,
}

/// Starts an injector (drift counted every second) and measures its start.
async fn measured_start(ctx: &Ctx, pods: usize, env: &[(&str, &str)]) -> Result<(Injector, Start)> {
    let before = apiserver_traffic(ctx);
    let started = Instant::now();
    let mut env = env.to_vec();
    env.push(("SIDECAR_INJECTOR__CLUSTER__DRIFT_INTERVAL_SECONDS", "1"));
    let mut injector = Injector::spawn(&ctx.plane, &ctx.binary, &env)?;
    injector.wait_ready()?;
    let ready = started.elapsed();
    wait_for_pods_watched(&injector, pods, Duration::from_secs(300)).await?;
    let synced = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = apiserver_traffic(ctx);
    let start = Start {
        ready,
        synced,
        rss_mib: rss_kib(&injector, "VmRSS")? / 1024.0,
        peak_mib: rss_kib(&injector, "VmHWM")? / 1024.0,
        lists: after.0 - before.0,
        list_mib: (after.1 - before.1) / 1024.0 / 1024.0,
        watch_mib: (after.2 - before.2) / 1024.0 / 1024.0,
    };
    Ok((injector, start))
}

/// The scale run.
pub async fn scale(ctx: &mut Ctx) -> Result<()> {
    let (total, namespace_count) = size()?;
    let webhook_pods = total.min(WEBHOOK_PODS);
    println!(
        "      size: {total} pods in {namespace_count} namespaces ({webhook_pods} through the webhook), {TEMPLATES} templates"
    );
    ctx.stop_injector();
    let injector =
        Injector::start(&ctx.plane, &ctx.binary, &[("SIDECAR_INJECTOR__CLUSTER__DRIFT_INTERVAL_SECONDS", "1")])?;
    wait_for_pods_watched(&injector, 0, Duration::from_secs(10)).await?;

    // Templates in service: the shipped ones and look-alikes up to TEMPLATES.
    let shipped = gauge(&injector.metrics(), "sidecar_injector_templates_loaded") as usize;
    let look_alikes = look_alike_templates(shipped);
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["apply", "-f", "-"], Some(&look_alikes.to_string()))?;
    let start = Instant::now();
    while (gauge(&injector.metrics(), "sidecar_injector_templates_loaded") as usize) < TEMPLATES {
        ensure!(start.elapsed() < Duration::from_secs(120), "{TEMPLATES} templates not in service within 2 min");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let baseline_pods = gauge(&injector.metrics(), "sidecar_injector_pods_watched") as usize;
    let rss_before_namespaces = rss_kib(&injector, "VmRSS")?;

    // Namespaces, not opted in yet (but the first), with their default ServiceAccount made here
    // rather than waiting for the controller manager's 20 requests a second.
    let names: Vec<String> = (0..namespace_count).map(|i| format!("scale-{i:05}")).collect();
    let start = Instant::now();
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let results: Vec<Result<()>> = futures::stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let (namespaces, client) = (namespaces.clone(), ctx.client.clone());
            async move {
                let labels = if i == 0 { json!({"sidecar-injector.io/inject": "enabled"}) } else { json!({}) };
                let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
                namespaces.create(&PostParams::default(), &ns).await?;
                let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}}))?;
                match Api::<ServiceAccount>::namespaced(client, name).create(&PostParams::default(), &account).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
                    Err(error) => Err(error.into()),
                }
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect::<Result<()>>()?;
    let ns_start = Instant::now();
    while (gauge(&injector.metrics(), "sidecar_injector_namespaces_watched") as usize) < namespace_count {
        ensure!(ns_start.elapsed() < Duration::from_secs(60), "the namespace cache did not reach {namespace_count}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let namespace_share = rss_kib(&injector, "VmRSS")? - rss_before_namespaces;
    println!(
        "      {namespace_count} namespaces created in {:.1} s; the namespace cache's share of the RSS: {:.1} MiB ({:.2} KiB per namespace)",
        start.elapsed().as_secs_f64(),
        namespace_share / 1024.0,
        namespace_share / namespace_count as f64
    );

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

    let mut samples = vec![(baseline_pods as f64, rss_kib(&injector, "VmRSS")?)];
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
        wait_for_pods_watched(&injector, count, Duration::from_secs(120)).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        samples.push((count as f64, rss_kib(&injector, "VmRSS")?));
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
    // Least squares: RSS = fixed + per_pod * pods.
    let n = samples.len() as f64;
    let (sx, sy) = samples.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (sxx, sxy) = samples.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x * x, b + x * y));
    let per_pod = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    let fixed = (sy - per_pod * sx) / n;
    let worst = samples.iter().map(|(x, y)| (y - (fixed + per_pod * x)).abs()).fold(0.0, f64::max);
    for (pods, rss) in &samples {
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
    ensure!(last <= GOAL_RSS_MIB, "RSS {last:.1} MiB at {total} pods is over the goal of {GOAL_RSS_MIB} MiB");

    // Start afresh, with paged lists and then with streaming lists: time to be ready and to sync,
    // memory, and what the start costs the API server.
    drop(injector);
    let everything = baseline_pods + total;
    let (paged_injector, paged) =
        measured_start(ctx, everything, &[("SIDECAR_INJECTOR__CLUSTER__STREAMING_LISTS", "false")]).await?;
    drop(paged_injector);
    let (fresh, streaming) = measured_start(ctx, everything, &[]).await?;
    for (how, start) in [("paged lists", &paged), ("streaming lists", &streaming)] {
        println!(
            "      restart with {how}: ready in {:.2} s, {everything} pods synced in {:.2} s, RSS {:.1} MiB (peak {:.1} MiB); API server: {:.0} LIST calls, {:.1} MiB of LIST responses, {:.1} MiB of pod watch events",
            start.ready.as_secs_f64(),
            start.synced.as_secs_f64(),
            start.rss_mib,
            start.peak_mib,
            start.lists,
            start.list_mib,
            start.watch_mib
        );
    }
    for (how, start) in [("paged", &paged), ("streaming", &streaming)] {
        ensure!(start.ready <= GOAL_READY, "{how}: ready after {:?}, goal {GOAL_READY:?}", start.ready);
        ensure!(start.synced <= GOAL_SYNCED, "{how}: synced after {:?}, goal {GOAL_SYNCED:?}", start.synced);
        ensure!(
            start.rss_mib <= GOAL_RSS_MIB,
            "{how}: RSS {:.1} MiB after the sync, goal {GOAL_RSS_MIB}",
            start.rss_mib
        );
    }

    // The drift gauge against a recount from the API, after an edit makes every injected pod stale.
    edit_tag_and_wait(ctx, &names[0], "3.2.99", Duration::from_secs(10)).await?;
    let current = ctx.dry_run_pod(&names[0], pod("probe", json!({}), json!({}))).await?;
    let current_hash = crate::scenarios::status(&current)
        .and_then(|s| s.templates.into_iter().find(|t| t.name == "log-shipper"))
        .map(|t| t.hash)
        .context("the probe was not injected")?;
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
                    .any(|t| t["name"] == "log-shipper" && t["hash"] != current_hash.as_str())
            })
        })
        .count();
    let start = Instant::now();
    let gauge_sum = loop {
        let metrics = fresh.metrics();
        let sum: f64 = metrics
            .lines()
            .filter(|l| {
                l.starts_with("sidecar_injector_drifted_pods{namespace=\"scale-") && l.contains("state=\"stale\"")
            })
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        if sum as usize == recount || start.elapsed() > Duration::from_secs(30) {
            break sum;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "      drift gauge: {gauge_sum:.0} stale pods in scale-* (recount from the API: {recount}), {:.1} s after the recount",
        start.elapsed().as_secs_f64()
    );
    ensure!(gauge_sum as usize == recount, "drift gauge {gauge_sum} != recount {recount}");

    // Admission cost with the big cache against an injector without a pod cache, alternating.
    let second_port = INJECTOR_HTTPS_PORT + 1;
    let port = second_port.to_string();
    let empty = Injector::start(
        &ctx.plane,
        &ctx.binary,
        &[("SIDECAR_INJECTOR__SERVER__HTTPS_PORT", port.as_str()), ("SIDECAR_INJECTOR__CLUSTER__WATCH_PODS", "false")],
    )?;
    let client = webhook_client(ctx, Some(&ctx.plane.webhook_client))?;
    let review = |uid: usize| {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": format!("scale-{uid}"), "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": names[1 % namespace_count], "operation": "CREATE", "userInfo": {"username": "bench"},
            "object": pod("bench", json!({"app": "scale"}), json!({}))}})
        .to_string()
    };
    let (mut big, mut small) = (Vec::new(), Vec::new());
    let mut uid = 0;
    for round in 0..20 {
        for (port, out) in [(INJECTOR_HTTPS_PORT, &mut big), (second_port, &mut small)] {
            let url = format!("https://127.0.0.1:{port}/mutate");
            for _ in 0..100 {
                uid += 1;
                let body = review(uid);
                let sent = Instant::now();
                let response = client.post(&url).header("content-type", "application/json").body(body).send().await?;
                ensure!(response.status() == 200);
                response.bytes().await?;
                if round > 0 {
                    out.push(sent.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
    }
    let (big_median, small_median) = (median(&mut big), median(&mut small));
    println!(
        "      admission with {total} pods cached: median {big_median:.0} µs; without a pod cache: {small_median:.0} µs; ratio {:.2} (goal ≤ {GOAL_RATIO}; 19 alternating rounds of 100)",
        big_median / small_median
    );
    ensure!(big_median / small_median <= GOAL_RATIO, "admission with the full pod cache costs more than {GOAL_RATIO}×");
    drop(empty);
    ctx.injector = Some(fresh);
    Ok(())
}
