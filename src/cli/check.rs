//! `sidecar-injector check-templates`: the checks that guard template ConfigMaps at admission, run
//! on files.

use std::path::Path;

use super::{CliError, template_sources_from};
use crate::engine::TemplateSet;
use crate::engine::checks::pod_security::{self, Level};
use crate::engine::emit::policy;
use crate::engine::templates::template::SidecarMode;

/// Loads every template under `path`; returns a summary line per template, or every error.
pub fn check_templates(path: &Path) -> Result<String, CliError> {
    let kept = match path.is_dir() {
        true => super::kept_from(&path.join("kept"))?,
        false => Default::default(),
    };
    let (set, errors) = TemplateSet::default().update_with_kept(
        template_sources_from(path)?,
        &kept,
        &crate::engine::templates::set::InProcess,
    );
    if !errors.is_empty() {
        return Err(errors.into());
    }
    let summary = set.iter().map(|t| {
        format!("ok  {} ({}{}, hash {})\n", t.name, if t.default { "default, " } else { "" }, t.description, t.hash)
    });
    // Each names its template (those found while compiling already do, with the line).
    let warnings = set.iter().flat_map(|t| {
        t.warnings.iter().map(|w| match w.starts_with("template \"") {
            true => format!("warning: {w}\n"),
            false => format!("warning: template {:?}: {w}\n", &*t.name),
        })
    });
    // Which rule decides `sidecarMode: auto` (`engine::injection::nodes`).
    let auto = set
        .iter()
        .filter(|t| t.sidecar_mode == SidecarMode::Auto && t.has_sidecars())
        .map(|t| format!("sidecar mode: {}: {}\n", t.name, crate::engine::model::native::AUTO_RULE));
    // Which rule decides the form of image volumes with a fallback (`engine::injection::image_volumes`).
    let image_volumes = set
        .iter()
        .filter(|t| t.has_volume_fallbacks())
        .map(|t| format!("image volumes: {}: {}\n", t.name, crate::engine::injection::image_volumes::RULE));
    // The policy mode (`compile-policies`): which templates the API server can inject itself.
    let policy = set.iter().filter_map(|t| {
        policy::webhook_only_reason(t, true).map(|reason| format!("webhook-only: {}: {reason}\n", t.name))
    });
    // The Pod Security level what each template adds meets on its own (`engine::checks::pod_security`).
    let pod_security = set.iter().filter(|t| t.has_containers()).filter_map(|t| {
        let (level, next) = pod_security::of_additions(&t.sample_rendering()?);
        let why = next.iter().map(|v| format!("{} ({})", v.reason, v.detail)).collect::<Vec<_>>().join(", ");
        Some(match level {
            Level::Restricted => format!("pod security: {}: restricted\n", t.name),
            Level::Baseline => format!("pod security: {}: baseline (restricted refuses: {why})\n", t.name),
            Level::Privileged => format!("pod security: {}: privileged (baseline refuses: {why})\n", t.name),
        })
    });
    // Rollouts (`engine::templates::rollout`): who gets which version, from the directory's `kept/`.
    let rollouts = set.iter().filter_map(|t| {
        let spec = t.rollout.as_ref()?;
        let who = match &spec.selector {
            Some(selector) => format!("{}% of workloads and those whose pods match {}", spec.share, selector.text),
            None => format!("{}% of workloads", spec.share),
        };
        let halt = format!(
            "halts after {} failed pods (restarts >= {}, or unready for {} s)",
            spec.halt.failed_pods, spec.halt.restarts, spec.halt.unready_seconds
        );
        Some(match set.rollout(&t.name) {
            Some(active) => match &active.halted {
                Some(h) => format!(
                    "rollout: {}: {} HALTED at {} ({}): every pod gets {}\n",
                    t.name, t.hash, h.at, h.reason, active.from.hash
                ),
                None => {
                    format!("rollout: {}: {} to {who}, the others keep {}; {halt}\n", t.name, t.hash, active.from.hash)
                }
            },
            None => format!(
                "rollout: {}: no version before it is kept (kept/ of this directory): every pod gets {}\n",
                t.name, t.hash
            ),
        })
    });
    Ok(summary
        .chain(warnings)
        .chain(auto)
        .chain(image_volumes)
        .chain(policy)
        .chain(pod_security)
        .chain(rollouts)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_that_needs_a_pod_name_fails_naming_the_controller_shape() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ok.yaml"), "inject:\n  labels:\n    owner: \"{{ workload.name }}\"\n").unwrap();
        std::fs::write(dir.path().join("named.yaml"), "inject:\n  labels:\n    owner: \"{{ pod.metadata.name }}\"\n")
            .unwrap();
        let errors = check_templates(dir.path()).unwrap_err().to_string();
        assert!(
            errors.contains("template \"named\" line 3: undefined value in \"{{ pod.metadata.name }}\"")
                && errors.contains("a pod a controller creates"),
            "{errors}"
        );
        std::fs::remove_file(dir.path().join("named.yaml")).unwrap();
        assert!(check_templates(dir.path()).unwrap().starts_with("ok  ok"));
    }

    #[test]
    fn image_volumes_are_warned_about_without_a_fallback_and_their_rule_is_printed_with_one() {
        let dir = tempfile::tempdir().unwrap();
        let volume = |fallback: &str| {
            format!(
                "inject:\n  volumes:\n    - name: agent\n      image: {{reference: \"agent:2\"}}\n{fallback}  appContainers:\n    volumeMounts: [{{name: agent, mountPath: /opt/agent}}]\n"
            )
        };
        std::fs::write(dir.path().join("bare.yaml"), volume("")).unwrap();
        std::fs::write(
            dir.path().join("copied.yaml"),
            volume("      fallback:\n        initContainer: {name: copy, image: \"agent:2\", volumeMounts: [{name: agent, mountPath: /c}]}\n"),
        )
        .unwrap();
        let out = check_templates(dir.path()).unwrap();
        assert!(
            out.contains("warning: template \"bare\": volume \"agent\" is an image volume without a fallback"),
            "{out}"
        );
        assert!(!out.contains("warning: template \"copied\""), "{out}");
        assert!(out.contains("image volumes: copied: an image volume with a fallback is mounted"), "{out}");
        assert!(out.contains("webhook-only: copied: an image volume declares a fallback"), "{out}");
    }

    #[test]
    fn an_unconstrained_override_inside_a_config_language_argument_is_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let template = |overridable: &str| {
            format!(
                "values: {{endpoint: \"gw:4317\"}}\noverridable: {overridable}\ninject:\n  sidecars:\n    - name: agent\n      image: agent\n      args: [\"--config=yaml:exporters::otlp::endpoint: {{{{ values.endpoint }}}}\"]\n      resources: {{requests: {{cpu: 1m, memory: 1Mi}}, limits: {{cpu: 1m, memory: 1Mi}}}}\n"
            )
        };
        std::fs::write(dir.path().join("agent.yaml"), template("[endpoint]")).unwrap();
        let out = check_templates(dir.path()).unwrap();
        assert!(
            out.contains(
                "warning: template \"agent\" line 7: overridable value endpoint lands in a configuration-language"
            ),
            "{out}"
        );
        std::fs::write(dir.path().join("agent.yaml"), template("[{name: endpoint, pattern: \"[a-z.-]+:[0-9]+\"}]"))
            .unwrap();
        assert!(!check_templates(dir.path()).unwrap().contains("warning"), "a pattern settles it");
        // The shipped templates carry no such warning.
        let shipped = check_templates(Path::new("templates")).unwrap();
        assert!(!shipped.contains("warning"), "{shipped}");
        // Every shipped template compiles into the policy mode.
        assert!(!shipped.contains("webhook-only"), "{shipped}");
    }

    #[test]
    fn each_template_says_the_pod_security_level_of_what_it_adds() {
        let shipped = check_templates(Path::new("templates")).unwrap();
        // The proxy's traffic-redirect init container needs NET_ADMIN and NET_RAW.
        assert!(
            shipped.contains("pod security: proxy: privileged (baseline refuses: non-default capabilities (container \"proxy-init\" must not include \"NET_ADMIN\", \"NET_RAW\" in securityContext.capabilities.add))"),
            "{shipped}"
        );
        let dir = tempfile::tempdir().unwrap();
        let hardened = "inject:\n  sidecars:\n    - name: agent\n      image: agent\n      resources: {requests: {cpu: 1m, memory: 1Mi}, limits: {cpu: 1m, memory: 1Mi}}\n      securityContext: {runAsNonRoot: true, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}, seccompProfile: {type: RuntimeDefault}}\n";
        std::fs::write(dir.path().join("agent.yaml"), hardened).unwrap();
        assert!(check_templates(dir.path()).unwrap().contains("pod security: agent: restricted\n"));
        let labels = "labels: {team: a}\n";
        std::fs::write(dir.path().join("agent.yaml"), format!("inject:\n  {labels}")).unwrap();
        assert!(!check_templates(dir.path()).unwrap().contains("pod security"), "no containers, no level");
    }

    #[test]
    fn a_rollout_says_who_gets_which_version_from_the_directorys_kept_versions() {
        let golden =
            Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/crates/engine/tests/golden/cases/rollout/templates"));
        let text = check_templates(golden).unwrap();
        assert!(
            text.contains("rollout: agent: 47d25d3f592a9611 to 25% of workloads and those whose pods match rollout=canary, the others keep 1f456f3191b145b3; halts after 2 failed pods (restarts >= 3, or unready for 300 s)"),
            "{text}"
        );
        assert!(text.contains("webhook-only: agent: a new version rolls out (rollout:)"), "{text}");
        let alone = tempfile::tempdir().unwrap();
        std::fs::copy(golden.join("agent.yaml"), alone.path().join("agent.yaml")).unwrap();
        let text = check_templates(alone.path()).unwrap();
        assert!(text.contains("rollout: agent: no version before it is kept"), "{text}");
    }
}
