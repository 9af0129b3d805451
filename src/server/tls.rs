//! The serving certificate: a rustls `ResolvesServerCert` whose certificate can be swapped while
//! the server runs, and a watcher that swaps it when the files change.
//!
//! The watcher polls the *content* of the files rather than watching their paths: Kubernetes updates
//! a Secret volume by swapping a `..data` symlink, which an inotify watch on the file path misses,
//! and cert-manager may write the certificate and the key one after the other. A new pair is only
//! taken when it parses and the key matches the certificate; otherwise the old one keeps serving
//! and the error is logged and counted once per distinct content.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::certs::{self, Pem};
use crate::telemetry::Metrics;

/// Why a certificate and key cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// Reading a file failed.
    #[error("{path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// Not a usable certificate or key.
    #[error("{0}")]
    Invalid(String),
}

fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses a PEM certificate chain and key into what rustls serves, checking that they belong together.
pub fn certified_key(pem: &Pem) -> Result<(CertifiedKey, OffsetDateTime), TlsError> {
    let chain = CertificateDer::pem_slice_iter(pem.cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Invalid(format!("certificate: {e}")))?;
    if chain.is_empty() {
        return Err(TlsError::Invalid("certificate: no PEM certificate found".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(pem.key.as_bytes())
        .map_err(|e| TlsError::Invalid(format!("private key: {e}")))?;
    let signing_key = crypto_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::Invalid(format!("private key: {e}")))?;
    let certified = CertifiedKey::new(chain, signing_key);
    certified
        .keys_match()
        .map_err(|e| TlsError::Invalid(format!("the private key does not match the certificate: {e}")))?;
    let expiry = certs::not_after(&pem.cert).map_err(|e| TlsError::Invalid(e.to_string()))?;
    Ok((certified, expiry))
}

/// The certificate in service, swappable without a restart.
#[derive(Debug)]
pub struct CertStore {
    current: ArcSwap<CertifiedKey>,
    expiry: ArcSwap<OffsetDateTime>,
}

impl CertStore {
    /// A store serving `pem`.
    pub fn new(pem: &Pem) -> Result<Self, TlsError> {
        let (key, expiry) = certified_key(pem)?;
        Ok(CertStore { current: ArcSwap::from_pointee(key), expiry: ArcSwap::from_pointee(expiry) })
    }

    /// Serves `pem` to new connections from now on; the old certificate stays when `pem` is invalid.
    pub fn replace(&self, pem: &Pem) -> Result<OffsetDateTime, TlsError> {
        let (key, expiry) = certified_key(pem)?;
        self.current.store(Arc::new(key));
        self.expiry.store(Arc::new(expiry));
        Ok(expiry)
    }

    /// When the certificate in service expires.
    pub fn expiry(&self) -> OffsetDateTime {
        **self.expiry.load()
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The TLS configuration of the HTTPS listener: TLS 1.2 and 1.3 only, HTTP/1.1, the store's
/// certificate; with `client_cas` (PEM), only clients presenting a certificate signed by one of them.
pub fn server_config(store: Arc<CertStore>, client_cas: Option<&str>) -> Result<rustls::ServerConfig, TlsError> {
    let builder = rustls::ServerConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("the ring provider supports TLS 1.2 and 1.3");
    let builder = match client_cas {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let invalid = |message: String| TlsError::Invalid(format!("tls.client_ca_file: {message}"));
            let mut roots = rustls::RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                roots.add(ca.map_err(|e| invalid(e.to_string()))?).map_err(|e| invalid(e.to_string()))?;
            }
            if roots.is_empty() {
                return Err(invalid("no certificate in the file".into()));
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), crypto_provider())
                    .build()
                    .map_err(|e| invalid(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(store);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Reads a certificate and key pair of files.
pub fn read_files(cert: &Path, key: &Path) -> Result<Pem, TlsError> {
    let read = |path: &Path| std::fs::read_to_string(path).map_err(|error| TlsError::Read { path: path.into(), error });
    Ok(Pem { cert: read(cert)?, key: read(key)? })
}

/// Polls `cert` and `key` every `interval` and serves them when their content changes and is valid.
pub async fn watch_files(
    store: Arc<CertStore>,
    cert: PathBuf,
    key: PathBuf,
    interval: Duration,
    metrics: Arc<Metrics>,
) {
    let digest = |pem: &Pem| Sha256::digest(format!("{}\n{}", pem.cert, pem.key).as_bytes()).to_vec();
    let mut seen = read_files(&cert, &key).ok().map(|pem| digest(&pem));
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let pem = match read_files(&cert, &key) {
            Ok(pem) => pem,
            Err(error) => {
                // A Secret volume update is atomic, but other writers may be mid-way; retry next tick.
                tracing::debug!(%error, "certificate files not readable, keeping the current certificate");
                continue;
            }
        };
        let current = digest(&pem);
        if seen.as_ref() == Some(&current) {
            continue;
        }
        seen = Some(current);
        match store.replace(&pem) {
            Ok(expiry) => {
                metrics.certificate_expiry.set(expiry.unix_timestamp());
                tracing::info!(cert = %cert.display(), %expiry, "serving a new certificate");
            }
            Err(error) => {
                metrics.certificate_reload_errors.inc();
                tracing::error!(cert = %cert.display(), %error, "new certificate files are invalid, keeping the current certificate");
            }
        }
    }
}
