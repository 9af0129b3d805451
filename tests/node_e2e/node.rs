//! One real node: containerd (runc, overlayfs, the CNI bridge), kubelet and kube-proxy, with the
//! settings `../shared/notes-node.md` found necessary on our machines, all in the suite's scratch
//! directory and namespaces (see `sandbox`). Images come from OCI archives imported into
//! containerd; nothing is pulled.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::controlplane::{ControlPlane, NODE_TOKEN, PROXY_TOKEN, Process, wait_for};
use crate::sandbox::{CGROUP, NODE_IP};

/// The node's name.
pub const NODE_NAME: &str = "e2e-node";
/// The pod network of the node's CNI bridge.
pub const POD_CIDR: &str = "10.244.0.0/24";
/// The sandbox image containerd pins (imported from `pause.tar`).
pub const PAUSE_IMAGE: &str = "localhost/sidecar-injector-e2e/pause:1";

/// containerd, kubelet and kube-proxy, stopped in reverse order when dropped.
pub struct Node {
    pub kube_proxy: Option<Process>,
    pub kubelet: Option<Process>,
    pub containerd: Option<Process>,
    pub socket: PathBuf,
    pub bin: PathBuf,
}

impl Node {
    /// Starts containerd, imports `images` (OCI archives), starts kubelet and kube-proxy and
    /// returns once the node is Ready.
    pub fn start(plane: &ControlPlane, bin: &Path, images: &[PathBuf]) -> Result<Node> {
        let dir = plane.dir.join("node");
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("containerd/containerd.sock");
        let mut node = Node { kube_proxy: None, kubelet: None, containerd: None, socket, bin: bin.to_owned() };
        node.start_containerd(plane, &dir)?;
        for image in images {
            node.ctr(&["images", "import", &image.display().to_string()])
                .with_context(|| format!("importing {}", image.display()))?;
        }
        node.start_kubelet(plane, &dir)?;
        node.start_kube_proxy(plane, &dir)?;
        Ok(node)
    }

    fn start_containerd(&mut self, plane: &ControlPlane, dir: &Path) -> Result<()> {
        let cni_conf = dir.join("cni");
        std::fs::create_dir_all(&cni_conf)?;
        std::fs::write(
            cni_conf.join("10-e2e.conflist"),
            format!(
                r#"{{"cniVersion":"1.0.0","name":"e2e","plugins":[
  {{"type":"bridge","bridge":"cni0","isGateway":true,"ipMasq":true,"hairpinMode":true,
    "ipam":{{"type":"host-local","ranges":[[{{"subnet":"{POD_CIDR}"}}]],"routes":[{{"dst":"0.0.0.0/0"}}],"dataDir":"{}"}}}},
  {{"type":"portmap","capabilities":{{"portMappings":true}}}}]}}"#,
                dir.join("cni-ipam").display()
            ),
        )?;
        let root = dir.join("containerd");
        let runc = which("runc")?;
        let config = dir.join("containerd.toml");
        std::fs::write(
            &config,
            format!(
                r#"version = 3
root = "{root}/root"
state = "{root}/state"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[plugins.'io.containerd.cri.v1.runtime']
  # Without CAP_SYS_RESOURCE a negative oom_score_adj cannot be set: every sandbox would fail.
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
"#,
                root = root.display(),
                socket = self.socket.display(),
                runc = runc.display(),
                cni_bin = self.bin.join("cni").display(),
                cni_conf = cni_conf.display(),
            ),
        )?;
        let mut command = Command::new(self.bin.join("containerd"));
        command.arg("--config").arg(&config);
        // The runc shim is found on PATH: ours first.
        command.env("PATH", format!("{}:{}", self.bin.display(), std::env::var("PATH").unwrap_or_default()));
        let mut process = Process::spawn("containerd", command, &plane.dir)?;
        let socket = self.socket.clone();
        let bin = self.bin.clone();
        wait_for("containerd", Duration::from_secs(30), &mut process, || {
            socket.exists() && ctr_output(&bin, &socket, &["version"]).is_ok()
        })?;
        self.containerd = Some(process);
        Ok(())
    }

    fn start_kubelet(&mut self, plane: &ControlPlane, dir: &Path) -> Result<()> {
        let kubeconfig = plane.kubeconfig_for("kubelet", NODE_TOKEN, "default")?;
        let config = dir.join("kubelet.yaml");
        std::fs::write(
            &config,
            format!(
                r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{CGROUP}
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
# Reads kernel tunables and refuses to start when they differ; never writes them (the sandbox
# shows it the values it wants).
protectKernelDefaults: true
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: "{ca}"}}
authorization: {{mode: AlwaysAllow}}
# Nothing can be pulled back, so no image is ever garbage-collected.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
resolvConf: ""
serializeImagePulls: false
syncFrequency: 5s
fileCheckFrequency: 5s
nodeStatusUpdateFrequency: 2s
"#,
                socket = self.socket.display(),
                ca = plane.dir.join("ca.crt").display(),
            ),
        )?;
        let mut command = Command::new(self.bin.join("kubelet"));
        command
            .arg(format!("--config={}", config.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--root-dir={}", dir.join("kubelet").display()))
            .arg(format!("--cert-dir={}", dir.join("kubelet-pki").display()))
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg(format!("--node-ip={NODE_IP}"))
            .arg("--v=1");
        let mut process = Process::spawn("kubelet", command, &plane.dir)?;
        let start = Instant::now();
        wait_for("kubelet", Duration::from_secs(90), &mut process, || {
            plane
                .kubectl(&[
                    "get",
                    "node",
                    NODE_NAME,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status} {.spec.taints}",
                ])
                .is_ok_and(|s| s.starts_with("True") && !s.contains("not-ready"))
        })?;
        println!("node-e2e: node {NODE_NAME} Ready {:.1} s after kubelet started", start.elapsed().as_secs_f64());
        self.kubelet = Some(process);
        Ok(())
    }

    fn start_kube_proxy(&mut self, plane: &ControlPlane, dir: &Path) -> Result<()> {
        let kubeconfig = plane.kubeconfig_for("kube-proxy", PROXY_TOKEN, "default")?;
        let config = dir.join("kube-proxy.yaml");
        std::fs::write(
            &config,
            format!(
                r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: "{kubeconfig}"}}
mode: iptables
hostnameOverride: {NODE_NAME}
clusterCIDR: {POD_CIDR}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# Zero leaves the host-global conntrack settings as they are.
conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
"#,
                kubeconfig = kubeconfig.display(),
            ),
        )?;
        let mut command = Command::new(self.bin.join("kube-proxy"));
        command.arg(format!("--config={}", config.display())).arg("--v=1");
        let mut process = Process::spawn("kube-proxy", command, &plane.dir)?;
        // Ready once it has written the `kubernetes` Service's rules.
        wait_for("kube-proxy", Duration::from_secs(60), &mut process, || {
            Command::new("iptables")
                .args(["-t", "nat", "-S", "KUBE-SERVICES"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("default/kubernetes:https"))
        })?;
        self.kube_proxy = Some(process);
        Ok(())
    }

    /// Runs `ctr` in containerd's `k8s.io` namespace (where the CRI keeps its images).
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        ctr_output(&self.bin, &self.socket, args)
    }

    /// Stops kube-proxy, kubelet and containerd, in that order.
    pub fn stop(&mut self) {
        for mut process in [self.kube_proxy.take(), self.kubelet.take(), self.containerd.take()].into_iter().flatten() {
            process.stop(Duration::from_secs(10));
        }
    }

    /// The last lines of each component's log.
    pub fn tails(&self, lines: usize) -> String {
        let mut text = String::new();
        for (name, process) in
            [("containerd", &self.containerd), ("kubelet", &self.kubelet), ("kube-proxy", &self.kube_proxy)]
        {
            if let Some(process) = process {
                text += &format!("--- {name} log (last {lines} lines)\n{}\n", process.tail(lines));
            }
        }
        text
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

fn ctr_output(bin: &Path, socket: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(bin.join("ctr"))
        .arg("--address")
        .arg(socket)
        .args(["-n", "k8s.io"])
        .args(args)
        .output()
        .context("running ctr")?;
    if !out.status.success() {
        bail!("ctr {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn which(program: &str) -> Result<PathBuf> {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
        .with_context(|| format!("{program} is not installed (e2e/node/build.sh installs it)"))
}
