//! Keeps the enforcement policy's bindings and params current with the templates in service.
//!
//! For every enforced template the injector server-side-applies a params ConfigMap in its own
//! namespace and a binding of the `sidecar-injector.io-enforced` ValidatingAdmissionPolicy (shipped
//! in `deploy/`) to the pods the template is enforced for (`engine::enforce::policy_objects`), and
//! deletes the labelled objects of templates no longer enforced. The API server then refuses pods
//! that lack an enforced template's items by itself, so the mandate holds while the injector is
//! down. None of these objects is in `deploy/`, so GitOps tools never see them change.
//!
//! Every replica reconciles; server-side apply with one field manager makes that idempotent. It runs
//! when the templates change (checked every [`INTERVAL`], as a fingerprint of what would be written),
//! after a failure, and every [`RESYNC`] regardless (an object deleted by hand comes back), and counts
//! failures in `sidecar_injector_enforcement_sync_errors_total`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::Value;

use crate::engine::{enforce, names};
use crate::state::AppState;

/// How often the templates in service are compared with what was last written.
pub const INTERVAL: Duration = Duration::from_secs(2);
/// How often everything is written again even when nothing changed here, so a binding or params
/// ConfigMap deleted or edited by hand comes back.
pub const RESYNC: Duration = Duration::from_secs(60);

const FIELD_MANAGER: &str = "sidecar-injector";

/// Per enforced template: its params ConfigMap and its binding, as applied.
type PolicyObjects = BTreeMap<String, (Value, Value)>;

fn binding_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicyBinding"),
        "validatingadmissionpolicybindings",
    )
}

fn configmap_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "ConfigMap"), "configmaps")
}

/// Starts the reconciler.
pub fn keep_current(client: Client, own_namespace: String, state: Arc<AppState>) {
    tokio::spawn(async move {
        let bindings: Api<DynamicObject> = Api::all_with(client.clone(), &binding_resource());
        let params: Api<DynamicObject> = Api::namespaced_with(client, &own_namespace, &configmap_resource());
        let mut written: Option<(PolicyObjects, tokio::time::Instant)> = None;
        let mut ticker = tokio::time::interval(INTERVAL);
        // After a failure (say, a cluster without admissionregistration.k8s.io/v1 policies), the
        // next attempt waits twice as long as the last, up to RESYNC, so the log is not flooded.
        let (mut retry_at, mut backoff) = (tokio::time::Instant::now(), INTERVAL);
        loop {
            ticker.tick().await;
            if !state.readiness.templates_synced.load(Ordering::Relaxed) || tokio::time::Instant::now() < retry_at {
                continue;
            }
            let engine = state.engine.load();
            let native = state.cluster.load().native_sidecars;
            let desired: PolicyObjects = engine
                .templates
                .iter()
                .filter(|t| t.enforced)
                .map(|t| (t.name.to_string(), enforce::policy_objects(t, native, &own_namespace)))
                .collect();
            if written.as_ref().is_some_and(|(last, at)| *last == desired && at.elapsed() < RESYNC) {
                continue;
            }
            match sync(&bindings, &params, &desired).await {
                Ok(()) => {
                    if written.as_ref().is_none_or(|(last, _)| *last != desired) {
                        tracing::info!(templates = ?desired.keys().collect::<Vec<_>>(), "enforcement policy bindings in place");
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

/// Applies every desired object, then deletes the labelled ones no template asks for.
async fn sync(bindings: &Api<DynamicObject>, params: &Api<DynamicObject>, desired: &PolicyObjects) -> kube::Result<()> {
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    for (configmap, binding) in desired.values() {
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
            if !desired.contains_key(&template) {
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
