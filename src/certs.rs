//! Certificates made by the injector itself: a CA, and serving certificates it signs. Used for the
//! self-managed mode (kept in a Secret) and the self-signed laptop mode. Pure: the clock is an
//! argument.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use time::{Duration, OffsetDateTime};

/// A PEM certificate and its PEM private key.
#[derive(Clone, PartialEq, Eq)]
pub struct Pem {
    /// Certificate, PEM.
    pub cert: String,
    /// Private key, PEM (PKCS#8).
    pub key: String,
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pem").field("cert", &self.cert).field("key", &"<redacted>").finish()
    }
}

/// Why a certificate could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen failed.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// The PEM is not a certificate.
    #[error("not a PEM certificate: {0}")]
    Parse(String),
}

fn validity(params: &mut CertificateParams, now: OffsetDateTime, days: u32) {
    // Backdate a little for clocks that disagree.
    params.not_before = now - Duration::minutes(5);
    params.not_after = now + Duration::days(i64::from(days));
}

/// A new self-signed CA.
pub fn generate_ca(common_name: &str, now: OffsetDateTime, days: u32) -> Result<Pem, CertError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    validity(&mut params, now, days);
    let cert = params.self_signed(&key)?;
    Ok(Pem { cert: cert.pem(), key: key.serialize_pem() })
}

/// A serving certificate for `hosts` (DNS names or IP addresses) signed by `ca`.
pub fn issue(ca: &Pem, hosts: &[String], now: OffsetDateTime, days: u32) -> Result<Pem, CertError> {
    let ca_key = KeyPair::from_pem(&ca.key)?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert, ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(DnType::CommonName, hosts.first().map(String::as_str).unwrap_or("sidecar-injector"));
    params.subject_alt_names = hosts
        .iter()
        .map(|h| match h.parse::<std::net::IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => Ok(SanType::DnsName(h.as_str().try_into()?)),
        })
        .collect::<Result<_, rcgen::Error>>()?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut params, now, days);
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Pem { cert: cert.pem(), key: key.serialize_pem() })
}

/// When the first certificate of a PEM chain expires.
pub fn not_after(cert_pem: &str) -> Result<OffsetDateTime, CertError> {
    let (_, pem) =
        x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).map_err(|e| CertError::Parse(e.to_string()))?;
    let cert = pem.parse_x509().map_err(|e| CertError::Parse(e.to_string()))?;
    Ok(cert.validity().not_after.to_datetime())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_issues_serving_certificates_that_rustls_verifies() {
        let now = OffsetDateTime::now_utc();
        let ca = generate_ca("test CA", now, 10).unwrap();
        let hosts = vec!["svc.ns.svc".to_owned(), "127.0.0.1".to_owned()];
        let serving = issue(&ca, &hosts, now, 2).unwrap();
        let expiry = not_after(&serving.cert).unwrap();
        assert!((expiry - now - Duration::days(2)).abs() < Duration::seconds(5));

        use rustls::client::danger::ServerCertVerifier;
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(ca.cert.as_bytes()).unwrap()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            roots.into(),
            rustls::crypto::ring::default_provider().into(),
        )
        .build()
        .unwrap();
        let leaf = CertificateDer::from_pem_slice(serving.cert.as_bytes()).unwrap();
        for host in ["svc.ns.svc", "127.0.0.1"] {
            let name = ServerName::try_from(host).unwrap();
            verifier
                .verify_server_cert(&leaf, &[], &name, &[], UnixTime::now())
                .unwrap_or_else(|e| panic!("{host}: {e}"));
        }
        let other = ServerName::try_from("evil.example").unwrap();
        assert!(verifier.verify_server_cert(&leaf, &[], &other, &[], UnixTime::now()).is_err());
        assert!(not_after("not a pem").is_err());
    }
}
