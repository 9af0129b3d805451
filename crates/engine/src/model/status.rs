//! The status annotation (`sidecar-injector.io/status`): what the injector did to a pod.
//!
//! It names each injected template with its content hash (to detect staleness and make re-admission
//! a no-op) and every item the injection added (to undo or redo exactly that, and for the
//! validating checks). The JSON is compact and its top-level lists are flat on purpose: the
//! ValidatingAdmissionPolicy in `deploy/` reads `"containers":[...]`, `"initContainers":[...]` and
//! `"nativeSidecars":[...]` with CEL regexes, since CEL cannot parse JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::names;

/// The content of the status annotation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InjectionStatus {
    /// Injected templates, in injection order.
    pub templates: Vec<TemplateRef>,
    /// Containers added beside the app (classic sidecars).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<String>,
    /// Init containers added, including native sidecars.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<String>,
    /// The init containers above that are native sidecars (`restartPolicy: Always`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub native_sidecars: Vec<String>,
    /// Volumes added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<String>,
    /// The templates' volumes that declare a fallback and were rendered as image volumes, added
    /// above or skipped (the others that declare one were rendered as their fallback; see
    /// `image_volumes`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_volumes: Vec<String>,
    /// Names of the pod `imagePullSecrets` added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// IPs of the pod `hostAliases` entries added.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_aliases: Vec<String>,
    /// Names of the pod `resourceClaims` entries added (Dynamic Resource Allocation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_claims: Vec<String>,
    /// Names of the pod `schedulingGates` added (each lifted later by its controller).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scheduling_gates: Vec<String>,
    /// Label keys added (besides `sidecar-injector.io/injected`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// Annotation keys added (besides this one).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotations: Vec<String>,
    /// Env vars and volume mounts added, per app container.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub app_containers: BTreeMap<String, AppContainerAdditions>,
    /// What the injection added to the pod-level `spec.resources` the pod sets, so that its
    /// containers fit (see `pod_resources`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_resources: Option<Padding>,
    /// Items a template wanted to add but the pod (or an earlier template) already had.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Skipped>,
    /// Why no template was injected, when none was; or why a chosen one was not (the namespace's
    /// Pod Security level).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A template and the content hash it had when injected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateRef {
    /// Template name.
    pub name: String,
    /// Template content hash.
    pub hash: String,
}

/// Env vars and mounts added to one app container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppContainerAdditions {
    /// Env var names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// `envFrom` sources, as `configMap/<name>` or `secret/<name>` (`+<prefix>` when they have
    /// one; see `compare::env_from_key`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_from: Vec<String>,
    /// Mount paths.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<String>,
    /// Entries merged into an env var the container already had, each exactly as added:
    /// `NAME=VALUE` (see `env_merge`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_merges: Vec<String>,
}

/// The kind of an injected item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ItemKind {
    /// A pod label.
    Label,
    /// A pod annotation.
    Annotation,
    /// An init container.
    InitContainer,
    /// A sidecar container.
    Sidecar,
    /// A pod volume.
    Volume,
    /// An env var of an app container.
    Env,
    /// A volume mount of an app container (identified by mount path).
    VolumeMount,
    /// An `envFrom` source of an app container (identified by `compare::env_from_key`).
    EnvFrom,
    /// A pod `imagePullSecrets` entry.
    ImagePullSecret,
    /// An env entry merged into the container's own variable (identified as `NAME=VALUE`).
    EnvMerge,
    /// A pod `hostAliases` entry (identified by IP).
    HostAlias,
    /// A pod `resourceClaims` entry (a DRA claim its containers use by name).
    ResourceClaim,
    /// A pod `schedulingGates` entry.
    SchedulingGate,
}

impl ItemKind {
    /// The kind as the status annotation writes it (`volume`, `hostAlias`).
    pub fn key(self) -> &'static str {
        match self {
            ItemKind::Label => "label",
            ItemKind::Annotation => "annotation",
            ItemKind::InitContainer => "initContainer",
            ItemKind::Sidecar => "sidecar",
            ItemKind::Volume => "volume",
            ItemKind::Env => "env",
            ItemKind::VolumeMount => "volumeMount",
            ItemKind::EnvFrom => "envFrom",
            ItemKind::ImagePullSecret => "imagePullSecret",
            ItemKind::EnvMerge => "envMerge",
            ItemKind::HostAlias => "hostAlias",
            ItemKind::ResourceClaim => "resourceClaim",
            ItemKind::SchedulingGate => "schedulingGate",
        }
    }

    /// Human name for messages.
    pub fn describe(self) -> &'static str {
        match self {
            ItemKind::Label => "label",
            ItemKind::Annotation => "annotation",
            ItemKind::InitContainer => "init container",
            ItemKind::Sidecar => "sidecar",
            ItemKind::Volume => "volume",
            ItemKind::Env => "env var",
            ItemKind::VolumeMount => "volume mount",
            ItemKind::EnvFrom => "envFrom source",
            ItemKind::ImagePullSecret => "image pull secret",
            ItemKind::EnvMerge => "merged env entry",
            ItemKind::HostAlias => "host alias",
            ItemKind::ResourceClaim => "resource claim",
            ItemKind::SchedulingGate => "scheduling gate",
        }
    }
}

/// An item not added because of a name conflict; the pod's own item won.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// Template that wanted to add it.
    pub template: String,
    /// Kind of item.
    pub kind: ItemKind,
    /// Its name (key, mount path).
    pub name: String,
    /// The app container, for env vars and mounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Who had it first: `pod` or `template:<name>`; or `volume:<name>` for an item that mounts
    /// a volume of its template that was skipped (the name means another volume in the pod).
    pub owner: String,
}

impl AppContainerAdditions {
    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.env_from.is_empty() && self.volume_mounts.is_empty() && self.env_merges.is_empty()
    }

    /// How many items were added.
    pub fn len(&self) -> usize {
        self.env.len() + self.env_from.len() + self.volume_mounts.len() + self.env_merges.len()
    }
}

impl InjectionStatus {
    /// Parses the annotation value.
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The annotation value (compact JSON).
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("the status always serializes")
    }

    /// The templates applied with conflicts: some item they add was already in the pod (or added
    /// by an earlier template), so the pod's item stands where the template's would be.
    pub fn conflicted_templates(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for skip in &self.skipped {
            if !names.contains(&skip.template.as_str()) {
                names.push(&skip.template);
            }
        }
        names
    }

    /// The value of the `injected` label this status calls for: `true` when every template applied
    /// cleanly, `partial` when some applied with conflicts, none when no template was injected.
    pub fn injected_label(&self) -> Option<&'static str> {
        match (self.templates.is_empty(), self.skipped.is_empty()) {
            (true, _) => None,
            (false, true) => Some(names::INJECTED_TRUE),
            (false, false) => Some(names::INJECTED_PARTIAL),
        }
    }

    /// Whether the injection recorded here is what `templates` (name, hash, in order) would inject now.
    pub fn is_current<'t>(&self, templates: impl IntoIterator<Item = (&'t str, &'t str)>) -> bool {
        let mut current = templates.into_iter();
        self.templates.iter().all(|t| current.next() == Some((t.name.as_str(), t.hash.as_str())))
            && current.next().is_none()
    }
}

/// What an injection added to the pod's `spec.resources`: per resource name, the quantity added.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Padding {
    /// Added to `spec.resources.requests`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, String>,
    /// Added to `spec.resources.limits`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, String>,
    /// The author's own values of the padded resources as they wrote them, where Kubernetes would
    /// write them otherwise (`0.5`, `1.5Gi`, `1000M`), which taking the padding back writes
    /// again, so strip and removal give back the author's text and not only an equal value
    /// (`500m`, `1536Mi`, `1G`). A claim like the rest: written back only where it is the value
    /// the pod's less the padding comes to.
    #[serde(default, skip_serializing_if = "Authored::is_empty")]
    pub authored: Authored,
}

/// The author's values of padded resources, as written (a string or a number): per field,
/// resource name → value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Authored {
    /// In `spec.resources.requests`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Value>,
    /// In `spec.resources.limits`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Value>,
}

impl Authored {
    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.limits.is_empty()
    }
}

impl Padding {
    /// Whether nothing was added.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.limits.is_empty()
    }

    /// In words, for `explain`: `requests cpu +10m, memory +32Mi; limits memory +64Mi`.
    pub fn describe(&self) -> String {
        let part = |field: &str, map: &BTreeMap<String, String>| {
            (!map.is_empty()).then(|| {
                format!("{field} {}", map.iter().map(|(k, v)| format!("{k} +{v}")).collect::<Vec<_>>().join(", "))
            })
        };
        [part("requests", &self.requests), part("limits", &self.limits)]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_the_policy_reads_is_stable() {
        let status = InjectionStatus {
            templates: vec![TemplateRef { name: "logs".into(), hash: "0123456789abcdef".into() }],
            containers: vec!["a".into(), "b".into()],
            init_containers: vec!["proxy".into()],
            native_sidecars: vec!["proxy".into()],
            app_containers: [("web".to_owned(), AppContainerAdditions { env: vec!["X".into()], ..Default::default() })]
                .into(),
            ..Default::default()
        };
        let text = status.to_annotation();
        assert_eq!(
            text,
            r#"{"templates":[{"name":"logs","hash":"0123456789abcdef"}],"containers":["a","b"],"initContainers":["proxy"],"nativeSidecars":["proxy"],"appContainers":{"web":{"env":["X"]}}}"#
        );
        assert_eq!(InjectionStatus::parse(&text).unwrap(), status);
    }
}
