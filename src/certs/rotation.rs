//! Deciding what the self-managed certificate needs, from what the Secret holds now: keep it,
//! create it, or rotate the serving certificate or the CA. Pure (the clock and the published
//! bundles are arguments), so every case is unit-tested without a cluster;
//! `cluster::cert_secret` reads and writes the Secret and the webhook configurations.
//!
//! A CA rotation takes two steps, so the API server never meets a certificate it does not trust:
//! first the new CA is added to the Secret as the *next* CA and to the bundle (old and new), while
//! serving stays on the old CA; every replica publishes that bundle. Only when every webhook
//! configuration's `caBundle` holds the next CA is it promoted and the serving certificate
//! re-issued from it.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use time::{Duration, OffsetDateTime};

use super::{CertError, Pem};
use crate::config::TlsSettings;

/// Secret keys.
const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const CA_BUNDLE: &str = "ca-bundle.crt";
const TLS_CERT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const NEXT_CA_CERT: &str = "next-ca.crt";
const NEXT_CA_KEY: &str = "next-ca.key";

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
    /// During a CA rotation: the CA that will sign the serving certificate once the webhook
    /// configurations trust it (it is already in `ca_bundle`).
    pub next_ca: Option<Pem>,
}

impl Material {
    /// The Secret's `data`.
    pub fn to_data(&self) -> BTreeMap<String, ByteString> {
        let next = self.next_ca.iter().flat_map(|n| [(NEXT_CA_CERT, &n.cert), (NEXT_CA_KEY, &n.key)]);
        [
            (CA_CERT, &self.ca.cert),
            (CA_KEY, &self.ca.key),
            (CA_BUNDLE, &self.ca_bundle),
            (TLS_CERT, &self.serving.cert),
            (TLS_KEY, &self.serving.key),
        ]
        .into_iter()
        .chain(next)
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
            next_ca: get(NEXT_CA_CERT).zip(get(NEXT_CA_KEY)).map(|(cert, key)| Pem { cert, key }),
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

/// Decides what to do with the Secret's current content (`None`: no Secret). `published` holds
/// the `caBundle` of every webhook configuration as it is now (a CA rotation's next CA is promoted
/// only when all of them trust it).
pub fn plan(
    existing: Option<&BTreeMap<String, ByteString>>,
    hosts: &[String],
    settings: &TlsSettings,
    now: OffsetDateTime,
    published: &[String],
) -> Result<Plan, CertError> {
    let renew_before = Duration::days(i64::from(settings.rotate_before_days));
    let new_ca = || super::generate_ca("sidecar-injector CA", now, settings.ca_validity_days);
    let serve = |ca: &Pem| super::issue(ca, hosts, now, settings.certificate_validity_days);
    let Some(data) = existing else {
        let ca = new_ca()?;
        return Ok(Plan::Create(Material { ca_bundle: ca.cert.clone(), serving: serve(&ca)?, ca, next_ca: None }));
    };
    let Some(current) = Material::from_data(data) else {
        let ca = new_ca()?;
        return Ok(Plan::Replace(
            Material { ca_bundle: ca.cert.clone(), serving: serve(&ca)?, ca, next_ca: None },
            "the Secret is incomplete".into(),
        ));
    };
    let expires_soon = |pem: &str| super::not_after(pem).map_or(true, |t| t - now < renew_before);
    if let Some(next) = &current.next_ca {
        let trusted = published.iter().all(|bundle| bundle.contains(next.cert.trim()));
        if !trusted {
            // Step 1 of a CA rotation is done; wait until every webhook configuration trusts it.
            return Ok(Plan::Keep(current));
        }
        // Step 2: every client trusts the next CA: sign with it from now on.
        let serving = serve(next)?;
        let promoted = Material { ca: next.clone(), serving, next_ca: None, ca_bundle: current.ca_bundle.clone() };
        return Ok(Plan::Replace(
            promoted,
            "the new CA is trusted by every webhook configuration: serving from it".into(),
        ));
    }
    if expires_soon(&current.ca.cert) {
        // Step 1: trust both CAs (the old one until it expires), keep serving from the old one.
        let next = new_ca()?;
        let ca_bundle = format!("{}{}", next.cert, current.ca.cert);
        return Ok(Plan::Replace(
            Material { ca_bundle, next_ca: Some(next), ..current },
            "the CA expires soon: publishing the new CA before serving from it".into(),
        ));
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
        .filter(|pem| super::not_after(pem).is_ok_and(|t| t > now))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::certs;

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

        let created = plan(None, &hosts, &settings, t0, &[]).unwrap();
        let Plan::Create(first) = &created else { panic!("{created:?}") };
        assert!(covers_hosts(&first.serving.cert, &hosts));
        let stored = data(&created);

        assert!(matches!(plan(Some(&stored), &hosts, &settings, t0 + Duration::days(59), &[]).unwrap(), Plan::Keep(_)));

        let Plan::Replace(rotated, reason) =
            plan(Some(&stored), &hosts, &settings, t0 + Duration::days(61), &[]).unwrap()
        else {
            panic!()
        };
        assert_eq!(reason, "the serving certificate expires soon");
        assert_eq!(rotated.ca, first.ca, "the CA stays");
        assert_ne!(rotated.serving, first.serving);

        let more_hosts = [hosts.clone(), vec!["extra.example".to_owned()]].concat();
        let Plan::Replace(_, reason) = plan(Some(&stored), &more_hosts, &settings, t0, &[]).unwrap() else { panic!() };
        assert_eq!(reason, "the serving certificate does not cover the service's names");

        let Plan::Replace(step1, reason) =
            plan(Some(&stored), &hosts, &settings, t0 + Duration::days(3630), std::slice::from_ref(&first.ca_bundle))
                .unwrap()
        else {
            panic!()
        };
        assert_eq!(reason, "the CA expires soon: publishing the new CA before serving from it");
        assert_eq!(step1.ca, first.ca, "still serving from the old CA");
        let next = step1.next_ca.clone().expect("a next CA");
        assert!(
            step1.ca_bundle.contains(&first.ca.cert) && step1.ca_bundle.starts_with(&next.cert),
            "both CAs are trusted"
        );

        let mut broken = stored.clone();
        broken.remove(TLS_KEY);
        assert!(
            matches!(plan(Some(&broken), &hosts, &settings, t0, &[]).unwrap(), Plan::Replace(_, r) if r == "the Secret is incomplete")
        );
    }

    #[test]
    fn expired_previous_cas_leave_the_bundle() {
        let now = OffsetDateTime::now_utc();
        let old = certs::generate_ca("old", now - Duration::days(10), 5).unwrap();
        let current = certs::generate_ca("current", now, 100).unwrap();
        assert_eq!(strip_expired(&format!("{}{}", current.cert, old.cert), now), current.cert);
    }

    /// Whether a client trusting exactly `bundle` (as the API server trusts a webhook's caBundle)
    /// accepts `serving` for `host` at `now`, by rustls' own verification.
    fn trusted(bundle: &str, serving: &str, host: &str, now: OffsetDateTime) -> bool {
        use rustls::client::danger::ServerCertVerifier;
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
            roots.add(ca.unwrap()).unwrap();
        }
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build().unwrap();
        let leaf = CertificateDer::from_pem_slice(serving.as_bytes()).unwrap();
        let at = UnixTime::since_unix_epoch(std::time::Duration::from_secs(now.unix_timestamp() as u64));
        verifier.verify_server_cert(&leaf, &[], &ServerName::try_from(host.to_owned()).unwrap(), &[], at).is_ok()
    }

    #[test]
    fn through_a_ca_rotation_the_api_server_trusts_every_certificate_a_replica_serves() {
        // A short-lived CA, so one run covers serving renewals and a whole CA rotation.
        let settings = TlsSettings { ca_validity_days: 200, ..settings() };
        let hosts = service_hosts(&settings, "sidecar-injector");
        let host = hosts[0].as_str();
        let t0 = OffsetDateTime::now_utc();
        let Plan::Create(created) = plan(None, &hosts, &settings, t0, &[]).unwrap() else { panic!() };
        // What the webhook configurations hold (two of them, published in turn) and the Secret.
        let mut published = vec![created.ca_bundle.clone(), created.ca_bundle.clone()];
        let mut secret = created.to_data();
        let mut steps = Vec::new();
        // A check every 10 days for 300 days; publishing lags one check behind on the second
        // configuration (a replica that failed to write it).
        for day in (10..=300).step_by(10) {
            let now = t0 + Duration::days(day);
            let material = match plan(Some(&secret), &hosts, &settings, now, &published).unwrap() {
                Plan::Keep(m) => m,
                Plan::Replace(m, reason) => {
                    steps.push(reason);
                    m
                }
                Plan::Create(_) => unreachable!(),
            };
            secret = material.to_data();
            // The replica publishes before it switches; the first configuration is written now,
            // the second only at the next check.
            published[1] = published[0].clone();
            published[0] = material.ca_bundle.clone();
            let serving = &material.serving.cert;
            // What the replica serves now must be trusted by every configuration as it is now,
            // the lagging one included.
            for (which, bundle) in published.iter().enumerate() {
                assert!(
                    trusted(bundle, serving, host, now),
                    "day {day}: configuration {which} does not trust the served certificate"
                );
            }
        }
        assert!(steps.iter().any(|s| s.starts_with("the CA expires soon")), "{steps:?}");
        assert!(steps.iter().any(|s| s.starts_with("the new CA is trusted")), "{steps:?}");
    }
}
