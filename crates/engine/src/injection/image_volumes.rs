//! Image volumes or their declared fallback: the one place that decides, per pod, which form a
//! template's image volume takes, says why, and applies the choice to a rendering.
//!
//! An `image` volume (KEP-4639: on by default since Kubernetes 1.35, GA in 1.36) mounts an OCI
//! image's files read-only, where agent injectors otherwise copy the agent from an init container
//! into an emptyDir on every pod start. It needs, on the node:
//! - a kubelet 1.35 or newer (older kubelets, or an API server with the feature off, drop or
//!   refuse the volume);
//! - a container runtime that mounts image volumes: containerd 2.1+ or CRI-O 1.31+;
//! - for a mount with `subPath`, a runtime that applies it inside an image volume: containerd 2.2+
//!   or CRI-O 1.33+ (older ones ignore it silently, and the container sees the whole image).
//!
//! A template's image volume may declare a `fallback:` (an emptyDir filled by a copy init
//! container it describes). Like native sidecars, the form is decided from the nodes the pod can
//! run on (`nodes`: its nodeName, else the nodes its nodeSelector and node affinity allow, else all
//! of them): the image volume where every such node supports it, the fallback elsewhere. Without
//! any node's facts, the API server's version decides whether image volumes mount, and a `subPath`
//! into one takes the fallback (no runtime is known to apply it).
//!
//! The status annotation records the volumes injected as image volumes among those that declare a
//! fallback (`imageVolumes`), and a pod's claim is re-rendered in the forms it records
//! ([`VolumeForms::Recorded`]): which form a node would choose today does not change what the
//! injection was, so strip, re-injection and drift stay exact. [`render`](crate::injection::render)
//! takes the forms as an argument, so no step can render without saying which.

use serde_json::Value;

use crate::model::kinds::{VOLUME_MOUNTS, VOLUMES};

/// The first Kubernetes version whose kubelet (and API server, by default) mounts image volumes.
pub const IMAGE_VOLUMES_SINCE: (u32, u32) = (1, 35);

/// How the decision reads in words (`check-templates`, docs).
pub const RULE: &str = "an image volume with a fallback is mounted as an image volume where every node the pod can run on has a kubelet 1.35+ and containerd 2.1+ or CRI-O 1.31+ (containerd 2.2+ or CRI-O 1.33+ when a mount uses subPath); elsewhere its fallback (an emptyDir filled by the init container it declares) is injected";

/// A node's container runtime, as `status.nodeInfo.containerRuntimeVersion` says it
/// (`containerd://2.2.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// Which runtime.
    pub runtime: Runtime,
    /// Its `(major, minor)`, when readable.
    pub version: Option<(u32, u32)>,
}

/// A container runtime the decision knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// containerd.
    Containerd,
    /// CRI-O.
    CriO,
    /// Another runtime (its support is not known: it counts as none).
    Other,
    /// The node does not report one.
    Unreported,
}

impl RuntimeVersion {
    /// Reads `containerRuntimeVersion` (`containerd://2.2.0`, `cri-o://1.33.1`, `docker://28.0.1`).
    pub fn parse(text: &str) -> Self {
        let text = text.trim();
        if text.is_empty() {
            return RuntimeVersion { runtime: Runtime::Unreported, version: None };
        }
        let (name, version) = text.split_once("://").unwrap_or((text, ""));
        let runtime = match name.to_ascii_lowercase().as_str() {
            "containerd" => Runtime::Containerd,
            "cri-o" | "crio" => Runtime::CriO,
            _ => Runtime::Other,
        };
        RuntimeVersion { runtime, version: major_minor(version) }
    }

    fn at_least(&self, containerd: (u32, u32), cri_o: (u32, u32)) -> bool {
        match (self.runtime, self.version) {
            (Runtime::Containerd, Some(version)) => version >= containerd,
            (Runtime::CriO, Some(version)) => version >= cri_o,
            _ => false,
        }
    }

    /// Whether it mounts image volumes (containerd 2.1+, CRI-O 1.31+).
    pub fn mounts_image_volumes(&self) -> bool {
        self.at_least((2, 1), (1, 31))
    }

    /// Whether it applies a `subPath` inside an image volume (containerd 2.2+, CRI-O 1.33+).
    pub fn applies_sub_path(&self) -> bool {
        self.at_least((2, 2), (1, 33))
    }
}

impl std::fmt::Display for RuntimeVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.runtime {
            Runtime::Containerd => "containerd",
            Runtime::CriO => "CRI-O",
            Runtime::Other => "a runtime other than containerd and CRI-O",
            Runtime::Unreported => return f.write_str("a runtime the node does not report"),
        };
        match self.version {
            Some((major, minor)) => write!(f, "{name} {major}.{minor}"),
            None => write!(f, "{name} of an unreadable version"),
        }
    }
}

/// `(major, minor)` of `v1.35.2`, `2.2.0-rc.1`, `1.33`.
pub(crate) fn major_minor(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.trim().trim_start_matches('v').split('.');
    let number = |part: Option<&str>| -> Option<u32> {
        let digits: String = part?.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    number(parts.next()).zip(number(parts.next()))
}

/// What keeps an image volume (or a `subPath` into one) from working where the pod can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The API server is older than 1.35 (no node's kubelet version is known).
    ApiServer((u32, u32)),
    /// A kubelet older than 1.35.
    Kubelet((u32, u32)),
    /// A container runtime that does not mount image volumes, or does not apply `subPath` in one.
    Runtime(RuntimeVersion),
    /// No node's container runtime is known, so nothing says that a `subPath` is applied.
    RuntimeUnknown,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (major, minor) = IMAGE_VOLUMES_SINCE;
        match self {
            Limit::ApiServer((a, b)) => write!(f, "the Kubernetes version is {a}.{b} (image volumes need {major}.{minor}+)"),
            Limit::Kubelet((a, b)) => write!(f, "a kubelet {a}.{b} (image volumes need {major}.{minor}+)"),
            Limit::Runtime(runtime) => write!(
                f,
                "{runtime} (image volumes need containerd 2.1+ or CRI-O 1.31+, a subPath into one containerd 2.2+ or CRI-O 1.33+)"
            ),
            Limit::RuntimeUnknown => {
                f.write_str("no node reports its container runtime (a subPath into an image volume needs containerd 2.2+ or CRI-O 1.33+, older runtimes ignore it)")
            }
        }
    }
}

/// Whether image volumes, and `subPath` mounts into them, work on every node a pod can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageVolumeSupport {
    /// Image volumes mount, or what keeps them from it.
    pub volumes: Result<(), Limit>,
    /// A `subPath` into one is applied, or what keeps it from being.
    pub sub_path: Result<(), Limit>,
}

impl ImageVolumeSupport {
    /// Nodes that mount image volumes and apply `subPath` in them.
    pub const EVERYWHERE: ImageVolumeSupport = ImageVolumeSupport { volumes: Ok(()), sub_path: Ok(()) };

    /// Decided by the API server's version (`None`: an unknown cluster, assumed recent). No
    /// runtime is known, so a `subPath` never counts as applied.
    pub fn of_api_server(version: Option<(u32, u32)>) -> Self {
        let volumes = match version {
            Some(version) if version < IMAGE_VOLUMES_SINCE => Err(Limit::ApiServer(version)),
            _ => Ok(()),
        };
        ImageVolumeSupport { volumes, sub_path: volumes.and(Err(Limit::RuntimeUnknown)) }
    }

    /// What one node supports.
    pub fn of_node(kubelet: (u32, u32), runtime: RuntimeVersion) -> Self {
        let volumes = match () {
            _ if kubelet < IMAGE_VOLUMES_SINCE => Err(Limit::Kubelet(kubelet)),
            _ if !runtime.mounts_image_volumes() => Err(Limit::Runtime(runtime)),
            _ => Ok(()),
        };
        let sub_path = volumes.and(if runtime.applies_sub_path() { Ok(()) } else { Err(Limit::Runtime(runtime)) });
        ImageVolumeSupport { volumes, sub_path }
    }

    /// What both support (the first limit found is kept).
    pub fn and(self, other: ImageVolumeSupport) -> Self {
        ImageVolumeSupport { volumes: self.volumes.and(other.volumes), sub_path: self.sub_path.and(other.sub_path) }
    }

    /// What keeps an image volume from working, for one whose mounts use `subPath` or not.
    pub fn limit(&self, uses_sub_path: bool) -> Option<Limit> {
        match uses_sub_path {
            true => self.sub_path.err(),
            false => self.volumes.err(),
        }
    }
}

/// Which form a rendering gives a template's image volumes that declare a fallback.
#[derive(Debug, Clone, Copy)]
pub enum VolumeForms<'s> {
    /// As the nodes the pod can run on support (a new injection).
    Nodes(ImageVolumeSupport),
    /// As a status annotation records them (`imageVolumes`): re-rendering what was injected.
    Recorded(&'s [String]),
}

/// A volume's declared fallback, rendered (see `template`'s `fallback:`).
#[derive(Debug, Clone, PartialEq)]
pub struct RenderedFallback {
    /// The volume's name.
    pub volume: String,
    /// The emptyDir that stands in for the image (`{}` unless the template gives one).
    pub empty_dir: Value,
    /// The init container that fills it.
    pub init_container: Value,
}

/// What a rendering did with one of a template's image volumes (`explain`, warnings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageVolumeChoice {
    /// The volume's name.
    pub volume: String,
    /// The fallback's init container, when the fallback was injected.
    pub fallback: Option<String>,
    /// Whether the template declares a fallback.
    pub declared_fallback: bool,
    /// What keeps the image volume from working where the pod can run (decided by the nodes;
    /// `None` when it works there, or when the forms were recorded).
    pub limit: Option<Limit>,
}

impl ImageVolumeChoice {
    /// The form, in words (`explain`).
    pub fn describe(&self) -> String {
        let volume = &self.volume;
        match (&self.fallback, self.limit) {
            (Some(init), Some(limit)) => format!(
                "volume {volume} is its fallback, an emptyDir filled by init container {init}, not an image volume: where the pod can run there is {limit}"
            ),
            (Some(init), None) => {
                format!("volume {volume} is its fallback, an emptyDir filled by init container {init} (as injected)")
            }
            (None, Some(limit)) => format!(
                "volume {volume} is an image volume without a fallback, which does not work where the pod can run: there is {limit}"
            ),
            (None, None) if self.declared_fallback => {
                format!("volume {volume} is an image volume (its fallback is not needed where the pod can run)")
            }
            (None, None) => format!("volume {volume} is an image volume"),
        }
    }
}

/// Gives each image volume of `volumes` its form: the image volume as rendered, or its fallback
/// (an emptyDir of that name, and its init container put first among `init_containers`). Returns
/// what was done with each, and the names of those with a fallback that stay image volumes (what
/// the status records).
pub(crate) fn apply(
    forms: VolumeForms<'_>,
    fallbacks: Vec<RenderedFallback>,
    volumes: &mut [Value],
    init_containers: &mut Vec<Value>,
    sidecars: &[Value],
    app_mounts: &[Value],
) -> (Vec<ImageVolumeChoice>, Vec<String>) {
    let mut choices = Vec::new();
    let mut kept_as_image = Vec::new();
    let mut first_fallback = 0;
    for volume in volumes.iter_mut().filter(|v| v.get("image").is_some()) {
        let name = volume.get(VOLUMES.key).and_then(Value::as_str).unwrap_or_default().to_owned();
        let fallback = fallbacks.iter().find(|f| f.volume == name);
        let limit = match forms {
            VolumeForms::Nodes(support) => {
                support.limit(uses_sub_path(&name, init_containers.iter().chain(sidecars), app_mounts))
            }
            VolumeForms::Recorded(_) => None,
        };
        let image = match (forms, fallback) {
            (_, None) => true,
            (VolumeForms::Nodes(_), Some(_)) => limit.is_none(),
            (VolumeForms::Recorded(recorded), Some(_)) => recorded.contains(&name),
        };
        let mut choice =
            ImageVolumeChoice { volume: name, fallback: None, declared_fallback: fallback.is_some(), limit };
        match (image, fallback) {
            (true, Some(_)) => kept_as_image.push(choice.volume.clone()),
            (false, Some(fallback)) => {
                *volume = serde_json::json!({ VOLUMES.key: &choice.volume, "emptyDir": fallback.empty_dir });
                choice.fallback = fallback.init_container.get("name").and_then(Value::as_str).map(str::to_owned);
                // Before the template's own init containers (and so before its native sidecars),
                // which may read the agent; in the order the volumes are declared.
                init_containers.insert(first_fallback, fallback.init_container.clone());
                first_fallback += 1;
            }
            (_, None) => {}
        }
        choices.push(choice);
    }
    (choices, kept_as_image)
}

/// Each name once, in the order first met (the volume names several templates give one form).
pub(crate) fn distinct<'n>(names: impl IntoIterator<Item = &'n String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in names {
        if !out.contains(name) {
            out.push(name.clone());
        }
    }
    out
}

/// Whether a mount of volume `name` by the template's containers or app-container mounts uses
/// `subPath` or `subPathExpr`.
fn uses_sub_path<'c>(name: &str, containers: impl Iterator<Item = &'c Value>, app_mounts: &[Value]) -> bool {
    let container_mounts = containers.flat_map(|c| c.get(VOLUME_MOUNTS.field).and_then(Value::as_array)).flatten();
    container_mounts.chain(app_mounts).any(|mount| {
        let sub_path = |field: &str| mount.get(field).and_then(Value::as_str).is_some_and(|s| !s.is_empty());
        mount.get("name").and_then(Value::as_str) == Some(name) && (sub_path("subPath") || sub_path("subPathExpr"))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn runtimes_are_read_from_the_node_and_judged_by_version() {
        // (containerRuntimeVersion, mounts image volumes, applies subPath)
        let cases = [
            ("containerd://2.2.9", true, true),
            ("containerd://2.1.4", true, false),
            ("containerd://1.7.27", false, false),
            ("cri-o://1.33.1", true, true),
            ("cri-o://1.31.0", true, false),
            ("cri-o://1.30.9", false, false),
            ("docker://28.0.1", false, false),
            ("containerd://banana", false, false),
            ("", false, false),
        ];
        for (text, mounts, sub_path) in cases {
            let runtime = RuntimeVersion::parse(text);
            assert_eq!((runtime.mounts_image_volumes(), runtime.applies_sub_path()), (mounts, sub_path), "{text}");
        }
        assert_eq!(RuntimeVersion::parse("containerd://2.2.0-rc.1").to_string(), "containerd 2.2");
        assert_eq!(RuntimeVersion::parse("").to_string(), "a runtime the node does not report");
    }

    #[test]
    fn kubelet_runtime_and_api_server_decide_together() {
        let containerd = |v: &str| RuntimeVersion::parse(&format!("containerd://{v}"));
        let node = ImageVolumeSupport::of_node((1, 37), containerd("2.2.9"));
        assert_eq!((node.volumes, node.sub_path), (Ok(()), Ok(())));
        let old_kubelet = ImageVolumeSupport::of_node((1, 34), containerd("2.2.9"));
        assert_eq!(old_kubelet.limit(false), Some(Limit::Kubelet((1, 34))));
        assert_eq!(old_kubelet.limit(true), Some(Limit::Kubelet((1, 34))), "no subPath without the volume");
        let no_sub_path = ImageVolumeSupport::of_node((1, 36), containerd("2.1.0"));
        assert_eq!(
            (no_sub_path.limit(false), no_sub_path.limit(true)),
            (None, Some(Limit::Runtime(containerd("2.1.0"))))
        );
        // The first limit of a pool is kept.
        assert_eq!(
            node.and(no_sub_path).and(old_kubelet),
            ImageVolumeSupport { volumes: old_kubelet.volumes, sub_path: no_sub_path.sub_path }
        );
        // The API server: its version for the volume; a subPath never, as no runtime is known.
        let api = ImageVolumeSupport::of_api_server(Some((1, 36)));
        assert_eq!((api.limit(false), api.limit(true)), (None, Some(Limit::RuntimeUnknown)));
        assert_eq!(ImageVolumeSupport::of_api_server(Some((1, 34))).limit(false), Some(Limit::ApiServer((1, 34))));
        assert_eq!(ImageVolumeSupport::of_api_server(None).limit(false), None);
    }

    #[test]
    fn a_volume_takes_its_fallback_where_the_nodes_cannot_mount_it() {
        let fallback = |volume: &str| RenderedFallback {
            volume: volume.into(),
            empty_dir: json!({"sizeLimit": "64Mi"}),
            init_container: json!({"name": format!("copy-{volume}"), "image": "agent:1"}),
        };
        let volumes = || {
            vec![
                json!({"name": "agent", "image": {"reference": "agent:1"}}),
                json!({"name": "tools", "image": {"reference": "tools:1"}}),
                json!({"name": "plain", "image": {"reference": "plain:1"}}),
                json!({"name": "cache", "emptyDir": {}}),
            ]
        };
        let sub_path_mount = [json!({"name": "tools", "mountPath": "/tools", "subPath": "bin"})];
        let unsupported = ImageVolumeSupport::of_node((1, 34), RuntimeVersion::parse("containerd://2.2.0"));
        let no_sub_path = ImageVolumeSupport::of_node((1, 36), RuntimeVersion::parse("containerd://2.1.0"));
        let owned = ["agent".to_owned()];
        // (case, forms, image volumes kept, fallbacks injected)
        let cases: [(&str, VolumeForms, &[&str], &[&str]); 4] = [
            ("old nodes: every fallback", VolumeForms::Nodes(unsupported), &[], &["copy-agent", "copy-tools"]),
            ("a subPath the runtime ignores", VolumeForms::Nodes(no_sub_path), &["agent"], &["copy-tools"]),
            ("recorded: agent only", VolumeForms::Recorded(&owned), &["agent"], &["copy-tools"]),
            ("recorded: none", VolumeForms::Recorded(&[]), &[], &["copy-agent", "copy-tools"]),
        ];
        for (case, forms, kept, injected) in cases {
            let (mut volumes, mut init) = (volumes(), vec![json!({"name": "own-init"})]);
            let (choices, image) =
                apply(forms, vec![fallback("agent"), fallback("tools")], &mut volumes, &mut init, &[], &sub_path_mount);
            assert_eq!(image, kept, "{case}");
            let init_names: Vec<&str> = init.iter().filter_map(|c| c["name"].as_str()).collect();
            assert_eq!(&init_names[..injected.len()], injected, "{case}: fallbacks first, in volume order");
            assert_eq!(init_names.last(), Some(&"own-init"), "{case}");
            for choice in &choices {
                let volume = volumes.iter().find(|v| v["name"] == choice.volume.as_str()).unwrap();
                assert_eq!(volume.get("emptyDir").is_some(), choice.fallback.is_some(), "{case}: {}", choice.volume);
            }
            // A volume without a fallback stays an image volume, whatever the nodes say.
            assert_eq!(volumes[2], json!({"name": "plain", "image": {"reference": "plain:1"}}), "{case}");
            assert_eq!(volumes[3], json!({"name": "cache", "emptyDir": {}}));
        }
        let (mut volumes, mut init) = (volumes(), Vec::new());
        let (choices, _) =
            apply(VolumeForms::Nodes(unsupported), vec![fallback("agent")], &mut volumes, &mut init, &[], &[]);
        assert_eq!(volumes[0], json!({"name": "agent", "emptyDir": {"sizeLimit": "64Mi"}}));
        assert_eq!(
            choices[2],
            ImageVolumeChoice {
                volume: "plain".into(),
                fallback: None,
                declared_fallback: false,
                limit: Some(Limit::Kubelet((1, 34)))
            }
        );
    }
}
