//! Keeps the real node off the host. The suite runs in a child process with a mount and a network
//! namespace of its own, so everything the node does to mounts, links, routes, iptables and the
//! per-namespace sysctls (`ip_forward`, `route_localnet`) vanishes with it; the few host-global
//! things it touches are fenced one by one:
//! - **kernel tunables** kubelet would write (`kernel.panic`, `panic_on_oops`,
//!   `vm.overcommit_memory`, ...): files holding the values kubelet wants are bind-mounted over
//!   them inside the namespace, and kubelet runs with `protectKernelDefaults` (it reads, never writes);
//! - **paths kubelet and containerd hard-code** (`/var/log/pods`, `/run/containerd`, `/run/netns`,
//!   `/var/lib/cni`): `/run`, `/var/log` and `/var/lib` are private mounts of scratch directories;
//! - **cgroups**: every process of the suite and every pod lives under [`CGROUP`] in each
//!   hierarchy (kubelet's `cgroupRoot`); the parent kills whatever is left there and removes it.
//!
//! The parent snapshots the host before and compares after ([`HostState`]), and removes what a
//! crashed earlier run left ([`remove_leftovers`]) before it starts.

// The harness calls libc (signals, rlimits, mounts, an allocator) where `unsafe` is the only way.
#![allow(unsafe_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

/// The cgroup (in every hierarchy) under which the suite and its pods run.
pub const CGROUP: &str = "sidecar-injector-node-e2e";

/// The node's address: on a bridge of its own inside the suite's network namespace (kubelet refuses
/// a loopback node IP).
pub const NODE_IP: &str = "10.213.0.1";

/// Kernel tunables kubelet sets when they differ from what it wants, with the values it wants.
const KUBELET_TUNABLES: [(&str, &str); 6] = [
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// Host-global sysctls compared before and after besides kubelet's: the ones a CNI plugin or
/// kube-proxy could change outside a network namespace.
const OTHER_WATCHED_SYSCTLS: [&str; 4] = [
    "net/ipv4/ip_forward",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "net/netfilter/nf_conntrack_max",
];

/// Process names of the node and control plane: none may outlive the suite.
const NODE_PROCESSES: [&str; 9] = [
    "kubelet",
    "kube-proxy",
    "containerd",
    "containerd-shim",
    "kube-apiserver",
    "etcd",
    "kube-controller",
    "kube-scheduler",
    "sidecar-injecto",
];

/// Paths kubelet, containerd and the CNI plugins use outside their configured directories.
const HOST_PATHS: [&str; 8] = [
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    "/run/netns",
    "/var/lib/cni",
    "/var/lib/kubelet",
    "/etc/cni",
    "/opt/cni",
];

/// What the host looks like in the places the node could leave traces.
#[derive(Debug, PartialEq)]
pub struct HostState {
    sysctls: Vec<(String, String)>,
    iptables: String,
    links: String,
    routes: String,
    mounts: BTreeSet<String>,
    paths: Vec<(String, bool)>,
    cgroups: Vec<String>,
}

impl HostState {
    /// Reads the host's state (run in the host's namespaces).
    pub fn read() -> HostState {
        let sysctls = KUBELET_TUNABLES
            .iter()
            .map(|(name, _)| name)
            .chain(&OTHER_WATCHED_SYSCTLS)
            .map(|name| {
                let value = std::fs::read_to_string(format!("/proc/sys/{name}")).unwrap_or_else(|_| "(absent)".into());
                (name.to_string(), value.trim().to_owned())
            })
            .collect();
        let mut iptables = String::new();
        for save in ["iptables-save", "ip6tables-save"] {
            // Counters and the generation comments change by themselves; rules and chains do not.
            let text = output(&mut Command::new(save)).unwrap_or_default();
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                iptables += &strip_counters(line);
                iptables.push('\n');
            }
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(4).map(str::to_owned))
            .collect();
        let paths = HOST_PATHS.iter().map(|p| (p.to_string(), Path::new(p).exists())).collect();
        HostState {
            sysctls,
            iptables,
            links: output(Command::new("ip").args(["-o", "link", "show"]))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split(':').nth(1).map(|n| n.trim().to_owned()))
                .collect::<Vec<_>>()
                .join(" "),
            routes: output(Command::new("ip").args(["route", "show", "table", "all"])).unwrap_or_default(),
            mounts,
            paths,
            cgroups: cgroup_dirs(),
        }
    }

    /// What differs from `before`, one line per difference.
    pub fn differences(&self, before: &HostState) -> Vec<String> {
        let mut found = Vec::new();
        for ((name, was), (_, now)) in before.sysctls.iter().zip(&self.sysctls) {
            if was != now {
                found.push(format!("sysctl {name}: {was} → {now}"));
            }
        }
        if before.iptables != self.iptables {
            found.push(format!("iptables rules differ:\n{}", line_diff(&before.iptables, &self.iptables)));
        }
        if before.links != self.links {
            found.push(format!("network links: [{}] → [{}]", before.links, self.links));
        }
        if before.routes != self.routes {
            found.push(format!("routes differ:\n{}", line_diff(&before.routes, &self.routes)));
        }
        let added: Vec<_> = self.mounts.difference(&before.mounts).collect();
        if !added.is_empty() {
            found.push(format!("mounts left: {added:?}"));
        }
        for ((path, was), (_, now)) in before.paths.iter().zip(&self.paths) {
            if was != now {
                found.push(format!("{path}: {} → {}", exists(*was), exists(*now)));
            }
        }
        if !self.cgroups.is_empty() {
            found.push(format!("cgroups left: {:?}", self.cgroups));
        }
        found
    }
}

fn exists(yes: bool) -> &'static str {
    if yes { "present" } else { "absent" }
}

fn strip_counters(line: &str) -> String {
    // `:INPUT ACCEPT [12:3456]` → `:INPUT ACCEPT`
    match (line.starts_with(':'), line.rfind(" [")) {
        (true, Some(at)) => line[..at].to_owned(),
        _ => line.to_owned(),
    }
}

fn line_diff(before: &str, after: &str) -> String {
    let was: BTreeSet<&str> = before.lines().collect();
    let now: BTreeSet<&str> = after.lines().collect();
    let mut text = String::new();
    for line in was.difference(&now) {
        text += &format!("  - {line}\n");
    }
    for line in now.difference(&was) {
        text += &format!("  + {line}\n");
    }
    text
}

fn output(command: &mut Command) -> Option<String> {
    let out = command.output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The cgroup hierarchies of the host: every mount under `/sys/fs/cgroup`.
fn hierarchies() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(" - cgroup ") || l.contains(" - cgroup2 "))
        .filter_map(|l| l.split_whitespace().nth(4).map(PathBuf::from))
        .filter(|p| p.starts_with("/sys/fs/cgroup"))
        .collect()
}

/// Our cgroup directory in every hierarchy where it exists.
fn cgroup_dirs() -> Vec<String> {
    hierarchies().into_iter().map(|h| h.join(CGROUP)).filter(|p| p.exists()).map(|p| p.display().to_string()).collect()
}

/// Every directory of a cgroup subtree, deepest first.
fn subtree(root: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_owned()];
    let mut i = 0;
    while i < dirs.len() {
        if let Ok(entries) = std::fs::read_dir(&dirs[i]) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(entry.path());
                }
            }
        }
        i += 1;
    }
    dirs.reverse();
    dirs
}

/// Kills every process in our cgroups (the suite's, a crashed earlier run's) and removes the
/// cgroups. Returns how many processes it had to kill.
pub fn remove_leftovers() -> Result<usize> {
    let mut killed = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut pids = BTreeSet::new();
        for hierarchy in hierarchies() {
            let root = hierarchy.join(CGROUP);
            for dir in subtree(&root).into_iter().filter(|d| d.exists()) {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        if pids.is_empty() {
            break;
        }
        ensure!(Instant::now() < deadline, "processes in the {CGROUP} cgroups would not die: {pids:?}");
        for pid in &pids {
            // SIGKILL reaches stopped and frozen processes too.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
            killed.insert(*pid);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for hierarchy in hierarchies() {
        let root = hierarchy.join(CGROUP);
        if !root.exists() {
            continue;
        }
        for dir in subtree(&root) {
            // A cgroup is removable a moment after its last process is reaped.
            let deadline = Instant::now() + Duration::from_secs(10);
            while let Err(error) = std::fs::remove_dir(&dir) {
                if error.kind() == std::io::ErrorKind::NotFound {
                    break;
                }
                ensure!(Instant::now() < deadline, "cannot remove cgroup {}: {error}", dir.display());
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    Ok(killed.len())
}

/// Inside the child, right after it entered its own mount and network namespaces: makes the
/// mounts private, hides the hard-coded host paths behind scratch directories, fences the kernel
/// tunables, brings up loopback and the node's bridge, and moves this process into [`CGROUP`] so
/// that every process it starts is found there.
pub fn enter(scratch: &Path) -> Result<()> {
    run("mount", &["--make-rprivate", "/"])?;
    run("mount", &["-t", "tmpfs", "-o", "mode=755,size=256m", "tmpfs", "/run"])?;
    for (dir, over) in [("var-log", "/var/log"), ("var-lib", "/var/lib")] {
        let private = scratch.join(dir);
        std::fs::create_dir_all(&private)?;
        run("mount", &["--bind", &private.display().to_string(), over])?;
    }
    let tunables = scratch.join("sysctl");
    std::fs::create_dir_all(&tunables)?;
    for (name, value) in KUBELET_TUNABLES {
        let file = tunables.join(name.replace('/', "."));
        std::fs::write(&file, format!("{value}\n"))?;
        run("mount", &["--bind", &file.display().to_string(), &format!("/proc/sys/{name}")])?;
    }
    run("ip", &["link", "set", "lo", "up"])?;
    run("ip", &["link", "add", "node0", "type", "bridge"])?;
    run("ip", &["addr", "add", &format!("{NODE_IP}/32"), "dev", "node0"])?;
    run("ip", &["link", "set", "node0", "up"])?;
    // A real node has a default route. Connections this namespace makes to a ClusterIP (the API
    // server calling the webhook's Service) need one: the route is looked up before kube-proxy's
    // DNAT rewrites the destination. Nothing leaves through it; the bridge has no uplink.
    run("ip", &["route", "add", "default", "dev", "node0"])?;
    let pid = std::process::id().to_string();
    for hierarchy in hierarchies() {
        let ours = hierarchy.join(CGROUP);
        std::fs::create_dir_all(&ours).with_context(|| format!("creating {}", ours.display()))?;
        if hierarchy.ends_with("cpuset") {
            // A new cpuset has no CPUs or memory nodes until given its parent's.
            for file in ["cpuset.cpus", "cpuset.mems"] {
                std::fs::write(ours.join(file), std::fs::read_to_string(hierarchy.join(file))?)?;
            }
        }
    }
    // Only the pids hierarchy holds the suite itself: enough to find every process it starts.
    let suite = Path::new("/sys/fs/cgroup/pids").join(CGROUP).join("suite");
    std::fs::create_dir_all(&suite)?;
    std::fs::write(suite.join("cgroup.procs"), &pid).context("joining the suite's cgroup")?;
    Ok(())
}

/// Runs a command, failing with its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Process ids of node and control-plane processes running now (by name).
pub fn node_processes() -> BTreeSet<(u32, String)> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default().trim().to_owned();
        // A killed process stays in /proc as a zombie until its parent (often init) reaps it.
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z'));
        if !zombie && NODE_PROCESSES.iter().any(|p| name.starts_with(p)) {
            found.insert((pid, name));
        }
    }
    found
}
