//! The self-managed certificate in a cluster without cert-manager: kept in a Secret in the
//! injector's namespace, its CA written into the `caBundle` of the injector's own webhook
//! configurations, checked and rotated on a timer. What to do is decided by the pure
//! [`certs::rotation::plan`](crate::certs::rotation::plan); this module reads and writes.
//!
//! Race-free across replicas: the Secret is created with `create` (a replica that loses the race
//! gets 409 and reads the winner's), and rotated with `replace` carrying the `resourceVersion` it
//! read (a replica that loses gets 409 and starts over). Replicas publish the bundle before they
//! switch what they serve.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use time::OffsetDateTime;

use crate::certs::rotation::{Material, Plan, plan, service_hosts};
use crate::config::TlsSettings;
use crate::server::tls::CertStore;
use crate::telemetry::Metrics;

/// Applies [`plan`] to the Secret until it holds current material; returns it.
pub async fn ensure_secret(client: &Client, namespace: &str, settings: &TlsSettings) -> anyhow::Result<Material> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let hosts = service_hosts(settings, namespace);
    for _ in 0..5 {
        let existing = secrets.get_opt(&settings.secret_name).await?;
        let data = existing.as_ref().map(|s| s.data.clone().unwrap_or_default());
        let published = published_bundles(client, settings).await?;
        let result = match plan(data.as_ref(), &hosts, settings, OffsetDateTime::now_utc(), &published)? {
            Plan::Keep(material) => return Ok(material),
            Plan::Create(material) => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(settings.secret_name.clone()),
                        namespace: Some(namespace.into()),
                        ..Default::default()
                    },
                    data: Some(material.to_data()),
                    type_: Some("Opaque".into()),
                    ..Default::default()
                };
                secrets.create(&PostParams::default(), &secret).await.map(|_| {
                    tracing::info!(secret = %settings.secret_name, "created the CA and serving certificate");
                    material
                })
            }
            Plan::Replace(material, reason) => {
                let mut secret = existing.expect("replace implies an existing Secret");
                secret.data = Some(material.to_data());
                secrets.replace(&settings.secret_name, &PostParams::default(), &secret).await.map(|_| {
                    tracing::info!(secret = %settings.secret_name, %reason, "rotated the certificate");
                    material
                })
            }
        };
        match result {
            Ok(material) => return Ok(material),
            // Another replica created or rotated it first: read theirs.
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("the Secret {} kept changing under us (5 conflicts in a row)", settings.secret_name)
}

/// The `caBundle` of every webhook of the named webhook configurations that exist.
async fn published_bundles(client: &Client, settings: &TlsSettings) -> anyhow::Result<Vec<String>> {
    let mut bundles = Vec::new();
    let text =
        |b: &Option<ByteString>| b.as_ref().map(|b| String::from_utf8_lossy(&b.0).into_owned()).unwrap_or_default();
    for name in &settings.webhook_configurations {
        let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        if let Some(config) = mutating.get_opt(name).await? {
            bundles.extend(config.webhooks.iter().flatten().map(|w| text(&w.client_config.ca_bundle)));
        }
        let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        if let Some(config) = validating.get_opt(name).await? {
            bundles.extend(config.webhooks.iter().flatten().map(|w| text(&w.client_config.ca_bundle)));
        }
    }
    Ok(bundles)
}

/// Writes `ca_bundle` into every webhook of the named Mutating and Validating webhook configurations.
pub async fn publish_ca_bundle(client: &Client, settings: &TlsSettings, ca_bundle: &str) -> anyhow::Result<()> {
    for name in &settings.webhook_configurations {
        update_bundle::<MutatingWebhookConfiguration>(client, name, ca_bundle, |c| {
            c.webhooks.iter_mut().flatten().map(|w| &mut w.client_config.ca_bundle).collect()
        })
        .await?;
        update_bundle::<ValidatingWebhookConfiguration>(client, name, ca_bundle, |c| {
            c.webhooks.iter_mut().flatten().map(|w| &mut w.client_config.ca_bundle).collect()
        })
        .await?;
    }
    Ok(())
}

async fn update_bundle<K>(
    client: &Client,
    name: &str,
    ca_bundle: &str,
    bundles: impl Fn(&mut K) -> Vec<&mut Option<ByteString>>,
) -> anyhow::Result<()>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize,
{
    let api: Api<K> = Api::all(client.clone());
    let want = ByteString(ca_bundle.as_bytes().to_vec());
    for _ in 0..5 {
        let Some(mut config) = api.get_opt(name).await? else {
            tracing::debug!(kind = %K::kind(&()), name, "webhook configuration not found; nothing to update");
            return Ok(());
        };
        if bundles(&mut config).iter().all(|b| b.as_ref() == Some(&want)) {
            return Ok(());
        }
        // A JSON patch of the caBundles alone (RBAC: `patch`, not `update`), each guarded by a
        // `test` of its webhook's name, so a configuration changed meanwhile is never half-written.
        let value = serde_json::to_value(&config)?;
        let webhooks = value.get("webhooks").and_then(serde_json::Value::as_array).cloned().unwrap_or_default();
        let encoded = serde_json::to_value(&want)?;
        let mut operations = Vec::new();
        for (index, webhook) in webhooks.iter().enumerate() {
            operations.push(
                serde_json::json!({"op": "test", "path": format!("/webhooks/{index}/name"), "value": webhook["name"]}),
            );
            operations.push(serde_json::json!({"op": "add", "path": format!("/webhooks/{index}/clientConfig/caBundle"), "value": encoded}));
        }
        let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(operations))?;
        match api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch)).await {
            Ok(_) => {
                tracing::info!(kind = %K::kind(&()), name, "wrote the CA into caBundle");
                return Ok(());
            }
            // The configuration changed between the read and the patch: read it again.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 422 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::bail!("{} {name} kept changing under us (5 conflicts in a row)", K::kind(&()))
}

/// Keeps the certificate current: checks the Secret every `tls.check_interval_seconds`, serves a
/// rotated certificate (whichever replica rotated it) and keeps the caBundles current.
pub async fn maintain(
    client: Client,
    namespace: String,
    settings: TlsSettings,
    store: Arc<CertStore>,
    metrics: Arc<Metrics>,
) {
    let mut ticker = tokio::time::interval(Duration::from_secs(settings.check_interval_seconds));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let result = async {
            let material = ensure_secret(&client, &namespace, &settings).await?;
            // Publish first: the bundle already trusts whatever the Secret's serving certificate
            // is signed by, and a replica must never serve what the API server does not trust yet.
            publish_ca_bundle(&client, &settings, &material.ca_bundle).await?;
            let expiry = store.replace(&material.serving)?;
            metrics.certificate_expiry.set(expiry.unix_timestamp());
            anyhow::Ok(())
        }
        .await;
        if let Err(error) = result {
            metrics.certificate_reload_errors.inc();
            tracing::error!(%error, "certificate maintenance failed; the current certificate keeps serving");
        }
    }
}
