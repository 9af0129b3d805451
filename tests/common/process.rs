//! The real `sidecar-injector serve` binary as a child process, without a cluster, on its
//! self-signed certificate: for what only a whole process shows (signals, exporters at exit).

// The harness calls libc (signals, rlimits, mounts, an allocator) where `unsafe` is the only way.
#![allow(unsafe_code)]
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// A running `serve` process; killed on drop if the test did not stop it.
pub struct ServeProcess {
    pub child: Child,
    pub https: u16,
    pub http: u16,
    ca_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl ServeProcess {
    /// Starts the binary with `extra_env` on top of a loopback, cluster-less configuration, and
    /// waits until `/readyz` answers 200.
    pub async fn start(extra_env: &[(&str, String)]) -> ServeProcess {
        Self::start_binary(std::path::Path::new(env!("CARGO_BIN_EXE_sidecar-injector")), extra_env).await
    }

    /// Like [`ServeProcess::start`], with another build of the binary (the release one).
    pub async fn start_binary(binary: &std::path::Path, extra_env: &[(&str, String)]) -> ServeProcess {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (https, http) = (free(), free());
        let child = Command::new(binary)
            .arg("serve")
            .env("SIDECAR_INJECTOR__CLUSTER__MODE", "off")
            .env("SIDECAR_INJECTOR__SERVER__ADDRESS", "127.0.0.1")
            .env("SIDECAR_INJECTOR__SERVER__HTTPS_PORT", https.to_string())
            .env("SIDECAR_INJECTOR__SERVER__HTTP_PORT", http.to_string())
            .env("SIDECAR_INJECTOR__TLS__SELF_SIGNED_CA_FILE", &ca_file)
            .envs(extra_env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let server = ServeProcess { child, https, http, ca_file, _dir: dir };
        let started = Instant::now();
        while reqwest::get(server.ready_url()).await.map(|r| r.status() != 200).unwrap_or(true) {
            assert!(started.elapsed() < Duration::from_secs(20), "the server did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server
    }

    pub fn ready_url(&self) -> String {
        format!("http://127.0.0.1:{}/readyz", self.http)
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.https)
    }

    /// A client builder that trusts the server's self-signed CA.
    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        (self.client_factory())()
    }

    /// Makes client builders trusting the server's CA, from any thread.
    pub fn client_factory(&self) -> impl Fn() -> reqwest::ClientBuilder + Send + 'static {
        let ca_file = self.ca_file.clone();
        move || client_builder_trusting(&ca_file)
    }

    /// The attack target this process is (`tests/common/attacks.rs`).
    pub fn target(&self) -> super::attacks::Target {
        super::attacks::Target {
            ip: std::net::Ipv4Addr::LOCALHOST.into(),
            https: self.https,
            http: self.http,
            server_name: "localhost".into(),
            ca_pem: std::fs::read(&self.ca_file).unwrap(),
            namespace: "shop".into(),
        }
    }

    pub fn sigterm(&self) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
    }

    /// Waits for the process to exit, failing the test after `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the server did not exit within {limit:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client builder that trusts the CA in `ca_file`.
fn client_builder_trusting(ca_file: &std::path::Path) -> reqwest::ClientBuilder {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(ca_file).unwrap()).unwrap();
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    reqwest::Client::builder().tls_backend_preconfigured(tls)
}
