//! Attacks by any client that can reach :8443, made the way an attacker would make them, against the
//! real release binary in its own process (2 workers, as on a 2-core node), while a canary creates
//! a **fresh TLS connection for every request** (as the API server's client may) and measures it.
//!
//! Pass criteria, per attack: zero canary failures and canary p99 ≤ 100 ms; over the whole run, the
//! server's peak RSS (VmHWM) ≤ the memory limit of the Deployment in `deploy/base/`. Every figure is
//! printed as a table row (the README's Reliability table comes from here).
//!
//! Run by `make hostile-load` (part of `make test`), which builds the release binary first; a
//! plain `cargo test` says how to run it and passes, like the e2e suite.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::fixtures::{admission_review, typical_pod};
use common::process::ServeProcess;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

const P99_LIMIT: Duration = Duration::from_millis(100);
const ATTACK_TIME: Duration = Duration::from_secs(6);

fn configmap_review(templates: &[(&str, String)]) -> Vec<u8> {
    let data: serde_json::Map<String, Value> =
        templates.iter().map(|(name, text)| (format!("{name}.yaml"), json!(text))).collect();
    let mut review = admission_review(&typical_pod(), "sidecar-injector", "attack");
    review["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "ConfigMap"});
    review["request"]["resource"] = json!({"group": "", "version": "v1", "resource": "configmaps"});
    review["request"]["name"] = json!("sidecar-templates");
    review["request"]["operation"] = json!("UPDATE");
    review["request"]["object"] = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "sidecar-templates", "namespace": "sidecar-injector", "labels": {"sidecar-injector.io/templates": "true"}},
        "data": data,
    });
    serde_json::to_vec(&review).unwrap()
}

/// The Deployment's memory limit in bytes, read from `deploy/base/deployment.yaml`.
fn deployment_memory_limit() -> u64 {
    let text = std::fs::read_to_string("deploy/base/deployment.yaml").unwrap();
    let line = text.lines().find(|l| l.contains("limits:") && l.contains("memory")).expect("a memory limit");
    let value = line.split("memory:").nth(1).unwrap().trim().trim_end_matches(['}', ' ']);
    let mebibytes: u64 = value.strip_suffix("Mi").expect("a limit in Mi").parse().unwrap();
    mebibytes * 1024 * 1024
}

fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Normal reviews, each on a new TCP + TLS connection, every 25 ms until stopped. It runs on a
/// thread and runtime of its own, as the API server is a process of its own: the attack's client
/// tasks must not delay the canary's client side and be counted as the server's latency.
fn canary(
    clients: impl Fn() -> reqwest::ClientBuilder + Send + 'static,
    url: String,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Vec<Duration>, usize)> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(canary_loop(clients, url, stop))
    })
}

async fn canary_loop(
    clients: impl Fn() -> reqwest::ClientBuilder,
    url: String,
    stop: Arc<AtomicBool>,
) -> (Vec<Duration>, usize) {
    let body = serde_json::to_vec(&admission_review(&typical_pod(), "shop", "canary")).unwrap();
    let mut latencies = Vec::new();
    let mut failures = 0;
    while !stop.load(Ordering::Relaxed) {
        // A new client per request: no pooled connection, no TLS session to resume.
        let client = clients().pool_max_idle_per_host(0).timeout(Duration::from_secs(10)).build().unwrap();
        let started = Instant::now();
        let answered = match client.post(&url).body(body.clone()).send().await {
            Ok(response) => response.status() == 200 && response.bytes().await.is_ok(),
            Err(_) => false,
        };
        match answered {
            true => latencies.push(started.elapsed()),
            false => failures += 1,
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    (latencies, failures)
}

/// Sends `body` to `path` from `parallel` loops until `deadline`; counts the answers by status.
async fn flood(server: &ServeProcess, path: &str, body: Vec<u8>, parallel: usize, deadline: Instant) -> String {
    let client = server.client_builder().timeout(Duration::from_secs(30)).build().unwrap();
    let url = server.url(path);
    let body = Arc::new(body);
    let tasks: Vec<_> = (0..parallel)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            tokio::spawn(async move {
                let mut answers: Vec<String> = Vec::new();
                while Instant::now() < deadline {
                    let answer = match client.post(&url).body(body.to_vec()).send().await {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let text: Value = r.json().await.unwrap_or(Value::Null);
                            let message = text["response"]["status"]["message"].as_str().unwrap_or("");
                            let allowed = text["response"]["allowed"].as_bool();
                            match (status, allowed) {
                                (200, Some(true)) => "200 allowed".to_owned(),
                                (200, Some(false)) if message.contains("sandbox limits") => {
                                    "200 refused: sandbox limits".into()
                                }
                                (200, Some(false)) if message.contains("one at a time") => "200 refused: busy".into(),
                                (200, Some(false)) if message.contains("ran out of time") => {
                                    "200 refused: out of time".into()
                                }
                                (200, Some(false)) => {
                                    format!("200 refused: {}", message.chars().take(60).collect::<String>())
                                }
                                (status, _) => format!("{status}"),
                            }
                        }
                        Err(e) => format!("error: {e}"),
                    };
                    answers.push(answer);
                }
                answers
            })
        })
        .collect();
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for task in tasks {
        for answer in task.await.unwrap() {
            *counts.entry(answer).or_default() += 1;
        }
    }
    counts.iter().map(|(answer, n)| format!("{n}× {answer}")).collect::<Vec<_>>().join(", ")
}

fn p99(latencies: &mut [Duration]) -> Duration {
    latencies.sort();
    latencies.get((latencies.len() * 99).div_ceil(100).saturating_sub(1)).copied().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn attacks_keep_a_fresh_connection_canary_fast_and_memory_within_the_deployment_limit() {
    let Some(binary) = std::env::var_os("SIDECAR_INJECTOR_BIN") else {
        eprintln!("hostile_load: not run (run `make hostile-load`, which builds the release binary first)");
        return;
    };
    let fds = common::raise_fd_limit(20_000);
    assert!(fds >= 16_000, "the test needs 16,000 file descriptors, the limit is {fds}");
    let server = ServeProcess::start_binary(
        std::path::Path::new(&binary),
        &[("SIDECAR_INJECTOR__SERVER__WORKERS", "2".into()), ("SIDECAR_INJECTOR__TELEMETRY__LOG_LEVEL", "warn".into())],
    )
    .await;
    let pid = server.child.id();
    let limit = deployment_memory_limit();
    let bomb =
        "inject:\n  annotations:\n    a: \"{% set x = 'x' * 100000000 ~ 'x' * 50000000 %}{{ x|length }}\"\n".to_owned();
    let cpu_hog = "inject:\n  annotations:\n    a: \"{% set x = 'x' * 20000000 %}{% for i in range(120) %}{{ (x|upper)|length }}{% endfor %}\"\n".to_owned();
    let mut worst = typical_pod();
    worst["metadata"]["annotations"]["note"] = json!("x".repeat(3 * 1024 * 1024 + 512 * 1024));
    let worst = serde_json::to_vec(&admission_review(&worst, "shop", "worst")).unwrap();

    type Attack<'a> = (&'a str, Box<dyn FnOnce(Instant) -> futures::future::BoxFuture<'a, String> + 'a>);
    let server_ref = &server;
    let attacks: Vec<Attack> = vec![
        (
            "3 ConfigMap checks at once, each the 150 MB string template",
            Box::new(|deadline| {
                Box::pin(flood(server_ref, "/validate", configmap_review(&[("evil", bomb.clone())]), 3, deadline))
            }),
        ),
        (
            "2 ConfigMap checks at once, each 3 CPU-hog templates (20 MB string, upper ×120)",
            Box::new(|deadline| {
                let templates: Vec<(&str, String)> =
                    vec![("a", cpu_hog.clone()), ("b", cpu_hog.clone()), ("c", cpu_hog.clone())];
                Box::pin(flood(server_ref, "/validate", configmap_review(&templates), 2, deadline))
            }),
        ),
        (
            "3,000 idle TCP connections (nothing sent)",
            Box::new(|deadline| {
                Box::pin(async move {
                    let mut held = Vec::new();
                    for _ in 0..3000 {
                        held.push(tokio::net::TcpStream::connect(("127.0.0.1", server_ref.https)).await.unwrap());
                    }
                    tokio::time::sleep_until(deadline.into()).await;
                    format!("{} held for {:.0} s", held.len(), ATTACK_TIME.as_secs_f64())
                })
            }),
        ),
        (
            "1,500 connections that send 1 byte of a ClientHello and stop",
            Box::new(|deadline| {
                Box::pin(async move {
                    let mut held = Vec::new();
                    for _ in 0..1500 {
                        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", server_ref.https)).await.unwrap();
                        let _ = tcp.write_all(&[0x16]).await;
                        held.push(tcp);
                    }
                    tokio::time::sleep_until(deadline.into()).await;
                    format!("{} held", held.len())
                })
            }),
        ),
        (
            "64 concurrent 3.5 MiB /mutate reviews",
            Box::new(|deadline| Box::pin(flood(server_ref, "/mutate", worst.clone(), 64, deadline))),
        ),
        (
            "64 concurrent 3.5 MiB /validate reviews",
            Box::new(|deadline| Box::pin(flood(server_ref, "/validate", worst.clone(), 64, deadline))),
        ),
        (
            "13,000 idle plain-HTTP connections to :8080",
            Box::new(|deadline| {
                Box::pin(async move {
                    // Past the listener's cap connects wait in the kernel: give each 20 ms.
                    let mut held = Vec::new();
                    for _ in 0..13_000 {
                        let connect = tokio::net::TcpStream::connect(("127.0.0.1", server_ref.http));
                        if let Ok(Ok(tcp)) = tokio::time::timeout(Duration::from_millis(20), connect).await {
                            held.push(tcp);
                        }
                        if Instant::now() >= deadline {
                            break;
                        }
                    }
                    tokio::time::sleep_until(deadline.into()).await;
                    format!("{} of 13,000 connected", held.len())
                })
            }),
        ),
    ];

    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for (name, attack) in attacks {
        let stop = Arc::new(AtomicBool::new(false));
        let canary_thread = canary(server.client_factory(), server.url("/mutate"), stop.clone());
        let deadline = Instant::now() + ATTACK_TIME;
        let attack = async {
            let outcome = attack(deadline).await;
            stop.store(true, Ordering::Relaxed);
            outcome
        };
        let outcome = attack.await;
        let (mut latencies, failures) = canary_thread.join().unwrap();
        let p99 = p99(&mut latencies);
        let ok = failures == 0 && p99 <= P99_LIMIT && latencies.len() >= 20;
        rows.push(format!(
            "| {name} | {outcome} | {} fresh connections, {failures} failed, p99 {} ms | {} |",
            latencies.len(),
            p99.as_millis(),
            if ok { "pass" } else { "FAIL" }
        ));
        if !ok {
            failed.push(name);
        }
        // Let the server drop what the attack left before the next one.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let peak = peak_rss(pid);
    println!("| attack | what the attacker got | canary (new TCP + TLS per request) | result |");
    println!("| --- | --- | --- | --- |");
    for row in &rows {
        println!("{row}");
    }
    println!(
        "peak RSS of the server over all attacks: {} MiB (Deployment memory limit {} MiB)",
        peak / 1024 / 1024,
        limit / 1024 / 1024
    );
    let ready = reqwest::get(server.ready_url()).await.unwrap().status();
    assert_eq!(ready, 200, "the server is not ready after the attacks");
    assert!(failed.is_empty(), "the canary failed or was slow during: {failed:?}");
    assert!(peak <= limit, "peak RSS {peak} over the Deployment's limit {limit}");
}
