//! sidecar-injector: a Kubernetes mutating admission webhook that injects sidecars, labels,
//! annotations, volumes and env into pods from templates kept in a ConfigMap.
//!
//! The crate is a pure core with a thin shell around it:
//! - [`engine`]: templates, selection, rendering, the injection plan and patch, validation. No IO;
//!   its own crate (`crates/engine/`, `sidecar-injector-engine`), re-exported here under its old path.
//! - [`admission`]: AdmissionReview in, engine decision, AdmissionReview out (pure).
//! - [`cli`]: the `inject`, `explain` and `check-templates` commands over files and stdin.
//! - [`server`]: the actix-web + rustls listeners, certificate reload; [`cluster`]: kube-rs watches
//!   of namespaces and template ConfigMaps, the self-managed certificate's Secret; [`certs`]: certificate
//!   making and the rotation plan (pure).
//! - [`config`], [`telemetry`]: settings, logs, traces and metrics.

#![deny(missing_docs)]

pub mod admission;
pub mod certs;
pub mod cli;
pub mod cluster;
pub mod config;
pub use sidecar_injector_engine as engine;
#[doc(hidden)]
pub mod fuzzing;
pub mod sandbox;
pub mod server;
pub mod state;
pub mod telemetry;
