//! The null webhook (`e2e/controlplane/cmd/nullwebhook`), the floor the injector's webhooks are
//! measured against: it answers every pod with a fixed JSONPatch, the injector's own patch for the
//! pod shape measured, so that the API server does the same work on the answer and only the
//! webhook's own cost differs. Shared by the load benchmark (`benches/server.rs`, part C) and the
//! scale run's churn phase (`tests/e2e/scale.rs`), which include this file by `#[path]` as a module
//! whose parent also has `controlplane` (`tests/e2e/controlplane.rs`) and `fixtures`
//! (`tests/common/fixtures.rs`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use super::controlplane::{ControlPlane, INJECTOR_HTTPS_PORT, Process, free_port};
use super::fixtures;

/// The typical Deployment pod as its controller creates it (`generateName`, no name, no
/// namespace), without the API token mount, so that one fixed patch fits every such pod.
pub fn bench_pod(generate_name: &str) -> Value {
    let mut pod = fixtures::typical_pod();
    pod["metadata"]["generateName"] = json!(generate_name);
    let metadata = pod["metadata"].as_object_mut().unwrap();
    metadata.remove("ownerReferences");
    metadata.remove("namespace");
    metadata.remove("name");
    pod["spec"]["serviceAccountName"] = json!("default");
    pod["spec"]["automountServiceAccountToken"] = json!(false);
    pod
}

/// The injector's JSONPatch for `pod` created in `namespace`, asked as the API server asks: `https`
/// trusts the injector's CA and presents the API server's webhook client certificate.
pub async fn injector_patch(https: &reqwest::Client, namespace: &str, pod: Value) -> Result<Vec<u8>> {
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "null-webhook-patch", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace,
        "operation": "CREATE", "userInfo": {"username": "bench"}, "object": pod}});
    let answer: Value = https
        .post(format!("https://127.0.0.1:{INJECTOR_HTTPS_PORT}/mutate"))
        .json(&review)
        .send()
        .await?
        .json()
        .await?;
    let patch = answer["response"]["patch"].as_str().context("the injector returned no patch")?;
    Ok(STANDARD.decode(patch)?)
}

/// A running null webhook.
pub struct NullWebhook {
    /// Stopped when dropped.
    pub process: Process,
    /// Its HTTP/1.1-only listener (what the API server speaks to a webhook behind a Service).
    pub port: u16,
    /// Its listener that offers HTTP/2 too, when asked for.
    pub port_h2: Option<u16>,
    /// The CA of its serving certificate, base64-encoded PEM, for a webhook's `caBundle`.
    pub ca_bundle: String,
}

/// Starts the null webhook in `dir` (its certificate, `patch.json` and log there), answering
/// `patch` on `/mutate` and nothing on `/validate`; with `h2`, on a second port that offers
/// HTTP/2 too.
pub fn start(plane: &ControlPlane, dir: &Path, patch: &[u8], h2: bool) -> Result<NullWebhook> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("patch.json"), patch)?;
    let now = time::OffsetDateTime::now_utc();
    let ca = sidecar_injector::certs::generate_ca("null webhook CA", now, 1)?;
    let serving = sidecar_injector::certs::issue(&ca, &["127.0.0.1".into()], now, 1)?;
    std::fs::write(dir.join("tls.crt"), &serving.cert)?;
    std::fs::write(dir.join("tls.key"), &serving.key)?;
    let port = free_port();
    let port_h2 = h2.then(free_port);
    let mut command = Command::new(plane.bin.join("nullwebhook"));
    command.args(["-listen", &format!("127.0.0.1:{port}")]);
    if let Some(port_h2) = port_h2 {
        command.args(["-listen-h2", &format!("127.0.0.1:{port_h2}")]);
    }
    command.arg("-cert").arg(dir.join("tls.crt"));
    command.arg("-key").arg(dir.join("tls.key")).arg("-patch").arg(dir.join("patch.json"));
    let process = Process::spawn("nullwebhook", command, dir)?;
    Ok(NullWebhook { process, port, port_h2, ca_bundle: STANDARD.encode(&ca.cert) })
}

/// Patches the injector's pod webhooks (both mutating entries and the pod validating entry) not
/// to see the namespaces labelled `key` with one of `values`: opted in, so the policies check
/// their pods, but served by something else.
pub fn not_for_the_injector(plane: &ControlPlane, key: &str, values: &[&str]) -> Result<()> {
    let not_ours = json!({"key": key, "operator": "NotIn", "values": values});
    for (kind, entries) in [("mutatingwebhookconfiguration", 2), ("validatingwebhookconfiguration", 1)] {
        let ops: Vec<Value> = (0..entries)
            .map(|i| json!({"op": "add", "path": format!("/webhooks/{i}/namespaceSelector/matchExpressions/-"), "value": not_ours}))
            .collect();
        plane.kubectl(&["patch", kind, "sidecar-injector", "--type=json", "-p", &Value::Array(ops).to_string()])?;
    }
    Ok(())
}

/// Polls a server-side dry run of `pod` in `namespace` until it comes back with a status
/// annotation: admission configurations and policies take a moment to take effect.
pub async fn wait_for_injection(client: &kube::Client, namespace: &str, pod: Value, what: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod: Pod = serde_json::from_value(pod)?;
    let start = Instant::now();
    loop {
        let dry = pods.create(&PostParams { dry_run: true, ..Default::default() }, &pod).await;
        if dry.is_ok_and(|p| p.metadata.annotations.unwrap_or_default().contains_key("sidecar-injector.io/status")) {
            return Ok(());
        }
        ensure!(start.elapsed() < Duration::from_secs(30), "{what} did not take effect");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
