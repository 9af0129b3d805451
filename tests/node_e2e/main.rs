//! End to end on a **real node**: the control plane of the e2e suite plus kubelet, containerd,
//! runc, the CNI bridge and kube-proxy, all built from the package registries
//! (`e2e/node/build.sh`). The injector runs from its image (the Dockerfile built by BuildKit,
//! `e2e/image/build.sh`, its linux/amd64 entry) as the Deployment `kubectl apply -k` installs,
//! behind its Service; the scenarios assert on what really ran: processes, logs, exec, exit codes.
//!
//! Runs when `SIDECAR_INJECTOR_NODE_E2E=1` (`make node-e2e`, part of `make test`, which builds the
//! image and names it in `SIDECAR_INJECTOR_IMAGE`); needs root. The
//! process splits in two: the parent stays in the host's namespaces, removes what a crashed earlier
//! run left, snapshots the host, runs the suite in a child with its own mount and network
//! namespaces (see `sandbox`), then kills whatever the child left, and fails unless the host is as
//! it was. The parent owns the run's scratch directory: removed after a clean run, kept (with every
//! component's log) after a failed one, and removed by the next run after a crashed one.

// The harness calls libc (signals, rlimits, mounts, an allocator) where `unsafe` is the only way.
#![allow(unsafe_code)]

mod availability;
#[path = "../common/mod.rs"]
mod common;
#[path = "../e2e/controlplane.rs"]
#[allow(dead_code)]
mod controlplane;
mod node;
mod sandbox;
mod scenarios;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{Context, Result, bail};

use controlplane::ControlPlane;
use node::Node;

/// Set in the child that runs inside the sandbox.
const CHILD: &str = "SIDECAR_INJECTOR_NODE_E2E_CHILD";
/// The run's scratch directory, made by the parent, used by the child.
const SCRATCH: &str = "SIDECAR_INJECTOR_NODE_E2E_DIR";
/// Scratch directories are `<tmp>/<PREFIX>*`; the parent's pid file marks one in use.
const PREFIX: &str = "sidecar-injector-node-e2e-";
/// In the scratch directory: the parent's pid while it runs; how many scenarios passed.
const PARENT_PID: &str = "parent.pid";
const PASSED: &str = "passed";

fn main() -> ExitCode {
    if std::env::var_os("SIDECAR_INJECTOR_NODE_E2E").is_none() {
        println!("node-e2e: not run (set SIDECAR_INJECTOR_NODE_E2E=1, or run `make node-e2e`)");
        return ExitCode::SUCCESS;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::env::set_current_dir(root).unwrap();
    let outcome = if std::env::var_os(CHILD).is_some() { child(root) } else { parent() };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("node-e2e: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// In the host's namespaces: build, clean, snapshot, run the child, clean, compare.
fn parent() -> Result<()> {
    if unsafe { libc::geteuid() } != 0 {
        bail!("the real node needs root (kubelet, containerd, namespaces, cgroups): run as root");
    }
    for script in ["e2e/controlplane/build.sh", "e2e/node/build.sh", "e2e/certmanager/build.sh"] {
        let status = Command::new("bash").arg(script).status().with_context(|| format!("running {script}"))?;
        if !status.success() {
            bail!("{script} failed (see above)");
        }
    }
    let leftovers = sandbox::remove_leftovers()?;
    if leftovers > 0 {
        println!("node-e2e: killed {leftovers} process(es) an earlier run left behind");
    }
    remove_crashed_scratch();
    let before = sandbox::HostState::read();
    let processes_before = sandbox::node_processes();
    let started = Instant::now();
    let scratch = tempfile::Builder::new().prefix(PREFIX).tempdir()?;
    std::fs::write(scratch.path().join(PARENT_PID), std::process::id().to_string())?;
    let mut command = Command::new(std::env::current_exe()?);
    command.env(CHILD, "1").env(SCRATCH, scratch.path());
    // SAFETY: unshare is async-signal-safe; the closure touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let status = command.status().context("starting the sandboxed suite")?;
    let killed = sandbox::remove_leftovers()?;
    let after = sandbox::HostState::read();
    let mut problems = after.differences(&before);
    let stray: Vec<_> = sandbox::node_processes().difference(&processes_before).cloned().collect();
    if !stray.is_empty() {
        problems.push(format!("processes left running: {stray:?}"));
    }
    println!(
        "node-e2e: host checks: {} ({killed} process(es) killed at teardown, {:.1} s in all)",
        if problems.is_empty() {
            "kernel tunables, iptables, links, routes, mounts, paths, cgroups as before"
        } else {
            "FAILED"
        },
        started.elapsed().as_secs_f64()
    );
    for problem in &problems {
        println!("  host: {problem}");
    }
    let passed = std::fs::read_to_string(scratch.path().join(PASSED)).ok();
    if !status.success() || passed.is_none() {
        std::fs::remove_file(scratch.path().join(PARENT_PID))?;
        println!("node-e2e: logs kept in {}", scratch.keep().display());
        bail!("the suite failed (see above)");
    }
    if !problems.is_empty() {
        bail!("the suite left traces on the host");
    }
    println!("node-e2e: {} scenarios passed", passed.unwrap_or_default().trim());
    Ok(())
}

/// Removes the scratch directories of runs whose parent was killed (their pid file names a process
/// that is gone); a failed run's directory has no pid file and is kept for its logs.
fn remove_crashed_scratch() {
    for entry in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
        let path = entry.path();
        if !entry.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let Ok(pid) = std::fs::read_to_string(path.join(PARENT_PID)) else { continue };
        if !Path::new(&format!("/proc/{}", pid.trim())).exists() {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// The name an OCI archive's index gives its image (`io.containerd.image.name`, what `ctr images
/// import` names it).
fn image_name(archive: &Path) -> Result<String> {
    let out = Command::new("tar").arg("-xOf").arg(archive).arg("index.json").output().context("running tar")?;
    if !out.status.success() {
        bail!("reading index.json of {}: {}", archive.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    let index: serde_json::Value = serde_json::from_slice(&out.stdout).context("index.json")?;
    index["manifests"][0]["annotations"]["io.containerd.image.name"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("no image name in {}'s index.json", archive.display()))
}

/// Inside the sandbox: the cluster, the node, the injector, the scenarios.
fn child(root: &Path) -> Result<()> {
    let dir = PathBuf::from(std::env::var_os(SCRATCH).context("no scratch directory from the parent")?);
    sandbox::enter(&dir).context("entering the sandbox")?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let passed = run(root, &dir)?;
    std::fs::write(dir.join(PASSED), passed.to_string())?;
    Ok(())
}

fn run(root: &Path, dir: &Path) -> Result<usize> {
    let setup = Instant::now();
    let bin = root.join("e2e/bin");
    let plane = ControlPlane::start_for_node(&bin, dir, node::NODE_NAME, sandbox::NODE_IP)?;
    println!("node-e2e: control plane ready after {:.1} s", setup.elapsed().as_secs_f64());
    let binary: PathBuf = std::env::var_os("SIDECAR_INJECTOR_BIN")
        .map_or_else(|| env!("CARGO_BIN_EXE_sidecar-injector").into(), Into::into);
    // The image BuildKit built from the Dockerfile (e2e/image/build.sh); imported under the name the
    // build gave it, then tagged as the suite's overlay names it.
    let injector_image: PathBuf = std::env::var_os("SIDECAR_INJECTOR_IMAGE")
        .context("SIDECAR_INJECTOR_IMAGE: the OCI archive e2e/image/build.sh writes (`make node-e2e` builds it)")?
        .into();
    let built_name = image_name(&injector_image)?;
    let images_dir = bin.join("node/images");
    let mut images: Vec<PathBuf> = ["pause", "busybox", "fluent-bit", "agent", "agent-files"]
        .iter()
        .map(|i| images_dir.join(format!("{i}.tar")))
        .collect();
    images.push(injector_image);
    let node = Node::start(&plane, &bin.join("node"), &images)?;
    node.ctr(&["images", "tag", &built_name, scenarios::INJECTOR_IMAGE])?;
    println!("node-e2e: node and images ready after {:.1} s", setup.elapsed().as_secs_f64());
    let mut ctx = Ctx { plane, node, binary };
    scenarios::setup(&mut ctx).context("the suite's setup (install, namespace, local images)")?;
    println!("node-e2e: injector installed after {:.1} s", setup.elapsed().as_secs_f64());

    use scenarios::*;
    let all: Vec<(&str, Scenario)> = vec![
        ("n1_install", n1_install),
        ("n2_workloads", n2_workloads),
        ("n3_jobs_complete", n3_jobs_complete),
        ("n9_env_merge", n9_env_merge),
        ("n10_native_by_nodes", n10_native_by_nodes),
        ("n11_pod_level_resources", n11_pod_level_resources),
        ("n12_enforced_resize", n12_enforced_resize),
        ("n13_in_place_upgrade", n13_in_place_upgrade),
        ("n14_image_volumes", n14_image_volumes),
        ("n16_scheduling_gate", n16_scheduling_gate),
        ("n17_pod_security", n17_pod_security),
        ("n18_declared_features", n18_declared_features),
        ("n19_rollout_halt", n19_rollout_halt),
        ("n4_drift_restart", n4_drift_restart),
        ("n5_injector_down", n5_injector_down),
        ("n6_attacks_on_the_pod", n6_attacks_on_the_pod),
        ("n7_availability", n7_availability),
        ("n8_helm_chart", n8_helm_chart),
        // Last: it moves the install to cert-manager's certificates.
        ("n15_cert_manager", n15_cert_manager),
    ];
    // `SIDECAR_INJECTOR_E2E_ONLY=n1,n2` runs only the scenarios whose names start with these.
    let only: Vec<String> = std::env::var("SIDECAR_INJECTOR_E2E_ONLY")
        .map(|v| v.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect())
        .unwrap_or_default();
    let mut passed = 0;
    let mut failed = Vec::new();
    // Each scenario must name only the suite's local images: a pull attempt fails the scenario
    // that made it (the ones already seen belong to an earlier one).
    let mut pulls_seen = pull_attempts(&ctx)?;
    if !pulls_seen.is_empty() {
        println!("  FAIL  setup: the kubelet tried to pull images:\n    {}", pulls_seen.join("\n    "));
        failed.push("setup");
    }
    for (name, scenario) in all {
        if !only.is_empty() && !only.iter().any(|o| name.starts_with(o.as_str())) {
            continue;
        }
        let started = Instant::now();
        // Read after every scenario, passed or failed, so a failed one's pulls are never blamed
        // on the next.
        let outcome = scenario(&mut ctx);
        let pulls: Vec<String> =
            pull_attempts(&ctx).unwrap_or_default().into_iter().filter(|p| !pulls_seen.contains(p)).collect();
        pulls_seen.extend(pulls.iter().cloned());
        let outcome = match (outcome, pulls.is_empty()) {
            (outcome, true) => outcome,
            (Ok(()), false) => Err(anyhow::anyhow!("the kubelet tried to pull images:\n    {}", pulls.join("\n    "))),
            (Err(error), false) => {
                Err(error.context(format!("the kubelet tried to pull images: {}", pulls.join("; "))))
            }
        };
        match outcome {
            Ok(()) => {
                passed += 1;
                println!("  ok    {name} ({:.1} s)", started.elapsed().as_secs_f64());
            }
            Err(error) => {
                println!("  FAIL  {name} ({:.1} s): {error:#}", started.elapsed().as_secs_f64());
                failed.push(name);
            }
        }
    }
    // For working on the suite: `SIDECAR_INJECTOR_NODE_E2E_HOLD=1` keeps the cluster up until the
    // file it names is removed (`nsenter -t <pid> -m -n` enters the sandbox meanwhile).
    if std::env::var_os("SIDECAR_INJECTOR_NODE_E2E_HOLD").is_some() {
        let hold = dir.join("hold");
        std::fs::write(&hold, "")?;
        println!(
            "node-e2e: holding; pid {}; kubeconfig {}; rm {} to go on",
            std::process::id(),
            ctx.plane.admin_kubeconfig.display(),
            hold.display()
        );
        while hold.exists() {
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }
    if !failed.is_empty() {
        println!("{}", ctx.node.tails(30));
        if let Ok(logs) = ctx.plane.kubectl(&["-n", "sidecar-injector", "logs", "deploy/sidecar-injector", "--tail=30"])
        {
            println!("--- injector log (last 30 lines)\n{logs}");
        }
        bail!("{} scenario(s) failed: {}", failed.len(), failed.join(", "));
    }
    ctx.teardown();
    Ok(passed)
}
