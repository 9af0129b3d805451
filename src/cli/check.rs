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
