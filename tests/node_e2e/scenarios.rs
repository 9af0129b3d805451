//! The real-node scenarios. Each asserts on what really ran: container processes and their cgroups,
//! logs, `kubectl exec`, exit codes, endpoints answering on pod IPs.

// The harness calls libc (signals, rlimits, mounts, an allocator) where `unsafe` is the only way.
#![allow(unsafe_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::{Value, json};

use crate::availability::{self, Row};
use crate::common::attacks;
use crate::controlplane::{ControlPlane, KUBERNETES_SERVICE_IP, curl};
use crate::node::Node;

/// The name the suite gives the built image it imports (`deploy/overlays/node-e2e` runs it).
pub const INJECTOR_IMAGE: &str = "localhost/sidecar-injector-e2e/sidecar-injector:e2e";
const BUSYBOX: &str = "localhost/sidecar-injector-e2e/busybox:1";
const FLUENT_BIT: &str = "localhost/sidecar-injector-e2e/fluent-bit:1";
const AGENT: &str = "localhost/sidecar-injector-e2e/agent:1";
const AGENT_FILES: &str = "localhost/sidecar-injector-e2e/agent-files:1";
/// The opted-in namespace of the workloads.
const SHOP: &str = "node-shop";
const INJECTOR_NS: &str = "sidecar-injector";
const INJECTOR_PODS: &str = "app.kubernetes.io/name=sidecar-injector,app.kubernetes.io/component=webhook";

/// A scenario.
pub type Scenario = fn(&mut Ctx) -> Result<()>;

/// What the scenarios share.
pub struct Ctx {
    pub plane: ControlPlane,
    pub node: Node,
    /// The injector's binary (the release build), for its command-line tools.
    pub binary: PathBuf,
}

impl Ctx {
    pub(crate) fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.plane.kubectl(args)
    }

    pub(crate) fn apply(&self, yaml: &str) -> Result<String> {
        self.plane.kubectl_as(&self.plane.admin_kubeconfig, &["apply", "-f", "-"], Some(yaml))
    }

    pub(crate) fn json(&self, args: &[&str]) -> Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        Ok(serde_json::from_str(&self.kubectl(&all)?)?)
    }

    /// The injector's command line with the admin's kubeconfig (as a user runs it).
    fn cli(&self, args: &[&str]) -> Result<String> {
        self.tool(&self.binary, args, &[])
    }

    /// Runs a command-line tool as the admin (their kubeconfig, plus `env`); its output, or an
    /// error with everything it printed.
    fn tool(&self, program: &std::path::Path, args: &[&str], env: &[(&str, PathBuf)]) -> Result<String> {
        let out = std::process::Command::new(program)
            .args(args)
            .env("KUBECONFIG", &self.plane.admin_kubeconfig)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .with_context(|| format!("running {}", program.display()))?;
        ensure!(
            out.status.success(),
            "{} {}: {}{}",
            program.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The injector's pods.
    pub(crate) fn injector_pods(&self) -> Result<Vec<Value>> {
        let list = self.json(&["-n", INJECTOR_NS, "get", "pods", "-l", INJECTOR_PODS])?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// The host PID of a container's first process, from containerd.
    pub(crate) fn container_pid(&self, container_id: &str) -> Result<u32> {
        let id = container_id.trim_start_matches("containerd://");
        let tasks = self.node.ctr(&["tasks", "ls"])?;
        tasks
            .lines()
            .find(|l| l.starts_with(id))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .with_context(|| format!("no running task for container {id}:\n{tasks}"))
    }

    /// The self-managed certificate Secret's data, decoded (`ca.crt`, `ca-bundle.crt`, ...).
    pub(crate) fn certificate_secret(&self) -> Result<std::collections::BTreeMap<String, String>> {
        self.secret_data("sidecar-injector-tls")
    }

    /// The data of a Secret of the injector's namespace, decoded.
    pub(crate) fn secret_data(&self, name: &str) -> Result<std::collections::BTreeMap<String, String>> {
        use base64::Engine as _;
        let secret = self.json(&["-n", INJECTOR_NS, "get", "secret", name])?;
        let mut data = std::collections::BTreeMap::new();
        for (key, value) in secret["data"].as_object().into_iter().flatten() {
            let bytes = base64::engine::general_purpose::STANDARD.decode(value.as_str().unwrap_or_default())?;
            data.insert(key.clone(), String::from_utf8(bytes)?);
        }
        Ok(data)
    }

    /// The caBundle of every webhook of the injector's two webhook configurations, decoded.
    pub(crate) fn ca_bundles(&self) -> Result<Vec<String>> {
        use base64::Engine as _;
        let mut bundles = Vec::new();
        for kind in ["mutatingwebhookconfiguration", "validatingwebhookconfiguration"] {
            let text = self.kubectl(&[
                "get",
                kind,
                "sidecar-injector",
                "-o",
                "jsonpath={.webhooks[*].clientConfig.caBundle}",
            ])?;
            for bundle in text.split_whitespace() {
                bundles.push(String::from_utf8(base64::engine::general_purpose::STANDARD.decode(bundle)?)?);
            }
        }
        Ok(bundles)
    }

    /// Waits until the webhook injects pods created in `namespace` (server-side dry run) with a
    /// log-shipper container that `want` accepts, several times in a row (so every replica serves
    /// it).
    pub(crate) fn wait_for_injection(&self, namespace: &str, want: impl Fn(&Value) -> bool) -> Result<()> {
        let pod = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: probe}}\nspec:\n  containers: [{{name: app, image: {BUSYBOX}}}]\n"
        );
        self.every_replica_serving("the webhook injecting through its Service", namespace, &pod, |p| {
            p["spec"]["initContainers"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["name"] == "log-shipper" && want(c)))
        })
    }

    /// Waits until a server-side dry run of `pod` (YAML) in `namespace` is stored as `served`
    /// accepts, six times in a row (so every replica behind the Service serves the templates it
    /// looks for).
    pub(crate) fn every_replica_serving(
        &self,
        what: &str,
        namespace: &str,
        pod: &str,
        served: impl Fn(&Value) -> bool,
    ) -> Result<()> {
        let mut in_a_row = 0;
        eventually(what, Duration::from_secs(90), || {
            let out = self.plane.kubectl_as(
                &self.plane.admin_kubeconfig,
                &["-n", namespace, "create", "--dry-run=server", "-o", "json", "-f", "-"],
                Some(pod),
            );
            let stored = out.ok().and_then(|o| serde_json::from_str::<Value>(&o).ok());
            in_a_row = if stored.as_ref().is_some_and(&served) { in_a_row + 1 } else { 0 };
            if in_a_row < 6 {
                std::thread::sleep(Duration::from_millis(250));
            }
            Ok((in_a_row >= 6).then_some(()))
        })
    }

    pub(crate) fn opted_in_namespace(&self, name: &str) -> Result<()> {
        self.apply(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n  labels: {{sidecar-injector.io/inject: enabled}}\n"
        ))?;
        eventually("the default ServiceAccount", Duration::from_secs(30), || {
            Ok(self.kubectl(&["-n", name, "get", "serviceaccount", "default"]).ok().map(|_| ()))
        })?;
        Ok(())
    }

    /// The running pods of a workload, by label selector.
    fn pods(&self, namespace: &str, selector: &str) -> Result<Vec<Value>> {
        let list = self.json(&["-n", namespace, "get", "pods", "-l", selector])?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// Stops the workloads so that kubelet stops their containers, then the node.
    pub fn teardown(&mut self) {
        let _ = self.kubectl(&["delete", "namespace", SHOP, "--wait=false"]);
        let _ = self.kubectl(&["-n", INJECTOR_NS, "scale", "deployment/sidecar-injector", "--replicas=0"]);
        let _ = eventually("pods gone", Duration::from_secs(60), || {
            let left = self.kubectl(&["get", "pods", "-A", "-o", "name"])?;
            Ok(left.trim().is_empty().then_some(()))
        });
        self.node.stop();
    }
}

/// A file of the memory cgroup a process is in, as a number.
fn memory_cgroup(pid: u32, file: &str) -> Result<u64> {
    memory_cgroup_up(pid, 0, file)
}

/// A file of the memory cgroup `levels` above the one a process is in (1: a container's pod), as
/// a number.
fn memory_cgroup_up(pid: u32, levels: usize, file: &str) -> Result<u64> {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let path =
        cgroup.lines().find_map(|l| l.split_once(":memory:")).map(|(_, p)| p.to_owned()).context("no memory cgroup")?;
    let mut dir = std::path::PathBuf::from(format!("/sys/fs/cgroup/memory{path}"));
    for _ in 0..levels {
        dir.pop();
    }
    let text = std::fs::read_to_string(dir.join(file)).with_context(|| format!("{}/{file}", dir.display()))?;
    Ok(text.trim().parse()?)
}

/// Polls `check` every 250 ms until it gives a value or `limit` passes.
pub(crate) fn eventually<T>(what: &str, limit: Duration, mut check: impl FnMut() -> Result<Option<T>>) -> Result<T> {
    let start = Instant::now();
    let mut last_error = None;
    loop {
        match check() {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(error) => last_error = Some(error),
        }
        if start.elapsed() > limit {
            match last_error {
                Some(error) => bail!("{what}: not within {limit:?} (last error: {error:#})"),
                None => bail!("{what}: not within {limit:?}"),
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn ready(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && pod["status"]["conditions"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn name(object: &Value) -> String {
    object["metadata"]["name"].as_str().unwrap_or_default().to_owned()
}

/// 1. `kubectl apply -k` of `deploy/` with only the image pointed at the local one: both replicas
///    Running and Ready under `enforce: restricted`, really non-root, read-only root, inside their
///    memory limit's cgroup; certificates written and caBundles set; `/readyz` and `/metrics` on
///    the pod IPs; the API server reaching `/mutate` through the Service.
pub fn n1_install(ctx: &mut Ctx) -> Result<()> {
    // The overlay changes nothing but the image (name, tag, pull policy).
    let shipped = ctx.kubectl(&["kustomize", "deploy"])?;
    let ours = ctx.kubectl(&["kustomize", "deploy/overlays/node-e2e"])?;
    let ours_as_shipped = ours
        .replace(INJECTOR_IMAGE, "ghcr.io/sidecar-injector/sidecar-injector:0.1.0")
        .replace("        imagePullPolicy: Never\n", "");
    ensure!(ours_as_shipped == shipped, "deploy/overlays/node-e2e changes more than the image");

    // The suite's `setup` installed it with `kubectl apply -k deploy/overlays/node-e2e`.
    ctx.kubectl(&["-n", INJECTOR_NS, "rollout", "status", "deployment/sidecar-injector", "--timeout=180s"])?;
    let enforce = ctx.kubectl(&[
        "get",
        "namespace",
        INJECTOR_NS,
        "-o",
        "jsonpath={.metadata.labels.pod-security\\.kubernetes\\.io/enforce}",
    ])?;
    ensure!(enforce == "restricted", "the injector's namespace enforces {enforce:?}, not restricted");
    // The level is really enforced there: a root pod is refused.
    let refused = ctx.plane.kubectl_as(
        &ctx.plane.admin_kubeconfig,
        &["-n", INJECTOR_NS, "create", "--dry-run=server", "-f", "-"],
        Some(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: root}}\nspec:\n  containers: [{{name: c, image: {BUSYBOX}, securityContext: {{runAsUser: 0}}}}]\n"
        )),
    );
    ensure!(
        refused.as_ref().is_err_and(|e| e.to_string().contains("violates PodSecurity \"restricted")),
        "a root pod was not refused by Pod Security in the injector's namespace: {refused:?}"
    );

    let pods = ctx.injector_pods()?;
    ensure!(pods.len() == 2, "{} injector pods, want 2", pods.len());
    for pod in &pods {
        ensure!(ready(pod), "injector pod {} is not Running and Ready", name(pod));
        let status = &pod["status"]["containerStatuses"][0];
        ensure!(status["restartCount"] == 0, "injector pod {} restarted: {status}", name(pod));
        let pid = ctx.container_pid(status["containerID"].as_str().unwrap_or_default())?;
        let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let uids = proc_status.lines().find(|l| l.starts_with("Uid:")).unwrap_or_default();
        ensure!(uids.split_whitespace().skip(1).all(|u| u == "65532"), "the injector runs as {uids:?}, not 65532");
        let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
        let root = mountinfo
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.get(4) == Some(&"/"))
            .context("no root mount")?;
        ensure!(root[5].split(',').any(|o| o == "ro"), "the root filesystem is mounted {:?}", root[5]);
        let limit = memory_cgroup(pid, "memory.limit_in_bytes")?;
        ensure!(limit == 256 << 20, "memory limit {limit} bytes, want 256Mi");

        // In-cluster credentials, and the API server reached through the `kubernetes` Service.
        let log = ctx.kubectl(&["-n", INJECTOR_NS, "logs", &name(pod)])?;
        let service = format!("\"server\":\"https://{KUBERNETES_SERVICE_IP}/\"");
        ensure!(log.contains(&service), "the injector did not use the kubernetes Service ({service}):\n{log}");

        let ip = pod["status"]["podIP"].as_str().context("no pod IP")?;
        let readyz = curl(&format!("http://{ip}:8080/readyz"), None, None);
        ensure!(readyz.is_some(), "/readyz on {ip}:8080 did not answer 200");
        let metrics = curl(&format!("http://{ip}:8080/metrics"), None, None).unwrap_or_default();
        ensure!(metrics.contains("sidecar_injector_"), "/metrics on {ip}:8080 has no sidecar_injector_ metrics");
    }

    let ca = ctx.certificate_secret()?.remove("ca-bundle.crt").unwrap_or_default();
    ensure!(ca.contains("BEGIN CERTIFICATE"), "the self-managed certificate Secret has no CA bundle");
    let bundles = ctx.ca_bundles()?;
    ensure!(bundles.len() == 4 && bundles.iter().all(|b| *b == ca), "a webhook's caBundle is not the Secret's CA");
    ctx.wait_for_injection(SHOP, |c| c["image"] == FLUENT_BIT)?;
    Ok(())
}

/// What every scenario stands on, done once before any of them runs, so that any selection of
/// scenarios passes: the install as a user makes it (`kubectl apply -k` of the node-e2e overlay),
/// the opted-in namespace, and the operator's edit that points the templates at the suite's local
/// images (no kubelet here can pull anything else).
pub fn setup(ctx: &mut Ctx) -> Result<()> {
    ctx.kubectl(&["apply", "-k", "deploy/overlays/node-e2e"])?;
    ctx.kubectl(&["-n", INJECTOR_NS, "rollout", "status", "deployment/sidecar-injector", "--timeout=180s"])?;
    ctx.opted_in_namespace(SHOP)?;
    // The shipped templates as installed, before the edit.
    ctx.wait_for_injection(SHOP, |c| c["image"] == "cr.fluentbit.io/fluent/fluent-bit:3.2.10")?;
    use_local_images(ctx)
}

/// Every image pull the kubelet attempted, as `namespace/pod: message`. The node has only the
/// suite's local images and no registry, so any attempt is a test naming an image it does not
/// have (its pod would sit in `ImagePullBackOff` until the test times out).
pub fn pull_attempts(ctx: &Ctx) -> Result<Vec<String>> {
    let events = ctx.json(&["get", "events", "--all-namespaces"])?;
    Ok(events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| match e["reason"].as_str() {
            Some("Pulling" | "ErrImageNeverPull") => true,
            Some("Failed" | "BackOff") => e["message"].as_str().is_some_and(|m| m.to_lowercase().contains("pull")),
            _ => false,
        })
        .map(|e| {
            format!(
                "{}/{}: {}",
                e["involvedObject"]["namespace"].as_str().unwrap_or_default(),
                e["involvedObject"]["name"].as_str().unwrap_or_default(),
                e["message"].as_str().unwrap_or_default()
            )
        })
        .collect())
}

/// One operator edit of the templates ConfigMap (`kubectl replace` of what `edit` makes of its data).
fn edit_templates(ctx: &Ctx, edit: impl FnOnce(&mut serde_json::Map<String, Value>) -> Result<()>) -> Result<()> {
    let mut configmap = ctx.json(&["-n", INJECTOR_NS, "get", "configmap", "sidecar-templates"])?;
    edit(configmap["data"].as_object_mut().context("no data")?)?;
    configmap["metadata"].as_object_mut().context("no metadata")?.remove("managedFields");
    ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["replace", "-f", "-"], Some(&configmap.to_string()))?;
    Ok(())
}

/// The operator's edit of the templates ConfigMap: the sidecar images pointed at the local
/// stand-ins, and one more template (a native sidecar with a startup probe).
fn use_local_images(ctx: &Ctx) -> Result<()> {
    edit_templates(ctx, |data| {
        let edit = |text: &Value, from: &str, to: &str| -> Result<Value> {
            let text = text.as_str().unwrap_or_default();
            ensure!(text.contains(from), "the shipped template no longer says {from:?}");
            Ok(Value::String(text.replace(from, to)))
        };
        data["log-shipper.yaml"] = edit(
            &data["log-shipper.yaml"],
            "image: cr.fluentbit.io/fluent/fluent-bit:3.2.10",
            &format!("image: {FLUENT_BIT}"),
        )?;
        data["otel-agent.yaml"] = edit(
            &data["otel-agent.yaml"],
            "image: otel/opentelemetry-collector-contrib:0.120.0",
            &format!("image: {AGENT}"),
        )?;
        data.insert(
        "port-agent.yaml".into(),
        Value::String(format!(
            r#"description: An agent the app needs from its first instruction (a startup probe holds the app back)
default: false
sidecarMode: native
values:
  image: {BUSYBOX}
inject:
  sidecars:
    - name: port-agent
      image: "{{{{ values.image }}}}"
      command: [/bin/sh, -c, "sleep 2; mkdir -p /tmp/www; echo agent-up > /tmp/www/index.html; exec httpd -f -p 8099 -h /tmp/www"]
      startupProbe:
        tcpSocket: {{port: 8099}}
        periodSeconds: 1
        failureThreshold: 30
"#
        )),
    );
        Ok(())
    })?;
    ctx.wait_for_injection(SHOP, |c| c["image"] == FLUENT_BIT)
}

/// The web Deployment (n2 looks into its pod, n4 drifts it), applied and rolled out; applying it
/// again changes nothing.
fn web_deployment(ctx: &Ctx) -> Result<()> {
    ctx.apply(&format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {SHOP}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app.kubernetes.io/name: web}}}}
  template:
    metadata:
      labels: {{app.kubernetes.io/name: web}}
      annotations: {{sidecar-injector.io/templates: "log-shipper,otel-agent"}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: app
          image: {BUSYBOX}
          imagePullPolicy: Never
          command: [/bin/sh, -c, 'echo "web app line from $(hostname)" >> /var/log/app/app.log; trap "exit 0" TERM; while true; do sleep 1; done']
"#
    ))?;
    ctx.kubectl(&["-n", SHOP, "rollout", "status", "deployment/web", "--timeout=120s"])?;
    Ok(())
}

/// 2. A Deployment whose app writes a line into the log directory the log-shipper template mounts:
///    the injected (native) sidecar really reads it, and the env the otel-agent template injects
///    is in the app container's environment, `$(VAR)` references expanded by kubelet.
pub fn n2_workloads(ctx: &mut Ctx) -> Result<()> {
    web_deployment(ctx)?;
    let pods = ctx.pods(SHOP, "app.kubernetes.io/name=web")?;
    let pod = pods.iter().find(|p| ready(p)).context("no Ready web pod")?;
    let pod_name = name(pod);
    let natives: Vec<&str> = pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["restartPolicy"] == "Always")
        .filter_map(|c| c["name"].as_str())
        .collect();
    ensure!(natives.contains(&"log-shipper") && natives.contains(&"otel-agent"), "native sidecars: {natives:?}");
    let line = format!("web app line from {pod_name}");
    eventually("the app's line in the log shipper's output", Duration::from_secs(30), || {
        let logs = ctx.kubectl(&["-n", SHOP, "logs", &pod_name, "-c", "log-shipper"])?;
        Ok(logs.contains(&line).then_some(()))
    })?;
    let env = ctx.kubectl(&["-n", SHOP, "exec", &pod_name, "-c", "app", "--", "env"])?;
    for want in [
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317".to_owned(),
        "OTEL_SERVICE_NAME=web".to_owned(),
        format!("OTEL_RESOURCE_ATTRIBUTES=k8s.namespace.name={SHOP},k8s.pod.name={pod_name}"),
    ] {
        ensure!(env.lines().any(|l| l == want), "{want:?} not in the app container's environment:\n{env}");
    }
    // The agent stand-in is up beside the app, on the port the injected env names.
    let agent = ctx.kubectl(&[
        "-n",
        SHOP,
        "exec",
        &pod_name,
        "-c",
        "app",
        "--",
        "sh",
        "-c",
        "nc -w 2 127.0.0.1 4317 </dev/null && echo open",
    ]);
    ensure!(agent.as_ref().is_ok_and(|o| o.contains("open")), "the agent's port is not open: {agent:?}");
    Ok(())
}

/// A Job's pod spec: the app checks the startup-probed agent's port first thing and exits.
fn job_template(templates: &str) -> String {
    format!(
        r#"    metadata:
      annotations: {{sidecar-injector.io/templates: "{templates}"}}
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 2
      containers:
        - name: app
          image: {BUSYBOX}
          imagePullPolicy: Never
          command: [/bin/sh, -c, 'printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 2 127.0.0.1 8099 | grep -q agent-up && echo "agent serving at start" && echo "job line" >> /var/log/app/app.log']
"#
    )
}

/// 3. A Job and a CronJob-made Job whose pods get native sidecars complete (kubelet stops the
///    sidecars once the app exits), and the startup-probed sidecar is serving before the app's
///    first instruction.
pub fn n3_jobs_complete(ctx: &mut Ctx) -> Result<()> {
    let template = job_template("log-shipper,port-agent");
    ctx.apply(&format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: report, namespace: {SHOP}}}\nspec:\n  backoffLimit: 0\n  template:\n{template}"
    ))?;
    let nested = template.lines().map(|l| format!("    {l}\n")).collect::<String>();
    ctx.apply(&format!(
        "apiVersion: batch/v1\nkind: CronJob\nmetadata: {{name: nightly, namespace: {SHOP}}}\nspec:\n  schedule: \"0 3 * * *\"\n  jobTemplate:\n    spec:\n      backoffLimit: 0\n      template:\n{nested}"
    ))?;
    ctx.kubectl(&["-n", SHOP, "create", "job", "nightly-now", "--from=cronjob/nightly"])?;
    for job in ["report", "nightly-now"] {
        let waited =
            ctx.kubectl(&["-n", SHOP, "wait", "--for=condition=Complete", &format!("job/{job}"), "--timeout=120s"]);
        if let Err(error) = waited {
            let pods = ctx
                .kubectl(&["-n", SHOP, "get", "pods", "-l", &format!("job-name={job}"), "-o", "wide"])
                .unwrap_or_default();
            bail!("job {job} did not complete: {error:#}\n{pods}");
        }
        let pods = ctx.pods(SHOP, &format!("job-name={job}"))?;
        ensure!(pods.len() == 1, "job {job}: {} pods (the first one should have succeeded)", pods.len());
        let pod = &pods[0];
        ensure!(pod["status"]["phase"] == "Succeeded", "job {job}'s pod is {}", pod["status"]["phase"]);
        // The app's first instruction reached the agent (without it the app fails, and the Job with it).
        let logs = ctx.kubectl(&["-n", SHOP, "logs", &name(pod), "-c", "app"])?;
        ensure!(logs.contains("agent serving at start"), "job {job}'s app did not find its agent serving: {logs:?}");
        // Both native sidecars were there, and kubelet stopped them after the app exited.
        let sidecars: Vec<&Value> = pod["status"]["initContainerStatuses"].as_array().into_iter().flatten().collect();
        let names: Vec<&str> = sidecars.iter().filter_map(|s| s["name"].as_str()).collect();
        ensure!(
            names.contains(&"log-shipper") && names.contains(&"port-agent"),
            "job {job}'s pod lacks its native sidecars: {names:?}"
        );
        for sidecar in sidecars {
            ensure!(
                sidecar["state"]["terminated"].is_object(),
                "job {job}: sidecar {} was not stopped: {}",
                sidecar["name"],
                sidecar["state"]
            );
        }
    }
    Ok(())
}

/// 9. Env merging as a container sees it: a template in a ConfigMap of its own merges into the
///    app's JAVA_TOOL_OPTIONS (literal), PYTHONPATH (valueFrom a ConfigMap), NODE_OPTIONS (from
///    envFrom) and AGENT_LIBS (in no source of a second container; in the first, whose envFrom
///    source lacks it, the documented `$(AGENT_LIBS)` left as written); the Job's containers print
///    the values the kubelet gave them.
pub fn n9_env_merge(ctx: &mut Ctx) -> Result<()> {
    ctx.apply(&format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: env-merge-templates
  namespace: {INJECTOR_NS}
  labels: {{sidecar-injector.io/templates: "true"}}
data:
  agent-env.yaml: |
    description: Agents loaded through the app's own variables
    inject:
      appContainers:
        env:
          - {{name: JAVA_TOOL_OPTIONS, value: "-javaagent:/otel/agent.jar", merge: {{append: " "}}}}
          - {{name: PYTHONPATH, value: /otel/python, merge: {{prepend: ":"}}}}
          - {{name: NODE_OPTIONS, value: "--require /otel/node.js", merge: {{append: " "}}}}
          - {{name: AGENT_LIBS, value: /otel/lib.so, merge: {{append: ":"}}}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: app-env, namespace: {SHOP}}}
data: {{NODE_OPTIONS: "--max-old-space-size=64"}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: python-path, namespace: {SHOP}}}
data: {{path: /app/py}}
"#
    ))?;
    let probe = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: probe, annotations: {{sidecar-injector.io/templates: agent-env}}}}\nspec:\n  containers: [{{name: app, image: {BUSYBOX}}}]\n"
    );
    ctx.every_replica_serving("every replica serving the new template", SHOP, &probe, |p| {
        let text = p.to_string();
        text.contains("agent-env") && text.contains("AGENT_LIBS")
    })?;
    ctx.apply(&format!(
        r#"apiVersion: batch/v1
kind: Job
metadata: {{name: env-merge, namespace: {SHOP}}}
spec:
  backoffLimit: 0
  template:
    metadata:
      annotations: {{sidecar-injector.io/templates: agent-env}}
    spec:
      restartPolicy: Never
      containers:
        - name: app
          image: {BUSYBOX}
          imagePullPolicy: Never
          command: [/bin/sh, -c, 'echo "J=$JAVA_TOOL_OPTIONS"; echo "P=$PYTHONPATH"; echo "N=$NODE_OPTIONS"; echo "L=$AGENT_LIBS"']
          env:
            - {{name: JAVA_TOOL_OPTIONS, value: "-Xmx64m -Dfile.encoding=UTF-8"}}
            - name: PYTHONPATH
              valueFrom: {{configMapKeyRef: {{name: python-path, key: path}}}}
          envFrom:
            - configMapRef: {{name: app-env}}
        - name: plain
          image: {BUSYBOX}
          imagePullPolicy: Never
          command: [/bin/sh, -c, 'echo "L=$AGENT_LIBS"']
"#
    ))?;
    let waited = ctx.kubectl(&["-n", SHOP, "wait", "--for=condition=Complete", "job/env-merge", "--timeout=90s"]);
    let pods = ctx.pods(SHOP, "job-name=env-merge")?;
    let pod = pods.first().context("no pod of job env-merge")?;
    waited.with_context(|| format!("job env-merge did not complete: {}", pod["status"]))?;
    let logs = ctx.kubectl(&["-n", SHOP, "logs", &name(pod), "-c", "app"])?;
    for want in [
        "J=-Xmx64m -Dfile.encoding=UTF-8 -javaagent:/otel/agent.jar",
        "P=/otel/python:/app/py",
        "N=--max-old-space-size=64 --require /otel/node.js",
        "L=$(AGENT_LIBS):/otel/lib.so",
    ] {
        ensure!(logs.lines().any(|l| l == want), "{want:?} is not what the container got:\n{logs}");
    }
    let plain = ctx.kubectl(&["-n", SHOP, "logs", &name(pod), "-c", "plain"])?;
    ensure!(plain.trim() == "L=/otel/lib.so", "the container without the variable got {plain:?}");
    // The author's entries are untouched and first; the status names the merged entries.
    let env = &pod["spec"]["containers"][0]["env"];
    ensure!(env[0]["value"] == "-Xmx64m -Dfile.encoding=UTF-8" && env[1]["valueFrom"].is_object(), "{env}");
    let status = pod["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap_or_default();
    ensure!(
        status.contains(r#""envMerges":["JAVA_TOOL_OPTIONS=$(JAVA_TOOL_OPTIONS) -javaagent:/otel/agent.jar""#),
        "{status}"
    );
    ctx.kubectl(&["-n", SHOP, "delete", "job", "env-merge", "--wait=false"])?;
    ctx.kubectl(&["-n", INJECTOR_NS, "delete", "configmap", "env-merge-templates"])?;
    Ok(())
}

/// 10. Native sidecars by the nodes' kubelets, as the real kubelet runs them: beside the real
///     1.37 node, a Node object reporting a 1.28 kubelet (never schedulable) makes a pod that may
///     run anywhere get a classic log-shipper container, while a pod pinned to the real node gets
///     a native one; both start on the real kubelet as decided.
pub fn n10_native_by_nodes(ctx: &mut Ctx) -> Result<()> {
    ctx.apply(
        r#"apiVersion: v1
kind: Node
metadata:
  name: upgrade-pending
  labels: {kubernetes.io/hostname: upgrade-pending}
spec:
  unschedulable: true
  taints: [{key: e2e/not-a-real-node, effect: NoSchedule}]
status:
  nodeInfo: {kubeletVersion: v1.28.15}
"#,
    )?;
    let pod = |name: &str, pinned: bool| {
        let selector = if pinned {
            format!("  nodeSelector: {{kubernetes.io/hostname: {}}}\n", crate::node::NODE_NAME)
        } else {
            String::new()
        };
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {SHOP}, annotations: {{sidecar-injector.io/templates: log-shipper}}}}\nspec:\n{selector}  terminationGracePeriodSeconds: 1\n  containers:\n    - name: app\n      image: {BUSYBOX}\n      imagePullPolicy: Never\n      command: [/bin/sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']\n"
        )
    };
    // Waits until a dry run of the unpinned pod gets its log-shipper in `list` (`containers`:
    // classic, `initContainers`: native), that is until the injector sees the nodes as `what`.
    let log_shipper_in = |list: &str, what: &str| {
        eventually(what, Duration::from_secs(30), || {
            let out = ctx.plane.kubectl_as(
                &ctx.plane.admin_kubeconfig,
                &["create", "--dry-run=server", "-o", "json", "-f", "-"],
                Some(&pod("probe", false)),
            )?;
            let stored: Value = serde_json::from_str(&out)?;
            let found = stored["spec"][list].as_array().is_some_and(|c| c.iter().any(|c| c["name"] == "log-shipper"));
            Ok(found.then_some(()))
        })
    };
    log_shipper_in("containers", "the 1.28 node deciding")?;
    ctx.apply(&pod("anywhere", false))?;
    ctx.apply(&pod("pinned", true))?;
    for name in ["anywhere", "pinned"] {
        ctx.kubectl(&["-n", SHOP, "wait", "--for=condition=Ready", &format!("pod/{name}"), "--timeout=90s"])?;
    }
    let anywhere = ctx.json(&["-n", SHOP, "get", "pod", "anywhere"])?;
    let running = |statuses: &Value| {
        statuses
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s["name"] == "log-shipper" && s["state"]["running"].is_object()))
    };
    ensure!(
        running(&anywhere["status"]["containerStatuses"]),
        "no running classic log-shipper: {}",
        anywhere["status"]
    );
    let pinned = ctx.json(&["-n", SHOP, "get", "pod", "pinned"])?;
    ensure!(
        running(&pinned["status"]["initContainerStatuses"]),
        "no running native log-shipper on the real kubelet: {}",
        pinned["status"]
    );
    ctx.kubectl(&["-n", SHOP, "delete", "pod", "anywhere", "pinned", "--wait=false"])?;
    ctx.kubectl(&["delete", "node", "upgrade-pending"])?;
    // The scenarios after this one expect native sidecars again.
    log_shipper_in("initContainers", "the 1.28 node gone")?;
    Ok(())
}

/// 11. Pod-level resources (KEP-2837) on the real kubelet: a Guaranteed pod whose `spec.resources`
///     equal what its app requests (the API server refused it after an unpadded injection) gets
///     the log-shipper padded in, runs with the sidecar, and its pod cgroup carries the padded
///     memory limit.
pub fn n11_pod_level_resources(ctx: &mut Ctx) -> Result<()> {
    ctx.apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: budgeted, namespace: {SHOP}, annotations: {{sidecar-injector.io/templates: log-shipper}}}}
spec:
  terminationGracePeriodSeconds: 1
  resources:
    requests: {{cpu: 200m, memory: 128Mi}}
    limits: {{cpu: 200m, memory: 128Mi}}
  containers:
    - name: app
      image: {BUSYBOX}
      imagePullPolicy: Never
      resources: {{requests: {{cpu: 200m, memory: 128Mi}}}}
      command: [/bin/sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
"#
    ))?;
    ctx.kubectl(&["-n", SHOP, "wait", "--for=condition=Ready", "pod/budgeted", "--timeout=90s"])?;
    let pod = ctx.json(&["-n", SHOP, "get", "pod", "budgeted"])?;
    // The shipped log-shipper: requests 10m/32Mi, limits 200m/64Mi; Guaranteed pads both alike.
    let limits = &pod["spec"]["resources"]["limits"];
    ensure!(limits["memory"] == "192Mi" && limits["cpu"] == "400m", "pod-level limits {limits}");
    ensure!(pod["status"]["qosClass"] == "Guaranteed", "QoS class {}", pod["status"]["qosClass"]);
    let sidecar = pod["status"]["initContainerStatuses"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "log-shipper"))
        .context("no log-shipper status")?;
    ensure!(sidecar["state"]["running"].is_object(), "the log-shipper is not running: {sidecar}");
    let app = pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "app"))
        .context("no app status")?;
    let pid = ctx.container_pid(app["containerID"].as_str().unwrap_or_default())?;
    let limit = memory_cgroup_up(pid, 1, "memory.limit_in_bytes")?;
    ensure!(limit == 192 << 20, "the pod cgroup's memory limit is {limit} bytes, not the padded 192Mi");
    ctx.kubectl(&["-n", SHOP, "delete", "pod", "budgeted", "--wait=false"])?;
    Ok(())
}

/// 12. In-place resizes (KEP-1287) of an enforced native sidecar on the real kubelet: below what
///     its template sets the resize is refused; above it, and the app's own container, the kubelet
///     applies it in place (no restart, same container), as the `resizePolicy` the injection gave
///     the sidecar says. `kubectl debug --target` at the enforced sidecar is refused, at the app
///     it runs.
pub fn n12_enforced_resize(ctx: &mut Ctx) -> Result<()> {
    ctx.apply(&format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: resize-templates
  namespace: {INJECTOR_NS}
  labels: {{sidecar-injector.io/templates: "true"}}
data:
  meter.yaml: |
    description: A metering agent every tier=metered pod runs with its resources
    enforced: true
    podSelector: {{matchLabels: {{tier: metered}}}}
    inject:
      sidecars:
        - name: meter
          image: {BUSYBOX}
          imagePullPolicy: Never
          command: [/bin/sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
          resources: {{requests: {{cpu: 50m, memory: 32Mi}}, limits: {{memory: 64Mi}}}}
"#
    ))?;
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: metered, namespace: {SHOP}, labels: {{tier: metered}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: app
      image: {BUSYBOX}
      imagePullPolicy: Never
      resources: {{requests: {{cpu: 100m}}}}
      command: [/bin/sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
"#
    );
    // Every replica serves the template before the pod is created (six dry runs in a row).
    ctx.every_replica_serving("every replica serving the enforced template", SHOP, &pod, |p| {
        all_containers(p).any(|c| c["name"] == "meter")
    })?;
    ctx.apply(&pod)?;
    ctx.kubectl(&["-n", SHOP, "wait", "--for=condition=Ready", "pod/metered", "--timeout=90s"])?;
    let meter_status = |pod: &Value| -> Option<Value> {
        pod["status"]["initContainerStatuses"].as_array()?.iter().find(|s| s["name"] == "meter").cloned()
    };
    let before = ctx.json(&["-n", SHOP, "get", "pod", "metered"])?;
    let started = meter_status(&before).context("no native meter")?;
    let resize = |list: &str, container: &str, cpu: &str| {
        let patch = json!({"spec": {list: [{"name": container, "resources": {"requests": {"cpu": cpu}}}]}});
        let args = ["-n", SHOP, "patch", "pod", "metered", "--subresource", "resize", "-p", &patch.to_string()];
        ctx.kubectl(&args)
    };
    let refused = resize("initContainers", "meter", "10m").err().context("meter resized to 10m")?.to_string();
    // Refused by the enforcement policy or the webhook, whichever the API server asks first.
    ensure!(refused.contains("template meter is enforced for this pod") && refused.contains("below"), "{refused}");
    println!("      meter to cpu 10m refused: {}", refused.lines().last().unwrap_or_default());
    resize("initContainers", "meter", "80m")?;
    resize("containers", "app", "60m")?;
    // The kubelet applies both in place: the allocated resources change, the containers do not.
    let after = eventually("the kubelet applying the resizes", Duration::from_secs(60), || {
        let pod = ctx.json(&["-n", SHOP, "get", "pod", "metered"])?;
        let meter = meter_status(&pod).context("no meter status")?;
        let app = pod["status"]["containerStatuses"].as_array().and_then(|s| s.first()).cloned().unwrap_or_default();
        let applied = meter["resources"]["requests"]["cpu"] == "80m" && app["resources"]["requests"]["cpu"] == "60m";
        Ok(applied.then_some(pod))
    })?;
    let meter = meter_status(&after).context("no meter status")?;
    ensure!(
        meter["containerID"] == started["containerID"] && meter["restartCount"] == 0,
        "the meter was restarted: {meter} (was {started})"
    );
    ensure!(after["status"]["containerStatuses"][0]["restartCount"] == 0, "the app was restarted");
    // The injection wrote the policy the kubelet followed: cpu and memory resize without a restart.
    let meter_spec = after["spec"]["initContainers"].as_array().and_then(|l| l.iter().find(|c| c["name"] == "meter"));
    let in_place = json!([{"resourceName": "cpu", "restartPolicy": "NotRequired"},
        {"resourceName": "memory", "restartPolicy": "NotRequired"}]);
    ensure!(meter_spec.is_some_and(|m| m["resizePolicy"] == in_place), "the meter's resizePolicy: {meter_spec:?}");
    println!(
        "      meter (resizePolicy NotRequired, written by the injection) to cpu 80m and the app to 60m applied in place, no restart"
    );
    // `kubectl debug --target` runs an ephemeral container in a container's process namespace:
    // at the enforced meter it is refused; at the app it runs, and sees the app's processes.
    let debug = |name: &str, target: &str| {
        let image = format!("--image={BUSYBOX}");
        let target = format!("--target={target}");
        let args =
            ["-n", SHOP, "debug", "metered", &image, "--image-pull-policy=Never", &target, "-c", name, "--", "ps"];
        ctx.kubectl(&args)
    };
    let refused = debug("peek-meter", "meter").err().context("kubectl debug --target=meter ran")?.to_string();
    // Refused by the enforcement policy or the webhook, whichever the API server asks first.
    ensure!(
        refused.contains("template meter is enforced for this pod: ephemeral container") && refused.contains("meter"),
        "{refused}"
    );
    println!("      kubectl debug --target=meter refused: {}", refused.lines().last().unwrap_or_default());
    debug("peek-app", "app")?;
    let seen = eventually("the ephemeral container at the app to finish", Duration::from_secs(60), || {
        let pod = ctx.json(&["-n", SHOP, "get", "pod", "metered"])?;
        let statuses = pod["status"]["ephemeralContainerStatuses"].as_array().cloned().unwrap_or_default();
        let done = statuses.iter().any(|s| s["name"] == "peek-app" && s["state"]["terminated"]["exitCode"] == 0);
        Ok(done.then_some(()))
    });
    let logs = ctx.kubectl(&["-n", SHOP, "logs", "metered", "-c", "peek-app"]).unwrap_or_default();
    seen.with_context(|| format!("its output: {logs}"))?;
    ensure!(logs.contains("while true"), "the app's processes not seen from its debug container: {logs}");
    println!("      kubectl debug --target=app ran and saw the app's processes");
    ctx.kubectl(&["-n", SHOP, "delete", "pod", "metered", "--wait=false"])?;
    ctx.kubectl(&["-n", INJECTOR_NS, "delete", "configmap", "resize-templates"])?;
    Ok(())
}

/// 13. `drift --in-place` on the real kubelet: after an image edit of a native and a classic
///     sidecar's templates, the update swaps both sidecars' images in the running pod; the kubelet
///     restarts just those two containers (the app keeps its container ID and restart count), the
///     pod is no longer stale, and what the kubelet did to the native sidecar and the pod's
///     readiness while it did it is printed.
pub fn n13_in_place_upgrade(ctx: &mut Ctx) -> Result<()> {
    let templates = |image: &str| {
        format!(
            r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: upgrade-templates
  namespace: {INJECTOR_NS}
  labels: {{sidecar-injector.io/templates: "true"}}
data:
  upgrade-native.yaml: |
    description: A native agent upgraded in place
    sidecarMode: native
    values: {{image: "{image}"}}
    inject:
      sidecars:
        - name: native-agent
          image: "{{{{ values.image }}}}"
          imagePullPolicy: Never
          command: [/bin/sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
  upgrade-classic.yaml: |
    description: A classic agent upgraded in place
    sidecarMode: container
    inject:
      sidecars:
        - name: classic-agent
          image: "{image}"
          imagePullPolicy: Never
          command: [/bin/sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
"#
        )
    };
    let pod = |name: &str| {
        format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: {SHOP}, annotations: {{sidecar-injector.io/templates: "upgrade-native,upgrade-classic"}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: app
      image: {BUSYBOX}
      imagePullPolicy: Never
      command: [/bin/sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
"#
        )
    };
    // Every replica serves `image` (six dry runs in a row give it to both agents).
    let served = |image: &str| {
        ctx.every_replica_serving(&format!("every replica serving {image}"), SHOP, &pod("probe"), |p| {
            let agents = all_containers(p).filter(|c| c["name"].as_str().is_some_and(|n| n.ends_with("-agent")));
            agents.filter(|c| c["image"] == image).count() == 2
        })
    };
    ctx.apply(&templates(BUSYBOX))?;
    served(BUSYBOX)?;
    ctx.apply(&pod("upgradable"))?;
    ctx.kubectl(&["-n", SHOP, "wait", "--for=condition=Ready", "pod/upgradable", "--timeout=90s"])?;
    let before = ctx.json(&["-n", SHOP, "get", "pod", "upgradable"])?;
    for name in ["app", "native-agent", "classic-agent"] {
        ensure!(status_of(&before, name)["state"]["running"].is_object(), "{name} not running: {}", before["status"]);
    }

    // The edit: both agents get another image (the fluent-bit stand-in: busybox with a script).
    ctx.apply(&templates(FLUENT_BIT))?;
    served(FLUENT_BIT)?;
    let plan = ctx.cli(&["drift", "--namespace", SHOP, "--in-place", "--dry-run"])?;
    let changes = format!("classic-agent: {BUSYBOX} → {FLUENT_BIT}, native-agent: {BUSYBOX} → {FLUENT_BIT}");
    ensure!(plan.contains(&format!("pod/upgradable: would update in place: {changes}")), "{plan}");

    // The update, watched: the pod's readiness every 200 ms while the run waits for the agents.
    let mut run = std::process::Command::new(&ctx.binary)
        .args(["drift", "--namespace", SHOP, "--in-place", "--rollout-timeout", "120"])
        .env("KUBECONFIG", &ctx.plane.admin_kubeconfig)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let started = Instant::now();
    let (mut samples, mut not_ready_samples) = (0, 0);
    while run.try_wait()?.is_none() {
        let pod = ctx.json(&["-n", SHOP, "get", "pod", "upgradable"])?;
        samples += 1;
        not_ready_samples += usize::from(!ready(&pod));
        ensure!(started.elapsed() < Duration::from_secs(180), "drift --in-place did not finish");
        std::thread::sleep(Duration::from_millis(200));
    }
    let took = started.elapsed();
    let output = run.wait_with_output()?;
    let said = String::from_utf8_lossy(&output.stdout);
    ensure!(output.status.success(), "drift --in-place failed: {said}{}", String::from_utf8_lossy(&output.stderr));
    ensure!(
        said.contains("pod/upgradable: updated in place") && said.contains("their new containers run after"),
        "{said}"
    );

    let after = ctx.json(&["-n", SHOP, "get", "pod", "upgradable"])?;
    let (app_before, app_after) = (status_of(&before, "app"), status_of(&after, "app"));
    ensure!(
        app_after["containerID"] == app_before["containerID"]
            && app_after["restartCount"] == app_before["restartCount"],
        "the app was restarted: {app_after} (was {app_before})"
    );
    for name in ["native-agent", "classic-agent"] {
        let (was, now) = (status_of(&before, name), status_of(&after, name));
        ensure!(
            now["state"]["running"].is_object() && now["containerID"] != was["containerID"],
            "{name} not replaced: {now}"
        );
        let image = all_containers(&after).find(|c| c["name"] == name).map(|c| c["image"].clone());
        ensure!(image == Some(json!(FLUENT_BIT)), "{name}'s image: {image:?}");
        println!(
            "      {name}: new container running {}, restart count {} → {}",
            now["image"], was["restartCount"], now["restartCount"]
        );
    }
    ensure!(ready(&after), "the pod is not Ready after the update");
    // What the kubelet did to the native sidecar: stopped the old container (its TERM trap exits 0)
    // and started one of the new image, as for any container whose image changes.
    let native = status_of(&after, "native-agent");
    let old = &native["lastState"]["terminated"];
    println!(
        "      native-agent: old container ended {} (exit {}, {}), new one started {}; the pod's Ready condition {} (since {}); {not_ready_samples} of {samples} samples not Ready during the {:.1} s run",
        old["finishedAt"],
        old["exitCode"],
        old["reason"],
        native["state"]["running"]["startedAt"],
        if ready_since(&after) == ready_since(&before) { "never changed" } else { "changed" },
        ready_since(&after),
        took.as_secs_f64()
    );
    let report: Value = serde_json::from_str(&ctx.cli(&["drift", "--namespace", SHOP, "-o", "json"])?)?;
    let listed = report.as_array().into_iter().flatten().any(|w| w["workload"]["name"] == "upgradable");
    ensure!(!listed, "still drifted after the in-place update: {report}");
    ctx.kubectl(&["-n", SHOP, "delete", "pod", "upgradable", "--wait=false"])?;
    ctx.kubectl(&["-n", INJECTOR_NS, "delete", "configmap", "upgrade-templates"])?;
    Ok(())
}

/// 16. A scheduling gate on the real node: a template's gate keeps the pod off the node
///     (`SchedulingGated`, no node, no container started) until its controller (here, the test)
///     lifts it with an update, which `/validate` allows; the pod then runs with the template's
///     sidecar, and `drift` counts it current (the lifted gate is no doubt).
pub fn n16_scheduling_gate(ctx: &mut Ctx) -> Result<()> {
    ctx.apply(&format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: gate-templates
  namespace: {INJECTOR_NS}
  labels: {{sidecar-injector.io/templates: "true"}}
data:
  prepared.yaml: |
    description: Holds tier=gated pods until their node is prepared, then runs a helper beside them
    default: true
    podSelector: {{matchLabels: {{tier: gated}}}}
    inject:
      schedulingGates:
        - name: e2e.example/prepared
      sidecars:
        - name: helper
          image: {BUSYBOX}
          imagePullPolicy: Never
          command: [/bin/sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
"#
    ))?;
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: gated, namespace: {SHOP}, labels: {{tier: gated}}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: app
      image: {BUSYBOX}
      imagePullPolicy: Never
      command: [/bin/sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
"#
    );
    ctx.every_replica_serving("every replica serving the gated template", SHOP, &pod, |p| {
        p["spec"]["schedulingGates"] == json!([{"name": "e2e.example/prepared"}])
    })?;
    ctx.apply(&pod)?;
    let reason = |pod: &Value| -> Option<String> {
        let conditions = pod["status"]["conditions"].as_array()?;
        conditions.iter().find(|c| c["type"] == "PodScheduled").and_then(|c| c["reason"].as_str()).map(str::to_owned)
    };
    eventually("the pod SchedulingGated", Duration::from_secs(30), || {
        let now = ctx.json(&["-n", SHOP, "get", "pod", "gated"])?;
        Ok((reason(&now).as_deref() == Some("SchedulingGated")).then_some(()))
    })?;
    // Held: a few seconds later still no node and no container.
    std::thread::sleep(Duration::from_secs(3));
    let held = ctx.json(&["-n", SHOP, "get", "pod", "gated"])?;
    ensure!(held["spec"]["nodeName"].is_null(), "a gated pod was bound to {}", held["spec"]["nodeName"]);
    ensure!(held["status"]["containerStatuses"].is_null(), "a gated pod's containers: {}", held["status"]);
    println!("      held SchedulingGated: no node, no container");
    let started = Instant::now();
    ctx.kubectl(&[
        "-n",
        SHOP,
        "patch",
        "pod",
        "gated",
        "--type=json",
        "-p",
        r#"[{"op": "remove", "path": "/spec/schedulingGates"}]"#,
    ])?;
    ctx.kubectl(&["-n", SHOP, "wait", "--for=condition=Ready", "pod/gated", "--timeout=90s"])?;
    let running = ctx.json(&["-n", SHOP, "get", "pod", "gated"])?;
    let helper = status_of(&running, "helper");
    ensure!(helper["state"]["running"].is_object(), "the helper is not running: {helper}");
    println!(
        "      the gate lifted by an update; Ready with the helper {:.1} s later",
        started.elapsed().as_secs_f64()
    );
    let report: Value = serde_json::from_str(&ctx.cli(&["drift", "--namespace", SHOP, "-o", "json"])?)?;
    let listed = report.as_array().into_iter().flatten().any(|w| w["workload"]["name"] == "gated");
    ensure!(!listed, "the pod whose gate was lifted is listed as drifted: {report}");
    ctx.kubectl(&["-n", SHOP, "delete", "pod", "gated", "--wait=false"])?;
    ctx.kubectl(&["-n", INJECTOR_NS, "delete", "configmap", "gate-templates"])?;
    Ok(())
}

/// 17. Pod Security on the real node: in a namespace that enforces `restricted`, a pod that meets
///     the level gets the hardened helper and not the traffic-capture init container (which only
///     `privileged` admits), the status saying why; the API server admits it and it runs Ready on
///     the real kubelet, seccomp `RuntimeDefault` and a non-root user applied by runc.
pub fn n17_pod_security(ctx: &mut Ctx) -> Result<()> {
    const RESTRICTED: &str = "node-restricted";
    ctx.kubectl(&["create", "namespace", RESTRICTED])?;
    ctx.kubectl(&[
        "label",
        "namespace",
        RESTRICTED,
        "sidecar-injector.io/inject=enabled",
        "pod-security.kubernetes.io/enforce=restricted",
    ])?;
    let result = pod_security(ctx, RESTRICTED);
    let _ = ctx.kubectl(&["-n", INJECTOR_NS, "delete", "configmap", "psa-templates"]);
    let _ = ctx.kubectl(&["delete", "namespace", RESTRICTED, "--wait=false"]);
    result
}

fn pod_security(ctx: &mut Ctx, namespace: &str) -> Result<()> {
    let hardened = "securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}, runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}";
    ctx.apply(&format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: psa-templates
  namespace: {INJECTOR_NS}
  labels: {{sidecar-injector.io/templates: "true"}}
data:
  psa-helper.yaml: |
    description: A helper every Pod Security level admits
    default: true
    podSelector: {{matchLabels: {{tier: psa}}}}
    inject:
      sidecars:
        - name: helper
          image: {BUSYBOX}
          imagePullPolicy: Never
          command: [/bin/sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
          {hardened}
  psa-net.yaml: |
    description: Traffic capture, which only the privileged level admits
    default: true
    podSelector: {{matchLabels: {{tier: psa}}}}
    inject:
      initContainers:
        - name: net-init
          image: {BUSYBOX}
          imagePullPolicy: Never
          command: [/bin/true]
          securityContext: {{capabilities: {{add: [NET_ADMIN, NET_RAW], drop: [ALL]}}}}
"#
    ))?;
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: restricted, namespace: {namespace}, labels: {{tier: psa}}}}
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {{runAsNonRoot: true, runAsUser: 65534, seccompProfile: {{type: RuntimeDefault}}}}
  containers:
    - name: app
      image: {BUSYBOX}
      imagePullPolicy: Never
      command: [/bin/sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
      securityContext: {{allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}
"#
    );
    let left_out = |p: &Value| {
        let status = p["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().unwrap_or_default();
        status.contains("template psa-net: the namespace enforces Pod Security")
    };
    ctx.every_replica_serving("every replica serving the psa templates", namespace, &pod, |p| {
        all_containers(p).any(|c| c["name"] == "helper") && left_out(p)
    })?;
    let started = Instant::now();
    ctx.apply(&pod)?;
    ctx.kubectl(&["-n", namespace, "wait", "--for=condition=Ready", "pod/restricted", "--timeout=90s"])?;
    let running = ctx.json(&["-n", namespace, "get", "pod", "restricted"])?;
    let names: Vec<Value> = all_containers(&running).map(|c| c["name"].clone()).collect();
    // Beside the shipped default templates' containers (log-shipper meets restricted in this pod).
    let has = |name: &str| names.contains(&json!(name));
    ensure!(has("helper") && has("app") && !has("net-init"), "containers {names:?}");
    ensure!(left_out(&running), "the status does not say why: {}", running["metadata"]["annotations"]);
    let helper = status_of(&running, "helper");
    ensure!(helper["state"]["running"].is_object(), "the helper is not running: {helper}");
    println!(
        "      admitted at restricted with the helper, net-init left out with the reason; Ready {:.1} s after create",
        started.elapsed().as_secs_f64()
    );
    ctx.kubectl(&["-n", namespace, "delete", "pod", "restricted", "--wait=false"])?;
    Ok(())
}

/// The status of a pod's container of that name, init containers first (`Null` when it has none).
fn status_of(pod: &Value, name: &str) -> Value {
    ["initContainerStatuses", "containerStatuses"]
        .iter()
        .flat_map(|list| pod["status"][list].as_array().cloned().unwrap_or_default())
        .find(|s| s["name"] == name)
        .unwrap_or_default()
}

/// 14. Image volumes on the real kubelet (1.37, containerd 2.2): a pod pinned to the real node gets
///     the agent as an image volume, and its app reads the agent's files through it, whole and
///     through a subPath mount (which containerd 2.2 applies); beside it a Node object reporting a
///     1.34 kubelet (never schedulable) makes a pod that may run anywhere get the template's
///     fallback, whose copy init container really fills the emptyDir the app then reads the same
///     files from. How long each pod took to become Ready is printed.
pub fn n14_image_volumes(ctx: &mut Ctx) -> Result<()> {
    ctx.apply(&format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: image-volume-templates
  namespace: {INJECTOR_NS}
  labels: {{sidecar-injector.io/templates: "true"}}
data:
  agent-files.yaml: |
    description: An agent as an image volume, or copied into an emptyDir where a node cannot mount one
    inject:
      volumes:
        - name: agent
          image: {{reference: "{AGENT_FILES}", pullPolicy: IfNotPresent}}
          fallback:
            initContainer:
              name: copy-agent
              image: {AGENT_FILES}
              imagePullPolicy: Never
              command: [cp, -R, /agent, /copy/]
              volumeMounts: [{{name: agent, mountPath: /copy}}]
      appContainers:
        volumeMounts:
          - {{name: agent, mountPath: /opt/agent, readOnly: true}}
          - {{name: agent, mountPath: /opt/agent-only, subPath: agent, readOnly: true}}
---
apiVersion: v1
kind: Node
metadata:
  name: image-volumes-pending
  labels: {{kubernetes.io/hostname: image-volumes-pending}}
spec:
  unschedulable: true
  taints: [{{key: e2e/not-a-real-node, effect: NoSchedule}}]
status:
  nodeInfo: {{kubeletVersion: v1.34.2, containerRuntimeVersion: "containerd://2.2.0"}}
"#
    ))?;
    let pod = |name: &str, pinned: bool| {
        let selector = match pinned {
            true => format!("  nodeSelector: {{kubernetes.io/hostname: {}}}\n", crate::node::NODE_NAME),
            false => String::new(),
        };
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {SHOP}, annotations: {{sidecar-injector.io/templates: agent-files}}}}\nspec:\n{selector}  terminationGracePeriodSeconds: 1\n  containers:\n    - name: app\n      image: {BUSYBOX}\n      imagePullPolicy: Never\n      command: [/bin/sh, -c, 'cat /opt/agent/agent/VERSION /opt/agent-only/VERSION; ls /opt/agent-only; trap \"exit 0\" TERM; while true; do sleep 1; done']\n"
        )
    };
    // Every replica sees the template and the 1.34 node: a dry run of the unpinned pod gets the
    // fallback.
    ctx.every_replica_serving("every replica serving the fallback", SHOP, &pod("probe", false), |p| {
        p["spec"]["volumes"]
            .as_array()
            .is_some_and(|v| v.iter().any(|v| v["name"] == "agent" && v["emptyDir"].is_object()))
    })?;
    // One after the other, so that each one's time to Ready is its own.
    let mut ready_after = Vec::new();
    for name in ["agent-anywhere", "agent-pinned"] {
        let started = Instant::now();
        ctx.apply(&pod(name, name == "agent-pinned"))?;
        ctx.kubectl(&["-n", SHOP, "wait", "--for=condition=Ready", &format!("pod/{name}"), "--timeout=90s"])?;
        ready_after.push(started.elapsed().as_secs_f64());
        let stored = ctx.json(&["-n", SHOP, "get", "pod", name])?;
        let volume =
            stored["spec"]["volumes"].as_array().and_then(|v| v.iter().find(|v| v["name"] == "agent")).cloned();
        let image_volume = volume.as_ref().is_some_and(|v| v["image"]["reference"] == AGENT_FILES);
        ensure!(image_volume == (name == "agent-pinned"), "{name}: volume {volume:?}");
        let logs = ctx.kubectl(&["-n", SHOP, "logs", name, "-c", "app"])?;
        let lines: Vec<&str> = logs.lines().collect();
        // The whole image (or copy), then the subPath mount's own file and its folder's listing:
        // `agent` as a folder there would mean the subPath was ignored.
        ensure!(
            lines.starts_with(&["agent-files 1", "agent-files 1"]) && lines[2..] == ["VERSION", "lib"],
            "{name}: the app read {lines:?}"
        );
    }
    let copied = ctx.json(&["-n", SHOP, "get", "pod", "agent-anywhere"])?;
    let copy = &copied["status"]["initContainerStatuses"][0];
    ensure!(
        copy["name"] == "copy-agent" && copy["state"]["terminated"]["exitCode"] == 0,
        "the fallback's copy did not run: {copy}"
    );
    println!(
        "      fallback (copied by copy-agent): Ready {:.1} s after create; image volume: Ready {:.1} s after create (the app read the agent's files through both, and through a subPath mount)",
        ready_after[0], ready_after[1]
    );
    ctx.kubectl(&["-n", SHOP, "delete", "pod", "agent-anywhere", "agent-pinned", "--wait=false"])?;
    ctx.kubectl(&["delete", "node", "image-volumes-pending"])?;
    ctx.kubectl(&["-n", INJECTOR_NS, "delete", "configmap", "image-volume-templates"])?;
    Ok(())
}

/// Every container of a pod as stored, init containers first.
fn all_containers(pod: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers"].into_iter().flat_map(move |f| pod["spec"][f].as_array().into_iter().flatten())
}

/// When the pod's Ready condition last changed.
fn ready_since(pod: &Value) -> Value {
    let conditions = pod["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conditions.into_iter().find(|c| c["type"] == "Ready").map(|c| c["lastTransitionTime"].clone()).unwrap_or_default()
}

/// 4. A template edit in the ConfigMap → `drift` lists the Deployment's old pod → `drift --restart`
///    → a new pod Running and Ready with the new template, the old one gone.
pub fn n4_drift_restart(ctx: &mut Ctx) -> Result<()> {
    web_deployment(ctx)?;
    let mut old: Vec<String> = ctx.pods(SHOP, "app.kubernetes.io/name=web")?.iter().map(name).collect();
    old.sort();
    ensure!(!old.is_empty(), "no web pods to drift");
    set_flush_seconds(ctx, 2)?;

    // The old pod is listed as stale once the edit is in service.
    let stale = |report: &Value| -> Vec<String> {
        report
            .as_array()
            .into_iter()
            .flatten()
            .filter(|w| w["workload"].to_string().contains("\"web\""))
            .flat_map(|w| w["stalePods"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p.as_str().map(str::to_owned))
            .collect()
    };
    eventually("drift listing the web pod as stale", Duration::from_secs(60), || {
        let report: Value = serde_json::from_str(&ctx.cli(&["drift", "--namespace", SHOP, "-o", "json"])?)?;
        let mut listed = stale(&report);
        listed.sort();
        Ok((listed == old).then_some(()))
    })?;
    let done = ctx.cli(&["drift", "--namespace", SHOP, "--restart", "--rollout-timeout", "120"])?;
    ensure!(done.contains("deployment/web"), "drift --restart: {done}");
    let fresh = eventually("the web pods replaced", Duration::from_secs(120), || {
        let pods = ctx.pods(SHOP, "app.kubernetes.io/name=web")?;
        let replaced = !pods.is_empty() && pods.iter().all(|p| ready(p) && !old.contains(&name(p)));
        Ok(replaced.then_some(pods))
    })?;
    for pod in &fresh {
        let args = pod["spec"]["initContainers"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "log-shipper"))
            .map(|c| c["args"].to_string())
            .unwrap_or_default();
        ensure!(args.contains("--flush=2"), "pod {} does not carry the edited template: {args}", name(pod));
    }
    let after: Value = serde_json::from_str(&ctx.cli(&["drift", "--namespace", SHOP, "-o", "json"])?)?;
    ensure!(stale(&after).is_empty(), "deployment/web still drifted after the restart: {after}");
    Ok(())
}

/// 5. The injector scaled to zero: a pod in an opted-in namespace is refused by the
///    ValidatingAdmissionPolicy with its message; scaled back, the same pod is created, injected
///    and running.
pub fn n5_injector_down(ctx: &mut Ctx) -> Result<()> {
    ctx.kubectl(&["-n", INJECTOR_NS, "scale", "deployment/sidecar-injector", "--replicas=0"])?;
    eventually("the injector's pods gone", Duration::from_secs(90), || {
        Ok(ctx.injector_pods()?.is_empty().then_some(()))
    })?;
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: lonely, namespace: {SHOP}}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
    - name: app
      image: {BUSYBOX}
      imagePullPolicy: Never
      command: [/bin/sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
"#
    );
    let refused = ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["create", "-f", "-"], Some(&pod));
    ensure!(
        refused.as_ref().is_err_and(|e| e.to_string().contains("sidecar injection did not happen")),
        "with the injector down the pod was not refused by the policy: {refused:?}"
    );
    ctx.kubectl(&["-n", INJECTOR_NS, "scale", "deployment/sidecar-injector", "--replicas=2"])?;
    ctx.kubectl(&["-n", INJECTOR_NS, "rollout", "status", "deployment/sidecar-injector", "--timeout=120s"])?;
    eventually("the same pod created", Duration::from_secs(60), || {
        Ok(ctx.plane.kubectl_as(&ctx.plane.admin_kubeconfig, &["create", "-f", "-"], Some(&pod)).ok())
    })?;
    let running = eventually("the pod Running and Ready", Duration::from_secs(60), || {
        let pod = ctx.json(&["-n", SHOP, "get", "pod", "lonely"])?;
        Ok(ready(&pod).then_some(pod))
    })?;
    ensure!(
        running["metadata"]["annotations"]["sidecar-injector.io/status"].is_string(),
        "the pod created after the injector came back was not injected"
    );
    Ok(())
}

/// 6. The attacks of `make hostile-load` sent to an injector **pod** (its pod IP), inside its real
///    memory limit: the container is not OOM-killed or restarted, and the fresh-connection canary
///    stays within the same p99 bound with no failure.
pub fn n6_attacks_on_the_pod(ctx: &mut Ctx) -> Result<()> {
    let pods = ctx.injector_pods()?;
    let pod = pods.iter().find(|p| ready(p)).context("no Ready injector pod")?;
    let status = &pod["status"]["containerStatuses"][0];
    let (container, restarts) = (status["containerID"].clone(), status["restartCount"].clone());
    let ip: std::net::IpAddr = pod["status"]["podIP"].as_str().context("no pod IP")?.parse()?;
    let ca = ctx.certificate_secret()?.remove("ca-bundle.crt").context("no CA bundle")?;
    let target = attacks::Target {
        ip,
        https: 8443,
        http: 8080,
        server_name: format!("sidecar-injector.{INJECTOR_NS}.svc"),
        ca_pem: ca.into_bytes(),
        namespace: SHOP.into(),
    };
    let fds = crate::common::raise_fd_limit(20_000);
    ensure!(fds >= 16_000, "the attacks need 16,000 file descriptors, the limit is {fds}");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?;
    let report = runtime.block_on(attacks::run(&target));
    print!("{}", report.table());

    let after = ctx.json(&["-n", INJECTOR_NS, "get", "pod", &name(pod)])?;
    let status = &after["status"]["containerStatuses"][0];
    let pid = ctx.container_pid(status["containerID"].as_str().unwrap_or_default())?;
    let read = |file: &str| memory_cgroup(pid, file);
    let (peak, limit, failcnt) =
        (read("memory.max_usage_in_bytes")?, read("memory.limit_in_bytes")?, read("memory.failcnt")?);
    println!(
        "      the pod's container over all attacks: peak {} MiB of its {} MiB limit (cgroup), {failcnt} allocation(s) over the limit",
        peak >> 20,
        limit >> 20
    );
    ensure!(
        status["containerID"] == container && status["restartCount"] == restarts,
        "the injector container restarted during the attacks: {}",
        status
    );
    ensure!(status["lastState"]["terminated"].is_null(), "the container was terminated: {}", status["lastState"]);
    ensure!(curl(&target.ready_url(), None, None).is_some(), "the pod is not ready after the attacks");
    ensure!(report.failed.is_empty(), "the canary failed or was slow during: {:?}", report.failed);
    Ok(())
}

/// Sets the log-shipper template's `flushSeconds` in the templates ConfigMap (one operator edit).
fn set_flush_seconds(ctx: &Ctx, seconds: u32) -> Result<()> {
    edit_templates(ctx, |data| {
        let text = data["log-shipper.yaml"].as_str().unwrap_or_default().to_owned();
        let line = text.lines().find(|l| l.trim_start().starts_with("flushSeconds:")).context("no flushSeconds")?;
        data["log-shipper.yaml"] = Value::String(text.replace(line, &format!("  flushSeconds: {seconds}")));
        Ok(())
    })
}

/// Every pod carries one consistent version of the log-shipper template: the hash in its status
/// annotation always goes with the same rendered `--flush` argument.
fn one_version_each(pods: &[Value]) -> Result<()> {
    let mut seen = std::collections::BTreeMap::<String, String>::new();
    for pod in pods {
        let status: Value = serde_json::from_str(
            pod["metadata"]["annotations"]["sidecar-injector.io/status"].as_str().context("a pod without status")?,
        )?;
        let hash = status["templates"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["name"] == "log-shipper"))
            .map(|t| t["hash"].to_string())
            .context("no log-shipper in the status")?;
        let flush = pod["spec"]["initContainers"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "log-shipper"))
            .and_then(|c| c["args"].as_array())
            .and_then(|a| a.iter().filter_map(|a| a.as_str()).find(|a| a.starts_with("--flush=")))
            .context("no --flush argument")?
            .to_owned();
        if let Some(other) = seen.insert(hash.clone(), flush.clone())
            && other != flush
        {
            bail!("template version {hash} injected as both {other} and {flush}");
        }
    }
    Ok(())
}

/// The injector's pods' (name, containerID, restartCount).
fn injector_containers(ctx: &Ctx) -> Result<Vec<(String, String, u64)>> {
    Ok(ctx
        .injector_pods()?
        .iter()
        .map(|p| {
            let status = &p["status"]["containerStatuses"][0];
            (
                name(p),
                status["containerID"].as_str().unwrap_or_default().to_owned(),
                status["restartCount"].as_u64().unwrap_or_default(),
            )
        })
        .collect())
}

/// `/mutate` requests each injector pod has answered: (pod name, count).
fn mutate_counts(ctx: &Ctx) -> Result<Vec<(String, f64)>> {
    let mut counts = Vec::new();
    for pod in ctx.injector_pods()? {
        let ip = pod["status"]["podIP"].as_str().unwrap_or_default().to_owned();
        let metrics = curl(&format!("http://{ip}:8080/metrics"), None, None).unwrap_or_default();
        let count = metrics
            .lines()
            .filter(|l| l.starts_with("sidecar_injector_admission_requests_total{endpoint=\"mutate\""))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum();
        counts.push((name(&pod), count));
    }
    Ok(counts)
}

/// Sends `signal` to the process of the injector replica that serves the API server's requests
/// now (the API server keeps its connections to one replica while one is enough), and waits
/// until kubelet has restarted it and both replicas are Ready again.
fn signal_a_replica(ctx: &Ctx, signal: i32) -> Result<()> {
    let before = mutate_counts(ctx)?;
    std::thread::sleep(Duration::from_secs(1));
    let after = mutate_counts(ctx)?;
    let busiest = after
        .iter()
        .map(|(pod, n)| (pod, n - before.iter().find(|(p, _)| p == pod).map_or(0.0, |(_, b)| *b)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(pod, _)| pod.clone())
        .context("no injector pod")?;
    let (pod, container, restarts) =
        injector_containers(ctx)?.into_iter().find(|(p, _, _)| *p == busiest).context("the busiest pod is gone")?;
    let pid = ctx.container_pid(&container)?;
    // SAFETY: kill(2) on a process id; no memory is shared.
    ensure!(unsafe { libc::kill(pid as i32, signal) } == 0, "kill {signal} {pid} failed");
    eventually("the replica restarted and both Ready", Duration::from_secs(120), || {
        let now = injector_containers(ctx)?;
        let restarted = now.iter().any(|(p, _, r)| *p == pod && *r > restarts);
        let pods = ctx.injector_pods()?;
        Ok((restarted && pods.len() == 2 && pods.iter().all(ready)).then_some(()))
    })
}

fn rollout(ctx: &Ctx, change: &[&str]) -> Result<()> {
    ctx.kubectl(change)?;
    ctx.kubectl(&["-n", INJECTOR_NS, "rollout", "status", "deployment/sidecar-injector", "--timeout=180s"])?;
    Ok(())
}

/// A CA rotation of the self-managed certificates, as when the CA nears its end: the CA certificate
/// in the Secret is re-signed (same key and name) to expire in 20 days, inside the 30 days before
/// expiry in which the replicas rotate it; returns once both replicas serve a certificate of the
/// new CA and every caBundle trusts it.
fn rotate_the_ca(ctx: &Ctx) -> Result<()> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    let before = ctx.certificate_secret()?;
    let field =
        |data: &std::collections::BTreeMap<String, String>, key: &str| data.get(key).cloned().unwrap_or_default();
    let (original, key) = (field(&before, "ca.crt"), field(&before, "ca.key"));
    // The CA as `certs::generate_ca` makes it (its name, constraints and key usages), ending soon.
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(rcgen::DnType::CommonName, "sidecar-injector CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + time::Duration::days(20);
    let ending = params.self_signed(&rcgen::KeyPair::from_pem(&key)?)?.pem();
    let patch = json!({"data": {"ca.crt": b64.encode(&ending)}}).to_string();
    ctx.kubectl(&["-n", INJECTOR_NS, "patch", "secret", "sidecar-injector-tls", "--type=merge", "-p", &patch])?;
    let new_ca = eventually("the CA rotated (published, then promoted)", Duration::from_secs(90), || {
        let now = ctx.certificate_secret()?;
        let ca = field(&now, "ca.crt");
        let done = !now.contains_key("next-ca.crt") && ca != ending && ca != original && field(&now, "ca.key") != key;
        Ok(done.then_some(ca))
    })?;
    eventually("both replicas serving from the new CA", Duration::from_secs(60), || {
        Ok((replicas_trusted_by(ctx, &new_ca)? == (2, 2)).then_some(()))
    })?;
    ensure!(ctx.ca_bundles()?.iter().all(|b| b.contains(new_ca.trim())), "a caBundle does not hold the new CA");
    Ok(())
}

/// Creates that may fail when a replica dies or hangs: the ones in flight to it at that moment
/// (the API server fails open and the policy refuses them). docs/reliability.md promises this figure.
const KILLED_REPLICA_FAILURES: usize = 5;

/// 7. Availability under load (20 pod creates per second, a quarter through a ReplicaSet) through
///    upgrades, crashes, template edits and an API server restart; prints the table.
pub fn n7_availability(ctx: &mut Ctx) -> Result<()> {
    const NS: &str = "node-load";
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let client = runtime.block_on(ctx.plane.admin_client())?;
    ctx.opted_in_namespace(NS)?;
    ctx.wait_for_injection(NS, |_| true)?;
    let next_image = INJECTOR_IMAGE.replace(":e2e", ":e2e-next");
    ctx.node.ctr(&["images", "tag", INJECTOR_IMAGE, &next_image])?;

    let mut rows: Vec<Row> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let record = |(row, pods): (Row, Vec<Value>),
                  allowed: usize,
                  versions: bool,
                  failures: &mut Vec<String>,
                  rows: &mut Vec<Row>| {
        if row.without_injection > 0 {
            failures.push(format!("{}: {} pods stored without injection", row.event, row.without_injection));
        }
        let failed = row.failed + row.replica_set_refusals as usize;
        if failed > allowed {
            failures
                .push(format!("{}: {failed} failed creates, at most {allowed} allowed ({:?})", row.event, row.errors));
        }
        if versions && let Err(error) = one_version_each(&pods) {
            failures.push(format!("{}: {error:#}", row.event));
        }
        println!("      {}", row.line());
        rows.push(row);
    };

    let restart = &["-n", INJECTOR_NS, "rollout", "restart", "deployment/sidecar-injector"];
    let m = availability::measure(ctx, &runtime, &client, NS, "rollout restart", |ctx| rollout(ctx, restart))?;
    record(m, 0, false, &mut failures, &mut rows);
    let image = format!("sidecar-injector={next_image}");
    let set_image = &["-n", INJECTOR_NS, "set", "image", "deployment/sidecar-injector", image.as_str()];
    let m = availability::measure(ctx, &runtime, &client, NS, "new image tag", |ctx| rollout(ctx, set_image))?;
    record(m, 0, false, &mut failures, &mut rows);
    // The replicas check the certificate Secret every 2 s instead of 5 min, so a rotation is quick.
    let interval = "SIDECAR_INJECTOR__TLS__CHECK_INTERVAL_SECONDS=2";
    rollout(ctx, &["-n", INJECTOR_NS, "set", "env", "deployment/sidecar-injector", interval])?;
    let m = availability::measure(ctx, &runtime, &client, NS, "CA rotation", |ctx| rotate_the_ca(ctx))?;
    record(m, 0, false, &mut failures, &mut rows);
    let m = availability::measure(ctx, &runtime, &client, NS, "a replica SIGKILLed", |ctx| {
        signal_a_replica(ctx, libc::SIGKILL)
    })?;
    record(m, KILLED_REPLICA_FAILURES, false, &mut failures, &mut rows);
    let m = availability::measure(ctx, &runtime, &client, NS, "a replica hung (SIGSTOP)", |ctx| {
        signal_a_replica(ctx, libc::SIGSTOP)
    })?;
    record(m, KILLED_REPLICA_FAILURES, false, &mut failures, &mut rows);
    let m = availability::measure(ctx, &runtime, &client, NS, "a template edit", |ctx| set_flush_seconds(ctx, 3))?;
    record(m, 0, true, &mut failures, &mut rows);
    let m = availability::measure(ctx, &runtime, &client, NS, "10 template edits in 10 s", |ctx| {
        for seconds in 10..20 {
            set_flush_seconds(ctx, seconds)?;
            std::thread::sleep(Duration::from_secs(1));
        }
        Ok(())
    })?;
    record(m, 0, true, &mut failures, &mut rows);
    let m = availability::measure(ctx, &runtime, &client, NS, "API server restarted", |ctx| {
        ctx.plane.stop_apiserver();
        std::thread::sleep(Duration::from_secs(2));
        ctx.plane.start_apiserver()?;
        Ok(())
    })?;
    record(m, usize::MAX, false, &mut failures, &mut rows);
    // The injector's watches reconnected to the restarted API server: an edit made now is served.
    set_flush_seconds(ctx, 42)?;
    ctx.wait_for_injection(NS, |c| c["args"].as_array().is_some_and(|a| a.iter().any(|a| a == "--flush=42")))
        .context("a template edit after the API server restarted")?;

    println!("{}", availability::HEADER);
    for row in &rows {
        println!("{}", row.line());
        for error in &row.errors {
            println!("        e.g. {error}");
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("; "));
    Ok(())
}

/// Helm with the admin's kubeconfig and its caches, config and data in the suite's scratch
/// directory (nothing left in the user's home).
fn helm(ctx: &Ctx, args: &[&str]) -> Result<String> {
    let helm = std::env::var_os("SIDECAR_INJECTOR_HELM")
        .context("SIDECAR_INJECTOR_HELM is not set (make node-e2e sets it)")?;
    let home = ctx.plane.dir.join("helm");
    let env = [
        ("HELM_CACHE_HOME", home.join("cache")),
        ("HELM_CONFIG_HOME", home.join("config")),
        ("HELM_DATA_HOME", home.join("data")),
    ];
    ctx.tool(std::path::Path::new(&helm), args, &env)
}

/// 8. The Helm chart on the real node, as docs/install.md says: the kustomize install removed, the
///    namespace created and labelled restricted, `helm install` with the local image: the replicas
///    Ready under that level and the webhook injecting through its Service; `helm upgrade` (one
///    more replica, a new pod template) rolls the injector, keeps the self-managed CA Secret and
///    the caBundles, and injection goes on.
pub fn n8_helm_chart(ctx: &mut Ctx) -> Result<()> {
    ctx.kubectl(&["delete", "-k", "deploy/overlays/node-e2e", "--wait=true", "--timeout=180s"])?;
    ctx.kubectl(&["create", "namespace", INJECTOR_NS])?;
    ctx.kubectl(&["label", "namespace", INJECTOR_NS, "pod-security.kubernetes.io/enforce=restricted"])?;
    let image = INJECTOR_IMAGE.rsplit_once(':').context("the image has a tag")?;
    let (repository, tag) = (format!("image.repository={}", image.0), format!("image.tag={}", image.1));
    let install = ["--namespace", INJECTOR_NS, "--set", &repository, "--set", &tag, "--set", "image.pullPolicy=Never"];
    let mut args = vec!["install", "sidecar-injector", "charts/sidecar-injector", "--wait", "--timeout", "180s"];
    args.extend(install);
    helm(ctx, &args)?;
    let ready = |ctx: &Ctx, count: usize| -> Result<()> {
        eventually("the chart's injector replicas Ready", Duration::from_secs(180), || {
            let pods = ctx.injector_pods()?;
            let current: Vec<&Value> = pods.iter().filter(|p| p["metadata"]["deletionTimestamp"].is_null()).collect();
            Ok((current.len() == count && current.iter().all(|p| ready(p))).then_some(()))
        })
    };
    ready(ctx, 2)?;
    ctx.wait_for_injection(SHOP, |_| true).context("injection after helm install")?;
    let secret = eventually("the CA Secret", Duration::from_secs(60), || Ok(ctx.certificate_secret().ok()))?;
    let ca = secret.get("ca.crt").context("no ca.crt in the Secret")?.clone();

    let mut args = vec!["upgrade", "sidecar-injector", "charts/sidecar-injector", "--wait", "--timeout", "180s"];
    args.extend(install);
    args.extend([
        "--set",
        "replicas=3",
        "--set",
        "extraEnv[0].name=SIDECAR_INJECTOR__TELEMETRY__LOG_LEVEL",
        "--set",
        "extraEnv[0].value=debug",
    ]);
    helm(ctx, &args)?;
    ready(ctx, 3)?;
    let env = ctx.kubectl(&[
        "-n",
        INJECTOR_NS,
        "get",
        "deployment",
        "sidecar-injector",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].env[*].name}",
    ])?;
    ensure!(
        env.contains("SIDECAR_INJECTOR__TELEMETRY__LOG_LEVEL"),
        "the upgrade did not reach the pod template: {env}"
    );
    ensure!(ctx.certificate_secret()? == secret, "helm upgrade changed the CA Secret");
    ensure!(ctx.ca_bundles()?.iter().all(|b| b.contains(ca.trim())), "a caBundle lost the CA after the upgrade");
    ctx.wait_for_injection(SHOP, |_| true).context("injection after helm upgrade")?;
    let releases = helm(ctx, &["list", "--namespace", INJECTOR_NS, "-o", "json"])?;
    ensure!(releases.contains("\"revision\":\"2\"") && releases.contains("deployed"), "helm list: {releases}");
    Ok(())
}

/// 15. A real cert-manager (its own controllers, built from its published packages:
///     e2e/certmanager) issues the injector's certificate and injects its CA, installed with
///     `deploy/overlays/cert-manager` as a user applies it (the image pointed at the local one).
///     Under the n7 load (20 creates/s), the serving certificate is renewed three times the way
///     `cmctl renew` does it (the Certificate's `Issuing` condition), then the CA once: no create
///     fails and no pod is stored without injection. The table prints the longest stretch of
///     failing creates for each.
pub fn n15_cert_manager(ctx: &mut Ctx) -> Result<()> {
    const NS: &str = "node-certs";
    // From a clean slate: the earlier scenarios' install (kustomize or the chart) goes.
    ctx.kubectl(&["delete", "-k", "deploy/overlays/node-e2e", "--wait=true", "--timeout=180s", "--ignore-not-found"])?;
    let node_bin = ctx.plane.bin.join("node");
    ctx.kubectl(&["apply", "-f", &node_bin.join("cert-manager-crds").display().to_string()])?;
    ctx.kubectl(&["wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"])?;
    let mut command = std::process::Command::new(node_bin.join("cert-manager"));
    command.arg(format!("--kubeconfig={}", ctx.plane.admin_kubeconfig.display())).arg("-v=1");
    let mut cert_manager = crate::controlplane::Process::spawn("cert-manager", command, &ctx.plane.dir)?;
    let result = with_cert_manager(ctx, NS);
    if result.is_err() {
        println!("      cert-manager's log (last lines):\n{}", cert_manager.tail(30));
    }
    cert_manager.stop(Duration::from_secs(5));
    result
}

fn with_cert_manager(ctx: &mut Ctx, namespace: &str) -> Result<()> {
    let shipped = ctx.kubectl(&["kustomize", "deploy/overlays/cert-manager"])?;
    ensure!(shipped.contains("ghcr.io/sidecar-injector/sidecar-injector:0.1.0"), "the overlay's image changed");
    ctx.apply(&shipped.replace("ghcr.io/sidecar-injector/sidecar-injector:0.1.0", INJECTOR_IMAGE))?;
    ctx.kubectl(&["-n", INJECTOR_NS, "wait", "--for=condition=Ready", "certificate", "--all", "--timeout=90s"])?;
    ctx.kubectl(&["-n", INJECTOR_NS, "rollout", "status", "deployment/sidecar-injector", "--timeout=180s"])?;
    let ca =
        || -> Result<String> { Ok(ctx.secret_data("sidecar-injector-cert")?.remove("ca.crt").unwrap_or_default()) };
    let first_ca = ca()?;
    eventually("cert-manager's CA in all four webhook entries", Duration::from_secs(60), || {
        let bundles = ctx.ca_bundles()?;
        Ok((bundles.len() == 4 && bundles.iter().all(|b| b.trim() == first_ca.trim())).then_some(()))
    })?;
    ctx.opted_in_namespace(namespace)?;
    ctx.wait_for_injection(namespace, |_| true)?;
    println!("      cert-manager issued the certificate and injected its CA; pods are injected");

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let client = runtime.block_on(ctx.plane.admin_client())?;
    let mut rows = Vec::new();
    let mut untrusted = Vec::new();
    let events = [
        "serving certificate renewed (1)",
        "serving certificate renewed (2)",
        "serving certificate renewed (3)",
        "CA renewed",
    ];
    for event in events {
        let mut trust = Vec::new();
        let (row, _) = availability::measure(ctx, &runtime, &client, namespace, event, |ctx| {
            if event == "CA renewed" {
                let before = ctx.secret_data("sidecar-injector-ca")?.remove("tls.crt").unwrap_or_default();
                let (started, bundles) = (Instant::now(), ctx.ca_bundles()?);
                renew(ctx, "sidecar-injector-ca")?;
                let renewed = ctx.secret_data("sidecar-injector-ca")?.remove("tls.crt").unwrap_or_default();
                ensure!(renewed != before, "the CA certificate did not change");
                trust.push(watch_trust(ctx, started, &bundles, |ctx| {
                    Ok(ctx.ca_bundles()?.iter().all(|b| b.contains(renewed.trim())))
                })?);
                let held = ctx.ca_bundles()?.first().map(|b| b.matches("BEGIN CERTIFICATE").count()).unwrap_or(0);
                println!("      the renewed CA is in every caBundle, which holds {held} certificate(s)");
            }
            // The serving certificate (after a CA renewal: one the renewed CA signed).
            let (started, bundles) = (Instant::now(), ctx.ca_bundles()?);
            renew(ctx, "sidecar-injector")?;
            trust.push(watch_trust(ctx, started, &bundles, serving_the_secret)?);
            Ok(())
        })?;
        let said: Vec<String> = trust.iter().map(Trust::describe).collect();
        println!(
            "      {} (longest stretch of failed creates: {:.1} s; {})",
            row.line(),
            row.longest_failing.as_secs_f64(),
            said.join("; then ")
        );
        untrusted.extend(
            trust
                .iter()
                .filter(|t| t.least_trusted.0 < t.least_trusted.1)
                .map(|t| format!("{event}: {}", t.describe())),
        );
        rows.push(row);
    }
    // The API server's own count of webhook calls that failed (a TLS failure fails the mutating
    // webhook open and the validating one closed).
    let metrics = ctx.kubectl(&["get", "--raw", "/metrics"])?;
    for line in metrics.lines().filter(|l| {
        (l.starts_with("apiserver_admission_webhook_fail_open_count")
            || l.starts_with("apiserver_admission_webhook_rejection_count"))
            && l.contains("sidecar-injector")
    }) {
        println!("      {line}");
    }
    println!("{}", availability::HEADER);
    for row in &rows {
        println!("{}", row.line());
    }
    let bad: Vec<String> = rows
        .iter()
        .filter(|r| r.failed + r.replica_set_refusals as usize > 0 || r.without_injection > 0)
        .map(|r| format!("{}: {:?}", r.event, r.errors))
        .collect();
    ensure!(bad.is_empty(), "renewals cost creates: {}", bad.join("; "));
    // Stronger than no failed create (the API server reuses connections it verified before): a
    // fresh connection, as a restarted or new API server makes, was accepted at every moment.
    ensure!(untrusted.is_empty(), "a fresh connection was refused: {}", untrusted.join("; "));

    // The chart in certManager mode installs the same, and cert-manager serves it as well.
    ctx.plane.kubectl_as(
        &ctx.plane.admin_kubeconfig,
        &["delete", "--wait=true", "--timeout=180s", "--ignore-not-found", "-f", "-"],
        Some(&shipped),
    )?;
    ctx.kubectl(&["create", "namespace", INJECTOR_NS])?;
    ctx.kubectl(&["label", "namespace", INJECTOR_NS, "pod-security.kubernetes.io/enforce=restricted"])?;
    let image = INJECTOR_IMAGE.rsplit_once(':').context("the image has a tag")?;
    let (repository, tag) = (format!("image.repository={}", image.0), format!("image.tag={}", image.1));
    helm(
        ctx,
        &[
            "install",
            "sidecar-injector",
            "charts/sidecar-injector",
            "--wait",
            "--timeout",
            "180s",
            "--namespace",
            INJECTOR_NS,
            "--set",
            &repository,
            "--set",
            &tag,
            "--set",
            "image.pullPolicy=Never",
            "--set",
            "certificates.mode=certManager",
        ],
    )?;
    ctx.kubectl(&["-n", INJECTOR_NS, "wait", "--for=condition=Ready", "certificate", "--all", "--timeout=90s"])?;
    let chart_ca = ctx.secret_data("sidecar-injector-ca")?.remove("ca.crt").unwrap_or_default();
    eventually("the chart's CA in all four webhook entries", Duration::from_secs(60), || {
        let bundles = ctx.ca_bundles()?;
        Ok((bundles.len() == 4 && bundles.iter().all(|b| b.contains(chart_ca.trim()))).then_some(()))
    })?;
    ctx.wait_for_injection(namespace, |_| true).context("injection with the chart in certManager mode")?;
    println!("      the chart in certManager mode: certificates Ready, its CA injected, pods injected");
    Ok(())
}

/// What a renewal did to the trust between the webhook configurations and the replicas, watched
/// until it was complete.
struct Trust {
    /// When the caBundles changed, if they did.
    bundles_changed: Option<Duration>,
    /// The fewest replicas a fresh connection verifying with the caBundle of that moment accepted,
    /// of how many.
    least_trusted: (usize, usize),
    /// How many times it was checked.
    checks: usize,
    /// When the renewal was complete.
    done_after: Duration,
}

impl Trust {
    fn describe(&self) -> String {
        format!(
            "caBundles {}, fresh connections: {} of {} replicas trusted at worst over {} checks, complete after {:.1} s",
            self.bundles_changed
                .map_or("unchanged".to_owned(), |at| format!("changed after {:.1} s", at.as_secs_f64())),
            self.least_trusted.0,
            self.least_trusted.1,
            self.checks,
            self.done_after.as_secs_f64()
        )
    }
}

/// Watches the caBundles and what a fresh connection verifying with them meets until `done`.
fn watch_trust(
    ctx: &Ctx,
    started: Instant,
    bundles_before: &[String],
    done: impl Fn(&Ctx) -> Result<bool>,
) -> Result<Trust> {
    let mut trust =
        Trust { bundles_changed: None, least_trusted: (usize::MAX, 0), checks: 0, done_after: Duration::ZERO };
    eventually("the renewal complete", Duration::from_secs(120), || {
        let bundles = ctx.ca_bundles()?;
        if trust.bundles_changed.is_none() && bundles != bundles_before {
            trust.bundles_changed = Some(started.elapsed());
        }
        let (trusted, all) = replicas_trusted_by(ctx, bundles.first().map(String::as_str).unwrap_or_default())?;
        if trusted < trust.least_trusted.0 {
            trust.least_trusted = (trusted, all);
        }
        trust.checks += 1;
        Ok(done(ctx)?.then(|| started.elapsed()))
    })
    .map(|done_after| Trust { done_after, ..trust })
}

/// Renews a Certificate of the injector's namespace as `cmctl renew` does (an `Issuing` condition
/// on its status) and waits until cert-manager has issued the next revision.
fn renew(ctx: &Ctx, certificate: &str) -> Result<()> {
    let revision = |ctx: &Ctx| -> Result<u64> {
        let status = ctx.json(&["-n", INJECTOR_NS, "get", "certificate", certificate])?;
        Ok(status["status"]["revision"].as_u64().unwrap_or(0))
    };
    let before = revision(ctx)?;
    let condition = json!([{"op": "add", "path": "/status/conditions/-", "value": {
        "type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
        "message": "Certificate re-issuance manually triggered"}}]);
    ctx.kubectl(&[
        "-n",
        INJECTOR_NS,
        "patch",
        "certificate",
        certificate,
        "--subresource=status",
        "--type=json",
        "-p",
        &condition.to_string(),
    ])?;
    eventually(&format!("certificate {certificate} renewed"), Duration::from_secs(60), || {
        Ok((revision(ctx)? > before).then_some(()))
    })?;
    Ok(())
}

/// How many replicas a fresh TLS connection verifying with `bundle` accepts, of how many.
fn replicas_trusted_by(ctx: &Ctx, bundle: &str) -> Result<(usize, usize)> {
    let file = std::env::temp_dir().join(format!("node-e2e-bundle-{}.pem", std::process::id()));
    std::fs::write(&file, bundle)?;
    let server = format!("sidecar-injector.{INJECTOR_NS}.svc");
    let pods = ctx.injector_pods()?;
    let trusted = pods
        .iter()
        .filter(|p| {
            let ip = p["status"]["podIP"].as_str().unwrap_or_default();
            std::process::Command::new("curl")
                .args(["-s", "-o", "/dev/null", "--max-time", "3", "--cacert"])
                .arg(&file)
                .args(["--resolve", &format!("{server}:8443:{ip}"), &format!("https://{server}:8443/")])
                .status()
                .is_ok_and(|s| s.success())
        })
        .count();
    let _ = std::fs::remove_file(&file);
    Ok((trusted, pods.len()))
}

/// Whether every replica serves the certificate the Secret holds now (the kubelet updates the
/// mounted Secret within seconds here; the injector reads its files every 5 s).
fn serving_the_secret(ctx: &Ctx) -> Result<bool> {
    let fingerprint = |pem_or_endpoint: Result<&str, &str>| -> String {
        let script = match pem_or_endpoint {
            Ok(_) => "openssl x509 -noout -fingerprint -sha256".to_owned(),
            Err(ip) => format!(
                "openssl s_client -connect {ip}:8443 -servername sidecar-injector.{INJECTOR_NS}.svc </dev/null 2>/dev/null | openssl x509 -noout -fingerprint -sha256"
            ),
        };
        let mut child = match std::process::Command::new("sh")
            .args(["-c", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            Ok(child) => child,
            Err(_) => return String::new(),
        };
        if let (Ok(pem), Some(mut stdin)) = (pem_or_endpoint, child.stdin.take()) {
            use std::io::Write;
            let _ = stdin.write_all(pem.as_bytes());
        }
        child.wait_with_output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned()).unwrap_or_default()
    };
    let secret = ctx.secret_data("sidecar-injector-cert")?;
    let want = fingerprint(Ok(secret.get("tls.crt").map(String::as_str).unwrap_or_default()));
    let pods = ctx.injector_pods()?;
    let serving = pods.iter().filter(|p| p["metadata"]["deletionTimestamp"].is_null()).all(|p| {
        let ip = p["status"]["podIP"].as_str().unwrap_or_default();
        !want.is_empty() && fingerprint(Err(ip)) == want
    });
    Ok(serving && !pods.is_empty())
}

/// 18. **Features the real kubelet declares**: the Node of kubelet 1.37.1 with its default
///     feature gates lists `RestartAllContainersOnContainerExits` in `status.declaredFeatures`
///     (printed: the list the docs give), and the engine reads that Node as offering it to a pod
///     the node can run, so a template that restarts the whole pod is injected without the
///     `node_feature_missing` warning there.
pub fn n18_declared_features(ctx: &mut Ctx) -> Result<()> {
    use sidecar_injector_engine::injection::node_features::{DeclaredBy, NodeFeature};
    use sidecar_injector_engine::injection::nodes::{NodeFacts, NodeObject, NodePool};
    let node: Value = serde_json::from_str(&ctx.kubectl(&["get", "node", crate::node::NODE_NAME, "-o", "json"])?)?;
    let declared = &node["status"]["declaredFeatures"];
    println!("      kubelet {} declares {declared}", node["status"]["nodeInfo"]["kubeletVersion"]);
    let feature = NodeFeature::RestartAllContainers;
    ensure!(
        declared.as_array().is_some_and(|list| list.iter().any(|f| f == feature.declared_as())),
        "the real node does not declare {}: {declared}",
        feature.declared_as()
    );
    let read: NodeObject = serde_json::from_value(node)?;
    let pool = NodePool::new([NodeFacts::of(&read)]);
    let pod = json!({"spec": {"nodeName": crate::node::NODE_NAME}});
    let reach = pool.facts_for(&pod, sidecar_injector_engine::ClusterFacts::default()).node_features;
    ensure!(reach.offers(feature) && reach.by == DeclaredBy::All, "the engine reads the real node as {reach:?}");
    Ok(())
}

/// 19. A rollout that halts itself on the real kubelet: a template's new version (with `rollout:`
///     to every workload) whose agent exits at once crash-loops in the pods that got it; the injector
///     replicas see it in the pods' container statuses and halt the rollout (the kept ConfigMap says
///     so, an Event goes on the template's ConfigMap), and new pods get the version before again,
///     which runs. Then a fixed version is promoted (one edit without `rollout:`): new pods get it and
///     run, and `drift` lists the pods of the halted version. Prints the time from the first crash to
///     the halt and how many pods got the bad version.
pub fn n19_rollout_halt(ctx: &mut Ctx) -> Result<()> {
    let result = rollout_halt(ctx);
    let _ = ctx.kubectl(&[
        "-n",
        SHOP,
        "delete",
        "deployment",
        "halt-web",
        "halt-late",
        "--ignore-not-found",
        "--wait=false",
    ]);
    let _ = ctx.kubectl(&[
        "-n",
        INJECTOR_NS,
        "delete",
        "configmap",
        "rollout-templates",
        "sidecar-injector-versions",
        "--ignore-not-found",
    ]);
    result
}

fn rollout_halt(ctx: &mut Ctx) -> Result<()> {
    const RUNS: &str = r#"[/bin/sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']"#;
    const CRASHES: &str = r#"[/bin/sh, -c, 'echo the new agent fails to start; exit 3']"#;
    let templates = |command: &str, rollout: &str| {
        format!(
            r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: rollout-templates
  namespace: {INJECTOR_NS}
  labels: {{sidecar-injector.io/templates: "true"}}
data:
  halt-agent.yaml: |
    description: An agent rolled out in steps
    default: true
    podSelector:
      matchLabels: {{tier: halt}}
{rollout}    inject:
      sidecars:
        - name: halt-agent
          image: {BUSYBOX}
          imagePullPolicy: Never
          command: {command}
          resources:
            requests: {{cpu: 10m, memory: 16Mi}}
            limits: {{cpu: 50m, memory: 32Mi}}
"#
        )
    };
    let deployment = |name: &str, replicas: u32| {
        format!(
            r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}, namespace: {SHOP}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}, tier: halt}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: app
          image: {BUSYBOX}
          imagePullPolicy: Never
          command: [/bin/sh, -c, 'trap "exit 0" TERM; while true; do sleep 1; done']
"#
        )
    };
    let probe = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: probe, labels: {{tier: halt}}}}\nspec:\n  containers: [{{name: app, image: {BUSYBOX}}}]\n"
    );
    let agent_command = |pod: &Value| -> String {
        all_containers(pod).find(|c| c["name"] == "halt-agent").map(|c| c["command"].to_string()).unwrap_or_default()
    };
    let crashes = |pod: &Value| agent_command(pod).contains("exit 3");
    let runs = |pod: &Value| agent_command(pod).contains("sleep 1");

    ctx.apply(&templates(RUNS, ""))?;
    ctx.every_replica_serving("every replica serving the first version", SHOP, &probe, runs)?;
    // The edit: a version that crashes, to every workload at once (the share is what reaches).
    let rollout = "    rollout: {share: 100, halt: {failedPods: 2, restarts: 2}}\n";
    ctx.apply(&templates(CRASHES, rollout))?;
    ctx.every_replica_serving("every replica serving the new version", SHOP, &probe, crashes)?;
    ctx.apply(&deployment("halt-web", 3))?;

    // The first crash, then the halt (the kept record names the version halted).
    let halted_record = || -> Result<Option<Value>> {
        let Ok(kept) = ctx.json(&["-n", INJECTOR_NS, "get", "configmap", "sidecar-injector-versions"]) else {
            return Ok(None);
        };
        let record: Value = serde_json::from_str(kept["data"]["halt-agent.json"].as_str().unwrap_or("{}"))?;
        Ok(record.get("halted").cloned())
    };
    let first_crash = eventually("the new agent's first crash", Duration::from_secs(90), || {
        let pods = ctx.pods(SHOP, "app=halt-web")?;
        let crashed = pods.iter().any(|p| status_of(p, "halt-agent")["lastState"]["terminated"].is_object());
        Ok(crashed.then(Instant::now))
    })?;
    let halt = eventually("the rollout's halt", Duration::from_secs(180), halted_record)?;
    let took = first_crash.elapsed();
    let pods = ctx.pods(SHOP, "app=halt-web")?;
    let bad: Vec<String> = pods.iter().filter(|p| crashes(p)).map(name).collect();
    println!(
        "      halted {:.1} s after the first crash; {} pods got the bad version; the halt says: {}",
        took.as_secs_f64(),
        bad.len(),
        halt["reason"]
    );
    ensure!(halt["reason"].as_str().is_some_and(|r| r.contains("container halt-agent")), "{halt}");

    // New pods get the version before again, and it runs.
    ctx.every_replica_serving("every replica serving the version before", SHOP, &probe, runs)?;
    ctx.apply(&deployment("halt-late", 1))?;
    ctx.kubectl(&["-n", SHOP, "wait", "--for=condition=Ready", "pod", "-l", "app=halt-late", "--timeout=90s"])?;
    let late = ctx.pods(SHOP, "app=halt-late")?;
    ensure!(late.iter().all(runs), "a pod created after the halt got the bad version");
    let events =
        ctx.kubectl(&["-n", INJECTOR_NS, "get", "events", "--field-selector", "reason=RolloutHalted", "-o", "name"])?;
    ensure!(!events.trim().is_empty(), "no RolloutHalted Event in {INJECTOR_NS}");
    let drift = ctx.cli(&["drift", "--namespace", SHOP])?;
    ensure!(drift.contains("halt-web"), "drift does not list the pods of the halted version:\n{drift}");

    // A fixed version, promoted with one edit.
    let fixed = r#"[/bin/sh, -c, 'echo fixed; trap "exit 0" TERM; while true; do sleep 1; done']"#;
    ctx.apply(&templates(fixed, ""))?;
    ctx.every_replica_serving("every replica serving the fixed version", SHOP, &probe, |p| {
        agent_command(p).contains("fixed")
    })?;
    ctx.kubectl(&["-n", SHOP, "rollout", "restart", "deployment/halt-web"])?;
    ctx.kubectl(&["-n", SHOP, "rollout", "status", "deployment/halt-web", "--timeout=120s"])?;
    let fixed_pods = ctx.pods(SHOP, "app=halt-web")?;
    let running: Vec<&Value> = fixed_pods.iter().filter(|p| p["metadata"]["deletionTimestamp"].is_null()).collect();
    ensure!(
        running.iter().all(|p| agent_command(p).contains("fixed") && ready(p)),
        "after promotion and a restart the pods do not all run the fixed agent"
    );
    println!("      the fixed version, promoted by one edit, runs in the restarted Deployment's pods");
    Ok(())
}
