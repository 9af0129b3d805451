//! The templates in service ([`TemplateSet`]): what the webhook, the CLI and the validating checks
//! share. [`TemplateSet::update`] keeps the last good version of a template whose new text is
//! broken, and the versions replaced lately, so that pods injected with them can still prove their
//! claims. Also where templates come from ([`TemplateSource`], the embedded defaults) and the
//! pre-check that may run new text out of process ([`PreCheck`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::model::yaml::SourceNode;
use crate::templates::compiler::content_hash;
use crate::templates::template::*;

/// A check that runs on new template text before it is compiled and test-rendered in this process.
///
/// Fuel and output caps bound what an expression *writes*, but MiniJinja's string operations (`~`,
/// `*`, `replace`, ...) can allocate without bound before anything is written, and Rust cannot
/// recover from running out of memory. The webhook therefore first test-renders new template text
/// in a child process with memory and CPU limits (`crate::sandbox`); a template that does not
/// survive there is never loaded, so a hostile or broken edit cannot crash every replica at once.
pub trait PreCheck {
    /// Errors for the sources that must not be loaded in this process.
    fn precheck(&self, sources: &[TemplateSource]) -> Vec<TemplateError>;
}

/// No pre-check: templates are loaded in this process directly (the CLI, tests).
pub struct InProcess;

impl PreCheck for InProcess {
    fn precheck(&self, _sources: &[TemplateSource]) -> Vec<TemplateError> {
        Vec::new()
    }
}

/// A named source of one template: where it came from (for messages) and its YAML text.
#[derive(Debug, Clone)]
pub struct TemplateSource {
    /// Template name.
    pub name: String,
    /// YAML text.
    pub text: String,
}

/// The templates in service, by name. Cheap to clone (templates are shared).
#[derive(Debug, Clone, Default)]
pub struct TemplateSet {
    templates: BTreeMap<String, Arc<Template>>,
    /// Versions replaced or removed by earlier updates, newest first, at most
    /// [`RETIRED_VERSIONS_KEPT`]: a pod injected with one of them can still prove which items are
    /// the injector's own (see `ownership`) and be re-injected cleanly after a template edit.
    retired: Vec<Arc<Template>>,
}

/// How many replaced template versions a [`TemplateSet`] remembers.
pub const RETIRED_VERSIONS_KEPT: usize = 32;

impl TemplateSet {
    /// Loads every source; returns the templates that loaded and the errors of those that did not.
    pub fn load(sources: impl IntoIterator<Item = TemplateSource>) -> (TemplateSet, Vec<TemplateError>) {
        TemplateSet::default().update(sources, &InProcess)
    }

    /// The set that results from replacing this one's templates by `sources`: templates absent from
    /// `sources` are dropped, a template whose new text fails (the `precheck` or loading) keeps its
    /// last good version (and its error is returned), templates that load are replaced. Unchanged
    /// templates are neither pre-checked nor recompiled.
    pub fn update(
        &self,
        sources: impl IntoIterator<Item = TemplateSource>,
        precheck: &dyn PreCheck,
    ) -> (TemplateSet, Vec<TemplateError>) {
        // Each source with the version in service when its text is unchanged (same content hash).
        let sources: Vec<(TemplateSource, Option<&Arc<Template>>)> = sources
            .into_iter()
            .map(|source| {
                let hash = hash_of_source(&source.text);
                let unchanged = self.templates.get(&source.name).filter(|t| hash.as_ref() == Some(&t.hash));
                (source, unchanged)
            })
            .collect();
        let changed: Vec<TemplateSource> =
            sources.iter().filter(|(_, u)| u.is_none()).map(|(s, _)| s.clone()).collect();
        let mut refused: BTreeMap<String, TemplateError> = match changed.is_empty() {
            true => BTreeMap::new(),
            false => precheck.precheck(&changed).into_iter().map(|e| (e.template.clone(), e)).collect(),
        };
        let mut templates = BTreeMap::new();
        let mut errors = Vec::new();
        for (source, unchanged) in sources {
            if templates.contains_key(&source.name) {
                errors.push(TemplateError {
                    template: source.name.clone(),
                    line: None,
                    message: "defined more than once; the first definition is used".into(),
                });
                continue;
            }
            let loaded = match (unchanged, refused.remove(&source.name)) {
                (Some(previous), _) => {
                    templates.insert(source.name, previous.clone());
                    continue;
                }
                (None, Some(error)) => Err(error),
                (None, None) => Template::load(&source.name, &source.text),
            };
            match loaded {
                Ok(template) => {
                    templates.insert(source.name, Arc::new(template));
                }
                Err(error) => {
                    if let Some(previous) = self.templates.get(&source.name) {
                        templates.insert(source.name, previous.clone());
                    }
                    errors.push(error);
                }
            }
        }
        let retired = self
            .templates
            .values()
            .filter(|old| templates.get(&*old.name).is_none_or(|new| new.hash != old.hash))
            .chain(&self.retired)
            .filter(|old| templates.get(&*old.name).is_none_or(|new| new.hash != old.hash))
            .take(RETIRED_VERSIONS_KEPT)
            .cloned()
            .collect();
        (TemplateSet { templates, retired }, errors)
    }

    /// The template of that name.
    pub fn get(&self, name: &str) -> Option<&Arc<Template>> {
        self.templates.get(name)
    }

    /// The template of that name with that content hash: the one in service, or a version that an
    /// earlier update replaced and this set still remembers.
    pub fn version(&self, name: &str, hash: &str) -> Option<&Arc<Template>> {
        self.templates.get(name).into_iter().chain(&self.retired).find(|t| &*t.name == name && t.hash == hash)
    }

    /// Templates in name order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Template>> {
        self.templates.values()
    }

    /// Template names in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.templates.keys().map(String::as_str)
    }

    /// Number of templates.
    pub fn len(&self) -> usize {
        self.templates.len()
    }

    /// Whether there are no templates.
    pub fn is_empty(&self) -> bool {
        self.templates.is_empty()
    }
}

/// The content hash a source would get, without compiling it (used to skip recompiling unchanged
/// templates on every ConfigMap event).
fn hash_of_source(text: &str) -> Option<String> {
    SourceNode::parse(text).ok().map(|root| content_hash(&root))
}

/// The default templates, from `templates/` at build time.
pub fn embedded_sources() -> Vec<TemplateSource> {
    include!(concat!(env!("OUT_DIR"), "/embedded_templates.rs"))
        .iter()
        .map(|(name, text)| TemplateSource { name: (*name).to_owned(), text: (*text).to_owned() })
        .collect()
}
