//! Native or classic sidecars: the one place that decides which a template's sidecars become in a
//! pod, says why, and writes and reads what makes a sidecar native. The webhook, the CLI
//! (`inject`, `explain`, `check-templates`), the validating checks and the policy compiler all ask
//! here.
//!
//! A native sidecar is an init container with `restartPolicy: Always`: it starts before the app
//! and stops by itself when the app ends, so Jobs complete. It needs the **kubelet** to be 1.29 or
//! newer; an older kubelet would wait for the init container to finish, and the pod would never
//! start. So `native` and `auto` make classic containers where the kubelets the pod may run on are
//! older (see `nodes` for which kubelets count).
//!
//! A native sidecar also gets a `resizePolicy` that resizes cpu and memory in place
//! (`NotRequired`) unless its template gives one: a vertical autoscaler or `kubectl patch
//! --subresource resize` then never restarts it. The kubelet treats an absent `resizePolicy` the
//! same way (the API server stopped writing it as a default in 1.33), so a native sidecar injected
//! before it was written is the same sidecar: comparisons take an absent one for this default
//! ([`restarts_nothing`]).

use serde_json::Value;

/// The first Kubernetes version whose kubelet runs native sidecars.
pub const NATIVE_SINCE: (u32, u32) = (1, 29);

/// The first Kubernetes version whose API server accepts a `resizePolicy` on a native sidecar.
pub const SIDECAR_RESIZE_POLICY_SINCE: (u32, u32) = (1, 33);

/// The `restartPolicy` of an init container that makes it a native sidecar.
pub const RESTART_ALWAYS: &str = "Always";

/// How `sidecarMode: auto` decides, in words (`check-templates`, docs).
pub const AUTO_RULE: &str = "auto: native sidecars where the kubelets of the nodes a pod can run on are 1.29+ (its nodeName, else the nodes its nodeSelector and node affinity allow, else the oldest node; the API server's version when no node reports one)";

/// How a template's `sidecars` are added to the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SidecarMode {
    /// Native sidecars where the kubelet runs them, classic containers with a warning elsewhere.
    Native,
    /// Classic containers beside the app.
    Container,
    /// Native when the cluster supports it, classic otherwise.
    Auto,
}

/// Whether a kubelet (or, without one, an API server) of this `(major, minor)` runs native sidecars.
pub fn supported_by(version: (u32, u32)) -> bool {
    version >= NATIVE_SINCE
}

/// Whether the sidecars of a template in `mode` become native sidecars where the pod runs
/// (`native_sidecars`: whether the kubelets there run them, `ClusterFacts::native_sidecars`).
pub fn is_native(mode: SidecarMode, native_sidecars: bool) -> bool {
    match mode {
        SidecarMode::Native | SidecarMode::Auto => native_sidecars,
        SidecarMode::Container => false,
    }
}

/// Why a template's sidecars are not what its mode asks for, or cost the pod something: a warning
/// for each that applies (`owner_kind`: the pod's workload kind).
pub fn concerns(mode: SidecarMode, native_sidecars: bool, owner_kind: &str) -> Vec<Concern> {
    let mut found = Vec::new();
    if mode == SidecarMode::Native && !native_sidecars {
        found.push(Concern::NativeUnavailable);
    }
    if !is_native(mode, native_sidecars) && matches!(owner_kind, "Job" | "CronJob") {
        found.push(Concern::ClassicInJob);
    }
    found
}

/// What [`concerns`] finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Concern {
    /// `sidecarMode: native` where the kubelet cannot run native sidecars: they are classic.
    NativeUnavailable,
    /// Classic sidecars in a Job's pod: the Job does not complete while they run.
    ClassicInJob,
}

/// The resources a native sidecar resizes in place unless its template says otherwise.
const RESIZED_IN_PLACE: [&str; 2] = ["cpu", "memory"];

/// The `resizePolicy` a native sidecar gets when its template gives none: cpu and memory resize
/// without a restart.
pub fn default_resize_policy() -> Value {
    RESIZED_IN_PLACE
        .iter()
        .map(|resource| serde_json::json!({"resourceName": resource, "restartPolicy": "NotRequired"}))
        .collect()
}

/// Makes a rendered sidecar a native sidecar (an init container that restarts always and, unless
/// the template says otherwise, resizes in place).
pub fn make_native(sidecar: &mut Value) {
    sidecar["restartPolicy"] = Value::from(RESTART_ALWAYS);
    if sidecar.get("resizePolicy").is_none() {
        sidecar["resizePolicy"] = default_resize_policy();
    }
}

/// Whether a `resizePolicy` restarts the container for no resource: what a container without one
/// does, so a container without one holds it.
pub fn restarts_nothing(resize_policy: &Value) -> bool {
    resize_policy.as_array().is_some_and(|entries| {
        entries.iter().all(|entry| entry.get("restartPolicy").is_none_or(|policy| policy == "NotRequired"))
    })
}

/// Whether an init container of a pod is a native sidecar.
pub fn is_native_sidecar(init_container: &Value) -> bool {
    init_container.get("restartPolicy").and_then(Value::as_str) == Some(RESTART_ALWAYS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_and_the_kubelet_decide_together() {
        let (new, old) = (supported_by((1, 29)), supported_by((1, 28)));
        assert!(is_native(SidecarMode::Auto, new) && is_native(SidecarMode::Native, new));
        assert!(!is_native(SidecarMode::Container, new));
        assert!(!is_native(SidecarMode::Auto, old) && !is_native(SidecarMode::Native, old));
        assert_eq!(concerns(SidecarMode::Native, old, "Pod"), [Concern::NativeUnavailable]);
        assert_eq!(concerns(SidecarMode::Auto, old, "Job"), [Concern::ClassicInJob]);
        assert_eq!(concerns(SidecarMode::Container, new, "CronJob"), [Concern::ClassicInJob]);
        assert!(concerns(SidecarMode::Auto, new, "Job").is_empty());
        let mut sidecar = serde_json::json!({"name": "s"});
        make_native(&mut sidecar);
        assert!(is_native_sidecar(&sidecar));
        assert_eq!(sidecar["resizePolicy"], default_resize_policy());
        assert!(restarts_nothing(&sidecar["resizePolicy"]));
        // The template's own policy is kept.
        let own = serde_json::json!([{"resourceName": "memory", "restartPolicy": "RestartContainer"}]);
        let mut sidecar = serde_json::json!({"name": "s", "resizePolicy": own});
        make_native(&mut sidecar);
        assert_eq!(sidecar["resizePolicy"], own);
        assert!(!restarts_nothing(&own));
    }
}
