//! The scale run (`make scale`, not part of `make test`): 10,000 pods in 1,000 opted-in namespaces
//! on KWOK's simulated nodes, with the drift watch on, and the figures the injector must meet:
//! resident memory against the pods it caches (fitted as a line: fixed + per pod), time to sync
//! after a start, the drift gauge against a recount from the API, the cost of an admission with
//! that cache against an injector with no pod cache (alternating rounds, one run), and what the
//! injector's start costs the API server (LIST calls and bytes).

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};

use crate::controlplane::{INJECTOR_HTTPS_PORT, Injector, curl};
use crate::scenarios::{Ctx, edit_tag_and_wait, pod, webhook_client};

const NAMESPACES: usize = 1_000;
const PODS_PER_NAMESPACE: usize = 10;
/// RSS goal: this much fixed ...
const GOAL_FIXED_MIB: f64 = 64.0;
/// ... plus this much per cached pod.
const GOAL_PER_POD_KIB: f64 = 2.0;

fn rss_kib(injector: &Injector) -> Result<f64> {
    let pid = injector.process.pid().context("the injector is not running")?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS")?;
    Ok(line.split_whitespace().nth(1).context("VmRSS value")?.parse()?)
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

/// The API server's LIST calls and LIST response bytes so far (all clients).
fn apiserver_lists(ctx: &Ctx) -> (f64, f64) {
    let token = "e2e-admin-token";
    let text = curl(&format!("{}/metrics", ctx.plane.url), Some(&ctx.plane.dir.join("ca.crt")), Some(token))
        .unwrap_or_default();
    let sum = |prefix: &str| {
        text.lines()
            .filter(|l| l.starts_with(prefix) && l.contains("verb=\"LIST\""))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>()
    };
    (sum("apiserver_request_total{"), sum("apiserver_response_sizes_sum{"))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The scale run.
pub async fn scale(ctx: &mut Ctx) -> Result<()> {
    let total = NAMESPACES * PODS_PER_NAMESPACE;
    // Drift counted every second, so the cache size is visible as soon as it changes.
    ctx.stop_injector();
    let injector =
        Injector::start(&ctx.plane, &ctx.binary, &[("SIDECAR_INJECTOR__CLUSTER__DRIFT_INTERVAL_SECONDS", "1")])?;
    wait_for_pods_watched(&injector, 0, Duration::from_secs(10)).await?;

    let names: Vec<String> = (0..NAMESPACES).map(|i| format!("scale-{i:04}")).collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": names.iter().map(|n| json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": n, "labels": {"sidecar-injector.io/inject": "enabled"}}})).collect::<Vec<_>>()});
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["apply", "-f", "-"], Some(&list.to_string()))?;
    let accounts: Api<ServiceAccount> = Api::all(ctx.client.clone());
    let start = Instant::now();
    loop {
        let made = accounts.list_metadata(&ListParams::default().fields("metadata.name=default")).await?.items;
        if made.iter().filter(|a| a.metadata.namespace.as_deref().is_some_and(|n| n.starts_with("scale-"))).count()
            == NAMESPACES
        {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(180),
            "the ServiceAccounts of {NAMESPACES} namespaces did not appear"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("      {NAMESPACES} namespaces ready in {:.1} s", start.elapsed().as_secs_f64());

    // Pods in five batches; the injector's RSS after each, once its cache holds them.
    let baseline_pods = gauge(&injector.metrics(), "sidecar_injector_pods_watched") as usize;
    let mut samples = vec![(baseline_pods as f64, rss_kib(&injector)?)];
    let batches = 5;
    let created_start = Instant::now();
    for batch in 0..batches {
        let from = batch * NAMESPACES / batches;
        let to = (batch + 1) * NAMESPACES / batches;
        let jobs = names[from..to].iter().flat_map(|ns| (0..PODS_PER_NAMESPACE).map(move |i| (ns.clone(), i)));
        let client = ctx.client.clone();
        let results: Vec<Result<()>> = futures::stream::iter(jobs)
            .map(|(ns, i)| {
                let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
                async move {
                    let mut p = pod(&format!("app-{i}"), json!({"app": "scale"}), json!({}));
                    p["spec"]["automountServiceAccountToken"] = json!(false);
                    let p: Pod = serde_json::from_value(p)?;
                    pods.create(&PostParams::default(), &p).await?;
                    Ok(())
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        for result in results {
            result?;
        }
        let count = baseline_pods + to * PODS_PER_NAMESPACE;
        wait_for_pods_watched(&injector, count, Duration::from_secs(120)).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        samples.push((count as f64, rss_kib(&injector)?));
    }
    let created = created_start.elapsed();
    println!(
        "      {total} pods created through the webhook in {:.1} s ({:.0} pods/s)",
        created.as_secs_f64(),
        total as f64 / created.as_secs_f64()
    );
    // Least squares: RSS = fixed + per_pod * pods.
    let n = samples.len() as f64;
    let (sx, sy) = samples.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (sxx, sxy) = samples.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x * x, b + x * y));
    let per_pod = (n * sxy - sx * sy) / (n * sxx - sx * sx);
    let fixed = (sy - per_pod * sx) / n;
    let worst = samples.iter().map(|(x, y)| (y - (fixed + per_pod * x)).abs()).fold(0.0, f64::max);
    for (pods, rss) in &samples {
        println!("      RSS with {pods:>6} pods cached: {:.1} MiB", rss / 1024.0);
    }
    println!(
        "      fit: RSS = {:.1} MiB + {:.2} KiB per pod (largest deviation from the line {:.1} MiB); goal {GOAL_FIXED_MIB} MiB + {GOAL_PER_POD_KIB} KiB per pod",
        fixed / 1024.0,
        per_pod,
        worst / 1024.0
    );
    let last = samples.last().map(|s| s.1).unwrap_or_default();
    let goal = GOAL_FIXED_MIB * 1024.0 + GOAL_PER_POD_KIB * total as f64;
    println!("      at {total} pods: {:.1} MiB against a goal of {:.1} MiB", last / 1024.0, goal / 1024.0);

    // Start afresh: time to sync, and what the start costs the API server.
    drop(injector);
    let (lists_before, bytes_before) = apiserver_lists(ctx);
    let started = Instant::now();
    let mut fresh =
        Injector::spawn(&ctx.plane, &ctx.binary, &[("SIDECAR_INJECTOR__CLUSTER__DRIFT_INTERVAL_SECONDS", "1")])?;
    fresh.wait_ready()?;
    let ready = started.elapsed();
    wait_for_pods_watched(&fresh, baseline_pods + total, Duration::from_secs(120)).await?;
    let synced = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (lists_after, bytes_after) = apiserver_lists(ctx);
    println!(
        "      restart: ready in {:.2} s, pod cache synced ({} pods) in {:.2} s; API server LIST calls {:.0}, {:.1} MiB of LIST responses",
        ready.as_secs_f64(),
        baseline_pods + total,
        synced.as_secs_f64(),
        lists_after - lists_before,
        (bytes_after - bytes_before) / 1024.0 / 1024.0
    );

    // The drift gauge against a recount from the API, after an edit makes every injected pod stale.
    edit_tag_and_wait(ctx, "scale-0000", "3.2.99", Duration::from_secs(10)).await?;
    let current = ctx.dry_run_pod("scale-0000", pod("probe", json!({}), json!({}))).await?;
    let current_hash = crate::scenarios::status(&current)
        .and_then(|s| s.templates.into_iter().find(|t| t.name == "log-shipper"))
        .map(|t| t.hash)
        .context("the probe was not injected")?;
    let all = Api::<Pod>::all(ctx.client.clone()).list_metadata(&ListParams::default()).await?.items;
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
            "namespace": "scale-0001", "operation": "CREATE", "userInfo": {"username": "bench"},
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
        "      admission with {total} pods cached: median {big_median:.0} µs; without a pod cache: {small_median:.0} µs; ratio {:.2} (goal ≤ 1.1; 19 alternating rounds of 100)",
        big_median / small_median
    );
    drop(empty);
    ctx.injector = Some(fresh);
    Ok(())
}
