//! Pod Security Admission's levels (`privileged`, `baseline`, `restricted`), decided as the API
//! server decides them: the 19 checks of `k8s.io/pod-security-admission` at v0.37, each in the
//! variant of the policy version asked for, with Kubernetes' own words for what fails (the facts
//! are in docs/notes/pod-security-checks.md). A leaf of the engine: it reads a pod as JSON and
//! says which checks it fails, so that an injection can be judged before the API server refuses
//! the pod for containers we added (issue 60), and `check-templates` can say what level a
//! template's containers meet.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde_json::Value;

/// The newest policy version the checks know: `latest` means `v1.37`.
pub const LATEST_MINOR: u32 = 37;

/// A Pod Security level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// No checks.
    Privileged,
    /// Known privilege escalations refused.
    Baseline,
    /// Hardening best practice on top of baseline.
    Restricted,
}

impl Level {
    /// The level a label value names (exactly, as the API server reads it).
    pub fn parse(text: &str) -> Option<Level> {
        match text {
            "privileged" => Some(Level::Privileged),
            "baseline" => Some(Level::Baseline),
            "restricted" => Some(Level::Restricted),
            _ => None,
        }
    }

    /// The level's name, as labels and messages write it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

/// What a namespace's level does in each of Pod Security Admission's modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Refuses a pod that fails the level.
    Enforce,
    /// Admits it with a warning to the client.
    Warn,
    /// Admits it with an audit annotation.
    Audit,
}

impl Mode {
    /// The mode's name, as its labels write it (`pod-security.kubernetes.io/<mode>`).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Warn => "warn",
            Mode::Audit => "audit",
        }
    }

    /// Its level label and its version label (read at every admission: no key is built).
    fn labels(self) -> (&'static str, &'static str) {
        match self {
            Mode::Enforce => ("pod-security.kubernetes.io/enforce", "pod-security.kubernetes.io/enforce-version"),
            Mode::Warn => ("pod-security.kubernetes.io/warn", "pod-security.kubernetes.io/warn-version"),
            Mode::Audit => ("pod-security.kubernetes.io/audit", "pod-security.kubernetes.io/audit-version"),
        }
    }
}

/// The policy a namespace's `pod-security.kubernetes.io/<mode>` labels set for one mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The level.
    pub level: Level,
    /// The minor version the checks run at (`latest` and newer versions clamped to the newest
    /// the checks and the API server know).
    pub minor: u32,
    /// The version as the label says it (`latest` when absent or invalid): messages show it.
    pub version_label: String,
}

impl Policy {
    /// The enforce policy of a namespace with `labels`, on an API server of minor version
    /// `server_minor` (see [`Policy::of`]).
    pub fn enforce_of(labels: &BTreeMap<String, String>, server_minor: u32) -> Policy {
        Policy::of(labels, Mode::Enforce, server_minor)
    }

    /// The policy of `mode` in a namespace with `labels`, on an API server of minor version
    /// `server_minor`, read as the API server reads it (no `AdmissionConfiguration` defaults: a
    /// missing label is `privileged` at `latest`). An invalid level is `restricted` for `enforce`
    /// (it fails closed) and `privileged` for `warn` and `audit` (they fail open); an absent or
    /// invalid version is `latest`. Without a `warn` label, `warn` takes a valid `enforce` level
    /// stricter than `privileged`, with its version unless `warn-version` is set.
    pub fn of(labels: &BTreeMap<String, String>, mode: Mode, server_minor: u32) -> Policy {
        let get = |mode: Mode, version: bool| {
            let (level, version_label) = mode.labels();
            labels.get(if version { version_label } else { level }).map(String::as_str)
        };
        let enforce = get(Mode::Enforce, false).and_then(Level::parse);
        let (level, version_from) = match (mode, get(mode, false)) {
            (Mode::Warn, None) if enforce.is_some_and(|level| level > Level::Privileged) => {
                let from = if get(Mode::Warn, true).is_some() { Mode::Warn } else { Mode::Enforce };
                (enforce.unwrap_or(Level::Privileged), from)
            }
            (_, None) => (Level::Privileged, mode),
            (Mode::Enforce, Some(text)) => (Level::parse(text).unwrap_or(Level::Restricted), mode),
            (_, Some(text)) => (Level::parse(text).unwrap_or(Level::Privileged), mode),
        };
        let newest = LATEST_MINOR.min(server_minor);
        let (minor, version_label) = match get(version_from, true).and_then(parse_version) {
            Some(minor) => (minor.min(newest), format!("v1.{minor}")),
            None => (newest, "latest".to_owned()),
        };
        Policy { level, minor, version_label }
    }

    /// The checks `pod` fails under this policy (none at `privileged`).
    pub fn violations(&self, pod: &Value) -> Vec<Violation> {
        violations(pod, self.level, self.minor)
    }

    /// When `after` (a pod with what an injection adds) fails this policy where `before` (the pod
    /// without it) passes, the checks it fails: the injection is what the API server would act
    /// on. Empty when both pass, or when `before` fails already.
    pub fn broken_by(&self, before: &Value, after: &Value) -> Vec<Violation> {
        if self.level == Level::Privileged || !self.violations(before).is_empty() {
            return Vec::new();
        }
        self.violations(after)
    }

    /// The API server's refusal of a pod that fails `violations` under this policy.
    pub fn message(&self, violations: &[Violation]) -> String {
        format!("violates PodSecurity \"{}:{}\": {}", self.level.name(), self.version_label, Self::items(violations))
    }

    /// The API server's warning (the `warn` mode) for a pod that fails `violations`.
    pub fn warning(&self, violations: &[Violation]) -> String {
        format!(
            "would violate PodSecurity \"{}:{}\": {}",
            self.level.name(),
            self.version_label,
            Self::items(violations)
        )
    }

    fn items(violations: &[Violation]) -> String {
        let items: Vec<String> = violations
            .iter()
            .map(|v| match v.detail.is_empty() {
                true => v.reason.clone(),
                false => format!("{} ({})", v.reason, v.detail),
            })
            .collect();
        items.join(", ")
    }
}

/// `v1.<minor>` as the API server accepts it: no leading zero, nothing around it.
fn parse_version(text: &str) -> Option<u32> {
    let minor = text.strip_prefix("v1.")?;
    let canonical = minor == "0" || (!minor.starts_with('0') && !minor.is_empty());
    (canonical && minor.bytes().all(|b| b.is_ascii_digit())).then(|| minor.parse().ok()).flatten()
}

/// One failed check, in Kubernetes' words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The check's ID (`allowPrivilegeEscalation`, `restrictedVolumes`, ...).
    pub check: &'static str,
    /// What is forbidden (`allowPrivilegeEscalation != false`).
    pub reason: String,
    /// Who and what (`container "app" must set securityContext.allowPrivilegeEscalation=false`).
    pub detail: String,
}

/// The checks `pod` fails at `level` and policy version `v1.<minor>`, in the order the API server
/// lists them (baseline checks, then restricted ones, each by ID).
pub fn violations(pod: &Value, level: Level, minor: u32) -> Vec<Violation> {
    if level == Level::Privileged {
        return Vec::new();
    }
    let pod = PodView::new(pod);
    let restricted = level == Level::Restricted;
    let v = minor;
    // (ID, runs at this level and version, the check)
    let checks: [(&'static str, bool, CheckFn); 19] = [
        ("appArmorProfile", true, app_armor),
        ("capabilities_baseline", !(restricted && v >= 22), capabilities_baseline),
        ("hostNamespaces", true, host_namespaces),
        ("hostPathVolumes", !restricted, host_path_volumes),
        ("hostPorts", true, host_ports),
        ("hostProbesAndHostLifecycle", v >= 34, probe_hosts),
        ("privileged", true, privileged),
        ("procMount", !(restricted && v >= 35), proc_mount_baseline),
        ("seLinuxOptions", true, se_linux),
        ("seccompProfile_baseline", !(restricted && v >= 19), seccomp_baseline),
        ("sysctls", true, sysctls),
        ("windowsHostProcess", true, windows_host_process),
        ("allowPrivilegeEscalation", restricted && v >= 8, allow_privilege_escalation),
        ("capabilities_restricted", restricted && v >= 22, capabilities_restricted),
        ("procMount_restricted", restricted && v >= 35, proc_mount_restricted),
        ("restrictedVolumes", restricted, restricted_volumes),
        ("runAsNonRoot", restricted, run_as_non_root),
        ("runAsUser", restricted && v >= 23, run_as_user),
        ("seccompProfile_restricted", restricted && v >= 19, seccomp_restricted),
    ];
    checks
        .into_iter()
        .filter(|(_, runs, _)| *runs)
        .filter_map(|(check, _, run)| run(&pod, v).map(|(reason, detail)| Violation { check, reason, detail }))
        .collect()
}

/// The highest level `pod` meets at `v1.<minor>`, and what keeps it from the next one (empty
/// at `restricted`).
pub fn highest_level(pod: &Value, minor: u32) -> (Level, Vec<Violation>) {
    let baseline = violations(pod, Level::Baseline, minor);
    if !baseline.is_empty() {
        return (Level::Privileged, baseline);
    }
    let restricted = violations(pod, Level::Restricted, minor);
    match restricted.is_empty() {
        true => (Level::Restricted, restricted),
        false => (Level::Baseline, restricted),
    }
}

/// The highest level what a template adds meets on its own at the newest policy version: a pod of
/// only its init containers, sidecars and volumes (rendered for a sample pod), with no pod-level
/// security settings, so every container must carry its own. What keeps it from the next level.
pub fn of_additions(rendered: &crate::injection::render::RenderedTemplate) -> (Level, Vec<Violation>) {
    let pod = serde_json::json!({"spec": {
        "initContainers": rendered.init_containers,
        "containers": rendered.sidecars,
        "volumes": rendered.pod_list(crate::model::kinds::VOLUMES),
    }});
    highest_level(&pod, LATEST_MINOR)
}

/// A check: `(reason, detail)` when the pod fails it.
type CheckFn = fn(&PodView, u32) -> Option<(String, String)>;

/// The parts of a pod the checks read.
struct PodView<'a> {
    spec: &'a Value,
    annotations: Vec<(&'a str, &'a str)>,
    /// Init containers, containers, ephemeral containers: the order messages name them in.
    containers: Vec<(&'a str, &'a Value)>,
}

impl<'a> PodView<'a> {
    fn new(pod: &'a Value) -> Self {
        let spec = pod.get("spec").unwrap_or(&Value::Null);
        let annotations = pod
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
            .map(|m| m.iter().filter_map(|(k, v)| Some((k.as_str(), v.as_str()?))).collect())
            .unwrap_or_default();
        let containers = ["initContainers", "containers", "ephemeralContainers"]
            .iter()
            .filter_map(|list| spec.get(*list).and_then(Value::as_array))
            .flatten()
            .map(|c| (c.get("name").and_then(Value::as_str).unwrap_or_default(), c))
            .collect();
        PodView { spec, annotations, containers }
    }

    /// A field of the pod's `securityContext`.
    fn pod_security(&self, path: &str) -> Option<&'a Value> {
        self.spec.get("securityContext")?.pointer(path)
    }

    /// Each container with a field of its `securityContext` (`None` where absent).
    fn container_security(&self, path: &'a str) -> impl Iterator<Item = (&'a str, Option<&'a Value>)> + '_ {
        self.containers.iter().map(move |(name, c)| (*name, c.get("securityContext").and_then(|s| s.pointer(path))))
    }

    fn is_windows(&self) -> bool {
        self.spec.pointer("/os/name").and_then(Value::as_str) == Some("windows")
    }

    fn host_users_false(&self) -> bool {
        self.spec.get("hostUsers").and_then(Value::as_bool) == Some(false)
    }
}

/// `"a", "b"`: each quoted as is, joined.
fn quoted<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> String {
    items.into_iter().map(|i| format!("\"{}\"", i.as_ref())).collect::<Vec<_>>().join(", ")
}

/// `container "a"` or `containers "a", "b"`.
fn containers_named(names: &[&str]) -> String {
    format!("{} {}", if names.len() == 1 { "container" } else { "containers" }, quoted(names))
}

/// `pod`, then the containers, joined with ` and ` (the parts present).
fn setters(pod: bool, containers: &[&str]) -> String {
    let mut parts = Vec::new();
    if pod {
        parts.push("pod".to_owned());
    }
    if !containers.is_empty() {
        parts.push(containers_named(containers));
    }
    parts.join(" and ")
}

/// Go's `strconv.Quote`, which the API server uses for annotation values in messages.
fn go_quote(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = match c as u32 {
                    n if n <= 0xffff => write!(out, "\\u{n:04x}"),
                    n => write!(out, "\\U{n:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn str_at<'a>(value: Option<&'a Value>, key: &str) -> Option<&'a str> {
    value?.get(key)?.as_str()
}

fn app_armor(pod: &PodView, _: u32) -> Option<(String, String)> {
    let allowed = |t: &str| t == "RuntimeDefault" || t == "Localhost";
    let mut bad_types = BTreeSet::new();
    let mut judge = |profile: &Value| {
        let t = str_at(Some(profile), "type").unwrap_or_default();
        if !allowed(t) {
            bad_types.insert(t.to_owned());
        }
        !allowed(t)
    };
    let pod_bad = pod.pod_security("/appArmorProfile").is_some_and(&mut judge);
    let bad_containers: Vec<&str> =
        pod.container_security("/appArmorProfile").filter(|(_, p)| p.is_some_and(&mut judge)).map(|(n, _)| n).collect();
    let mut bad_annotations: Vec<String> = pod
        .annotations
        .iter()
        .filter(|(k, _)| k.starts_with("container.apparmor.security.beta.kubernetes.io/"))
        .filter(|(_, v)| !(v.is_empty() || *v == "runtime/default" || v.starts_with("localhost/")))
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect();
    if !pod_bad && bad_containers.is_empty() && bad_annotations.is_empty() {
        return None;
    }
    bad_annotations.sort();
    let mut who = vec![setters(pod_bad, &bad_containers)].into_iter().filter(|s| !s.is_empty()).collect::<Vec<_>>();
    match bad_annotations.len() {
        0 => {}
        1 => who.push("annotation".to_owned()),
        _ => who.push("annotations".to_owned()),
    }
    let values: Vec<String> = bad_types.into_iter().chain(bad_annotations).collect();
    let reason = if values.len() == 1 { "forbidden AppArmor profile" } else { "forbidden AppArmor profiles" };
    Some((
        reason.to_owned(),
        format!("{} must not set AppArmor profile type to {}", who.join(" and "), quoted(&values)),
    ))
}

const DEFAULT_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The containers that add a capability `allowed` refuses, and those capabilities.
fn added_capabilities<'a>(pod: &PodView<'a>, allowed: &dyn Fn(&str) -> bool) -> (Vec<&'a str>, BTreeSet<String>) {
    let (mut containers, mut capabilities) = (Vec::new(), BTreeSet::new());
    for (name, add) in pod.container_security("/capabilities/add") {
        let bad: Vec<&str> = add.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        let bad: Vec<&str> = bad.into_iter().filter(|c| !allowed(c)).collect();
        if !bad.is_empty() {
            containers.push(name);
            capabilities.extend(bad.into_iter().map(str::to_owned));
        }
    }
    (containers, capabilities)
}

fn capabilities_baseline(pod: &PodView, _: u32) -> Option<(String, String)> {
    let (containers, capabilities) = added_capabilities(pod, &|c| DEFAULT_CAPABILITIES.contains(&c));
    (!containers.is_empty()).then(|| {
        let detail = format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_named(&containers),
            quoted(&capabilities)
        );
        ("non-default capabilities".to_owned(), detail)
    })
}

fn host_namespaces(pod: &PodView, _: u32) -> Option<(String, String)> {
    let set: Vec<String> = ["hostNetwork", "hostPID", "hostIPC"]
        .iter()
        .filter(|f| pod.spec.get(**f).and_then(Value::as_bool) == Some(true))
        .map(|f| format!("{f}=true"))
        .collect();
    (!set.is_empty()).then(|| ("host namespaces".to_owned(), set.join(", ")))
}

fn volumes<'a>(pod: &PodView<'a>) -> impl Iterator<Item = (&'a str, &'a Value)> {
    let list = pod.spec.get("volumes").and_then(Value::as_array);
    list.into_iter().flatten().map(|v| (v.get("name").and_then(Value::as_str).unwrap_or_default(), v))
}

fn host_path_volumes(pod: &PodView, _: u32) -> Option<(String, String)> {
    let names: Vec<&str> = volumes(pod).filter(|(_, v)| v.get("hostPath").is_some()).map(|(n, _)| n).collect();
    let noun = if names.len() == 1 { "volume" } else { "volumes" };
    (!names.is_empty()).then(|| ("hostPath volumes".to_owned(), format!("{noun} {}", quoted(&names))))
}

/// `uses` for one, `use` for several.
fn uses(count: usize) -> &'static str {
    if count == 1 { "uses" } else { "use" }
}

fn host_ports(pod: &PodView, _: u32) -> Option<(String, String)> {
    let (mut containers, mut ports) = (Vec::new(), BTreeSet::new());
    for (name, container) in &pod.containers {
        let list = container.get("ports").and_then(Value::as_array);
        let host: Vec<i64> = list
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("hostPort").and_then(Value::as_i64))
            .filter(|p| *p != 0)
            .collect();
        if !host.is_empty() {
            containers.push(*name);
            ports.extend(host.into_iter().map(|p| p.to_string()));
        }
    }
    (!containers.is_empty()).then(|| {
        let noun = if ports.len() == 1 { "hostPort" } else { "hostPorts" };
        let ports: Vec<String> = ports.into_iter().collect();
        let detail =
            format!("{} {} {noun} {}", containers_named(&containers), uses(containers.len()), ports.join(", "));
        ("hostPort".to_owned(), detail)
    })
}

fn probe_hosts(pod: &PodView, _: u32) -> Option<(String, String)> {
    let (mut containers, mut hosts) = (BTreeSet::new(), BTreeSet::new());
    let handlers = ["/livenessProbe", "/readinessProbe", "/startupProbe", "/lifecycle/postStart", "/lifecycle/preStop"];
    for (name, container) in &pod.containers {
        for handler in handlers {
            for action in ["httpGet", "tcpSocket"] {
                let host = container.pointer(&format!("{handler}/{action}/host")).and_then(Value::as_str);
                if let Some(host) = host.filter(|h| !h.is_empty()) {
                    containers.insert(*name);
                    hosts.insert(host);
                }
            }
        }
    }
    (!containers.is_empty()).then(|| {
        let names: Vec<&str> = containers.into_iter().collect();
        let noun = if hosts.len() == 1 { "probe or lifecycle host" } else { "probe or lifecycle hosts" };
        let detail = format!("{} {} {noun} {}", containers_named(&names), uses(names.len()), quoted(&hosts));
        ("probe or lifecycle host".to_owned(), detail)
    })
}

fn privileged(pod: &PodView, _: u32) -> Option<(String, String)> {
    let bad: Vec<&str> = pod
        .container_security("/privileged")
        .filter(|(_, v)| v.and_then(Value::as_bool) == Some(true))
        .map(|(n, _)| n)
        .collect();
    let detail = || format!("{} must not set securityContext.privileged=true", containers_named(&bad));
    (!bad.is_empty()).then(|| ("privileged".to_owned(), detail()))
}

fn proc_mount(pod: &PodView) -> Option<(String, String)> {
    let (mut containers, mut values) = (Vec::new(), BTreeSet::new());
    for (name, value) in pod.container_security("/procMount") {
        if let Some(value) = value.and_then(Value::as_str).filter(|v| *v != "Default") {
            containers.push(name);
            values.insert(value);
        }
    }
    (!containers.is_empty()).then(|| {
        let detail =
            format!("{} must not set securityContext.procMount to {}", containers_named(&containers), quoted(&values));
        ("procMount".to_owned(), detail)
    })
}

fn proc_mount_baseline(pod: &PodView, minor: u32) -> Option<(String, String)> {
    if minor >= 35 && pod.host_users_false() {
        return None;
    }
    proc_mount(pod)
}

fn proc_mount_restricted(pod: &PodView, _: u32) -> Option<(String, String)> {
    proc_mount(pod)
}

fn se_linux(pod: &PodView, minor: u32) -> Option<(String, String)> {
    let allowed = |t: &str| {
        ["", "container_t", "container_init_t", "container_kvm_t"].contains(&t)
            || (minor >= 31 && t == "container_engine_t")
    };
    let (mut types, mut user, mut role) = (BTreeSet::new(), false, false);
    let mut judge = |options: &Value| {
        let mut bad = false;
        let t = str_at(Some(options), "type").unwrap_or_default();
        if !allowed(t) {
            types.insert(t.to_owned());
            bad = true;
        }
        if !str_at(Some(options), "user").unwrap_or_default().is_empty() {
            (user, bad) = (true, true);
        }
        if !str_at(Some(options), "role").unwrap_or_default().is_empty() {
            (role, bad) = (true, true);
        }
        bad
    };
    let pod_bad = pod.pod_security("/seLinuxOptions").is_some_and(&mut judge);
    let containers: Vec<&str> = pod
        .container_security("/seLinuxOptions")
        .filter(|(_, options)| options.is_some_and(&mut judge))
        .map(|(n, _)| n)
        .collect();
    if !pod_bad && containers.is_empty() {
        return None;
    }
    let mut data = Vec::new();
    match types.len() {
        0 => {}
        1 => data.push(format!("type {}", quoted(&types))),
        _ => data.push(format!("types {}", quoted(&types))),
    }
    if user {
        data.push("user may not be set".to_owned());
    }
    if role {
        data.push("role may not be set".to_owned());
    }
    let detail =
        format!("{} set forbidden securityContext.seLinuxOptions: {}", setters(pod_bad, &containers), data.join("; "));
    Some(("seLinuxOptions".to_owned(), detail))
}

/// A seccomp profile type the restricted and baseline levels allow.
fn allowed_seccomp(t: &str) -> bool {
    t == "RuntimeDefault" || t == "Localhost"
}

fn seccomp_baseline(pod: &PodView, minor: u32) -> Option<(String, String)> {
    if minor < 19 {
        return seccomp_annotations(pod);
    }
    let mut types = BTreeSet::new();
    let mut judge = |profile: &Value| {
        let t = str_at(Some(profile), "type").unwrap_or_default();
        if !allowed_seccomp(t) {
            types.insert(t.to_owned());
        }
        !allowed_seccomp(t)
    };
    let pod_bad = pod.pod_security("/seccompProfile").is_some_and(&mut judge);
    let containers: Vec<&str> =
        pod.container_security("/seccompProfile").filter(|(_, p)| p.is_some_and(&mut judge)).map(|(n, _)| n).collect();
    (pod_bad || !containers.is_empty()).then(|| {
        let detail = format!(
            "{} must not set securityContext.seccompProfile.type to {}",
            setters(pod_bad, &containers),
            quoted(&types)
        );
        ("seccompProfile".to_owned(), detail)
    })
}

/// Before v1.19: the seccomp annotations of the pod and of its containers.
fn seccomp_annotations(pod: &PodView) -> Option<(String, String)> {
    let names: BTreeSet<&str> = pod.containers.iter().map(|(n, _)| *n).collect();
    let read = |key: &str| {
        key == "seccomp.security.alpha.kubernetes.io/pod"
            || key.strip_prefix("container.seccomp.security.alpha.kubernetes.io/").is_some_and(|n| names.contains(n))
    };
    let bad: BTreeSet<String> = pod
        .annotations
        .iter()
        .filter(|(k, v)| read(k) && !(*v == "runtime/default" || *v == "docker/default" || v.starts_with("localhost/")))
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect();
    let noun = if bad.len() == 1 { "annotation" } else { "annotations" };
    let bad: Vec<String> = bad.into_iter().collect();
    (!bad.is_empty()).then(|| ("seccompProfile".to_owned(), format!("forbidden {noun} {}", bad.join(", "))))
}

fn sysctls(pod: &PodView, minor: u32) -> Option<(String, String)> {
    let allowed = |name: &str| {
        let v1_0 = [
            "kernel.shm_rmid_forced",
            "net.ipv4.ip_local_port_range",
            "net.ipv4.tcp_syncookies",
            "net.ipv4.ping_group_range",
            "net.ipv4.ip_unprivileged_port_start",
        ];
        let later: [(u32, &[&str]); 4] = [
            (27, &["net.ipv4.ip_local_reserved_ports"]),
            (
                29,
                &[
                    "net.ipv4.tcp_keepalive_time",
                    "net.ipv4.tcp_fin_timeout",
                    "net.ipv4.tcp_keepalive_intvl",
                    "net.ipv4.tcp_keepalive_probes",
                ],
            ),
            (32, &["net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"]),
            (37, &["net.ipv4.tcp_slow_start_after_idle", "net.ipv4.tcp_notsent_lowat"]),
        ];
        v1_0.contains(&name) || later.iter().any(|(from, names)| minor >= *from && names.contains(&name))
    };
    let list = pod.pod_security("/sysctls").and_then(Value::as_array);
    let bad: Vec<&str> = list
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("name").and_then(Value::as_str))
        .filter(|n| !allowed(n))
        .collect();
    (!bad.is_empty()).then(|| ("forbidden sysctls".to_owned(), bad.join(", ")))
}

fn windows_host_process(pod: &PodView, _: u32) -> Option<(String, String)> {
    let is_true = |v: Option<&Value>| v.and_then(Value::as_bool) == Some(true);
    let pod_bad = is_true(pod.pod_security("/windowsOptions/hostProcess"));
    let containers: Vec<&str> =
        pod.container_security("/windowsOptions/hostProcess").filter(|(_, v)| is_true(*v)).map(|(n, _)| n).collect();
    (pod_bad || !containers.is_empty()).then(|| {
        let detail =
            format!("{} must not set securityContext.windowsOptions.hostProcess=true", setters(pod_bad, &containers));
        ("hostProcess".to_owned(), detail)
    })
}

fn allow_privilege_escalation(pod: &PodView, minor: u32) -> Option<(String, String)> {
    if minor >= 25 && pod.is_windows() {
        return None;
    }
    let bad: Vec<&str> = pod
        .container_security("/allowPrivilegeEscalation")
        .filter(|(_, v)| v.and_then(Value::as_bool) != Some(false))
        .map(|(n, _)| n)
        .collect();
    (!bad.is_empty()).then(|| {
        let detail = format!("{} must set securityContext.allowPrivilegeEscalation=false", containers_named(&bad));
        ("allowPrivilegeEscalation != false".to_owned(), detail)
    })
}

fn capabilities_restricted(pod: &PodView, minor: u32) -> Option<(String, String)> {
    if minor >= 25 && pod.is_windows() {
        return None;
    }
    let missing_drop: Vec<&str> = pod
        .container_security("/capabilities")
        .filter(|(_, caps)| {
            let drop = caps.and_then(|c| c.get("drop")).and_then(Value::as_array);
            !drop.is_some_and(|d| d.iter().any(|c| c.as_str() == Some("ALL")))
        })
        .map(|(n, _)| n)
        .collect();
    let (adders, capabilities) = added_capabilities(pod, &|c| c == "NET_BIND_SERVICE");
    let mut parts = Vec::new();
    if !missing_drop.is_empty() {
        parts.push(format!("{} must set securityContext.capabilities.drop=[\"ALL\"]", containers_named(&missing_drop)));
    }
    if !adders.is_empty() {
        parts.push(format!(
            "{} must not include {} in securityContext.capabilities.add",
            containers_named(&adders),
            quoted(&capabilities)
        ));
    }
    (!parts.is_empty()).then(|| ("unrestricted capabilities".to_owned(), parts.join("; ")))
}

const RESTRICTED_VOLUME_SOURCES: [&str; 9] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

const NAMED_VOLUME_SOURCES: [&str; 21] = [
    "hostPath",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "nfs",
    "iscsi",
    "glusterfs",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "fc",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
];

fn restricted_volumes(pod: &PodView, _: u32) -> Option<(String, String)> {
    let (mut names, mut types) = (Vec::new(), BTreeSet::new());
    for (name, volume) in volumes(pod) {
        if RESTRICTED_VOLUME_SOURCES.iter().any(|s| volume.get(*s).is_some()) {
            continue;
        }
        names.push(name);
        types.insert(NAMED_VOLUME_SOURCES.iter().find(|s| volume.get(**s).is_some()).copied().unwrap_or("unknown"));
    }
    (!names.is_empty()).then(|| {
        let noun = if names.len() == 1 { "volume" } else { "volumes" };
        let kind = if types.len() == 1 { "restricted volume type" } else { "restricted volume types" };
        let detail = format!("{noun} {} {} {kind} {}", quoted(&names), uses(names.len()), quoted(&types));
        ("restricted volume types".to_owned(), detail)
    })
}

fn run_as_non_root(pod: &PodView, minor: u32) -> Option<(String, String)> {
    if minor >= 35 && pod.host_users_false() {
        return None;
    }
    let pod_value = pod.pod_security("/runAsNonRoot").and_then(Value::as_bool);
    let (mut explicit, mut implicit) = (Vec::new(), Vec::new());
    for (name, value) in pod.container_security("/runAsNonRoot") {
        match value.and_then(Value::as_bool) {
            Some(false) => explicit.push(name),
            Some(true) => {}
            None if pod_value == Some(true) => {}
            None => implicit.push(name),
        }
    }
    let reason = "runAsNonRoot != true".to_owned();
    if pod_value == Some(false) || !explicit.is_empty() {
        let detail =
            format!("{} must not set securityContext.runAsNonRoot=false", setters(pod_value == Some(false), &explicit));
        return Some((reason, detail));
    }
    (!implicit.is_empty())
        .then(|| (reason, format!("pod or {} must set securityContext.runAsNonRoot=true", containers_named(&implicit))))
}

fn run_as_user(pod: &PodView, minor: u32) -> Option<(String, String)> {
    if minor >= 35 && pod.host_users_false() {
        return None;
    }
    let zero = |v: Option<&Value>| v.and_then(Value::as_i64) == Some(0);
    let pod_bad = zero(pod.pod_security("/runAsUser"));
    let containers: Vec<&str> =
        pod.container_security("/runAsUser").filter(|(_, v)| zero(*v)).map(|(n, _)| n).collect();
    (pod_bad || !containers.is_empty())
        .then(|| ("runAsUser=0".to_owned(), format!("{} must not set runAsUser=0", setters(pod_bad, &containers))))
}

fn seccomp_restricted(pod: &PodView, minor: u32) -> Option<(String, String)> {
    if minor >= 25 && pod.is_windows() {
        return None;
    }
    let mut types = BTreeSet::new();
    let pod_type = pod.pod_security("/seccompProfile").map(|p| str_at(Some(p), "type").unwrap_or_default());
    let pod_bad = pod_type.is_some_and(|t| !allowed_seccomp(t));
    if let Some(t) = pod_type.filter(|_| pod_bad) {
        types.insert(t.to_owned());
    }
    let covered = pod_type.is_some_and(allowed_seccomp);
    let (mut explicit, mut implicit) = (Vec::new(), Vec::new());
    for (name, profile) in pod.container_security("/seccompProfile") {
        match profile.map(|p| str_at(Some(p), "type").unwrap_or_default()) {
            Some(t) if allowed_seccomp(t) => {}
            Some(t) => {
                explicit.push(name);
                types.insert(t.to_owned());
            }
            None if covered => {}
            None => implicit.push(name),
        }
    }
    let reason = "seccompProfile".to_owned();
    if pod_bad || !explicit.is_empty() {
        let detail = format!(
            "{} must not set securityContext.seccompProfile.type to {}",
            setters(pod_bad, &explicit),
            quoted(&types)
        );
        return Some((reason, detail));
    }
    (!implicit.is_empty()).then(|| {
        let detail = format!(
            "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
            containers_named(&implicit)
        );
        (reason, detail)
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": spec})
    }

    fn message(pod: &Value, level: Level, minor: u32) -> String {
        let policy = Policy { level, minor, version_label: "latest".into() };
        policy.message(&violations(pod, level, minor))
    }

    #[test]
    fn a_plain_pod_is_baseline_and_restricted_says_every_missing_field_in_kubernetes_words() {
        let plain = pod(json!({"containers": [{"name": "app", "image": "app"}]}));
        assert!(violations(&plain, Level::Baseline, LATEST_MINOR).is_empty());
        assert_eq!(
            message(&plain, Level::Restricted, LATEST_MINOR),
            "violates PodSecurity \"restricted:latest\": allowPrivilegeEscalation != false (container \"app\" must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container \"app\" must set securityContext.capabilities.drop=[\"ALL\"]), runAsNonRoot != true (pod or container \"app\" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container \"app\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
        );
        assert_eq!(highest_level(&plain, LATEST_MINOR).0, Level::Baseline);
        let hardened = pod(json!({
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "app", "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}],
        }));
        assert_eq!(highest_level(&hardened, LATEST_MINOR), (Level::Restricted, Vec::new()));
    }

    #[test]
    fn a_traffic_redirect_init_container_is_privileged_level_and_says_why() {
        // The shipped proxy's init container: root, NET_ADMIN and NET_RAW.
        let redirect = pod(json!({
            "initContainers": [{"name": "proxy-init", "securityContext": {"runAsUser": 0, "runAsNonRoot": false, "capabilities": {"add": ["NET_ADMIN", "NET_RAW"]}}}],
            "containers": [{"name": "app"}, {"name": "proxy", "ports": [{"containerPort": 15001, "hostPort": 80}, {"containerPort": 1, "hostPort": 10000}]}],
        }));
        let (level, why) = highest_level(&redirect, LATEST_MINOR);
        assert_eq!(level, Level::Privileged);
        let checks: Vec<&str> = why.iter().map(|v| v.check).collect();
        assert_eq!(checks, ["capabilities_baseline", "hostPorts"]);
        assert_eq!(
            why[0].detail,
            "container \"proxy-init\" must not include \"NET_ADMIN\", \"NET_RAW\" in securityContext.capabilities.add"
        );
        // Ports sort as text, unquoted.
        assert_eq!(why[1].detail, "container \"proxy\" uses hostPorts 10000, 80");
        let restricted = violations(&redirect, Level::Restricted, LATEST_MINOR);
        let run_as = restricted.iter().find(|v| v.check == "runAsNonRoot").unwrap();
        assert_eq!(run_as.detail, "container \"proxy-init\" must not set securityContext.runAsNonRoot=false");
        let user = restricted.iter().find(|v| v.check == "runAsUser").unwrap();
        assert_eq!(user.detail, "container \"proxy-init\" must not set runAsUser=0");
        let capabilities = restricted.iter().find(|v| v.check == "capabilities_restricted").unwrap();
        assert_eq!(
            capabilities.detail,
            "containers \"proxy-init\", \"app\", \"proxy\" must set securityContext.capabilities.drop=[\"ALL\"]; container \"proxy-init\" must not include \"NET_ADMIN\", \"NET_RAW\" in securityContext.capabilities.add"
        );
    }

    #[test]
    fn versions_choose_the_variants() {
        let unmasked = pod(
            json!({"hostUsers": false, "containers": [{"name": "a", "securityContext": {"procMount": "Unmasked"}}]}),
        );
        // From v1.35 baseline allows it in a user namespace; restricted never does.
        assert!(violations(&unmasked, Level::Baseline, 35).is_empty());
        assert_eq!(violations(&unmasked, Level::Baseline, 34)[0].check, "procMount");
        let restricted: Vec<&str> = violations(&unmasked, Level::Restricted, 35).iter().map(|v| v.check).collect();
        assert!(restricted.contains(&"procMount_restricted") && !restricted.contains(&"procMount"), "{restricted:?}");
        // Sysctls allowed from the version that added them.
        let keepalive = pod(
            json!({"securityContext": {"sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "1"}, {"name": "kernel.msgmax", "value": "1"}]}, "containers": []}),
        );
        assert_eq!(violations(&keepalive, Level::Baseline, 29)[0].detail, "kernel.msgmax");
        assert_eq!(violations(&keepalive, Level::Baseline, 28)[0].detail, "net.ipv4.tcp_keepalive_time, kernel.msgmax");
        // Windows pods skip three restricted checks from v1.25, not runAsNonRoot.
        let windows = pod(json!({"os": {"name": "windows"}, "containers": [{"name": "a"}]}));
        let checks: Vec<&str> = violations(&windows, Level::Restricted, 25).iter().map(|v| v.check).collect();
        assert_eq!(checks, ["runAsNonRoot"]);
        assert_eq!(violations(&windows, Level::Restricted, 24).len(), 4);
        // Before v1.19 seccomp is read from annotations (Go-quoted values).
        let mut annotated = pod(json!({"containers": [{"name": "a"}]}));
        annotated["metadata"]["annotations"] = json!({"container.seccomp.security.alpha.kubernetes.io/a": "unconfined", "container.seccomp.security.alpha.kubernetes.io/gone": "unconfined"});
        let seccomp = violations(&annotated, Level::Baseline, 18);
        assert_eq!(
            seccomp[0].detail,
            "forbidden annotation container.seccomp.security.alpha.kubernetes.io/a=\"unconfined\""
        );
        assert!(violations(&annotated, Level::Baseline, 19).is_empty());
    }

    #[test]
    fn warn_and_audit_fail_open_and_warn_follows_enforce() {
        let of = |pairs: &[(&str, &str)], mode: Mode| {
            let labels = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
            Policy::of(&labels, mode, 37)
        };
        let enforce = ("pod-security.kubernetes.io/enforce", "baseline");
        let enforce_version = ("pod-security.kubernetes.io/enforce-version", "v1.30");
        // An invalid warn or audit level is privileged, where enforce's is restricted.
        for mode in [Mode::Warn, Mode::Audit] {
            let label = format!("pod-security.kubernetes.io/{}", mode.name());
            assert_eq!(of(&[(&label, "Restricted")], mode).level, Level::Privileged, "{mode:?}");
        }
        // Without a warn label, warn takes enforce's level and version; audit does not.
        let warn = of(&[enforce, enforce_version], Mode::Warn);
        assert_eq!((warn.level, warn.minor), (Level::Baseline, 30));
        assert_eq!(of(&[enforce, enforce_version], Mode::Audit).level, Level::Privileged);
        // Unless warn has a version label of its own; an invalid enforce level is not taken.
        let warn = of(&[enforce, enforce_version, ("pod-security.kubernetes.io/warn-version", "v1.33")], Mode::Warn);
        assert_eq!((warn.level, warn.minor), (Level::Baseline, 33));
        let invalid = ("pod-security.kubernetes.io/enforce", "strict");
        assert_eq!(of(&[invalid], Mode::Warn).level, Level::Privileged);
        assert_eq!(of(&[invalid], Mode::Enforce).level, Level::Restricted);
        // A warn label of its own wins, even a laxer one.
        assert_eq!(
            of(&[enforce, ("pod-security.kubernetes.io/warn", "privileged")], Mode::Warn).level,
            Level::Privileged
        );
    }

    #[test]
    fn an_injection_breaks_a_level_only_where_the_pod_passed_it() {
        let policy = Policy::enforce_of(
            &[("pod-security.kubernetes.io/enforce".to_owned(), "baseline".to_owned())].into_iter().collect(),
            37,
        );
        let before = pod(json!({"containers": [{"name": "app"}]}));
        let mut after = before.clone();
        after["spec"]["initContainers"] =
            json!([{"name": "init", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]);
        assert_eq!(
            policy.message(&policy.broken_by(&before, &after)),
            "violates PodSecurity \"baseline:latest\": non-default capabilities (container \"init\" must not include \"NET_ADMIN\" in securityContext.capabilities.add)"
        );
        assert_eq!(policy.broken_by(&before, &before), []);
        // A pod that fails on its own is not the injection's doing.
        assert_eq!(policy.broken_by(&after, &after), []);
    }

    #[test]
    fn labels_parse_as_the_api_server_parses_them() {
        let of = |pairs: &[(&str, &str)], server: u32| {
            let labels = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
            Policy::enforce_of(&labels, server)
        };
        let restricted = of(&[("pod-security.kubernetes.io/enforce", "restricted")], 37);
        assert_eq!(
            (restricted.level, restricted.minor, restricted.version_label.as_str()),
            (Level::Restricted, 37, "latest")
        );
        // No label: privileged; an invalid level fails closed; a future version counts as the newest
        // the server knows, shown as written; an invalid version is latest.
        assert_eq!(of(&[], 37).level, Level::Privileged);
        assert_eq!(of(&[("pod-security.kubernetes.io/enforce", "Restricted")], 37).level, Level::Restricted);
        let future = of(
            &[
                ("pod-security.kubernetes.io/enforce", "baseline"),
                ("pod-security.kubernetes.io/enforce-version", "v1.99"),
            ],
            36,
        );
        assert_eq!((future.minor, future.version_label.as_str()), (36, "v1.99"));
        for invalid in ["1.30", "v1.030", "v1.30.0", "V1.30", " v1.30", "v2.0", "v1."] {
            let policy = of(
                &[
                    ("pod-security.kubernetes.io/enforce", "baseline"),
                    ("pod-security.kubernetes.io/enforce-version", invalid),
                ],
                37,
            );
            assert_eq!((policy.minor, policy.version_label.as_str()), (37, "latest"), "{invalid}");
        }
        assert_eq!(parse_version("v1.0"), Some(0));
    }

    #[test]
    fn messages_quote_and_count_as_kubernetes_does() {
        let pod = pod(json!({
            "hostNetwork": true, "hostIPC": true,
            "securityContext": {"seLinuxOptions": {"type": "spc_t", "user": "u"}, "appArmorProfile": {"type": "Unconfined"}},
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}, {"name": "data", "nfs": {"server": "s", "path": "/"}}, {"name": "ok", "emptyDir": {}}],
            "containers": [
                {"name": "a", "securityContext": {"privileged": true, "seLinuxOptions": {"role": "r"}}, "readinessProbe": {"httpGet": {"host": "example.com", "port": 80}}},
                {"name": "b", "livenessProbe": {"tcpSocket": {"host": "1.2.3.4", "port": 1}}},
            ],
        }));
        let mut annotated = pod.clone();
        annotated["metadata"]["annotations"] =
            json!({"container.apparmor.security.beta.kubernetes.io/x": "un\"confined"});
        let details: Vec<(&str, String)> = violations(&annotated, Level::Baseline, LATEST_MINOR)
            .into_iter()
            .map(|v| (v.check, format!("{} ({})", v.reason, v.detail)))
            .collect();
        assert_eq!(
            details,
            [
                ("appArmorProfile", "forbidden AppArmor profiles (pod and annotation must not set AppArmor profile type to \"Unconfined\", \"container.apparmor.security.beta.kubernetes.io/x=\"un\\\"confined\"\")".to_owned()),
                ("hostNamespaces", "host namespaces (hostNetwork=true, hostIPC=true)".to_owned()),
                ("hostPathVolumes", "hostPath volumes (volume \"root\")".to_owned()),
                ("hostProbesAndHostLifecycle", "probe or lifecycle host (containers \"a\", \"b\" use probe or lifecycle hosts \"1.2.3.4\", \"example.com\")".to_owned()),
                ("privileged", "privileged (container \"a\" must not set securityContext.privileged=true)".to_owned()),
                ("seLinuxOptions", "seLinuxOptions (pod and container \"a\" set forbidden securityContext.seLinuxOptions: type \"spc_t\"; user may not be set; role may not be set)".to_owned()),
            ]
        );
        let volumes = violations(&pod, Level::Restricted, LATEST_MINOR)
            .into_iter()
            .find(|v| v.check == "restrictedVolumes")
            .unwrap();
        assert_eq!(volumes.detail, "volumes \"root\", \"data\" use restricted volume types \"hostPath\", \"nfs\"");
        assert_eq!(go_quote("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\x01\"");
    }
}
