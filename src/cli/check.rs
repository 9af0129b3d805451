//! `sidecar-injector check-templates`: the checks that guard template ConfigMaps at admission, run
//! on files.

use std::path::Path;

use super::{CliError, template_sources_from};
use crate::engine::TemplateSet;

/// Loads every template under `path`; returns a summary line per template, or every error.
pub fn check_templates(path: &Path) -> Result<String, CliError> {
    let (set, errors) = TemplateSet::load(template_sources_from(path)?);
    if !errors.is_empty() {
        return Err(errors.into());
    }
    Ok(set
        .iter()
        .map(|t| {
            format!("ok  {} ({}{}, hash {})\n", t.name, if t.default { "default, " } else { "" }, t.description, t.hash)
        })
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
}
