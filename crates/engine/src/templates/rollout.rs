//! A template's new version reaching pods in steps (`rollout:`): which version a pod gets, which
//! versions are kept and why, and when the injected containers of the new version have failed
//! enough for the rollout to halt by itself.
//!
//! The choice is per **workload** ([`Workload::of_pod`]: every replica of a Deployment, every pod
//! of a Job, gets the same version) and needs nothing but the pod and the set: a bucket from a
//! hash of the template's name and the workload ([`bucket`]), the share and selector the template
//! sets, the pins the pod and its namespace name ([`Pins`]), and a halt. So every replica of the
//! injector, and the CLI, choose alike.
//!
//! What must outlive a replica is kept in one ConfigMap the injector owns in its own namespace
//! ([`Kept`]: `sidecar-injector-versions`): the text of the version in service before a rollout
//! (`<name>.<hash>.yaml`), and per template a small [`Record`] (`<name>.json`: the version rolled
//! from, a halt, the versions kept, newest first). The rollout's settings stay where operators
//! write them, in the template, and do not count in its content hash, so promotion (deleting
//! `rollout:`) makes no new version: the pods that got the new one stay up to date.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::names;
pub use crate::templates::template::{
    DEFAULT_FAILED_PODS, DEFAULT_RESTARTS, DEFAULT_UNREADY_SECONDS, HaltThresholds, Rollout,
};
use crate::templates::template::{Piece, Template};
use crate::workload::Workload;

/// Versions kept per template (the oldest beyond this are forgotten, pins to them refused).
pub const KEPT_PER_TEMPLATE: usize = 4;
/// The most the kept ConfigMap's data may weigh (keys and values). The API server refuses a
/// ConfigMap over 1 MiB; the rest is left for its metadata and a margin.
pub const KEPT_BYTES: usize = 900 * 1024;
/// Buckets a workload falls in: a share is a whole percent, so 100 buckets per percent leave the
/// hash's spread intact.
pub const BUCKETS: u32 = 10_000;

/// Container waiting reasons that mean the container cannot run as configured.
const FAILING_REASONS: &[&str] = &[
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// What the injector keeps about one template (`<name>.json` in the kept ConfigMap).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Record {
    /// The version in full service before the rollout under way (its text is kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The halt of the rollout of one version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<Halt>,
    /// The versions whose text is kept, newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
}

/// A halted rollout: the version whose pods failed, why, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Halt {
    /// The content hash of the version that was halted.
    pub version: String,
    /// The failures that halted it.
    pub reason: String,
    /// When (RFC 3339).
    pub at: String,
}

/// The kept ConfigMap's data, read: a record and kept texts per template.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kept {
    /// `<name>.json`, by template name.
    pub records: BTreeMap<String, Record>,
    /// `<name>.<hash>.yaml`, by (template name, hash).
    pub texts: BTreeMap<(String, String), String>,
}

impl Kept {
    /// Reads the ConfigMap's data; keys it cannot read are reported and left out.
    pub fn from_data(data: &BTreeMap<String, String>) -> (Kept, Vec<String>) {
        let mut kept = Kept::default();
        let mut errors = Vec::new();
        for (key, value) in data {
            let parts: Vec<&str> = key.split('.').collect();
            match parts.as_slice() {
                [name, "json"] => match serde_json::from_str::<Record>(value) {
                    Ok(record) => drop(kept.records.insert((*name).to_owned(), record)),
                    Err(e) => {
                        errors.push(format!("{}: key {key:?} is not a rollout record: {e}", names::KEPT_CONFIGMAP))
                    }
                },
                [name, hash, "yaml"] if is_hash(hash) => {
                    kept.texts.insert(((*name).to_owned(), (*hash).to_owned()), value.clone());
                }
                _ => errors.push(format!(
                    "{}: key {key:?} is neither <template>.json nor <template>.<hash>.yaml",
                    names::KEPT_CONFIGMAP
                )),
            }
        }
        (kept, errors)
    }

    /// The ConfigMap data that says this.
    pub fn to_data(&self) -> BTreeMap<String, String> {
        let records = self
            .records
            .iter()
            .map(|(name, record)| (record_key(name), serde_json::to_string(record).expect("a record serializes")));
        let texts = self.texts.iter().map(|((name, hash), text)| (text_key(name, hash), text.clone()));
        records.chain(texts).collect()
    }

    /// The JSON merge patch of the ConfigMap's `data` that turns `self` into `wanted`, `None` when
    /// they agree (keys `wanted` lacks are removed).
    pub fn merge_patch_to(&self, wanted: &Kept) -> Option<Value> {
        let (now, then) = (self.to_data(), wanted.to_data());
        let mut data = serde_json::Map::new();
        for key in now.keys().filter(|k| !then.contains_key(*k)) {
            data.insert(key.clone(), Value::Null);
        }
        for (key, value) in then.iter().filter(|(k, v)| now.get(*k) != Some(v)) {
            data.insert(key.clone(), Value::String(value.clone()));
        }
        (!data.is_empty()).then(|| serde_json::json!({ "data": data }))
    }

    /// What the ConfigMap's data weighs: its keys and values, in bytes.
    pub fn weight(&self) -> usize {
        self.to_data().iter().map(|(key, value)| key.len() + value.len()).sum()
    }

    /// Forgets kept versions, oldest first and from the template keeping the most, until the data
    /// weighs at most `budget` bytes; a version a rollout rolls from is never forgotten (pods
    /// that are not in the share get it). Returns the (template, version) pairs forgotten.
    pub fn fit(&mut self, budget: usize) -> Vec<(String, String)> {
        let mut forgotten = Vec::new();
        let mut weight = self.weight();
        while weight > budget {
            let forgettable = |record: &Record| record.kept.iter().filter(|h| record.from.as_ref() != Some(*h)).count();
            let most = self
                .records
                .iter_mut()
                .filter(|(_, record)| forgettable(record) > 0)
                .max_by(|(a_name, a), (b_name, b)| forgettable(a).cmp(&forgettable(b)).then(b_name.cmp(a_name)));
            let Some((name, record)) = most else { break };
            let Some(at) = record.kept.iter().rposition(|h| record.from.as_ref() != Some(h)) else { break };
            let hash = record.kept.remove(at);
            let key = (name.clone(), hash);
            if let Some(text) = self.texts.remove(&key) {
                weight -= text_key(&key.0, &key.1).len() + text.len();
            }
            forgotten.push(key);
        }
        self.records.retain(|_, record| *record != Record::default());
        forgotten
    }
}

fn is_hash(text: &str) -> bool {
    text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn record_key(name: &str) -> String {
    format!("{name}.json")
}

fn text_key(name: &str, hash: &str) -> String {
    format!("{name}.{hash}.yaml")
}

/// A rollout under way: the template in service has `rollout:`, and the version it rolls from is
/// known.
#[derive(Debug, Clone)]
pub struct Active {
    /// The settings (the template in service's `rollout:`).
    pub spec: Rollout,
    /// The version in full service before.
    pub from: Arc<Template>,
    /// The halt of the version in service, if it was halted.
    pub halted: Option<Halt>,
}

impl Active {
    /// Whether new pods of unpinned workloads may get the new version at all.
    pub fn reaches_anyone(&self) -> bool {
        self.halted.is_none() && (self.spec.share > 0 || self.spec.selector.is_some())
    }
}

/// Where a pin comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinSource {
    /// The pod's `sidecar-injector.io/pins` annotation (its workload's pod template).
    Pod,
    /// Its namespace's.
    Namespace,
}

/// The versions a pod's and its namespace's `sidecar-injector.io/pins` annotations name, by
/// template (the pod's entry wins).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pins {
    by_template: BTreeMap<String, (String, PinSource)>,
}

impl Pins {
    /// Reads `template=<hash>[,template=<hash>...]` (a hash may be shortened to 6 or more of its
    /// leading characters) from the pod's and the namespace's annotations.
    pub fn of(
        pod_annotations: &BTreeMap<String, String>,
        namespace_annotations: &BTreeMap<String, String>,
    ) -> Result<Pins, String> {
        let mut pins = Pins::default();
        for (annotations, source) in [(namespace_annotations, PinSource::Namespace), (pod_annotations, PinSource::Pod)]
        {
            let Some(text) = annotations.get(names::PINS_ANNOTATION) else { continue };
            for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let parsed = entry.split_once('=').map(|(t, h)| (t.trim(), h.trim()));
                let Some((template, hash)) = parsed.filter(|(t, h)| {
                    !t.is_empty() && h.len() >= 6 && h.len() <= 16 && h.bytes().all(|b| b.is_ascii_hexdigit())
                }) else {
                    return Err(format!(
                        "the {} annotation of the {} has {entry:?}: write template=<version hash> (6 to 16 hex digits of the hash `explain` and the status annotation show), entries separated by commas",
                        names::PINS_ANNOTATION,
                        source.describe()
                    ));
                };
                pins.by_template.insert(template.to_owned(), (hash.to_ascii_lowercase(), source));
            }
        }
        Ok(pins)
    }

    /// Whether nothing is pinned.
    pub fn is_empty(&self) -> bool {
        self.by_template.is_empty()
    }

    /// The pin of a template, if any.
    pub fn get(&self, template: &str) -> Option<(&str, PinSource)> {
        self.by_template.get(template).map(|(hash, source)| (hash.as_str(), *source))
    }
}

impl PinSource {
    fn describe(self) -> &'static str {
        match self {
            PinSource::Pod => "pod",
            PinSource::Namespace => "namespace",
        }
    }
}

/// What a version is chosen for: the pod, its namespace, its workload, its labels and its pins.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// The pod's namespace.
    pub namespace: &'a str,
    /// Its workload.
    pub workload: &'a Workload,
    /// Its labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Its pins.
    pub pins: &'a Pins,
}

/// Why a pod got the version it got (for `explain`), where a rollout or a pin decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// No rollout under way and no pin: the version in service.
    InService,
    /// A pin named it.
    Pinned(PinSource),
    /// The workload's bucket is within the share.
    InShare {
        /// The workload's bucket (of [`BUCKETS`]).
        bucket: u32,
        /// The share, percent.
        share: u8,
    },
    /// The rollout's selector matches the pod's labels.
    Selected,
    /// The workload's bucket is outside the share: the previous version.
    OutsideShare {
        /// The workload's bucket.
        bucket: u32,
        /// The share, percent.
        share: u8,
    },
    /// The rollout halted: the previous version.
    Halted(Halt),
}

impl Why {
    /// One sentence (empty for [`Why::InService`]).
    pub fn describe(&self, workload: &Workload) -> String {
        let percent = |bucket: u32| format!("{:.2}", f64::from(bucket) / 100.0);
        match self {
            Why::InService => String::new(),
            Why::Pinned(source) => format!("pinned by the {} annotation {}", source.describe(), names::PINS_ANNOTATION),
            Why::InShare { bucket, share } => format!(
                "rollout: {} {} falls at {}% of workloads, within the {share}% that get the new version",
                workload.kind,
                workload.name,
                percent(*bucket)
            ),
            Why::Selected => "rollout: the pod's labels match the rollout's selector".to_owned(),
            Why::OutsideShare { bucket, share } => format!(
                "rollout: {} {} falls at {}% of workloads, outside the {share}% that get the new version: the version in service before",
                workload.kind,
                workload.name,
                percent(*bucket)
            ),
            Why::Halted(halt) => format!(
                "rollout halted at {} ({}): the version in service before; `drift` lists the pods that got {}",
                halt.at, halt.reason, halt.version
            ),
        }
    }
}

/// The bucket (of [`BUCKETS`]) a workload falls in for a template: the same in every replica and
/// every run (a content hash, not the process's hasher), and independent between templates.
pub fn bucket(template: &str, namespace: &str, workload: &Workload) -> u32 {
    let mut hasher = Sha256::new();
    for part in [template, namespace, &workload.kind, &workload.name] {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    let digest = hasher.finalize();
    let head = u64::from_be_bytes(digest[..8].try_into().expect("a sha256 digest has 8 bytes"));
    (head % u64::from(BUCKETS)) as u32
}

/// The names of the containers `template` injects (init containers, sidecars, image volumes'
/// fallback init containers), where every one is written literally; `None` where a name is
/// computed (the halt watch then judges every injected container of the pod).
pub fn container_names(template: &Template) -> Option<Vec<String>> {
    fn literal_name(piece: &Piece) -> Option<String> {
        let name = match piece {
            Piece::Literal(container) => container.get("name"),
            Piece::Map(entries) => match entries.iter().find(|(key, _)| key == "name").map(|(_, name)| name) {
                Some(Piece::Literal(name)) => Some(name),
                _ => None,
            },
            _ => None,
        };
        name.and_then(Value::as_str).map(str::to_owned)
    }
    let inject = &template.inject;
    let containers = inject.init_containers.iter().chain(&inject.sidecars).map(|item| &item.piece);
    let fallbacks = inject.lists().flatten().filter_map(|item| item.fallback.as_ref()).map(|f| &f.init_container);
    containers.chain(fallbacks).map(literal_name).collect()
}

/// The version of a template a pod gets: `current` (the version in service) unless a rollout
/// under way (`active`) or a pin decides otherwise. A pin names `current`, the version rolled
/// from, or a `kept` one; any other pin is an error that names what is kept.
pub fn choose<'t>(
    current: &'t Arc<Template>,
    active: Option<&'t Active>,
    kept: &'t [Arc<Template>],
    subject: Subject<'_>,
) -> Result<(&'t Arc<Template>, Why), String> {
    if let Some((pin, source)) = subject.pins.get(&current.name) {
        // An enforced template's pods must have a version the enforcement policy admits: the
        // versions in service, not any kept one.
        let kept: &[Arc<Template>] = if current.enforced { &[] } else { kept };
        let known = std::iter::once(current).chain(active.map(|a| &a.from)).chain(kept);
        let mut matching: Vec<&Arc<Template>> = known.filter(|t| t.hash.starts_with(pin)).collect();
        // One version may be in several places (in service and kept, after a revert).
        matching.sort_by(|a, b| a.hash.cmp(&b.hash));
        matching.dedup_by(|a, b| a.hash == b.hash);
        return match matching.as_slice() {
            [version] => Ok((version, Why::Pinned(source))),
            [] => {
                let mut versions: Vec<&str> = std::iter::once(current)
                    .chain(active.map(|a| &a.from))
                    .chain(kept)
                    .map(|t| t.hash.as_str())
                    .collect();
                versions.sort_unstable();
                versions.dedup();
                Err(match current.enforced {
                    true => format!(
                        "the {} annotation of the {} pins template {} to version {pin}, which is not in service: the template is enforced, so a pin may name only a version in service ({})",
                        names::PINS_ANNOTATION,
                        source.describe(),
                        current.name,
                        versions.join(", ")
                    ),
                    false => format!(
                        "the {} annotation of the {} pins template {} to version {pin}, which is not kept: the versions kept are {} (a pin holds only while its version is kept, the {KEPT_PER_TEMPLATE} newest)",
                        names::PINS_ANNOTATION,
                        source.describe(),
                        current.name,
                        versions.join(", ")
                    ),
                })
            }
            _ => Err(format!(
                "the {} annotation of the {} pins template {} to version {pin}, which more than one kept version starts with: write more of its hash",
                names::PINS_ANNOTATION,
                source.describe(),
                current.name
            )),
        };
    }
    let Some(active) = active else { return Ok((current, Why::InService)) };
    if let Some(halt) = &active.halted {
        return Ok((&active.from, Why::Halted(halt.clone())));
    }
    if active.spec.selector.as_ref().is_some_and(|s| s.matches(subject.labels)) {
        return Ok((current, Why::Selected));
    }
    let bucket = bucket(&current.name, subject.namespace, subject.workload);
    let share = active.spec.share;
    match bucket < u32::from(share) * (BUCKETS / 100) {
        true => Ok((current, Why::InShare { bucket, share })),
        false => Ok((&active.from, Why::OutsideShare { bucket, share })),
    }
}

/// What failed in one of a pod's injected containers (`containers`), read from the pod's
/// `status` at `now`, if anything: a waiting reason that means it cannot run as configured,
/// `restarts` restarts or more, or running unready for `unready_seconds` or more.
pub fn container_failure(
    pod_status: &Value,
    containers: &[&str],
    thresholds: HaltThresholds,
    now: jiff::Timestamp,
) -> Option<String> {
    let statuses = ["initContainerStatuses", "containerStatuses"]
        .into_iter()
        .filter_map(|field| pod_status.get(field).and_then(Value::as_array))
        .flatten();
    for status in statuses {
        let Some(name) = status.get("name").and_then(Value::as_str).filter(|n| containers.contains(n)) else {
            continue;
        };
        let waiting = status.get("state").and_then(|s| s.get("waiting"));
        if let Some(reason) = waiting.and_then(|w| w.get("reason")).and_then(Value::as_str)
            && FAILING_REASONS.contains(&reason)
        {
            let message = waiting.and_then(|w| w.get("message")).and_then(Value::as_str).unwrap_or_default();
            let message: String = message.chars().take(160).collect();
            return Some(match message.is_empty() {
                true => format!("container {name}: {reason}"),
                false => format!("container {name}: {reason} ({message})"),
            });
        }
        let restarts = status.get("restartCount").and_then(Value::as_u64).unwrap_or(0);
        if restarts >= u64::from(thresholds.restarts) {
            return Some(format!("container {name}: restarted {restarts} times"));
        }
        let running_since = status.get("state").and_then(|s| s.get("running")).and_then(|r| r.get("startedAt"));
        let since = running_since.and_then(Value::as_str).and_then(|t| t.parse::<jiff::Timestamp>().ok());
        let unready = status.get("ready") == Some(&Value::Bool(false));
        if let (true, Some(since)) = (unready, since) {
            let seconds = now.as_second().saturating_sub(since.as_second());
            if seconds >= i64::from(thresholds.unready_seconds) {
                return Some(format!("container {name}: running but not ready for {seconds} s"));
            }
        }
    }
    None
}

/// Why a rollout halts, given the failures of the pods that got its version (`pod`, what failed),
/// `None` while they are fewer than the threshold.
pub fn halt_reason(version: &str, failures: &[(String, String)], thresholds: HaltThresholds) -> Option<String> {
    if failures.is_empty() || (failures.len() as u64) < u64::from(thresholds.failed_pods.max(1)) {
        return None;
    }
    let shown: Vec<String> = failures.iter().take(3).map(|(pod, what)| format!("{pod}: {what}")).collect();
    let more = failures.len().saturating_sub(shown.len());
    Some(format!(
        "{} pods with version {version} failed (threshold {}): {}{}",
        failures.len(),
        thresholds.failed_pods.max(1),
        shown.join("; "),
        match more {
            0 => String::new(),
            n => format!("; and {n} more"),
        }
    ))
}
