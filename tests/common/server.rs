//! A real `serve` on loopback ports for tests: real rustls, real certificates (made by rcgen), laid
//! out like a Kubernetes Secret volume so that rotation can be done the way the kubelet does it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sidecar_injector::certs::{self, Pem};
use sidecar_injector::cli::serve::Starting;
use sidecar_injector::config::{ClusterMode, Settings, TlsMode};
use sidecar_injector::sandbox::Sandbox;
use sidecar_injector::state::AppState;

/// A running server and what a client needs to talk to it.
pub struct TestServer {
    pub https: SocketAddr,
    pub http: SocketAddr,
    pub ca: Pem,
    pub dir: tempfile::TempDir,
    pub state: Arc<AppState>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    generation: u32,
}

pub fn issue(ca: &Pem) -> Pem {
    certs::issue(ca, &["localhost".into(), "127.0.0.1".into()], time::OffsetDateTime::now_utc(), 30).unwrap()
}

/// Writes `pem` the way the kubelet updates a Secret volume: files in a fresh timestamped directory,
/// then the `..data` symlink swapped atomically (rename over it). `tls.crt` and `tls.key` are
/// symlinks through `..data`.
pub fn write_secret_volume(dir: &Path, generation: u32, pem: &Pem) {
    let target = format!("..2026_11_21_{generation:04}");
    std::fs::create_dir(dir.join(&target)).unwrap();
    std::fs::write(dir.join(&target).join("tls.crt"), &pem.cert).unwrap();
    std::fs::write(dir.join(&target).join("tls.key"), &pem.key).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(&target, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for file in ["tls.crt", "tls.key"] {
        if std::fs::symlink_metadata(dir.join(file)).is_err() {
            std::os::unix::fs::symlink(PathBuf::from("..data").join(file), dir.join(file)).unwrap();
        }
    }
}

impl TestServer {
    /// Starts a server without a cluster, serving certificate files, tweaked by `configure`.
    pub fn start(configure: impl FnOnce(&mut Settings)) -> TestServer {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let ca = certs::generate_ca("test CA", time::OffsetDateTime::now_utc(), 60).unwrap();
        write_secret_volume(dir.path(), 0, &issue(&ca));
        let mut settings = Settings::default();
        settings.server.address = "127.0.0.1".into();
        settings.server.https_port = 0;
        settings.server.http_port = 0;
        settings.server.workers = 2;
        settings.server.shutdown_timeout_seconds = 10;
        // Every test stops its server; tests/shutdown.rs is where the drain is tested.
        settings.server.drain_seconds = 0;
        settings.cluster.mode = ClusterMode::Off;
        settings.tls.mode = TlsMode::Files;
        settings.tls.cert_file = Some(dir.path().join("tls.crt"));
        settings.tls.key_file = Some(dir.path().join("tls.key"));
        settings.tls.reload_interval_seconds = 1;
        configure(&mut settings);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (shutdown_tx, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            actix_web::rt::System::with_tokio_rt(|| {
                tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
            })
            .block_on(async move {
                let sandbox = Sandbox::new(env!("CARGO_BIN_EXE_sidecar-injector").into());
                let started = Starting::new(settings, Arc::new(sandbox)).await.expect("server starts");
                ready_tx.send((started.servers.https_addr, started.servers.http_addr, started.state.clone())).unwrap();
                started
                    .servers
                    .run_until(started.state, async {
                        let _ = shutdown_rx.await;
                    })
                    .await
                    .unwrap();
            });
        });
        let (https, http, state) = ready_rx.recv_timeout(Duration::from_secs(30)).expect("server started");
        TestServer { https, http, ca, dir, state, shutdown: Some(shutdown_tx), thread: Some(thread), generation: 0 }
    }

    /// A rustls client configuration trusting the test CA, for the given TLS versions.
    pub fn client_tls(&self, versions: &[&'static rustls::SupportedProtocolVersion]) -> rustls::ClientConfig {
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(self.ca.cert.as_bytes()).unwrap()).unwrap();
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth()
    }

    /// An HTTPS client trusting the test CA (TLS 1.2 and 1.3).
    pub fn client(&self) -> reqwest::Client {
        let tls = self.client_tls(&[&rustls::version::TLS13, &rustls::version::TLS12]);
        reqwest::Client::builder().tls_backend_preconfigured(tls).timeout(Duration::from_secs(30)).build().unwrap()
    }

    /// `https://localhost:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.https.port())
    }

    /// `http://127.0.0.1:<port><path>` on the plain listener.
    pub fn plain_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.http.port())
    }

    /// Rotates the serving certificate the way a Secret volume update does.
    pub fn rotate(&mut self, pem: &Pem) {
        self.generation += 1;
        write_secret_volume(self.dir.path(), self.generation, pem);
    }

    /// Stops the server gracefully and waits for it.
    pub fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
