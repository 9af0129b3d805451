//! Keeps the admission policy objects current with the templates in service: the enforcement
//! policy's bindings and params and, in the policy mode, the compiled injection policy.
//!
//! For every enforced template the injector server-side-applies a params ConfigMap in its own
//! namespace and a binding of the `sidecar-injector.io-enforced` ValidatingAdmissionPolicy (shipped
//! in `deploy/`) to the pods the template is enforced for (`engine::checks::enforce::policy_objects`), and
//! deletes the labelled objects of templates no longer enforced. The API server then refuses pods
//! that lack an enforced template's items by itself, so the mandate holds while the injector is
//! down. None of these objects is in `deploy/`, so GitOps tools never see them change.
//!
//! Every replica reconciles; server-side apply with one field manager makes that idempotent. It runs
//! when the templates change (checked every [`INTERVAL`], as a fingerprint of what would be written),
//! after a failure, and every [`RESYNC`] regardless (an object deleted by hand comes back), and counts
//! failures in `sidecar_injector_enforcement_sync_errors_total`.
//!
//! In the policy mode (`cluster.injection_policy`) it also server-side-applies the
//! MutatingAdmissionPolicy `sidecar-injector.io-inject` and its binding as `engine::emit::policy`
//! compiles them from the same templates, so the API server injects first admissions itself.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::Value;

use crate::engine::{checks::enforce, emit::policy, names};
use crate::state::AppState;

/// How often the templates in service are compared with what was last written.
pub const INTERVAL: Duration = Duration::from_secs(2);
/// How often everything is written again even when nothing changed here, so a binding or params
/// ConfigMap deleted or edited by hand comes back.
pub const RESYNC: Duration = Duration::from_secs(60);

const FIELD_MANAGER: &str = "sidecar-injector";

/// Per enforced template: its params ConfigMap and its binding, as applied.
type PolicyObjects = BTreeMap<String, (Value, Value)>;

/// Everything this reconciler writes: the enforcement bindings and, in the policy mode, the
/// MutatingAdmissionPolicy compiled from the templates and its binding (`engine::emit::policy`).
#[derive(Debug, PartialEq)]
struct Desired {
    enforced: PolicyObjects,
    injection: Option<(Value, Value)>,
}

/// Which admission policy objects the injector keeps current (settings `cluster.enforcement_policy`
/// and `cluster.injection_policy`).
#[derive(Debug, Clone, Copy)]
pub struct Modes {
    /// Bindings of the enforcement policy, one per enforced template.
    pub enforcement: bool,
    /// The injection policy and its binding.
    pub injection: bool,
}

fn binding_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicyBinding"),
        "validatingadmissionpolicybindings",
    )
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind), plural)
}

fn configmap_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "ConfigMap"), "configmaps")
}

/// Starts the reconciler.
pub fn keep_current(client: Client, own_namespace: String, state: Arc<AppState>, modes: Modes) {
    tokio::spawn(async move {
        let apis = Apis {
            bindings: Api::all_with(client.clone(), &binding_resource()),
            params: Api::namespaced_with(client.clone(), &own_namespace, &configmap_resource()),
            injection_policy: Api::all_with(
                client.clone(),
                &resource("MutatingAdmissionPolicy", "mutatingadmissionpolicies"),
            ),
            injection_binding: Api::all_with(
                client,
                &resource("MutatingAdmissionPolicyBinding", "mutatingadmissionpolicybindings"),
            ),
        };
        let mut written: Option<(Desired, tokio::time::Instant)> = None;
        let mut compiled: Option<(Arc<crate::engine::Engine>, bool, (Value, Value))> = None;
        let mut ticker = tokio::time::interval(INTERVAL);
        // After a failure (say, a cluster without admissionregistration.k8s.io/v1 policies), the
        // next attempt waits twice as long as the last, up to RESYNC, so the log is not flooded.
        let (mut retry_at, mut backoff) = (tokio::time::Instant::now(), INTERVAL);
        loop {
            ticker.tick().await;
            if !state.readiness.templates_synced.load(Ordering::Relaxed) || tokio::time::Instant::now() < retry_at {
                continue;
            }
            let engine = state.engine.load_full();
            // Cluster-wide objects: native only where every node runs a kubelet that starts them.
            let native = state.nodes.load().facts_for(&serde_json::Value::Null, **state.cluster.load()).native_sidecars;
            let may_precede = enforce::may_precede(&engine.templates);
            let enforced: PolicyObjects = engine
                .templates
                .iter()
                .filter(|t| modes.enforcement && (t.enforced || t.audit))
                .map(|t| {
                    let versions: Vec<&crate::engine::Template> =
                        engine.templates.versions_in_service(&t.name).into_iter().map(|t| &**t).collect();
                    let objects = enforce::policy_objects(&versions, native, &own_namespace, may_precede.as_deref());
                    (t.name.to_string(), objects)
                })
                .collect();
            // Compiled again only when the templates in service (or the sidecar mode) change, and
            // off the async workers: hundreds of templates take a while.
            let injection = match &compiled {
                _ if !modes.injection => None,
                Some((for_engine, for_native, objects))
                    if Arc::ptr_eq(for_engine, &engine) && *for_native == native =>
                {
                    Some(objects.clone())
                }
                _ => {
                    let (templates, namespace) = (engine.clone(), own_namespace.clone());
                    let objects = tokio::task::spawn_blocking(move || {
                        let compiled = policy::compile(&templates.templates, native, &[namespace]);
                        (compiled.policy, compiled.binding)
                    })
                    .await
                    .expect("compiling the injection policy does not panic");
                    compiled = Some((engine.clone(), native, objects.clone()));
                    Some(objects)
                }
            };
            let desired = Desired { enforced, injection };
            if written.as_ref().is_some_and(|(last, at)| *last == desired && at.elapsed() < RESYNC) {
                continue;
            }
            match sync(&apis, &desired, modes).await {
                Ok(()) => {
                    if written.as_ref().is_none_or(|(last, _)| *last != desired) {
                        tracing::info!(
                            enforced = ?desired.enforced.keys().collect::<Vec<_>>(),
                            injection_policy = desired.injection.is_some(),
                            "admission policy objects in place"
                        );
                    }
                    written = Some((desired, tokio::time::Instant::now()));
                    backoff = INTERVAL;
                }
                Err(error) => {
                    state.metrics.enforcement_sync_errors.inc();
                    tracing::error!(%error, retry_in = ?backoff, "could not write the enforcement policy's bindings");
                    retry_at = tokio::time::Instant::now() + backoff;
                    backoff = (backoff * 2).min(RESYNC);
                }
            }
        }
    });
}

struct Apis {
    bindings: Api<DynamicObject>,
    params: Api<DynamicObject>,
    injection_policy: Api<DynamicObject>,
    injection_binding: Api<DynamicObject>,
}

/// Applies every desired object, then deletes the labelled ones no template asks for.
async fn sync(apis: &Apis, desired: &Desired, modes: Modes) -> kube::Result<()> {
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    if let Some((policy, binding)) = &desired.injection {
        // The policy first: a binding to a missing policy does nothing, the other way round
        // would leave the old policy bound to new selectors for a moment.
        apis.injection_policy.patch(names::INJECTION_POLICY, &apply, &Patch::Apply(policy)).await?;
        apis.injection_binding.patch(names::INJECTION_POLICY, &apply, &Patch::Apply(binding)).await?;
    }
    if !modes.enforcement {
        return Ok(());
    }
    let (bindings, params) = (&apis.bindings, &apis.params);
    for (configmap, binding) in desired.enforced.values() {
        // Params first: a binding whose params are missing refuses every pod it matches.
        let name = configmap["metadata"]["name"].as_str().unwrap_or_default();
        params.patch(name, &apply, &Patch::Apply(configmap)).await?;
        let name = binding["metadata"]["name"].as_str().unwrap_or_default();
        bindings.patch(name, &apply, &Patch::Apply(binding)).await?;
    }
    let labelled = ListParams::default().labels(names::ENFORCED_TEMPLATE_LABEL);
    // Bindings first, for the same reason.
    for api in [bindings, params] {
        for object in api.list_metadata(&labelled).await?.items {
            let template = object.labels().get(names::ENFORCED_TEMPLATE_LABEL).cloned().unwrap_or_default();
            if !desired.enforced.contains_key(&template) {
                tracing::info!(name = %object.name_any(), template, "template no longer enforced; removing");
                match api.delete(&object.name_any(), &DeleteParams::default()).await {
                    Err(kube::Error::Api(status)) if status.is_not_found() => {}
                    Err(error) => return Err(error),
                    Ok(_) => {}
                }
            }
        }
    }
    Ok(())
}
