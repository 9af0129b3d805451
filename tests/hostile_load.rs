//! Attacks by any client that can reach :8443, made the way an attacker would make them
//! (`tests/common/attacks.rs`), against the real release binary in its own process (2 workers, as
//! on a 2-core node), while a canary creates a **fresh TLS connection for every request** (as the
//! API server's client may) and measures it. The real-node suite runs the same attacks against the
//! injector's pod, inside its container's memory limit.
//!
//! Pass criteria, per attack: zero canary failures and canary p99 ≤ 100 ms; over the whole run, the
//! server's peak RSS (VmHWM) ≤ the memory limit of the Deployment in `deploy/base/`. Every figure is
//! printed as a table row (docs/reliability.md's table comes from here).
//!
//! Run by `make hostile-load` (part of `make test`), which builds the release binary first; a
//! plain `cargo test` says how to run it and passes, like the e2e suite.

mod common;

use common::attacks;
use common::process::ServeProcess;

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
    let report = attacks::run(&server.target()).await;
    let peak = peak_rss(pid);
    print!("{}", report.table());
    println!(
        "peak RSS of the server over all attacks: {} MiB (Deployment memory limit {} MiB)",
        peak / 1024 / 1024,
        limit / 1024 / 1024
    );
    let ready = reqwest::get(server.ready_url()).await.unwrap().status();
    assert_eq!(ready, 200, "the server is not ready after the attacks");
    assert!(report.failed.is_empty(), "the canary failed or was slow during: {:?}", report.failed);
    assert!(peak <= limit, "peak RSS {peak} over the Deployment's limit {limit}");
}
