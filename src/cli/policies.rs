//! `sidecar-injector compile-policies`: the MutatingAdmissionPolicy and binding compiled from the
//! templates, as YAML to apply (or commit, for GitOps) — what the injector keeps in sync itself
//! when `cluster.injection_policy` is on.

use std::path::Path;

use super::{CliError, load_templates};
use crate::engine::ClusterFacts;
use crate::engine::emit::policy;

/// The policy and binding as two YAML documents, preceded by a comment per template the policy
/// leaves to the webhook (and why).
pub fn compile_policies(
    templates: Option<&Path>,
    cluster: ClusterFacts,
    injector_namespace: &str,
) -> Result<String, CliError> {
    let set = load_templates(templates)?;
    let compiled = policy::compile(&set, cluster.native_sidecars, &[injector_namespace.to_owned()]);
    let mut out = String::new();
    out.push_str(&format!(
        "# Compiled by sidecar-injector {}: {}\n",
        env!("CARGO_PKG_VERSION"),
        match compiled.compiled.is_empty() {
            true => "no template compiles; every pod is left to the webhook".to_owned(),
            false => format!("injects {}", compiled.compiled.join(", ")),
        }
    ));
    for (template, reason) in &compiled.webhook_only {
        out.push_str(&format!("# webhook-only: {template}: {reason}\n"));
    }
    for document in [&compiled.policy, &compiled.binding] {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(document).map_err(|e| CliError::one(e.to_string()))?);
    }
    Ok(out)
}
