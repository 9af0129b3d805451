//! sidecar-injector: a Kubernetes mutating admission webhook that injects sidecars, labels,
//! annotations, volumes and env into pods from templates kept in a ConfigMap.
//!
//! The crate is a pure core with a thin shell around it:
//! - [`engine`]: templates, selection, rendering, the injection plan and patch, validation. No IO.
//! - [`cli`]: the `inject`, `explain` and `check-templates` commands over files and stdin.

pub mod cli;
pub mod engine;
