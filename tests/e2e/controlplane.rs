//! A real cluster on loopback: etcd, kube-apiserver, kube-controller-manager and kube-scheduler built
//! from Go modules (see `e2e/controlplane/`), simulated nodes run by KWOK (nodes that stay Ready,
//! pods that start and Job pods that complete, without a kubelet), a self-made PKI (rcgen), a static
//! admin token, a service-account key pair; and the injector as a local process with a token of its
//! own ServiceAccount.
//!
//! Every child process is killed when its guard drops (the harness's teardown, also on panic) and,
//! through `PR_SET_PDEATHSIG`, when the harness itself dies, so nothing is left running.

// The harness calls libc (signals, rlimits, mounts, an allocator) where `unsafe` is the only way.
#![allow(unsafe_code)]

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use sidecar_injector::certs;

/// Simulated nodes (KWOK). Each takes 1,100 pods, so the scale run fits too.
pub const NODES: usize = 10;

/// The fixed HTTPS port of the injector: `deploy/overlays/e2e` points the webhooks at it.
pub const INJECTOR_HTTPS_PORT: u16 = 18443;

/// A child process that is stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Process {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Process {
    /// Starts `command`, its output appended to `<dir>/<name>.log` (a restarted component keeps
    /// its earlier log). The child is killed when the *thread* that started it ends
    /// (`PR_SET_PDEATHSIG`): start long-lived ones on the main thread.
    pub fn spawn(name: &str, mut command: Command, dir: &Path) -> Result<Process> {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&log)?;
        command.stdout(Stdio::from(file.try_clone()?)).stderr(Stdio::from(file)).stdin(Stdio::null());
        // SAFETY: prctl is async-signal-safe; the closure touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command.spawn().with_context(|| format!("starting {name}"))?;
        Ok(Process { child: Some(child), log })
    }

    /// Its process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL. Returns the exit status when it exited by itself.
    pub fn stop(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// The last `lines` lines of its log.
    pub fn tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// A free loopback port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Polls `check` until it is true or `timeout` passes; gives up at once when `process` exits.
pub fn wait_for(
    what: &str,
    timeout: Duration,
    process: &mut Process,
    mut check: impl FnMut() -> bool,
) -> Result<Duration> {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if !process.running() {
            bail!("{what} exited:\n{}", process.tail(30));
        }
        if check() {
            return Ok(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("{what} not ready within {timeout:?}:\n{}", process.tail(30))
}

/// etcd, kube-apiserver, the controllers, the scheduler, KWOK, and how to reach them.
pub struct ControlPlane {
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub etcd: Process,
    pub apiserver: Option<Process>,
    /// kube-controller-manager, kube-scheduler and KWOK (dropped, so stopped, with the plane).
    pub components: Vec<Process>,
    pub url: String,
    pub admin_kubeconfig: PathBuf,
    /// The client certificate the API server presents to webhooks (its AdmissionConfiguration),
    /// and the CA that signed it, which the injector is told to require (`tls.client_ca_file`).
    pub webhook_client: certs::Pem,
    pub webhook_client_ca_file: PathBuf,
    apiserver_args: Vec<String>,
}

const ADMIN_TOKEN: &str = "e2e-admin-token";
/// The real node's kubelet credential (`system:node:<node>`, group `system:nodes`).
pub const NODE_TOKEN: &str = "e2e-node-token";
/// kube-proxy's credential (`system:kube-proxy`, bound to `system:node-proxier` by default).
pub const PROXY_TOKEN: &str = "e2e-kube-proxy-token";
/// The ClusterIP of the `kubernetes` Service: the first address of `--service-cluster-ip-range`.
pub const KUBERNETES_SERVICE_IP: &str = "10.0.0.1";

impl ControlPlane {
    /// Starts the whole cluster in `dir` with binaries from `bin`: etcd and kube-apiserver (returns
    /// once `/readyz` is ok), then the controllers, the scheduler and KWOK's nodes.
    pub fn start(bin: &Path, dir: &Path) -> Result<ControlPlane> {
        let mut plane = ControlPlane::start_api_only(bin, dir)?;
        plane.start_controllers()?;
        plane.start_kwok()?;
        Ok(plane)
    }

    /// The control plane of a real node (`tests/node_e2e`), in the node suite's own network
    /// namespace: kube-apiserver listens on every address of that namespace and advertises the
    /// node's address, so the `kubernetes` Service leads pods to it through kube-proxy; it
    /// authenticates the kubelet and kube-proxy by token (`system:node:<node>` in `system:nodes`,
    /// `system:kube-proxy`) and reaches kubelets by their InternalIP with a client certificate.
    /// Controllers and the scheduler run; KWOK does not.
    #[allow(dead_code)]
    pub fn start_for_node(bin: &Path, dir: &Path, node: &str, node_ip: &str) -> Result<ControlPlane> {
        let mut plane = ControlPlane::start_api(bin, dir, Some((node, node_ip)))?;
        plane.start_controllers()?;
        Ok(plane)
    }

    /// Only etcd and kube-apiserver: what the benchmark measures admission on, without controllers
    /// taking CPU from it.
    #[allow(dead_code)]
    pub fn start_api_only(bin: &Path, dir: &Path) -> Result<ControlPlane> {
        ControlPlane::start_api(bin, dir, None)
    }

    fn start_api(bin: &Path, dir: &Path, node: Option<(&str, &str)>) -> Result<ControlPlane> {
        let now = time::OffsetDateTime::now_utc();
        let ca = certs::generate_ca("e2e cluster CA", now, 2)?;
        let mut hosts = vec!["127.0.0.1".to_owned(), "localhost".into(), "kubernetes.default.svc".into()];
        if let Some((_, node_ip)) = node {
            // Pods reach the API server through the `kubernetes` Service (its ClusterIP, the first
            // address of the service range) or the node's address.
            hosts.extend([KUBERNETES_SERVICE_IP.to_owned(), node_ip.to_owned()]);
        }
        let serving = certs::issue(&ca, &hosts, now, 1)?;
        let service_accounts = rcgen::KeyPair::generate()?;
        let write = |name: &str, text: &str| -> Result<PathBuf> {
            let path = dir.join(name);
            std::fs::write(&path, text)?;
            Ok(path)
        };
        let ca_file = write("ca.crt", &ca.cert)?;
        let (cert, key) = (write("apiserver.crt", &serving.cert)?, write("apiserver.key", &serving.key)?);
        // The key pair that signs service-account tokens (kubectl create token).
        let sa_key = write("sa.key", &service_accounts.serialize_pem())?;
        let sa_pub = write("sa.pub", &service_accounts.public_key_pem())?;
        let mut token_lines = format!("{ADMIN_TOKEN},admin,admin,system:masters\n");
        if let Some((node, _)) = node {
            token_lines += &format!(
                "{NODE_TOKEN},system:node:{node},node,system:nodes\n{PROXY_TOKEN},system:kube-proxy,kube-proxy\n"
            );
        }
        let tokens = write("tokens.csv", &token_lines)?;
        // The API server authenticates itself to webhooks with a client certificate, as a
        // production control plane can (AdmissionConfiguration → kubeconfig per webhook host).
        let webhook_client_ca = certs::generate_ca("e2e webhook client CA", now, 2)?;
        let webhook_client = certs::issue_client(&webhook_client_ca, "kube-apiserver", now, 1)?;
        let webhook_client_ca_file = write("webhook-client-ca.crt", &webhook_client_ca.cert)?;
        let client_cert = write("webhook-client.crt", &webhook_client.cert)?;
        let client_key = write("webhook-client.key", &webhook_client.key)?;
        let user = format!(
            "  user:\n    client-certificate: {}\n    client-key: {}\n",
            client_cert.display(),
            client_key.display()
        );
        let webhook_kubeconfig = write(
            "webhook.kubeconfig",
            &format!(
                "apiVersion: v1\nkind: Config\nusers:\n- name: \"127.0.0.1:{INJECTOR_HTTPS_PORT}\"\n{user}- name: \"*\"\n{user}"
            ),
        )?;
        let plugin = |name: &str| {
            format!(
                "- name: {name}\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n",
                webhook_kubeconfig.display()
            )
        };
        let admission = write(
            "admission.yaml",
            &format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{}{}",
                plugin("ValidatingAdmissionWebhook"),
                plugin("MutatingAdmissionWebhook")
            ),
        )?;

        let (client_port, peer_port, secure_port) = (free_port(), free_port(), free_port());
        let mut etcd = Command::new(bin.join("etcd"));
        etcd.args(["--name", "e2e", "--data-dir"]).arg(dir.join("etcd")).args([
            &format!("--listen-client-urls=http://127.0.0.1:{client_port}"),
            &format!("--advertise-client-urls=http://127.0.0.1:{client_port}"),
            &format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            &format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            &format!("--initial-cluster=e2e=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]);
        let mut etcd = Process::spawn("etcd", etcd, dir)?;
        let health = format!("http://127.0.0.1:{client_port}/health");
        wait_for("etcd", Duration::from_secs(30), &mut etcd, || {
            curl(&health, None, None).is_some_and(|b| b.contains("\"health\":\"true\""))
        })?;

        let mut apiserver_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{client_port}"),
            format!("--secure-port={secure_port}"),
            format!("--tls-cert-file={}", cert.display()),
            format!("--tls-private-key-file={}", key.display()),
            format!("--token-auth-file={}", tokens.display()),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            // Responses travel over loopback here: gzip (on for clients that ask, as Go's do, and
            // for every event of their streaming lists) only spends the cores the cluster shares
            // with what is measured. In the scale run Go clients' node watches fell behind, were
            // closed and came back as streaming lists of every Node, gzipped, hundreds of times
            // (a fifth of the API server's CPU). The injector's client asks for no gzip.
            "--feature-gates=APIResponseCompression=false".into(),
            format!("--admission-control-config-file={}", admission.display()),
        ];
        match node {
            None => apiserver_args.extend([
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                // The endpoint reconciler refuses a loopback address; there is no Service network anyway.
                "--endpoint-reconciler-type=none".into(),
                "--authorization-mode=RBAC".into(),
            ]),
            Some((_, node_ip)) => {
                let kubelet_client = certs::issue_client(&ca, "kube-apiserver-kubelet-client", now, 1)?;
                apiserver_args.extend([
                    // Only the node suite's network namespace has these addresses.
                    "--bind-address=0.0.0.0".into(),
                    format!("--advertise-address={node_ip}"),
                    "--authorization-mode=Node,RBAC".into(),
                    // logs, exec and port-forward dial the kubelet at its InternalIP, not by name.
                    "--kubelet-preferred-address-types=InternalIP".into(),
                    format!(
                        "--kubelet-client-certificate={}",
                        write("kubelet-client.crt", &kubelet_client.cert)?.display()
                    ),
                    format!("--kubelet-client-key={}", write("kubelet-client.key", &kubelet_client.key)?.display()),
                ]);
            }
        }
        let url = format!("https://127.0.0.1:{secure_port}");
        let admin_kubeconfig = dir.join("admin.kubeconfig");
        std::fs::write(&admin_kubeconfig, kubeconfig(&url, &ca_file, ADMIN_TOKEN, "default"))?;
        let mut plane = ControlPlane {
            dir: dir.to_owned(),
            bin: bin.to_owned(),
            etcd,
            apiserver: None,
            components: Vec::new(),
            url,
            admin_kubeconfig,
            webhook_client,
            webhook_client_ca_file,
            apiserver_args,
        };
        plane.start_apiserver()?;
        Ok(plane)
    }

    /// Starts kube-controller-manager and kube-scheduler (with the admin kubeconfig, no leader
    /// election, no serving port of their own).
    fn start_controllers(&mut self) -> Result<()> {
        let kubeconfig = format!("--kubeconfig={}", self.admin_kubeconfig.display());
        let mut controllers = Command::new(self.bin.join("kube-controller-manager"));
        controllers.args([
            kubeconfig.as_str(),
            "--leader-elect=false",
            "--secure-port=0",
            "--use-service-account-credentials=false",
            &format!("--service-account-private-key-file={}", self.dir.join("sa.key").display()),
            &format!("--root-ca-file={}", self.dir.join("ca.crt").display()),
            // Namespaces delete in seconds rather than after the default sync periods.
            "--namespace-sync-period=5s",
            // The scale run's nodes post their status once a minute and renew no Lease (the
            // injector does not watch Leases): with the default 50 s grace every node would turn
            // Unknown, be tainted and untainted each minute, tripling the node writes.
            "--node-monitor-grace-period=2m",
            "--concurrent-namespace-syncs=4",
        ]);
        self.components.push(Process::spawn("kube-controller-manager", controllers, &self.dir)?);
        let mut scheduler = Command::new(self.bin.join("kube-scheduler"));
        scheduler.args([kubeconfig.as_str(), "--leader-elect=false", "--secure-port=0"]);
        self.components.push(Process::spawn("kube-scheduler", scheduler, &self.dir)?);
        Ok(())
    }

    /// Starts KWOK and registers [`NODES`] simulated nodes; returns once they are Ready.
    fn start_kwok(&mut self) -> Result<()> {
        let kubeconfig = format!("--kubeconfig={}", self.admin_kubeconfig.display());
        let mut kwok = Command::new(self.bin.join("kwok"));
        kwok.args([
            kubeconfig.as_str(),
            &format!("--config={}", self.bin.join("kwok-stages.yaml").display()),
            "--manage-all-nodes=false",
            "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--manage-nodes-with-label-selector=",
            "--manage-single-node=",
            "--cidr=10.244.0.0/16",
            "--node-ip=10.0.0.1",
            &format!("--server-address=127.0.0.1:{}", free_port()),
        ]);
        self.components.push(Process::spawn("kwok", kwok, &self.dir)?);
        let nodes: Vec<String> = (0..NODES)
            .map(|i| {
                format!(
                    r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"kwok-node-{i}","annotations":{{"kwok.x-k8s.io/node":"fake","node.alpha.kubernetes.io/ttl":"0"}},"labels":{{"kubernetes.io/hostname":"kwok-node-{i}","kubernetes.io/os":"linux","kubernetes.io/arch":"amd64","type":"kwok"}}}},"status":{{"allocatable":{{"cpu":"64","memory":"256Gi","pods":"1100"}},"capacity":{{"cpu":"64","memory":"256Gi","pods":"1100"}}}}}}"#
                )
            })
            .collect();
        let list = format!(r#"{{"apiVersion":"v1","kind":"List","items":[{}]}}"#, nodes.join(","));
        self.kubectl_as(&self.admin_kubeconfig, &["apply", "-f", "-"], Some(&list))?;
        let start = Instant::now();
        loop {
            for process in &mut self.components {
                if !process.running() {
                    bail!("{} exited:\n{}", process.log.display(), process.tail(30));
                }
            }
            let ready = self.kubectl(&[
                "get",
                "nodes",
                "-o",
                "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
            ])?;
            if ready.split_whitespace().filter(|s| *s == "True").count() == NODES {
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("the KWOK nodes did not become Ready within 60 s: {ready:?}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// (Re)starts kube-apiserver and waits for `/readyz`.
    pub fn start_apiserver(&mut self) -> Result<Duration> {
        let mut command = Command::new(self.bin.join("kube-apiserver"));
        command.args(&self.apiserver_args);
        let mut process = Process::spawn("kube-apiserver", command, &self.dir)?;
        let readyz = format!("{}/readyz", self.url);
        let ca = self.dir.join("ca.crt");
        let took = wait_for("kube-apiserver", Duration::from_secs(90), &mut process, || {
            curl(&readyz, Some(&ca), Some(ADMIN_TOKEN)).is_some_and(|b| b.trim() == "ok")
        })?;
        self.apiserver = Some(process);
        Ok(took)
    }

    /// Stops kube-apiserver (etcd stays).
    pub fn stop_apiserver(&mut self) {
        if let Some(mut process) = self.apiserver.take() {
            process.stop(Duration::from_secs(10));
        }
    }

    /// Runs kubectl as the admin.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.kubectl_as(&self.admin_kubeconfig, args, None)
    }

    /// Runs kubectl with a kubeconfig, optionally feeding `stdin`; the error carries stderr.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Result<String> {
        self.kubectl_with_stderr(kubeconfig, args, stdin).map(|(stdout, _)| stdout)
    }

    /// [`Plane::kubectl_as`], with what kubectl printed on stderr when it succeeded (the admission
    /// warnings).
    pub fn kubectl_with_stderr(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<(String, String)> {
        let mut command = Command::new(self.bin.join("kubectl"));
        command.arg("--kubeconfig").arg(kubeconfig).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
        command.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = command.spawn()?;
        if let Some(input) = stdin {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(input.as_bytes())?;
        }
        let output = child.wait_with_output()?;
        if output.status.success() {
            let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
            Ok((text(&output.stdout), text(&output.stderr)))
        } else {
            bail!("kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim())
        }
    }

    /// A kubeconfig for a token.
    pub fn kubeconfig_for(&self, name: &str, token: &str, namespace: &str) -> Result<PathBuf> {
        let path = self.dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, kubeconfig(&self.url, &self.dir.join("ca.crt"), token, namespace))?;
        Ok(path)
    }

    /// A kube-rs client for the admin.
    pub async fn admin_client(&self) -> Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.admin_kubeconfig)?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }
}

fn kubeconfig(url: &str, ca: &Path, token: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster: {{server: \"{url}\", certificate-authority: \"{}\"}}\nusers:\n- name: user\n  user: {{token: \"{token}\"}}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: user, namespace: {namespace}}}\ncurrent-context: e2e\n",
        ca.display()
    )
}

/// A GET with a few seconds' timeout; `None` on any failure.
pub fn curl(url: &str, ca: Option<&Path>, token: Option<&str>) -> Option<String> {
    let mut command = Command::new("curl");
    command.args(["-sf", "--max-time", "3", url]);
    if let Some(ca) = ca {
        command.arg("--cacert").arg(ca);
    }
    if let Some(token) = token {
        command.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    let output = command.output().ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The injector running as a local process with a token of its own ServiceAccount.
pub struct Injector {
    pub process: Process,
    pub http_port: u16,
}

impl Injector {
    /// Starts `sidecar-injector serve` with the ServiceAccount's token, without waiting.
    pub fn spawn(plane: &ControlPlane, binary: &Path, extra_env: &[(&str, &str)]) -> Result<Injector> {
        let token =
            plane.kubectl(&["-n", "sidecar-injector", "create", "token", "sidecar-injector", "--duration=2h"])?;
        let kubeconfig = plane.kubeconfig_for("injector", token.trim(), "sidecar-injector")?;
        let http_port = free_port();
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_BACKTRACE", "1")
            .env("SIDECAR_INJECTOR__SERVER__ADDRESS", "127.0.0.1")
            .env("SIDECAR_INJECTOR__SERVER__HTTPS_PORT", INJECTOR_HTTPS_PORT.to_string())
            .env("SIDECAR_INJECTOR__SERVER__HTTP_PORT", http_port.to_string())
            .env("SIDECAR_INJECTOR__SERVER__SHUTDOWN_TIMEOUT_SECONDS", "5")
            // The API server calls this one process by URL, no Service to leave, so the drain
            // would only make each restart of the suite 3 s longer (the node suite keeps it).
            .env("SIDECAR_INJECTOR__SERVER__DRAIN_SECONDS", "0")
            .env("SIDECAR_INJECTOR__CLUSTER__NAMESPACE", "sidecar-injector")
            .env("SIDECAR_INJECTOR__CLUSTER__DRIFT_INTERVAL_SECONDS", "2")
            .env("SIDECAR_INJECTOR__TLS__SELF_SIGNED_CA_FILE", plane.dir.join("unused-ca.pem"))
            .env("SIDECAR_INJECTOR__TLS__CLIENT_CA_FILE", &plane.webhook_client_ca_file);
        for (key, value) in extra_env {
            command.env(key, value);
        }
        let name = format!("injector-{http_port}");
        let process = Process::spawn(&name, command, &plane.dir)?;
        Ok(Injector { process, http_port })
    }

    /// Waits for `/readyz`.
    pub fn wait_ready(&mut self) -> Result<()> {
        let readyz = format!("http://127.0.0.1:{}/readyz", self.http_port);
        wait_for("the injector", Duration::from_secs(30), &mut self.process, || curl(&readyz, None, None).is_some())?;
        Ok(())
    }

    /// Starts `sidecar-injector serve` with the ServiceAccount's token and waits for `/readyz`.
    pub fn start(plane: &ControlPlane, binary: &Path, extra_env: &[(&str, &str)]) -> Result<Injector> {
        let mut injector = Injector::spawn(plane, binary, extra_env)?;
        injector.wait_ready()?;
        Ok(injector)
    }

    /// `/metrics` of the injector.
    pub fn metrics(&self) -> String {
        curl(&format!("http://127.0.0.1:{}/metrics", self.http_port), None, None).unwrap_or_default()
    }
}
