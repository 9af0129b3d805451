//! Self-managed certificates, for clusters without cert-manager: a CA and a serving certificate for
//! `<service>.<namespace>.svc` kept in a Secret in the injector's namespace, the CA written into the
//! `caBundle` of the injector's own webhook configurations, and rotation before expiry.
//!
//! Race-free across replicas: the Secret is created with `create` (a replica that loses the race
//! gets 409 and reads the winner's), and rotated with `replace` carrying the `resourceVersion` it
//! read (a replica that loses gets 409 and starts over). What to do is decided by the pure
//! [`plan`], so every case is unit-tested without a cluster.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use time::{Duration as TimeDuration, OffsetDateTime};

use crate::certs::{self, CertError, Pem};
use crate::config::TlsSettings;
use crate::server::tls::CertStore;
use crate::telemetry::Metrics;

/// Secret keys.
const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const CA_BUNDLE: &str = "ca-bundle.crt";
const TLS_CERT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";

/// The content of the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Material {
    /// The CA that signs serving certificates.
    pub ca: Pem,
    /// PEM CAs clients must trust: the current one, and the previous one while a CA rotation is
    /// recent (serving certificates signed by either verify).
    pub ca_bundle: String,
    /// The serving certificate.
    pub serving: Pem,
}

impl Material {
    fn to_data(&self) -> BTreeMap<String, ByteString> {
        [
            (CA_CERT, &self.ca.cert),
            (CA_KEY, &self.ca.key),
            (CA_BUNDLE, &self.ca_bundle),
            (TLS_CERT, &self.serving.cert),
            (TLS_KEY, &self.serving.key),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
        .collect()
    }

    fn from_data(data: &BTreeMap<String, ByteString>) -> Option<Material> {
        let get = |k: &str| data.get(k).and_then(|v| String::from_utf8(v.0.clone()).ok());
        let ca = Pem { cert: get(CA_CERT)?, key: get(CA_KEY)? };
        Some(Material {
            ca_bundle: get(CA_BUNDLE).unwrap_or_else(|| ca.cert.clone()),
            ca,
            serving: Pem { cert: get(TLS_CERT)?, key: get(TLS_KEY)? },
        })
    }
}

/// What to do with the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// It is current.
    Keep(Material),
    /// It does not exist: create it.
    Create(Material),
    /// Rotate: replace it, for the reason given.
    Replace(Material, String),
}

/// The names the serving certificate must be valid for.
pub fn service_hosts(settings: &TlsSettings, namespace: &str) -> Vec<String> {
    let service = &settings.service_name;
    let mut hosts = vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
        service.clone(),
    ];
    hosts.extend(settings.hosts.iter().cloned());
    hosts
}

fn covers_hosts(cert_pem: &str, hosts: &[String]) -> bool {
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()) else { return false };
    let Ok(cert) = pem.parse_x509() else { return false };
    let Ok(Some(san)) = cert.subject_alternative_name() else { return false };
    let names: Vec<String> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some((*d).to_owned()),
            x509_parser::extensions::GeneralName::IPAddress(ip) => match ip.len() {
                4 => Some(std::net::Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]).to_string()),
                16 => <[u8; 16]>::try_from(*ip).ok().map(|b| std::net::Ipv6Addr::from(b).to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    hosts.iter().all(|h| names.contains(h))
}

/// Decides what to do with the Secret's current content (`None`: no Secret).
pub fn plan(
    existing: Option<&BTreeMap<String, ByteString>>,
    hosts: &[String],
    settings: &TlsSettings,
    now: OffsetDateTime,
) -> Result<Plan, CertError> {
    let renew_before = TimeDuration::days(i64::from(settings.rotate_before_days));
    let new_ca = || certs::generate_ca("sidecar-injector CA", now, settings.ca_validity_days);
    let serve = |ca: &Pem| certs::issue(ca, hosts, now, settings.certificate_validity_days);
    let Some(data) = existing else {
        let ca = new_ca()?;
        return Ok(Plan::Create(Material { ca_bundle: ca.cert.clone(), serving: serve(&ca)?, ca }));
    };
    let Some(current) = Material::from_data(data) else {
        let ca = new_ca()?;
        return Ok(Plan::Replace(
            Material { ca_bundle: ca.cert.clone(), serving: serve(&ca)?, ca },
            "the Secret is incomplete".into(),
        ));
    };
    let expires_soon = |pem: &str| certs::not_after(pem).map_or(true, |t| t - now < renew_before);
    if expires_soon(&current.ca.cert) {
        // Trust both CAs until the old one expires, so certificates it signed keep verifying.
        let ca = new_ca()?;
        let ca_bundle = format!("{}{}", ca.cert, current.ca.cert);
        return Ok(Plan::Replace(Material { serving: serve(&ca)?, ca, ca_bundle }, "the CA expires soon".into()));
    }
    let reason = if expires_soon(&current.serving.cert) {
        "the serving certificate expires soon"
    } else if !covers_hosts(&current.serving.cert, hosts) {
        "the serving certificate does not cover the service's names"
    } else {
        let ca_bundle = strip_expired(&current.ca_bundle, now);
        return Ok(if ca_bundle == current.ca_bundle {
            Plan::Keep(current)
        } else {
            Plan::Replace(Material { ca_bundle, ..current }, "a previous CA expired".into())
        });
    };
    Ok(Plan::Replace(Material { serving: serve(&current.ca)?, ..current }, reason.into()))
}

/// The bundle without the CAs that have expired.
fn strip_expired(bundle: &str, now: OffsetDateTime) -> String {
    bundle
        .split_inclusive("-----END CERTIFICATE-----\n")
        .filter(|pem| certs::not_after(pem).is_ok_and(|t| t > now))
        .collect()
}

/// Applies [`plan`] to the Secret until it holds current material; returns it.
pub async fn ensure_secret(client: &Client, namespace: &str, settings: &TlsSettings) -> anyhow::Result<Material> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let hosts = service_hosts(settings, namespace);
    for _ in 0..5 {
        let existing = secrets.get_opt(&settings.secret_name).await?;
        let data = existing.as_ref().map(|s| s.data.clone().unwrap_or_default());
        let result = match plan(data.as_ref(), &hosts, settings, OffsetDateTime::now_utc())? {
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
            let expiry = store.replace(&material.serving)?;
            metrics.certificate_expiry.set(expiry.unix_timestamp());
            publish_ca_bundle(&client, &settings, &material.ca_bundle).await
        }
        .await;
        if let Err(error) = result {
            metrics.certificate_reload_errors.inc();
            tracing::error!(%error, "certificate maintenance failed; the current certificate keeps serving");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> TlsSettings {
        TlsSettings {
            certificate_validity_days: 90,
            rotate_before_days: 30,
            ca_validity_days: 3650,
            ..TlsSettings::default()
        }
    }

    fn data(plan: &Plan) -> BTreeMap<String, ByteString> {
        match plan {
            Plan::Keep(m) | Plan::Create(m) | Plan::Replace(m, _) => m.to_data(),
        }
    }

    #[test]
    fn the_secret_is_created_kept_and_rotated_when_due() {
        let settings = settings();
        let hosts = service_hosts(&settings, "sidecar-injector");
        assert!(hosts.contains(&"sidecar-injector.sidecar-injector.svc".to_owned()));
        let t0 = OffsetDateTime::now_utc();

        let created = plan(None, &hosts, &settings, t0).unwrap();
        let Plan::Create(first) = &created else { panic!("{created:?}") };
        assert!(covers_hosts(&first.serving.cert, &hosts));
        let stored = data(&created);

        assert!(matches!(plan(Some(&stored), &hosts, &settings, t0 + TimeDuration::days(59)).unwrap(), Plan::Keep(_)));

        let Plan::Replace(rotated, reason) =
            plan(Some(&stored), &hosts, &settings, t0 + TimeDuration::days(61)).unwrap()
        else {
            panic!()
        };
        assert_eq!(reason, "the serving certificate expires soon");
        assert_eq!(rotated.ca, first.ca, "the CA stays");
        assert_ne!(rotated.serving, first.serving);

        let more_hosts = [hosts.clone(), vec!["extra.example".to_owned()]].concat();
        let Plan::Replace(_, reason) = plan(Some(&stored), &more_hosts, &settings, t0).unwrap() else { panic!() };
        assert_eq!(reason, "the serving certificate does not cover the service's names");

        let Plan::Replace(new_ca, reason) =
            plan(Some(&stored), &hosts, &settings, t0 + TimeDuration::days(3630)).unwrap()
        else {
            panic!()
        };
        assert_eq!(reason, "the CA expires soon");
        assert_ne!(new_ca.ca, first.ca);
        assert!(
            new_ca.ca_bundle.contains(&first.ca.cert) && new_ca.ca_bundle.starts_with(&new_ca.ca.cert),
            "both CAs are trusted"
        );

        let mut broken = stored.clone();
        broken.remove(TLS_KEY);
        assert!(
            matches!(plan(Some(&broken), &hosts, &settings, t0).unwrap(), Plan::Replace(_, r) if r == "the Secret is incomplete")
        );
    }

    #[test]
    fn expired_previous_cas_leave_the_bundle() {
        let now = OffsetDateTime::now_utc();
        let old = certs::generate_ca("old", now - TimeDuration::days(10), 5).unwrap();
        let current = certs::generate_ca("current", now, 100).unwrap();
        assert_eq!(strip_expired(&format!("{}{}", current.cert, old.cert), now), current.cert);
    }
}
