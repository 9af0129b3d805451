//! The templates in service ([`TemplateSet`]): what the webhook, the CLI and the validating checks
//! share. [`TemplateSet::update`] keeps the last good version of a template whose new text is
//! broken, and the versions replaced lately, so that pods injected with them can still prove their
//! claims. Also where templates come from ([`TemplateSource`], the embedded defaults) and the
//! pre-check that may run new text out of process ([`PreCheck`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::model::yaml::SourceNode;
use crate::templates::compiler::content_hash;
use crate::templates::rollout::{self, Active, KEPT_PER_TEMPLATE, Kept, Pins, Subject, Why};
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
    /// The versions the kept ConfigMap holds (`rollout::Kept`), which pins may name.
    kept: Vec<Arc<Template>>,
    /// The rollouts under way, by template name.
    rollouts: BTreeMap<String, Active>,
    /// What the kept ConfigMap should hold for these rollouts (the shell writes it).
    kept_wanted: Kept,
    /// Templates with `rollout:` whose version in service before is not known, with why.
    rollout_notices: Vec<String>,
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
    /// templates are neither pre-checked nor recompiled. No version is kept for rollouts (see
    /// [`TemplateSet::update_with_kept`]).
    pub fn update(
        &self,
        sources: impl IntoIterator<Item = TemplateSource>,
        precheck: &dyn PreCheck,
    ) -> (TemplateSet, Vec<TemplateError>) {
        self.update_with_kept(sources, &Kept::default(), precheck)
    }

    /// [`TemplateSet::update`], with what the kept ConfigMap holds (`kept`): the versions rollouts
    /// roll from, their halts. The set says what that ConfigMap should hold next
    /// ([`TemplateSet::kept_wanted`]).
    pub fn update_with_kept(
        &self,
        sources: impl IntoIterator<Item = TemplateSource>,
        kept: &Kept,
        precheck: &dyn PreCheck,
    ) -> (TemplateSet, Vec<TemplateError>) {
        // Each source with the version in service when its text is unchanged (same content hash,
        // same `rollout:`).
        let sources: Vec<(TemplateSource, Option<&Arc<Template>>)> = sources
            .into_iter()
            .map(|source| {
                let identity = identity_of_source(&source.text);
                let unchanged = self.templates.get(&source.name).filter(|t| {
                    identity.as_ref().is_some_and(|(hash, rollout)| {
                        *hash == t.hash && identity_of_source(&t.source).is_some_and(|(_, r)| r == *rollout)
                    })
                });
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
        let (kept_versions, kept_errors) = self.load_kept(kept, precheck);
        errors.extend(kept_errors);
        let mut set = TemplateSet { templates, retired, kept: kept_versions, ..TemplateSet::default() };
        set.start_rollouts(self, kept);
        (set, errors)
    }

    /// The versions `kept` holds, compiled (those this set holds already are not compiled again);
    /// a text whose content hash is not the one its key says is refused.
    fn load_kept(&self, kept: &Kept, precheck: &dyn PreCheck) -> (Vec<Arc<Template>>, Vec<TemplateError>) {
        let mut versions = Vec::new();
        let mut to_load = Vec::new();
        let mut errors = Vec::new();
        for ((name, hash), text) in &kept.texts {
            if let Some(known) = self.kept.iter().chain(&self.retired).find(|t| *t.name == **name && t.hash == *hash) {
                versions.push(known.clone());
            } else if identity_of_source(text).is_some_and(|(h, _)| h == *hash) {
                to_load.push(TemplateSource { name: name.clone(), text: text.clone() });
            } else {
                errors.push(TemplateError {
                    template: name.clone(),
                    line: None,
                    message: format!(
                        "the version kept in {} as {hash} is not that version (its content hash differs): ignored",
                        crate::names::KEPT_CONFIGMAP
                    ),
                });
            }
        }
        // One pre-check each: versions of one template share its name, which is how the pre-check
        // names what it refuses.
        for source in to_load {
            let refused = precheck.precheck(std::slice::from_ref(&source)).into_iter().next();
            match refused.map_or_else(|| Template::load(&source.name, &source.text), Err) {
                Ok(template) => versions.push(Arc::new(template)),
                Err(error) => errors.push(TemplateError {
                    message: format!("the version kept in {}: {}", crate::names::KEPT_CONFIGMAP, error.message),
                    ..error
                }),
            }
        }
        (versions, errors)
    }

    /// The rollouts under way for the templates in service, and what the kept ConfigMap should
    /// hold for them. The version rolled from is, in this order: the one the kept record names
    /// (so every replica agrees, also one started since), the one `previous` rolled from, the
    /// version `previous` served in full. A replica never forgets a record another wrote: where it
    /// knows no version to roll from it leaves the record alone (and serves the version in service
    /// to every pod, with a notice); only a template without `rollout:` (promoted) clears its
    /// record's rollout.
    fn start_rollouts(&mut self, previous: &TemplateSet, kept: &Kept) {
        let mut wanted = kept.clone();
        for template in self.templates.values() {
            let name = &*template.name;
            let Some(spec) = &template.rollout else {
                if let Some(record) = wanted.records.get_mut(name) {
                    record.from = None;
                    record.halted = None;
                }
                continue;
            };
            let record = wanted.records.get(name).cloned().unwrap_or_default();
            let earlier = previous.templates.get(name).filter(|t| t.hash != template.hash);
            let from_hash = record
                .from
                .clone()
                .or_else(|| previous.rollouts.get(name).map(|a| a.from.hash.clone()))
                // Without a rollout under way (none, or one with nothing to roll from) the earlier
                // version served every pod.
                .or_else(|| earlier.map(|t| t.hash.clone()))
                .filter(|hash| *hash != template.hash);
            let from = from_hash.as_ref().and_then(|hash| {
                self.kept
                    .iter()
                    .chain(previous.templates.values())
                    .chain(previous.rollouts.values().map(|a| &a.from))
                    .chain(&self.retired)
                    .find(|t| *t.name == *name && t.hash == *hash)
                    .cloned()
            });
            let Some(from) = from else {
                self.rollout_notices.push(match from_hash {
                    Some(hash) => format!(
                        "template {name} has rollout:, but the version it rolls from ({hash}) is not kept: every pod gets version {}",
                        template.hash
                    ),
                    None => format!(
                        "template {name} has rollout:, but no version served before it is known (the injector did not see one since {} was written): every pod gets version {}",
                        crate::names::KEPT_CONFIGMAP,
                        template.hash
                    ),
                });
                continue;
            };
            let record = wanted.records.entry(name.to_owned()).or_default();
            record.from = Some(from.hash.clone());
            record.kept.retain(|hash| *hash != from.hash);
            record.kept.insert(0, from.hash.clone());
            record.kept.truncate(KEPT_PER_TEMPLATE);
            wanted.texts.insert((name.to_owned(), from.hash.clone()), from.source.to_string());
            let halted = record.halted.clone().filter(|halt| halt.version == template.hash);
            self.rollouts.insert(name.to_owned(), Active { spec: spec.clone(), from, halted });
        }
        // Only what the records list is kept: at most `KEPT_PER_TEMPLATE` per template.
        let listed =
            |name: &str, hash: &str| wanted.records.get(name).is_some_and(|r| r.kept.iter().any(|h| h == hash));
        let texts = std::mem::take(&mut wanted.texts);
        wanted.texts = texts.into_iter().filter(|((name, hash), _)| listed(name, hash)).collect();
        wanted.records.retain(|_, record| *record != rollout::Record::default());
        for (name, hash) in wanted.fit(rollout::KEPT_BYTES) {
            self.rollout_notices.push(format!(
                "version {hash} of template {name} is no longer kept: {} would weigh more than {} KiB (a pin to it is refused)",
                crate::names::KEPT_CONFIGMAP,
                rollout::KEPT_BYTES / 1024
            ));
        }
        if wanted.weight() > rollout::KEPT_BYTES {
            self.rollout_notices.push(format!(
                "the versions rollouts roll from weigh {} KiB, more than {} can hold ({} KiB): the API server refuses the write, and a replica started later does not know them (roll out fewer large templates at once)",
                wanted.weight() / 1024,
                crate::names::KEPT_CONFIGMAP,
                rollout::KEPT_BYTES / 1024
            ));
        }
        self.kept.retain(|t| wanted.texts.contains_key(&(t.name.to_string(), t.hash.clone())));
        self.kept_wanted = wanted;
    }

    /// What the kept ConfigMap should hold (the shell writes what differs).
    pub fn kept_wanted(&self) -> &Kept {
        &self.kept_wanted
    }

    /// Templates with `rollout:` that serve every pod because the version before is not known.
    pub fn rollout_notices(&self) -> &[String] {
        &self.rollout_notices
    }

    /// The rollout under way for a template.
    pub fn rollout(&self, name: &str) -> Option<&Active> {
        self.rollouts.get(name)
    }

    /// Whether any rollout is under way.
    pub fn has_rollouts(&self) -> bool {
        !self.rollouts.is_empty()
    }

    /// The rollouts under way, by template name.
    pub fn rollouts(&self) -> impl Iterator<Item = (&str, &Active)> {
        self.rollouts.iter().map(|(name, active)| (name.as_str(), active))
    }

    /// The versions of template `name` a pod may have and still be what the injector gives: the
    /// one in service, and while a rollout is under way (halted too: pods of either exist) the
    /// one it rolls from. What the enforcement policy admits (`Requirements::common`); an enforced
    /// template's pins may name only these.
    pub fn versions_in_service(&self, name: &str) -> Vec<&Arc<Template>> {
        self.templates.get(name).into_iter().chain(self.rollouts.get(name).map(|a| &a.from)).collect()
    }

    /// The versions of a template that the kept ConfigMap holds, newest first.
    pub fn kept_versions(&self, name: &str) -> Vec<&Arc<Template>> {
        let order = self.kept_wanted.records.get(name).map(|r| r.kept.as_slice()).unwrap_or_default();
        order.iter().filter_map(|hash| self.kept.iter().find(|t| *t.name == *name && t.hash == *hash)).collect()
    }

    /// The version of template `name` a pod gets (`rollout::choose`), and why; `None` where no
    /// template has that name, an error where a pin names a version that is not kept.
    pub fn for_pod(&self, name: &str, subject: Subject<'_>) -> Option<Result<(&Arc<Template>, Why), String>> {
        let current = self.templates.get(name)?;
        let kept: Vec<Arc<Template>> = self.kept_versions(name).into_iter().cloned().collect();
        // `choose` borrows from the set; the kept versions are the set's own `Arc`s.
        Some(rollout::choose(current, self.rollouts.get(name), &kept, subject).map(|(chosen, why)| {
            let own = std::iter::once(current)
                .chain(self.rollouts.get(name).map(|a| &a.from))
                .chain(&self.kept)
                .find(|t| t.hash == chosen.hash && *t.name == *name)
                .unwrap_or(current);
            (own, why)
        }))
    }

    /// Whether version `hash` of template `name` is one some new pod may get: the version in
    /// service (where a rollout under way reaches anyone), the version a rollout rolls from, or
    /// the version `pins` name. A pod injected with one is not drifted, and `/validate` compares
    /// it with its version.
    pub fn serves(&self, name: &str, hash: &str, pins: &Pins) -> bool {
        let Some(current) = self.templates.get(name) else { return false };
        let pinned = pins.get(name).is_some_and(|(pin, _)| hash.starts_with(pin) && self.version(name, hash).is_some());
        pinned
            || match self.rollouts.get(name) {
                None => current.hash == hash,
                Some(active) => active.from.hash == hash || (active.reaches_anyone() && current.hash == hash),
            }
    }

    /// The version a pod outside any rollout's reach gets (for messages): the version rolled from
    /// while a rollout under way reaches nobody, else the version in service.
    pub fn default_version(&self, name: &str) -> Option<&Arc<Template>> {
        match self.rollouts.get(name) {
            Some(active) if !active.reaches_anyone() => Some(&active.from),
            _ => self.templates.get(name),
        }
    }

    /// The template of that name.
    pub fn get(&self, name: &str) -> Option<&Arc<Template>> {
        self.templates.get(name)
    }

    /// The template of that name with that content hash: the one in service, or a version that an
    /// earlier update replaced and this set still remembers.
    pub fn version(&self, name: &str, hash: &str) -> Option<&Arc<Template>> {
        self.templates
            .get(name)
            .into_iter()
            .chain(self.rollouts.get(name).map(|a| &a.from))
            .chain(&self.kept)
            .chain(&self.retired)
            .find(|t| &*t.name == name && t.hash == hash)
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

/// The content hash a source would get and its `rollout:` (which the hash leaves out), without
/// compiling it: used to skip recompiling unchanged templates on every ConfigMap event.
fn identity_of_source(text: &str) -> Option<(String, Value)> {
    let root = SourceNode::parse(text).ok()?;
    let rollout = root.to_json().get("rollout").cloned().unwrap_or(Value::Null);
    Some((content_hash(&root), rollout))
}

/// The default templates, from `templates/` at build time.
pub fn embedded_sources() -> Vec<TemplateSource> {
    include!(concat!(env!("OUT_DIR"), "/embedded_templates.rs"))
        .iter()
        .map(|(name, text)| TemplateSource { name: (*name).to_owned(), text: (*text).to_owned() })
        .collect()
}
