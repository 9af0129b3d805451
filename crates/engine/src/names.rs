//! The names of the product contract: label and annotation keys that manifests, policies, tests and
//! users' scripts depend on. Nothing else in the crate spells these strings.

/// The namespace the injector is deployed in by default (`deploy/`); the webhook never touches it.
pub const INJECTOR_NAMESPACE: &str = "sidecar-injector";

/// Prefix of every label and annotation the injector reads or writes.
pub const PREFIX: &str = "sidecar-injector.io/";

/// The annotation `kubectl logs` and `kubectl exec` read for a pod's default container (else the
/// first in `spec.containers`).
pub const DEFAULT_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-container";

/// Namespace label that opts a namespace in (`enabled`) and pod label that opts a pod out (`disabled`).
pub const INJECT_LABEL: &str = "sidecar-injector.io/inject";
/// Value of [`INJECT_LABEL`] on a namespace that opts in.
pub const INJECT_ENABLED: &str = "enabled";
/// Value of [`INJECT_LABEL`] on a pod that opts out.
pub const INJECT_DISABLED: &str = "disabled";

/// Annotation on a namespace or a pod (the pod's wins) naming the templates to inject: `"a,b"`.
pub const TEMPLATES_ANNOTATION: &str = "sidecar-injector.io/templates";

/// Status annotation written on every pod the injector decided about (see `engine::status`).
pub const STATUS_ANNOTATION: &str = "sidecar-injector.io/status";

/// Label written on every pod that received at least one template.
pub const INJECTED_LABEL: &str = "sidecar-injector.io/injected";
/// Value of [`INJECTED_LABEL`] when every template applied cleanly.
pub const INJECTED_TRUE: &str = "true";
/// Value of [`INJECTED_LABEL`] when some template applied with conflicts (the pod's own item stands
/// where the template's would be): the pod is not fully what its templates make.
pub const INJECTED_PARTIAL: &str = "partial";

/// Label that marks template ConfigMaps in the injector's namespace.
pub const TEMPLATES_CONFIGMAP_LABEL: &str = "sidecar-injector.io/templates";

/// The value of [`TEMPLATES_CONFIGMAP_LABEL`] on the ConfigMap the injector keeps rollout state in
/// ([`KEPT_CONFIGMAP`]): watched with the templates, never read as templates.
pub const KEPT_LABEL_VALUE: &str = "kept";

/// The ConfigMap, in the injector's namespace, where it keeps the versions a rollout rolls from
/// and the rollouts' halts (`templates::rollout::Kept`).
pub const KEPT_CONFIGMAP: &str = "sidecar-injector-versions";

/// Pins, annotation on a namespace or a pod (the pod's entry wins): `template=<version hash>,...`
/// keeps the pod on that version while it is kept (`templates::rollout::Pins`).
pub const PINS_ANNOTATION: &str = "sidecar-injector.io/pins";

/// Annotation the kubelet puts on mirror pods (static pods reflected into the API server).
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Label the API server sets on every namespace to the namespace's own name, so a
/// namespaceSelector can name namespaces.
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// Namespaces the injector never touches, besides its own.
pub const SYSTEM_NAMESPACES: [&str; 3] = ["kube-system", "kube-public", "kube-node-lease"];

/// The annotation key of a per-pod value override: `sidecar-injector.io/<template>.<value>`.
pub fn override_annotation(template: &str, value: &str) -> String {
    format!("{PREFIX}{template}.{value}")
}

/// The ValidatingAdmissionPolicy (shipped in `deploy/`) that holds enforced templates while the
/// injector is down; the injector binds it once per enforced template.
pub const ENFORCEMENT_POLICY: &str = "sidecar-injector.io-enforced";
/// Label on the bindings and params ConfigMaps the injector writes for enforced templates: the
/// template's name. The injector deletes the labelled objects of templates no longer enforced.
pub const ENFORCED_TEMPLATE_LABEL: &str = "sidecar-injector.io/enforced-template";
/// Prefix of the names of those bindings and ConfigMaps (followed by the template's name).
pub const ENFORCED_OBJECT_PREFIX: &str = "sidecar-injector-enforced-";

/// The MutatingAdmissionPolicy (and its binding) compiled from the templates (`engine::policy`).
pub const INJECTION_POLICY: &str = "sidecar-injector.io-inject";

/// Where Kubernetes' ServiceAccount admission plugin mounts the API token.
pub const SERVICE_ACCOUNT_TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
