//! Certificates made by the injector itself: a CA, and serving certificates it signs. Used for the
//! self-managed mode (kept in a Secret, rotated as [`rotation`] decides) and the self-signed laptop
//! mode. Pure: the clock is an argument; `cluster::cert_secret` does the cluster's reads and writes.

pub mod rotation;

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
    issue_with(ca, hosts, now, days, ExtendedKeyUsagePurpose::ServerAuth)
}

/// A client certificate for `name` signed by `ca`: what the API server presents to the webhook when
/// `tls.client_ca_file` is set (its AdmissionConfiguration names the files).
pub fn issue_client(ca: &Pem, name: &str, now: OffsetDateTime, days: u32) -> Result<Pem, CertError> {
    issue_with(ca, &[name.to_owned()], now, days, ExtendedKeyUsagePurpose::ClientAuth)
}

fn issue_with(
    ca: &Pem,
    hosts: &[String],
    now: OffsetDateTime,
    days: u32,
    usage: ExtendedKeyUsagePurpose,
) -> Result<Pem, CertError> {
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
    params.extended_key_usages = vec![usage];
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

/// Writes `contents` to `path` so that nobody else can redirect or pre-empt the write: into a new
/// file created exclusively next to it (never following a symlink, never reusing an existing
/// file), then renamed over `path` (a rename replaces a symlink instead of following it, and in a
/// sticky directory such as `/tmp` it cannot replace another user's file). Used for the laptop
/// mode's CA file, whose default path is in the shared temporary directory.
pub fn write_file_safely(path: &std::path::Path, contents: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    if let Ok(existing) = std::fs::symlink_metadata(path) {
        // SAFETY: geteuid has no preconditions.
        #[allow(unsafe_code)]
        let me = unsafe { libc::geteuid() };
        if !existing.file_type().is_file() || existing.uid() != me {
            return Err(std::io::Error::other(format!(
                "{} exists and is {} (owned by uid {}): remove it or choose another path",
                path.display(),
                if existing.file_type().is_symlink() { "a symlink" } else { "not a regular file of yours" },
                existing.uid()
            )));
        }
    }
    let name =
        path.file_name().ok_or_else(|| std::io::Error::other(format!("{} is not a file path", path.display())))?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    for attempt in 0..16u32 {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let temporary = dir.join(format!(".{}.{}.{nanos}.{attempt}", name.to_string_lossy(), std::process::id()));
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temporary);
        let mut file = match file {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            other => other?,
        };
        let written =
            file.write_all(contents).and_then(|()| file.sync_all()).and_then(|()| std::fs::rename(&temporary, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        return written;
    }
    Err(std::io::Error::other(format!("could not create a new file next to {}", path.display())))
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

    #[test]
    fn the_ca_file_is_written_without_following_or_reusing_what_others_placed() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("ca.pem");
        write_file_safely(&target, b"first").unwrap();
        write_file_safely(&target, b"second").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"second");
        // A symlink planted at the path is refused, and what it points to is untouched.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let planted = dir.path().join("planted.pem");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let err = write_file_safely(&planted, b"ca").unwrap_err();
        assert!(err.to_string().contains("is a symlink"), "{err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        // No temporary files are left behind.
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), 3, "{left:?}");
    }
}
