//! Settings of `serve`: one typed struct, loaded with the `config` crate from defaults, then an
//! optional YAML file, then environment variables `SIDECAR_INJECTOR__SECTION__KEY`. Unknown keys and
//! invalid values are refused at start-up with a message naming the key. Every setting is listed,
//! with its default, in docs/settings.md (a test compares the names).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Prefix of the environment variables that set settings.
pub const ENV_PREFIX: &str = "SIDECAR_INJECTOR";

/// All settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Listeners and limits.
    pub server: ServerSettings,
    /// The serving certificate.
    pub tls: TlsSettings,
    /// The Kubernetes API connection.
    pub cluster: ClusterSettings,
    /// Templates used when there is no cluster.
    pub templates: TemplateSettings,
    /// Logs, traces.
    pub telemetry: TelemetrySettings,
}

/// Listeners and limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// Address both listeners bind to.
    pub address: String,
    /// HTTPS port of `/mutate` and `/validate` (0: any free port).
    pub https_port: u16,
    /// Plain HTTP port of `/healthz`, `/readyz` and `/metrics` (0: any free port).
    pub http_port: u16,
    /// Largest AdmissionReview body accepted; larger ones get 413. The API server refuses requests
    /// over 3 MiB and etcd objects over ~1.5 MiB, so a real review (object, and oldObject on
    /// UPDATE) stays under 4 MiB.
    pub max_body_bytes: usize,
    /// Request bodies held at once, across all connections (read, parsed or being decided); a
    /// request waits for room up to `room_wait_ms`. Bounds the memory any set of clients can make
    /// the server hold, whatever their number.
    pub max_inflight_bytes: usize,
    /// How long a request waits for room among the bodies in flight before it gets 503 with
    /// `Retry-After: 1`. The API server's webhook client retries such an answer after a second
    /// within its own timeout (5 s in deploy/), so short waits turn an overload into retries
    /// instead of a failed-open call (and a pod the policy refuses). Capped at `body_timeout_ms`.
    pub room_wait_ms: u64,
    /// Worker threads (0: one per CPU).
    pub workers: usize,
    /// Time a client has to send a request's headers before the connection is closed (slow clients).
    pub client_request_timeout_ms: u64,
    /// Time a client has to send a request's body; then the request gets 408.
    pub body_timeout_ms: u64,
    /// Idle keep-alive time of a connection. Longer than the API server's own idle timeout (90 s),
    /// so that the client is the one to close an idle connection: a server closing it can cross a
    /// request the client is sending on it, which Go's client does not resend (a POST), so the
    /// call fails open.
    pub keep_alive_seconds: u64,
    /// Most concurrent connections per worker (each established TLS connection holds tens of KiB).
    pub max_connections_per_worker: usize,
    /// TLS handshakes in progress per worker; more connections wait in the kernel's queue.
    pub max_tls_handshakes_per_worker: usize,
    /// Time a client has to complete the TLS handshake (the API server needs a few ms).
    pub tls_handshake_timeout_ms: u64,
    /// On SIGTERM, how long the server keeps serving, every answer with `Connection: close`, before
    /// it stops taking connections: the API server retires its pooled connections to this replica
    /// one by one, each after an answer, instead of having them closed under a request it may be
    /// sending (which it would not resend).
    pub drain_seconds: u64,
    /// After the drain, how long in-flight requests may take before the process exits.
    pub shutdown_timeout_seconds: u64,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            address: "0.0.0.0".into(),
            https_port: 8443,
            http_port: 8080,
            max_body_bytes: 4 * 1024 * 1024,
            max_inflight_bytes: 24 * 1024 * 1024,
            workers: 0,
            client_request_timeout_ms: 5000,
            body_timeout_ms: 10_000,
            room_wait_ms: 1000,
            keep_alive_seconds: 120,
            max_connections_per_worker: 4096,
            max_tls_handshakes_per_worker: 4096,
            tls_handshake_timeout_ms: 1000,
            drain_seconds: 3,
            shutdown_timeout_seconds: 25,
        }
    }
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TlsMode {
    /// `files` when `cert_file` is set, else `self-managed` in a cluster, else `self-signed`.
    Auto,
    /// `cert_file` and `key_file`, reloaded when they change (e.g. from cert-manager).
    Files,
    /// A CA and serving certificate kept in a Secret, written into the webhook configurations.
    SelfManaged,
    /// Generated at start-up, CA written to `self_signed_ca_file`; for laptops and tests.
    SelfSigned,
}

/// The serving certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// Where the certificate comes from.
    pub mode: TlsMode,
    /// PEM certificate chain (mode `files`).
    pub cert_file: Option<PathBuf>,
    /// PEM private key (mode `files`).
    pub key_file: Option<PathBuf>,
    /// How often the files are checked for changes (mode `files`), in seconds.
    pub reload_interval_seconds: u64,
    /// Secret holding the CA and serving certificate (mode `self-managed`).
    pub secret_name: String,
    /// Service name the certificate is issued for: `<service>.<namespace>.svc`.
    pub service_name: String,
    /// Mutating and validating webhook configurations whose `caBundle` is kept current.
    pub webhook_configurations: Vec<String>,
    /// Validity of a serving certificate, in days.
    pub certificate_validity_days: u32,
    /// Validity of the CA, in days.
    pub ca_validity_days: u32,
    /// Renew the serving certificate when it expires within this many days.
    pub rotate_before_days: u32,
    /// How often the Secret is checked (other replicas may have rotated it), in seconds.
    pub check_interval_seconds: u64,
    /// Where the CA of a self-signed certificate is written (mode `self-signed`).
    pub self_signed_ca_file: PathBuf,
    /// Names and addresses the injector's own certificates are valid for: all of a self-signed one's,
    /// and in self-managed mode besides `<service>.<namespace>.svc` and its variants.
    pub hosts: Vec<String>,
    /// PEM CA(s) of the client certificate the API server presents to webhooks (configured in its
    /// AdmissionConfiguration). When set, a client without a certificate signed by one of them is
    /// refused during the TLS handshake, so only the API server can reach `/mutate` and
    /// `/validate`. Unset: any client is served (the bounds still hold).
    pub client_ca_file: Option<PathBuf>,
}

impl Default for TlsSettings {
    fn default() -> Self {
        TlsSettings {
            mode: TlsMode::Auto,
            cert_file: None,
            key_file: None,
            reload_interval_seconds: 5,
            secret_name: "sidecar-injector-tls".into(),
            service_name: "sidecar-injector".into(),
            webhook_configurations: vec!["sidecar-injector".into()],
            certificate_validity_days: 90,
            ca_validity_days: 3650,
            rotate_before_days: 30,
            check_interval_seconds: 300,
            self_signed_ca_file: std::env::temp_dir().join("sidecar-injector-ca.pem"),
            hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            client_ca_file: None,
        }
    }
}

/// Whether to use the Kubernetes API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterMode {
    /// Use it when a kubeconfig or an in-cluster service account is found.
    Auto,
    /// Require it.
    On,
    /// Never (templates from `templates.dir` or embedded, every namespace opted in).
    Off,
}

/// The Kubernetes API connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSettings {
    /// Whether to use the Kubernetes API.
    pub mode: ClusterMode,
    /// The injector's namespace (template ConfigMaps, TLS Secret; never injected). Default: the
    /// `POD_NAMESPACE` environment variable, else the service account's namespace, else
    /// `sidecar-injector`.
    pub namespace: Option<String>,
    /// How long a request waits for a namespace that the cache has not seen yet (it was created a
    /// moment ago), in milliseconds; then its labels count as unknown.
    pub namespace_wait_ms: u64,
    /// Kubernetes version to assume instead of asking the API server (e.g. `1.33`).
    pub kubernetes_version: Option<String>,
    /// Watch pod metadata cluster-wide to export `sidecar_injector_drifted_pods` (needs list and
    /// watch on pods).
    pub watch_pods: bool,
    /// How often the drift metrics are recomputed, in seconds.
    pub drift_interval_seconds: u64,
    /// List pods for the drift watch, and nodes for the node watch, as a streaming list (the API
    /// server's `WatchList`: objects sent one by one from its watch cache) rather than in pages; an
    /// API server that refuses it gets paged lists.
    pub streaming_lists: bool,
    /// Keep a binding of the `sidecar-injector.io-enforced` ValidatingAdmissionPolicy (and its
    /// params ConfigMap) for every enforced template, so the API server refuses pods that lack an
    /// enforced template's sidecars while the injector is down (needs the RBAC in `deploy/`).
    pub enforcement_policy: bool,
    /// The policy mode: keep the MutatingAdmissionPolicy `sidecar-injector.io-inject` compiled from
    /// the templates (and its binding) in the cluster, so the API server injects first admissions
    /// itself (`deploy/overlays/policy` turns it on with the RBAC it needs).
    pub injection_policy: bool,
    /// Publish Kubernetes Events (on a pod's owner, and on template ConfigMaps) for pods injected
    /// with conflicts, refused, with ignored overrides or `enforced: audit` findings, and for
    /// refused or unapplied template edits (needs `create`/`patch` on `events.k8s.io` events).
    pub events: bool,
    /// Watch the nodes' kubelet versions, so `sidecarMode: auto` adds native sidecars only where
    /// the pod's nodes run kubelet 1.29 or newer (not by the API server's version; needs
    /// `list`/`watch` on nodes).
    pub watch_nodes: bool,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            mode: ClusterMode::Auto,
            namespace: None,
            namespace_wait_ms: 2000,
            kubernetes_version: None,
            watch_pods: true,
            drift_interval_seconds: 30,
            streaming_lists: true,
            enforcement_policy: true,
            injection_policy: false,
            events: true,
            watch_nodes: true,
        }
    }
}

/// Templates used when there is no cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TemplateSettings {
    /// Directory of `<name>.yaml` templates; the embedded defaults when absent. With a cluster, the
    /// template ConfigMaps are used instead.
    pub dir: Option<PathBuf>,
}

/// Log format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Logs and traces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetrySettings {
    /// Log format.
    pub log_format: LogFormat,
    /// Log filter, `tracing` EnvFilter syntax (`info`, `sidecar_injector=debug,warn`).
    pub log_level: String,
    /// OTLP/HTTP endpoint for traces (`http://collector:4318`, plain HTTP); traces are off when absent.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the traces.
    pub service_name: String,
}

impl Default for TelemetrySettings {
    fn default() -> Self {
        TelemetrySettings {
            log_format: LogFormat::Text,
            log_level: "info".into(),
            otlp_endpoint: None,
            service_name: "sidecar-injector".into(),
        }
    }
}

/// An invalid configuration, with a message that names the key.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl Settings {
    /// Defaults, then the YAML file (when given), then `SIDECAR_INJECTOR__...` variables from `env`.
    pub fn load(file: Option<&Path>, env: impl IntoIterator<Item = (String, String)>) -> Result<Settings, ConfigError> {
        let mut builder = config::Config::builder();
        if let Some(file) = file {
            if !file.is_file() {
                return Err(ConfigError(format!("{}: no such file", file.display())));
            }
            builder = builder.add_source(config::File::from(file).format(config::FileFormat::Yaml));
        }
        let env: std::collections::HashMap<String, String> =
            env.into_iter().filter(|(k, _)| k.starts_with(&format!("{ENV_PREFIX}__"))).collect();
        builder = builder.add_source(
            config::Environment::with_prefix(ENV_PREFIX)
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .list_separator(",")
                .with_list_parse_key("tls.webhook_configurations")
                .with_list_parse_key("tls.hosts")
                .source(Some(env)),
        );
        let settings: Settings =
            builder.build().and_then(|c| c.try_deserialize()).map_err(|e| ConfigError(e.to_string()))?;
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let fail = |m: &str| Err(ConfigError(m.to_owned()));
        let server = &self.server;
        if server.https_port == server.http_port && server.https_port != 0 {
            return fail("server.https_port and server.http_port must differ");
        }
        if server.max_body_bytes < 64 * 1024 {
            return fail("server.max_body_bytes must be at least 65536");
        }
        if server.max_inflight_bytes < server.max_body_bytes + 1024 * 1024 {
            return fail(
                "server.max_inflight_bytes must be at least server.max_body_bytes + 1 MiB (room for one largest request and the small ones)",
            );
        }
        if server.max_tls_handshakes_per_worker == 0 || server.tls_handshake_timeout_ms == 0 {
            return fail("server.max_tls_handshakes_per_worker and server.tls_handshake_timeout_ms must be positive");
        }
        if server.max_connections_per_worker == 0 {
            return fail("server.max_connections_per_worker must be at least 1");
        }
        if server.room_wait_ms == 0 {
            return fail("server.room_wait_ms must be at least 1");
        }
        let tls = &self.tls;
        if tls.cert_file.is_some() != tls.key_file.is_some() {
            return fail("tls.cert_file and tls.key_file must be set together");
        }
        if tls.mode == TlsMode::Files && tls.cert_file.is_none() {
            return fail("tls.mode files needs tls.cert_file and tls.key_file");
        }
        if self.cluster.drift_interval_seconds == 0 {
            return fail("cluster.drift_interval_seconds must be at least 1");
        }
        if tls.reload_interval_seconds == 0 || tls.check_interval_seconds == 0 {
            return fail("tls.reload_interval_seconds and tls.check_interval_seconds must be at least 1");
        }
        if tls.rotate_before_days >= tls.certificate_validity_days {
            return fail("tls.rotate_before_days must be less than tls.certificate_validity_days");
        }
        if tls.certificate_validity_days >= tls.ca_validity_days {
            return fail("tls.certificate_validity_days must be less than tls.ca_validity_days");
        }
        if self.telemetry.log_level.trim().is_empty() {
            return fail("telemetry.log_level must not be empty");
        }
        tracing_subscriber::EnvFilter::try_new(&self.telemetry.log_level)
            .map_err(|e| ConfigError(format!("telemetry.log_level {:?}: {e}", self.telemetry.log_level)))?;
        if let Some(version) = &self.cluster.kubernetes_version
            && crate::engine::ClusterFacts::from_version_string(version).is_none()
        {
            return Err(ConfigError(format!("cluster.kubernetes_version {version:?} is not a version like 1.33")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    #[test]
    fn defaults_then_file_then_environment() {
        assert_eq!(Settings::load(None, env(&[])).unwrap(), Settings::default());
        let f = file("server:\n  https_port: 9443\n  http_port: 9080\ntls:\n  webhook_configurations: [a, b]\n");
        let s = Settings::load(Some(f.path()), env(&[])).unwrap();
        assert_eq!((s.server.https_port, s.server.http_port), (9443, 9080));
        assert_eq!(s.tls.webhook_configurations, vec!["a", "b"]);

        let s = Settings::load(
            Some(f.path()),
            env(&[
                ("SIDECAR_INJECTOR__SERVER__HTTPS_PORT", "10443"),
                ("SIDECAR_INJECTOR__TELEMETRY__LOG_FORMAT", "json"),
                ("SIDECAR_INJECTOR__TLS__WEBHOOK_CONFIGURATIONS", "x,y"),
                ("SIDECAR_INJECTOR__CLUSTER__MODE", "off"),
                ("OTHER__SERVER__HTTPS_PORT", "1"),
            ]),
        )
        .unwrap();
        assert_eq!((s.server.https_port, s.server.http_port), (10443, 9080), "env wins over the file");
        assert_eq!(s.telemetry.log_format, LogFormat::Json);
        assert_eq!(s.tls.webhook_configurations, vec!["x", "y"]);
        assert_eq!(s.cluster.mode, ClusterMode::Off);
    }

    #[test]
    fn unknown_keys_and_invalid_values_are_refused_with_the_key() {
        /// (settings file, environment, expected message fragment)
        type Case = (&'static str, &'static [(&'static str, &'static str)], &'static str);
        let cases: &[Case] = &[
            ("server:\n  https_prot: 1\n", &[], "unknown field `https_prot`"),
            ("servr: {}\n", &[], "unknown field `servr`"),
            ("", &[("SIDECAR_INJECTOR__SERVER__HTTPS_PORT", "eighty")], "https_port"),
            ("", &[("SIDECAR_INJECTOR__SERVER__NOPE", "1")], "unknown field `nope`"),
            ("tls:\n  mode: sometimes\n", &[], "sometimes for key `tls.mode`"),
            ("server:\n  https_port: 8080\n", &[], "must differ"),
            ("tls:\n  cert_file: /a\n", &[], "must be set together"),
            ("tls:\n  mode: files\n", &[], "needs tls.cert_file"),
            ("server:\n  max_body_bytes: 10\n", &[], "at least 65536"),
            ("server:\n  max_inflight_bytes: 70000\n", &[], "room for one largest request"),
            ("server:\n  room_wait_ms: 0\n", &[], "server.room_wait_ms must be at least 1"),
            ("telemetry:\n  log_level: \"=\"\n", &[], "telemetry.log_level"),
            ("cluster:\n  kubernetes_version: latest\n", &[], "cluster.kubernetes_version"),
            ("tls:\n  rotate_before_days: 400\n", &[], "rotate_before_days"),
        ];
        for (text, vars, fragment) in cases {
            let f = file(text);
            let err = Settings::load(Some(f.path()), env(vars)).unwrap_err().to_string();
            assert!(err.starts_with("invalid configuration: ") && err.contains(fragment), "{text:?} {vars:?}: {err}");
        }
        let err = Settings::load(Some(Path::new("/nonexistent.yaml")), env(&[])).unwrap_err().to_string();
        assert!(err.contains("/nonexistent.yaml: no such file"), "{err}");
    }
}
