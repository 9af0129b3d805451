//! The pure core: templates, selection, rendering, the injection plan and its patch, and the
//! post-mutation validation. No IO, no async, no clock: everything here is a function of its inputs,
//! so the webhook, the CLI (`inject`, `explain`, `check-templates`) and the validating checks all
//! call the same code and can never disagree.
//!
//! Entry point: [`Engine::evaluate`] takes a pod and the facts about its namespace and cluster and
//! returns a [`Decision`]: out of scope, already up to date, a patch to apply, or a denial.
//!
//! The modules are layers, each using only itself and those below: the shared words, `model`
//! (the vocabulary), `templates`, `injection`, `claims`, `emit`, `checks`, this decision, and its
//! callers `drift`, `review` and `offline` (`tests/layout.rs` holds the order and checks it).
//!
//! This crate depends on no async runtime, HTTP server or Kubernetes client, so its tests
//! (`cargo test -p sidecar-injector-engine`: unit tests, the upgrade fixture and the properties)
//! build without the server's dependencies.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod checks;
pub mod claims;
pub mod drift;
pub mod emit;
pub mod facts;
pub mod findings;
pub mod injection;
pub mod lean;
pub mod manifest;
pub mod model;
pub mod names;
pub mod offline;
pub mod pod;
pub mod quantity;
pub mod review;
pub mod templates;
pub mod workload;

#[cfg(test)]
mod rollout_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use serde_json::Value;

pub use facts::{ClusterFacts, NamespaceFacts};
pub use findings::{Warning, WarningCode};
use injection::image_volumes::VolumeForms;
pub use injection::plan::{Injection, PlannedTemplate};
pub use injection::render::{RenderError, RenderedTemplate};
pub use injection::select::{Choice, ChoiceSource, OutOfScope, TemplateVerdict};
pub use model::status::InjectionStatus;
pub use pod::PodShapeError;
pub use templates::set::{TemplateSet, TemplateSource};
pub use templates::template::{Template, TemplateError};

/// The injection engine: the templates in service plus the namespaces it never touches.
#[derive(Debug, Clone, Default)]
pub struct Engine {
    /// Templates in service.
    pub templates: TemplateSet,
    /// Namespaces excluded besides kube-system, kube-public and kube-node-lease (normally the
    /// injector's own).
    pub excluded_namespaces: Vec<String>,
}

/// One pod to decide about.
#[derive(Debug, Clone)]
pub struct PodRequest {
    /// The pod as submitted (raw JSON, so unknown fields survive).
    pub pod: Arc<Value>,
    /// Its namespace.
    pub namespace: NamespaceFacts,
    /// The cluster.
    pub cluster: ClusterFacts,
    /// The workload the pod belongs to, when the caller knows better than the pod's own metadata
    /// (the CLI, for a Deployment's pod template); `None`: derived from the pod.
    pub workload: Option<workload::Workload>,
}

/// What the engine decided for a pod.
#[derive(Debug, Clone)]
pub struct Decision {
    /// Which templates were considered and why each was or was not chosen (absent when the pod is
    /// out of scope or malformed).
    pub choice: Option<Choice>,
    /// The outcome.
    pub outcome: Outcome,
    /// Things the user should know that do not stop the injection (ignored overrides, an
    /// unreadable previous status), each with its code.
    pub warnings: Vec<Warning>,
    /// Templates marked `enforced: audit` that `enforced: true` would have made refuse this pod,
    /// or inject into it against its annotations (each also explained in `warnings`).
    pub audited: Vec<String>,
}

/// The outcome of [`Engine::evaluate`].
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Not considered for injection.
    OutOfScope(OutOfScope),
    /// The pod already has exactly the injection it would get: its status annotation names the
    /// current template versions, and every item it names is really there, holding every field
    /// its template sets (see `ownership`).
    UpToDate(InjectionStatus),
    /// Apply this patch. The status may list no templates (nothing matched); the patch then only
    /// writes the status annotation, which says why.
    Inject(Injection),
    /// Refuse the pod, with a message for its author.
    Denied(Denial),
}

/// Why a pod is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denial {
    /// The pod's JSON is malformed.
    Shape(PodShapeError),
    /// An annotation names templates that do not exist.
    UnknownTemplates {
        /// The missing names.
        missing: Vec<String>,
        /// What exists.
        known: Vec<String>,
        /// Which annotation named them.
        source: ChoiceSource,
    },
    /// A template failed to render for this pod, or an override annotation is invalid.
    Render(RenderError),
    /// The status annotation names the current template versions, but items it names were
    /// changed since (by a later mutating webhook, or by hand in a copied pod): neither keeping
    /// them as injected nor reclassifying them as the pod's own would tell the truth.
    Altered(Vec<String>),
    /// An enforced template cannot be applied as written: the pod (or a template injected before
    /// it) has items of the same names that are not the template's.
    Enforced {
        /// The template.
        template: String,
        /// Each conflict, as a sentence.
        conflicts: Vec<String>,
    },
    /// The namespace could not be read (neither the watched cache nor a direct lookup answered),
    /// and templates would be injected, or choose by its labels: refused rather than decided on
    /// unknown labels and annotations, for the pod's controller to retry.
    NamespaceUnavailable {
        /// The namespace.
        namespace: String,
        /// Why it could not be read.
        reason: String,
        /// The templates that would be injected or whose namespaceSelector could not be judged.
        templates: Vec<String>,
    },
    /// A `sidecar-injector.io/pins` annotation is malformed, or pins a version that is not kept.
    Pin(String),
    /// An enforced template's injection would make a pod the API server refuses.
    WouldBeInvalid {
        /// The enforced template.
        template: String,
        /// What the API server would say.
        reasons: Vec<String>,
    },
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::Shape(e) => write!(f, "sidecar-injector: the pod is malformed: {e}"),
            Denial::UnknownTemplates { missing, known, source } => write!(
                f,
                "sidecar-injector: {} on the {} names unknown template(s) {}; known templates: {}",
                names::TEMPLATES_ANNOTATION,
                if *source == ChoiceSource::PodAnnotation { "pod" } else { "namespace" },
                missing.join(", "),
                if known.is_empty() { "none".to_owned() } else { known.join(", ") }
            ),
            Denial::Render(e) => write!(f, "sidecar-injector: cannot inject: {e}"),
            Denial::NamespaceUnavailable { namespace, reason, templates } => write!(
                f,
                "sidecar-injector: the labels of namespace {namespace} could not be read ({reason}), and they and its annotations decide template(s) {}: the pod is refused rather than injected on unknown labels; creating it again in a moment will work once the injector can read the namespace",
                templates.join(", ")
            ),
            Denial::Altered(changes) => write!(
                f,
                "sidecar-injector: the pod's {} annotation says it was injected with the current templates, but {}; if another mutating webhook changes the injected containers, exclude them there; to inject a copied pod afresh, remove the annotation",
                names::STATUS_ANNOTATION,
                changes.join("; ")
            ),
            Denial::Pin(message) => write!(f, "sidecar-injector: {message}"),
            Denial::WouldBeInvalid { template, reasons } => write!(
                f,
                "sidecar-injector: template {template} is enforced for this pod, but the API server would refuse the pod with it: {}",
                reasons.join("; ")
            ),
            Denial::Enforced { template, conflicts } => write!(
                f,
                "sidecar-injector: template {template} is enforced for this pod, so the pod cannot replace or skip what it injects: {}. Remove these items from the pod and let the injector add them (if another mutating webhook changes them, exclude the injector's containers there); only the cluster operator can exempt pods, through the template's podSelector and namespaceSelector",
                conflicts.join("; ")
            ),
        }
    }
}

/// Every rendering one decision makes, each made once. A decision reads a template version for
/// the pod (or the pod without its claimed items) at several steps: the claim's check, the stand-in
/// and rebuilt versions, the resized containers carried over, the injection itself and the
/// enforcement checks after it. Each step asks this store, which renders only what no earlier step
/// rendered for the same version, pod and image volume forms (a rendering with no image volume is
/// the same in every form). Versions are told apart by their content hash, pods by identity.
struct Renderings<'r> {
    request: &'r PodRequest,
    owner: workload::Workload,
    mask_pod_reads: bool,
    made: Vec<Made>,
    /// How many renderings were made (the tests count them).
    renders: usize,
}

/// One rendering kept by [`Renderings`].
struct Made {
    name: Arc<str>,
    hash: String,
    pod: Arc<Value>,
    /// The forms asked for: `None` for the nodes' (fixed for a decision), else those recorded.
    forms: Option<Vec<String>>,
    rendered: Result<Rc<RenderedTemplate>, RenderError>,
}

impl Made {
    fn is_for(&self, template: &Template, pod: &Arc<Value>, forms: VolumeForms<'_>) -> bool {
        let same_forms = match (&self.rendered, forms, &self.forms) {
            // Image volume forms change only the image volumes: a rendering without any, or one
            // that failed before they were chosen, is the same in every form.
            (Ok(rendered), _, _) if rendered.volume_forms.is_empty() => true,
            (Err(_), _, _) => true,
            (Ok(_), VolumeForms::Nodes(_), None) => true,
            (Ok(_), VolumeForms::Recorded(asked), Some(made)) => asked == made.as_slice(),
            _ => false,
        };
        same_forms && self.name == template.name && self.hash == template.hash && Arc::ptr_eq(&self.pod, pod)
    }
}

impl<'r> Renderings<'r> {
    fn new(request: &'r PodRequest, mask_pod_reads: bool) -> Self {
        let owner = request.workload.clone().unwrap_or_else(|| workload::Workload::of_pod(&request.pod));
        Renderings { request, owner, mask_pod_reads, made: Vec::new(), renders: 0 }
    }

    /// Renders without keeping (the evaluation's namespace, workload and masking fixed); the
    /// annotations are `pod`'s, computed once per pod by the caller, not once per template.
    fn render_now(
        &mut self,
        template: &Template,
        pod: &Arc<Value>,
        annotations: &BTreeMap<String, String>,
        forms: VolumeForms<'_>,
    ) -> Result<RenderedTemplate, RenderError> {
        self.renders += 1;
        let subject =
            injection::render::Subject { pod: injection::render::pod_value(pod.clone()), workload: &self.owner };
        let namespace = &self.request.namespace;
        match self.mask_pod_reads {
            true => injection::render::render_masked(template, &subject, annotations, namespace, forms),
            false => injection::render::render(template, &subject, annotations, namespace, forms),
        }
    }

    /// The rendering of `template` for `pod` (whose annotations are `annotations`) in `forms`,
    /// made now or by an earlier step, and kept for the later ones.
    fn get(
        &mut self,
        template: &Template,
        pod: &Arc<Value>,
        annotations: &BTreeMap<String, String>,
        forms: VolumeForms<'_>,
    ) -> Result<Rc<RenderedTemplate>, RenderError> {
        if let Some(made) = self.made.iter().find(|made| made.is_for(template, pod, forms)) {
            return made.rendered.clone();
        }
        let rendered = self.render_now(template, pod, annotations, forms).map(Rc::new);
        self.made.push(Made {
            name: template.name.clone(),
            hash: template.hash.clone(),
            pod: pod.clone(),
            forms: match forms {
                VolumeForms::Nodes(_) => None,
                VolumeForms::Recorded(recorded) => Some(recorded.to_vec()),
            },
            rendered: rendered.clone(),
        });
        rendered
    }

    /// The same rendering, owned by the caller (which changes it): taken out of the store, or
    /// rendered now without keeping where no step made it.
    fn take(
        &mut self,
        template: &Template,
        pod: &Arc<Value>,
        annotations: &BTreeMap<String, String>,
        forms: VolumeForms<'_>,
    ) -> Result<RenderedTemplate, RenderError> {
        match self.made.iter().position(|made| made.is_for(template, pod, forms)) {
            Some(index) => self.made.swap_remove(index).rendered.map(Self::unshared),
            None => self.render_now(template, pod, annotations, forms),
        }
    }

    /// A kept rendering, owned by the caller and no longer kept.
    fn own(&mut self, rendered: Rc<RenderedTemplate>) -> RenderedTemplate {
        self.made.retain(|made| !matches!(&made.rendered, Ok(kept) if Rc::ptr_eq(kept, &rendered)));
        Self::unshared(rendered)
    }

    fn unshared(rendered: Rc<RenderedTemplate>) -> RenderedTemplate {
        Rc::try_unwrap(rendered).unwrap_or_else(|shared| (*shared).clone())
    }
}

/// What a pod's status annotation proves, read before anything is planned (`Engine::check_claim`):
/// the data the decision's one planning step (`Engine::plan_decision`) chooses its alternative from.
struct Claimed {
    /// The status annotation as the pod has it.
    claim: InjectionStatus,
    /// The pod without the claimed items, which the claimed versions are rendered for.
    base: Arc<Value>,
    /// `base`'s annotations, read once.
    base_annotations: BTreeMap<String, String>,
    /// Which claimed items are present, provably the injector's, doubted or resized.
    assessed: claims::ownership::Ownership,
    /// The first alternative, where the claim names the versions in service and each rendered for
    /// `base`: those renderings (one per selected template, in order), planned with the present
    /// items kept where they are.
    keep: Option<Vec<Rc<RenderedTemplate>>>,
}

/// The other alternative: a fresh injection, which may remove only `owned` (the provably injected
/// items), rendered for `base` (the pod without them, whose annotations are `base_annotations`);
/// the containers named in `carried` keep the pod's `resources` (resized in place since their
/// injection; `None`: it has none). Without a claim, it removes nothing from the pod as submitted.
struct Replacement {
    owned: InjectionStatus,
    base: Arc<Value>,
    base_annotations: BTreeMap<String, String>,
    carried: BTreeMap<String, Option<Value>>,
}

impl Engine {
    /// Reads a pod's status annotation against what the claimed template versions render for the
    /// pod without the claimed items. Nothing is planned here: the claim is refused where its
    /// items changed since a current injection (or an enforced template's are not exactly its
    /// own), else what it proves is returned for the planning step.
    fn check_claim(
        &self,
        pod: &Value,
        claim: InjectionStatus,
        selected: &[&Arc<Template>],
        store: &mut Renderings<'_>,
    ) -> Result<Claimed, Denial> {
        let base = Arc::new(claims::strip::strip_injection(pod, &claim));
        let base_annotations = pod::string_map(&base, "annotations").unwrap_or_default();
        // What was injected is re-rendered in the forms it was given, whatever the nodes say now.
        let as_claimed = VolumeForms::Recorded(&claim.image_volumes);
        let mut render = |template: &Template| store.get(template, &base, &base_annotations, as_claimed).ok();
        let mut renderings: Vec<Option<Rc<RenderedTemplate>>> = Vec::with_capacity(claim.templates.len());
        for (claimed, first) in claim.templates.iter().zip(claims::versions::first_of_each_name(&claim)) {
            let version =
                first.then(|| claims::versions::claimed_version(&self.templates, claimed, pod, &claim, &mut render));
            renderings.push(version.flatten().and_then(|template| render(&template)));
        }
        let stood_in = stand_in_for_gone_versions(pod, &claim, selected, &mut renderings, &mut render);
        let assessed = stood_in.unwrap_or_else(|| {
            let renderings: Vec<Option<&RenderedTemplate>> = renderings.iter().map(Option::as_deref).collect();
            claims::ownership::assess(pod, &claim, &renderings, claims::ownership::Moment::Admission)
        });
        let current = assessed.present.is_current(selected.iter().map(|t| (&*t.name, t.hash.as_str())));
        if current && !assessed.altered.is_empty() {
            return Err(Denial::Altered(assessed.altered));
        }
        if current {
            // An enforced template's items count as injected only when exactly the template's.
            let enforced = claim.templates.iter().zip(&renderings).find_map(|(claimed, rendered)| {
                let rendered = rendered.as_ref()?;
                // The version in service where it stood in for the claimed one.
                let version = || selected.iter().copied().find(|t| *t.name == claimed.name && t.hash == rendered.hash);
                let template = self.templates.version(&claimed.name, &claimed.hash).or_else(version);
                let template = template.filter(|t| t.enforced)?;
                let conflicts = checks::enforce::inexact_items(&assessed.present, &assessed.owned, rendered);
                (!conflicts.is_empty()).then(|| Denial::Enforced { template: template.name.to_string(), conflicts })
            });
            if let Some(denial) = enforced {
                return Err(denial);
            }
        }
        // Same versions, each rendered: the items that hold may stay where they are.
        let keep = current.then(|| renderings.into_iter().take(selected.len()).collect::<Option<Vec<_>>>());
        let keep = keep.flatten().filter(|kept| kept.len() == selected.len());
        Ok(Claimed { claim, base, base_annotations, assessed, keep })
    }

    /// The first alternative of a claim of the versions in service: the present items stay where
    /// they are and anything missing is added (up to date when that adds nothing; refused, or
    /// admitted as written, where the API server would refuse the result). `None` where the plan
    /// fails or says otherwise: the claim puts items where the templates do not, or keeping them
    /// breaks the namespace's Pod Security level where the pod without them passes (the
    /// injection is then decided afresh, which leaves out the templates that break it).
    fn keep_in_place(
        &self,
        claimed: &Claimed,
        kept: Vec<Rc<RenderedTemplate>>,
        selected: &[&Arc<Template>],
        choice: &Choice,
        store: &mut Renderings<'_>,
        warnings: &mut Vec<Warning>,
    ) -> Option<Outcome> {
        let Claimed { claim, base, assessed, .. } = claimed;
        let cluster = store.request.cluster;
        let planned: Vec<PlannedTemplate> = kept
            .into_iter()
            .zip(selected)
            .map(|(rendered, t)| planned_template(t, store.own(rendered), cluster))
            .collect();
        let reason = planned.is_empty().then(|| choice.summary_of_none());
        let guard = PodSecurityGuard::of(store.request, base);
        let breaks = |injection: &Injection| guard.as_ref().is_some_and(|g| g.refusal(injection).is_some());
        let pod = &*store.request.pod;
        match injection::plan::plan(pod, injection::plan::Earlier::Keep(&assessed.present), planned, reason) {
            Ok(fresh) if !fresh.invalid.is_empty() => Some(refuse_or_admit(pod, None, fresh, selected, warnings)),
            Ok(fresh) if breaks(&fresh) => None,
            Ok(fresh) if fresh.status == *claim && assessed.all_present => Some(Outcome::UpToDate(fresh.status)),
            Ok(fresh) if claims::ownership::includes_items_of(&fresh.status, &assessed.present) => {
                warnings.extend(doubted(assessed.doubts.iter().cloned()));
                warnings.extend(fresh.warnings.iter().cloned());
                Some(Outcome::Inject(fresh))
            }
            _ => None,
        }
    }

    /// The other alternative for a claimed pod: what the replacement may remove (the items the
    /// claim proves, with the resized containers it can carry over) and the pod it renders for.
    fn replacement(
        &self,
        claimed: Claimed,
        selected: &[&Arc<Template>],
        store: &mut Renderings<'_>,
        warnings: &mut Vec<Warning>,
    ) -> Replacement {
        let Claimed { claim, base, base_annotations, assessed, .. } = claimed;
        warnings.extend(doubted(assessed.doubts.iter().cloned()));
        let (owned, carried) =
            self.carry_resized(assessed, &claim, selected, &base, &base_annotations, store, warnings);
        match claims::ownership::owns_all(&owned, &claim) {
            true => Replacement { owned, base, base_annotations, carried },
            false => {
                let base = Arc::new(claims::strip::strip_injection(&store.request.pod, &owned));
                let base_annotations = pod::string_map(&base, "annotations").unwrap_or_default();
                Replacement { owned, base, base_annotations, carried }
            }
        }
    }

    /// Which containers resized in place since their injection (`Ownership::resized`) are
    /// replaced by their templates' current versions with the pod's `resources` carried over:
    /// those a current version still renders, when that makes every claimed item the injector's
    /// own (so the versions rendered here, for the pod without the claimed items, are the ones
    /// planned). A template edit does not undo a resize, and the resources may be the author's
    /// (the claim travels with copies), so they stay whatever the new version sets. Any other
    /// resized container is kept as the pod's own, with a warning.
    #[allow(clippy::too_many_arguments)]
    fn carry_resized(
        &self,
        assessed: claims::ownership::Ownership,
        claim: &InjectionStatus,
        selected: &[&Arc<Template>],
        base: &Arc<Value>,
        base_annotations: &BTreeMap<String, String>,
        store: &mut Renderings<'_>,
        warnings: &mut Vec<Warning>,
    ) -> (InjectionStatus, BTreeMap<String, Option<Value>>) {
        let mut owned = assessed.owned;
        let mut carried = BTreeMap::new();
        if !assessed.resized.is_empty() {
            let as_claimed = VolumeForms::Recorded(&claim.image_volumes);
            let current: Vec<Rc<RenderedTemplate>> =
                selected.iter().filter_map(|t| store.get(t, base, base_annotations, as_claimed).ok()).collect();
            let mut with_carried = owned.clone();
            for resized in &assessed.resized {
                let still_rendered = current.iter().any(|rendered| {
                    let mut containers = rendered.init_containers.iter().chain(&rendered.sidecars);
                    containers.any(|c| c.get("name").and_then(Value::as_str) == Some(&resized.name))
                });
                if still_rendered {
                    resized.placement.record(&mut with_carried, &resized.name);
                    carried.insert(resized.name.clone(), resized.resources.clone());
                }
            }
            match claims::ownership::owns_all(&with_carried, claim) {
                true => {
                    with_carried.pod_resources = assessed.present.pod_resources;
                    owned = with_carried;
                }
                false => carried.clear(),
            }
        }
        for resized in assessed.resized.iter().filter(|r| !carried.contains_key(&r.name)) {
            warnings.push(Warning::new(
                WarningCode::ClaimDoubted,
                format!(
                    "{} {:?} was resized in place (its resources are not the template's) and cannot be replaced with them carried over (its template no longer renders it, or other claimed items are not provably the injector's): it is kept as the pod's own",
                    resized.placement.item_kind().describe(),
                    resized.name
                ),
            ));
        }
        (owned, carried)
    }
}

/// An edit that changed nothing a pod holds (its `description`, `default:`, a selector, a value
/// none of its items use, an item added) makes a new version all the same. Where versions a claim
/// names are gone (`renderings` has none for them: a replica started since, the CLI), the versions
/// in service stand in for them when every other version the claim names is known and every
/// claimed item is in the pod just as they render it. A pod gains nothing by it: where the claim
/// is then current the items stay and nothing is replaced, as for a claim naming the versions in
/// service; where it is stale, some version it names was proven by its hash (the pod is a copy of
/// a real injection), and its items are replaced as every stale injection's are. Then the
/// stand-ins' renderings fill `renderings` and the ownership found is returned (its `present`
/// naming the versions in service); `None` otherwise.
fn stand_in_for_gone_versions(
    pod: &Value,
    claim: &InjectionStatus,
    selected: &[&Arc<Template>],
    renderings: &mut [Option<Rc<RenderedTemplate>>],
    mut render: impl FnMut(&Template) -> Option<Rc<RenderedTemplate>>,
) -> Option<claims::ownership::Ownership> {
    let in_service = |name: &str| selected.iter().find(|t| *t.name == *name);
    // The version each reference is read as.
    let as_read: Vec<&str> = claim
        .templates
        .iter()
        .zip(renderings.iter())
        .map(|(claimed, rendered)| match (rendered, in_service(&claimed.name)) {
            (None, Some(now)) => now.hash.as_str(),
            _ => claimed.hash.as_str(),
        })
        .collect();
    // Decided before anything renders: a claim that names a template twice, or a gone version of
    // one not in service, costs no rendering (and the others at most one per template selected).
    let accounted =
        claim.templates.iter().zip(renderings.iter()).all(|(c, r)| r.is_some() || in_service(&c.name).is_some());
    let first = claims::versions::first_of_each_name(claim);
    if !accounted || first.iter().any(|first| !first) || renderings.iter().all(Option::is_some) {
        return None;
    }
    let stand_ins: Vec<Option<Rc<RenderedTemplate>>> = claim
        .templates
        .iter()
        .zip(renderings.iter())
        .map(|(claimed, rendered)| match rendered {
            None => render(in_service(&claimed.name)?),
            Some(_) => None,
        })
        .collect();
    let with: Vec<Option<&RenderedTemplate>> =
        renderings.iter().zip(&stand_ins).map(|(claimed, now)| claimed.as_deref().or(now.as_deref())).collect();
    let mut assessed = claims::ownership::assess(pod, claim, &with, claims::ownership::Moment::Admission);
    if !assessed.altered.is_empty() {
        return None;
    }
    assessed.present.templates = claim
        .templates
        .iter()
        .zip(&as_read)
        .map(|(claimed, hash)| model::status::TemplateRef { name: claimed.name.clone(), hash: (*hash).to_owned() })
        .collect();
    for (rendering, stand_in) in renderings.iter_mut().zip(stand_ins) {
        *rendering = rendering.take().or(stand_in);
    }
    Some(assessed)
}

/// Whether the enforcement checks read a template again whatever the injection skipped: its host
/// aliases, mounts and `envFrom` keys can be shadowed by the pod's without any skip (another IP for
/// one of their host names, a mount below one, an env entry of a key's name), and a pod may share
/// its process namespace with a template's containers that need their own.
fn checked_for_shadows(template: &Template) -> bool {
    let inject = &template.inject;
    !inject.pod_lists[model::kinds::HOST_ALIASES.index].is_empty()
        || !inject.app_lists[model::kinds::VOLUME_MOUNTS.index].is_empty()
        || inject.app_lists[model::kinds::ENV_FROM.index].iter().any(|source| !source.keys.is_empty())
        || template.own_process_namespace
}

/// An injection that would make a pod the API server refuses (`Injection::invalid`) is not
/// applied: an enforced template refuses the pod with the API server's reasons; otherwise the pod
/// is admitted as its author wrote it (fail open; the reasons go in the warning and the metric).
/// Where the plan replaces an `earlier` injection (or none), the pod still gets the status
/// annotation, with no template and the reason: the companion ValidatingAdmissionPolicy refuses
/// a pod of an opted-in namespace that has none. Only when even that would break a rule (the
/// annotations are full) is the pod left without it.
fn refuse_or_admit(
    pod: &Value,
    earlier: Option<injection::plan::Earlier<'_>>,
    injection: injection::plan::Injection,
    selected: &[&Arc<Template>],
    warnings: &mut Vec<Warning>,
) -> Outcome {
    let reasons = injection.invalid;
    if let Some(template) = selected.iter().find(|t| t.enforced && !t.audit) {
        return Outcome::Denied(Denial::WouldBeInvalid { template: template.name.to_string(), reasons });
    }
    let reason = injection::select::OutOfScope::WouldBeInvalid { reasons, refused_patch: injection.patch };
    warnings
        .push(Warning::new(WarningCode::InjectionWouldBeInvalid, format!("sidecar-injector: not injected: {reason}")));
    let recorded = earlier.and_then(|earlier| {
        injection::plan::plan(pod, earlier, Vec::new(), Some(format!("not injected: {reason}"))).ok()
    });
    match recorded {
        Some(recorded) if recorded.invalid.is_empty() => {
            Outcome::Inject(injection::plan::Injection { skipped_as: Some(reason), ..recorded })
        }
        _ => Outcome::OutOfScope(reason),
    }
}

/// Gives the containers named in `carried` the resources they had in the pod (see
/// `Engine::carry_resized`).
fn carry_resources(rendered: &mut RenderedTemplate, carried: &BTreeMap<String, Option<Value>>) {
    if carried.is_empty() {
        return;
    }
    for container in rendered.init_containers.iter_mut().chain(&mut rendered.sidecars) {
        let name = container.get("name").and_then(Value::as_str);
        let Some(resources) = name.and_then(|n| carried.get(n)).cloned() else { continue };
        if let Value::Object(fields) = container {
            match resources {
                Some(resources) => drop(fields.insert("resources".to_owned(), resources)),
                None => drop(fields.remove("resources")),
            }
        }
    }
}

/// Ownership's doubts about a claim, as warnings.
fn doubted(doubts: impl IntoIterator<Item = String>) -> impl Iterator<Item = Warning> {
    doubts.into_iter().map(|doubt| Warning::new(WarningCode::ClaimDoubted, doubt))
}

/// What an `enforced: audit` template reports for a pod that enforcement would give it to.
const AUDIT_FORCED: &str = "it would be injected into this pod whatever its annotations and opt-out label say";

/// The sidecar mode for this pod: the pod's choice where the template lets it choose, else the
/// template's.
fn sidecar_mode(template: &Template, rendered: &RenderedTemplate) -> templates::template::SidecarMode {
    rendered.sidecar_mode.unwrap_or(template.sidecar_mode)
}

/// What the user should know about how a template's sidecars run on this cluster and workload.
fn sidecar_mode_warnings(
    template: &Template,
    rendered: &RenderedTemplate,
    cluster: ClusterFacts,
    owner: &workload::Workload,
) -> Vec<Warning> {
    let mut warnings = Vec::new();
    if rendered.sidecars.is_empty() {
        return warnings;
    }
    let (major, minor) = model::native::NATIVE_SINCE;
    for concern in model::native::concerns(sidecar_mode(template, rendered), cluster.native_sidecars, &owner.kind) {
        warnings.push(match concern {
            model::native::Concern::NativeUnavailable => Warning::new(
                WarningCode::NativeSidecarsUnavailable,
                format!(
                    "template {} asks for native sidecars (sidecarMode: native), which need a kubelet {major}.{minor} or newer: they are added as classic containers (decided {})",
                    template.name, cluster.rule
                ),
            ),
            model::native::Concern::ClassicInJob => Warning::new(
                WarningCode::ClassicSidecarsInJob,
                format!(
                    "template {} adds classic sidecar containers to a pod of {} {}: the Job does not complete while they run (native sidecars, kubelet {major}.{minor}+ with sidecarMode native or auto, stop by themselves; decided {})",
                    template.name, owner.kind, owner.name, cluster.rule
                ),
            ),
        });
    }
    warnings
}

/// Gives a volume name one form in the whole pod: where templates that declare a fallback for the
/// same name chose differently (one mounts it with `subPath`, the other does not), every one of
/// them takes the fallback, rendered again by `render_again` with the agreed image volumes.
/// Without this, the pod's form of a shared name would depend on which template came first, and
/// the status (which records forms by volume name) could not say it.
fn agree_on_volume_forms<E>(
    renderings: &mut [RenderedTemplate],
    support: injection::image_volumes::ImageVolumeSupport,
    mut render_again: impl FnMut(usize, &[String]) -> Result<RenderedTemplate, E>,
) -> Result<(), E> {
    let declared = |r: &RenderedTemplate| -> Vec<(String, bool)> {
        let with_fallback = r.volume_forms.iter().filter(|c| c.declared_fallback);
        with_fallback.map(|c| (c.volume.clone(), c.fallback.is_none())).collect()
    };
    let all: Vec<(String, bool)> = renderings.iter().flat_map(declared).collect();
    let image = injection::image_volumes::distinct(
        all.iter()
            .filter(|(name, _)| all.iter().filter(|(other, _)| other == name).all(|(_, image)| *image))
            .map(|(name, _)| name),
    );
    for (index, rendered) in renderings.iter_mut().enumerate() {
        if declared(rendered).iter().all(|(name, kept)| *kept == image.contains(name)) {
            continue;
        }
        *rendered = render_again(index, &image)?;
        // Taken for another template's subPath mount: that is what the nodes do not apply.
        for choice in rendered.volume_forms.iter_mut().filter(|c| c.fallback.is_some() && c.limit.is_none()) {
            choice.limit = support.limit(true);
        }
    }
    Ok(())
}

/// What the user should know about the form a template's image volumes take where the pod can
/// run (`image_volumes`).
fn image_volume_warnings(template: &Template, rendered: &RenderedTemplate, cluster: ClusterFacts) -> Vec<Warning> {
    let with_limit = rendered.volume_forms.iter().filter_map(|choice| choice.limit.map(|limit| (choice, limit)));
    with_limit
        .map(|(choice, limit)| match &choice.fallback {
            Some(init) => Warning::new(
                WarningCode::ImageVolumeFallback,
                format!(
                    "template {}: volume {} is an emptyDir filled by init container {init}, not an image volume: where the pod can run there is {limit} (decided {})",
                    template.name, choice.volume, cluster.rule.nodes()
                ),
            ),
            None => Warning::new(
                WarningCode::ImageVolumeUnsupported,
                format!(
                    "template {} adds image volume {}, which does not work where the pod can run: there is {limit} (decided {}); the template can declare a fallback",
                    template.name, choice.volume, cluster.rule.nodes()
                ),
            ),
        })
        .collect()
}

/// What the user should know about features a template's containers need of the node
/// (`node_features`): where no node the pod can run on offers one, the scheduler never places it.
/// By container: given only where the injection adds it.
fn node_feature_warnings(
    template: &Template,
    rendered: &RenderedTemplate,
    cluster: ClusterFacts,
) -> Vec<(String, Warning)> {
    let containers = rendered.init_containers.iter().chain(&rendered.sidecars);
    let missing = injection::node_features::missing(containers, cluster.node_features);
    missing
        .into_iter()
        .map(|(feature, container)| {
            let warning = Warning::new(
                WarningCode::NodeFeatureMissing,
                format!(
                    "template {}: container {container} has {}, which needs nodes that offer {}: none where the pod can run does (decided {}, {}), so the scheduler leaves the pod Pending until one joins",
                    template.name,
                    feature.use_in_words(),
                    feature.declared_as(),
                    cluster.rule.nodes(),
                    cluster.node_features.how()
                ),
            );
            (container.to_owned(), warning)
        })
        .collect()
}

impl Engine {
    /// An engine serving `templates`, never touching `excluded_namespaces` (besides the system ones).
    pub fn new(templates: TemplateSet, excluded_namespaces: Vec<String>) -> Self {
        Engine { templates, excluded_namespaces }
    }

    /// Decides what to do with a pod.
    pub fn evaluate(&self, request: &PodRequest) -> Decision {
        self.evaluate_with(request, false)
    }

    /// Decides with every field computed from pod data masked (see `injection::render::render_masked`).
    pub(crate) fn evaluate_masked(&self, request: &PodRequest) -> Decision {
        self.evaluate_with(request, true)
    }

    fn evaluate_with(&self, request: &PodRequest, mask_pod_reads: bool) -> Decision {
        self.evaluate_in(&mut Renderings::new(request, mask_pod_reads))
    }

    /// Decides for the request `renderings` serves, with its renderings.
    fn evaluate_in(&self, renderings: &mut Renderings<'_>) -> Decision {
        let request = renderings.request;
        let mut decision = self.decide(request, renderings);
        let (status, patch) = match &decision.outcome {
            Outcome::Inject(injection) => (&injection.status, Some(injection.patch.as_slice())),
            Outcome::UpToDate(status) => (status, None),
            Outcome::OutOfScope(injection::select::OutOfScope::PodOptedOut) => {
                let labels = pod::string_map(&request.pod, "labels").unwrap_or_default();
                let annotations = pod::string_map(&request.pod, "annotations").unwrap_or_default();
                let reach = injection::select::audit_reach_of_opted_out(
                    &self.templates,
                    &labels,
                    &annotations,
                    &request.namespace,
                );
                for template in reach {
                    decision.warnings.push(Warning::new(
                        WarningCode::EnforcementAudit,
                        format!("template {template} is enforced: audit; with enforced: true {AUDIT_FORCED}"),
                    ));
                    decision.audited.push(template.to_string());
                }
                return decision;
            }
            Outcome::OutOfScope(_) | Outcome::Denied(_) => return decision,
        };
        if let Some(denial) = self.enforcement_denials(renderings, status, patch, |t| t.enforced).into_iter().next() {
            decision.outcome = Outcome::Denied(denial);
            return decision;
        }
        // `enforced: audit`: what `enforced: true` would do, reported instead of done.
        let mut findings = Vec::new();
        for denial in self.enforcement_denials(renderings, status, patch, |t| t.audit) {
            if let Denial::Enforced { template, conflicts } = denial {
                findings.push((template, format!("it would refuse this pod: {}", conflicts.join("; "))));
            }
        }
        let forced = decision.choice.iter().flat_map(|c| &c.verdicts);
        for (name, _) in forced.filter(|(_, v)| *v == injection::select::TemplateVerdict::AuditEnforced) {
            findings.push((name.to_string(), AUDIT_FORCED.to_owned()));
        }
        for (template, finding) in findings {
            decision.warnings.push(Warning::new(
                WarningCode::EnforcementAudit,
                format!("template {template} is enforced: audit; with enforced: true {finding}"),
            ));
            if !decision.audited.contains(&template) {
                decision.audited.push(template);
            }
        }
        decision
    }

    /// For each template of `status` that `which` picks and that was applied with conflicts the
    /// pod may not have under enforcement (see `enforce`), the refusal it calls for. The
    /// conflicts are judged on the pod as `patch` leaves it (what the kubelet will run), never
    /// on items the patch removes.
    fn enforcement_denials(
        &self,
        renderings: &mut Renderings<'_>,
        status: &InjectionStatus,
        patch: Option<&[json_patch::PatchOperation]>,
        which: fn(&Template) -> bool,
    ) -> Vec<Denial> {
        let request = renderings.request;
        let conflicted = status.conflicted_templates();
        // Templates a pod can shadow without any skip are checked too.
        let enforced: Vec<&Arc<Template>> = status
            .templates
            .iter()
            .filter_map(|t| self.templates.version(&t.name, &t.hash).filter(|t| which(t)))
            .filter(|t| conflicted.contains(&&*t.name) || checked_for_shadows(t))
            .collect();
        if enforced.is_empty() {
            return Vec::new();
        }
        let after: Result<std::borrow::Cow<'_, Value>, String> = match patch {
            Some(patch) => {
                let mut after = (*request.pod).clone();
                json_patch::patch(&mut after, patch)
                    .map(|()| std::borrow::Cow::Owned(after))
                    .map_err(|e| format!("the injection's patch does not apply to the pod: {e}"))
            }
            None => Ok(std::borrow::Cow::Borrowed(&*request.pod)),
        };
        let annotations = pod::string_map(&request.pod, "annotations").unwrap_or_default();
        let mut denials = Vec::new();
        for template in enforced {
            let forms = VolumeForms::Recorded(&status.image_volumes);
            // Judged on what the pod's reads render, also where the decision masked them.
            let rendering = match renderings.mask_pod_reads {
                true => {
                    let subject = injection::render::Subject::new(request.pod.clone(), &renderings.owner);
                    injection::render::render(template, &subject, &annotations, &request.namespace, forms).map(Rc::new)
                }
                false => renderings.get(template, &request.pod, &annotations, forms),
            };
            let conflicts = match (rendering, &after) {
                (_, Err(e)) => vec![e.clone()],
                (Ok(rendered), Ok(pod)) => {
                    let native =
                        model::native::is_native(sidecar_mode(template, &rendered), request.cluster.native_sidecars);
                    let enforced = |name: &str| self.templates.get(name).is_some_and(|t| which(t));
                    let mut found = checks::enforce::conflicts(pod, status, &rendered, native, &enforced);
                    found.extend(checks::enforce::shadowed_host_names(pod, &rendered));
                    found.extend(checks::enforce::shadowed_mounts(pod, status, &rendered));
                    found.extend(checks::enforce::replaced_env_from_keys(pod, status, &rendered));
                    found.extend(checks::enforce::shared_process_namespace(pod, template));
                    found
                }
                (Err(e), _) => vec![format!("the template does not render for the pod as it is: {e}")],
            };
            if !conflicts.is_empty() {
                denials.push(Denial::Enforced { template: template.name.to_string(), conflicts });
            }
        }
        denials
    }

    /// The first step of [`Engine::decide`]: the pod's annotations and the templates chosen for
    /// it, or the decision when there is nothing to render (a malformed pod, out of scope, unknown
    /// templates named, a namespace nobody could read).
    fn choose(&self, request: &PodRequest) -> Result<(BTreeMap<String, String>, Choice), Box<Decision>> {
        let decision =
            |choice, outcome| Box::new(Decision { choice, outcome, warnings: Vec::new(), audited: Vec::new() });
        let pod = &*request.pod;
        let (labels, annotations) = match (pod::string_map(pod, "labels"), pod::string_map(pod, "annotations")) {
            (Ok(l), Ok(a)) => (l, a),
            (Err(e), _) | (_, Err(e)) => {
                return Err(decision(None, Outcome::Denied(Denial::Shape(e))));
            }
        };
        let choice = match injection::select::select(
            &self.templates,
            &labels,
            &annotations,
            &request.namespace,
            &self.excluded_namespaces,
        ) {
            Ok(choice) => choice,
            Err(reason) => return Err(decision(None, Outcome::OutOfScope(reason))),
        };
        let missing: Vec<String> = choice.missing().map(str::to_owned).collect();
        if !missing.is_empty() {
            let denial = Denial::UnknownTemplates {
                missing,
                known: self.templates.names().map(str::to_owned).collect(),
                source: choice.source.clone(),
            };
            return Err(decision(Some(choice), Outcome::Denied(denial)));
        }
        // A namespace nobody could read: its labels and its annotations (the templates it names,
        // its per-namespace values) are unknown, so nothing that would be injected is decided.
        let undecided: Vec<String> = choice.undecided().chain(choice.selected()).map(str::to_owned).collect();
        if let (false, Some(reason)) = (undecided.is_empty(), &request.namespace.unavailable) {
            let denial = Denial::NamespaceUnavailable {
                namespace: request.namespace.name.clone(),
                reason: reason.clone(),
                templates: undecided,
            };
            return Err(decision(Some(choice), Outcome::Denied(denial)));
        }
        Ok((annotations, choice))
    }

    /// The version of each selected template this pod gets (see `templates::rollout`): the one
    /// in service, unless a rollout under way or a pin decides otherwise (noted in the choice).
    pub(crate) fn versions_for(
        &self,
        request: &PodRequest,
        annotations: &BTreeMap<String, String>,
        choice: &mut Choice,
    ) -> Result<Vec<&Arc<Template>>, Denial> {
        // A pod that gets no template is not refused for its (or its namespace's) pins.
        if choice.selected().next().is_none() {
            return Ok(Vec::new());
        }
        let pins = templates::rollout::Pins::of(annotations, &request.namespace.annotations).map_err(Denial::Pin)?;
        // Nothing to choose between (the common case): the versions in service, no work per pod.
        if pins.is_empty() && !self.templates.has_rollouts() {
            return Ok(choice.selected().filter_map(|name| self.templates.get(name)).collect());
        }
        let labels = pod::string_map(&request.pod, "labels").unwrap_or_default();
        let workload = request.workload.clone().unwrap_or_else(|| workload::Workload::of_pod(&request.pod));
        let subject = templates::rollout::Subject {
            namespace: &request.namespace.name,
            workload: &workload,
            labels: &labels,
            pins: &pins,
        };
        let mut selected = Vec::new();
        let mut versions = Vec::new();
        let names: Vec<&str> = choice.selected().collect();
        for name in names {
            match self.templates.for_pod(name, subject) {
                None => {}
                Some(Err(message)) => return Err(Denial::Pin(message)),
                Some(Ok((template, why))) => {
                    if why != templates::rollout::Why::InService {
                        versions.push(injection::select::ChosenVersion {
                            template: template.name.clone(),
                            hash: template.hash.clone(),
                            why: why.describe(&workload),
                        });
                    }
                    selected.push(template);
                }
            }
        }
        choice.versions = versions;
        Ok(selected)
    }

    /// A decision in one pass down: the templates chosen and their versions, the pod's claim read
    /// (no planning), then one planning step (`plan_decision`).
    fn decide(&self, request: &PodRequest, renderings: &mut Renderings<'_>) -> Decision {
        let mut warnings = Vec::new();
        let decision = |choice, outcome, warnings| Decision { choice, outcome, warnings, audited: Vec::new() };
        let (annotations, mut choice) = match self.choose(request) {
            Ok(chosen) => chosen,
            Err(decided) => return *decided,
        };
        let selected = match self.versions_for(request, &annotations, &mut choice) {
            Ok(selected) => selected,
            Err(denial) => return decision(Some(choice), Outcome::Denied(denial), warnings),
        };
        // The status annotation is a claim (see `ownership`): what it proves decides what may go.
        let claimed = match read_claim(&annotations, &mut warnings) {
            None => None,
            Some(claim) => match self.check_claim(&request.pod, claim, &selected, renderings) {
                Ok(claimed) => Some(claimed),
                Err(denial) => return decision(Some(choice), Outcome::Denied(denial), warnings),
            },
        };
        let outcome = self.plan_decision(annotations, claimed, &selected, &choice, renderings, &mut warnings);
        decision(Some(choice), outcome, warnings)
    }

    /// A decision's one planning step, its alternatives in order: a claim of the versions in
    /// service keeps its items where they are (`keep_in_place`), where the plan allows it; else a
    /// fresh injection replaces what the claim proves (without a claim, into the pod as
    /// submitted, whose `annotations` are at hand).
    fn plan_decision(
        &self,
        annotations: BTreeMap<String, String>,
        claimed: Option<Claimed>,
        selected: &[&Arc<Template>],
        choice: &Choice,
        renderings: &mut Renderings<'_>,
        warnings: &mut Vec<Warning>,
    ) -> Outcome {
        let replacement = match claimed {
            None => Replacement {
                owned: InjectionStatus::default(),
                base: renderings.request.pod.clone(),
                base_annotations: annotations,
                carried: BTreeMap::new(),
            },
            Some(mut claimed) => {
                let kept = claimed.keep.take();
                let in_place =
                    kept.and_then(|kept| self.keep_in_place(&claimed, kept, selected, choice, renderings, warnings));
                if let Some(outcome) = in_place {
                    return outcome;
                }
                self.replacement(claimed, selected, renderings, warnings)
            }
        };
        self.plan_replacement(replacement, selected, choice, renderings, warnings)
    }

    /// The fresh injection of `selected` over what `replacement` may remove: refused or admitted
    /// without the templates where the API server would refuse the result, and judged by the
    /// namespace's Pod Security levels.
    fn plan_replacement(
        &self,
        replacement: Replacement,
        selected: &[&Arc<Template>],
        choice: &Choice,
        renderings: &mut Renderings<'_>,
        warnings: &mut Vec<Warning>,
    ) -> Outcome {
        let request = renderings.request;
        let pod = &*request.pod;
        let Replacement { owned, base, base_annotations, carried } = replacement;
        let container_names: Vec<&str> = pod
            .get("spec")
            .and_then(|s| s.get("containers"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c.get("name").and_then(Value::as_str))
            .collect();
        for template in selected {
            if let Err(e) = injection::render::check_chosen_containers(template, &base_annotations, &container_names) {
                return Outcome::Denied(Denial::Render(RenderError::Override(e)));
            }
        }
        let renderings_of = |templates: &[&Arc<Template>], renderings: &mut Renderings<'_>, warnings: &mut _| {
            self.planned_templates(templates, (&base, &base_annotations), &carried, renderings, warnings)
        };
        let planned = match renderings_of(selected, renderings, warnings) {
            Ok(planned) => planned,
            Err(e) => return Outcome::Denied(Denial::Render(e)),
        };
        let reason = planned.is_empty().then(|| choice.summary_of_none());
        let earlier = injection::plan::Earlier::Replace(&owned);
        match injection::plan::plan(pod, earlier, planned, reason) {
            Ok(injection) if !injection.invalid.is_empty() => {
                refuse_or_admit(pod, Some(earlier), injection, selected, warnings)
            }
            Ok(injection) => {
                // Planned again for fewer templates where Pod Security leaves some out: their
                // renderings' warnings were given with the first plan.
                let replan = |templates: &[&Arc<Template>], reason: Option<String>| {
                    let planned = renderings_of(templates, renderings, &mut Vec::new()).ok()?;
                    let planned = injection::plan::plan(pod, earlier, planned, reason).ok()?;
                    planned.invalid.is_empty().then_some(planned)
                };
                let outcome = match PodSecurityGuard::of(request, &base) {
                    Some(guard) => guard.judge(injection, selected, replan, warnings),
                    None => Outcome::Inject(injection),
                };
                if let Outcome::Inject(injection) = &outcome {
                    warnings.extend(injection.warnings.iter().cloned());
                }
                outcome
            }
            Err(e) => Outcome::Denied(Denial::Shape(e)),
        }
    }

    /// `templates` rendered for `base` (the pod without the items the plan may remove, and its
    /// annotations) as they are planned: each template's image volumes in the form all of them
    /// agree on, the containers resized in place since their injection given their resources
    /// (`carried`). The renderings' warnings go to `warnings`.
    fn planned_templates(
        &self,
        templates: &[&Arc<Template>],
        (base, base_annotations): (&Arc<Value>, &BTreeMap<String, String>),
        carried: &BTreeMap<String, Option<Value>>,
        renderings: &mut Renderings<'_>,
        warnings: &mut Vec<Warning>,
    ) -> Result<Vec<PlannedTemplate>, RenderError> {
        let cluster = renderings.request.cluster;
        let mut rendered_all = Vec::with_capacity(templates.len());
        for template in templates {
            let forms = VolumeForms::Nodes(cluster.image_volumes);
            // Kept (a copy planned) where the enforcement checks after the decision read it again.
            let rendered = match !renderings.mask_pod_reads
                && (template.enforced || template.audit)
                && checked_for_shadows(template)
            {
                true => renderings.get(template, base, base_annotations, forms).map(|r| (*r).clone()),
                false => renderings.take(template, base, base_annotations, forms),
            };
            rendered_all.push(rendered?);
        }
        agree_on_volume_forms(&mut rendered_all, cluster.image_volumes, |index, image| {
            renderings.take(templates[index], base, base_annotations, VolumeForms::Recorded(image))
        })?;
        let mut planned = Vec::with_capacity(templates.len());
        for (template, mut rendered) in templates.iter().zip(rendered_all) {
            carry_resources(&mut rendered, carried);
            warnings.append(&mut rendered.warnings);
            warnings.extend(sidecar_mode_warnings(template, &rendered, cluster, &renderings.owner));
            warnings.extend(image_volume_warnings(template, &rendered, cluster));
            planned.push(planned_template(template, rendered, cluster));
        }
        Ok(planned)
    }
}

/// A rendering as the planner takes it, with what the cluster decides for it.
fn planned_template(template: &Template, rendered: RenderedTemplate, cluster: ClusterFacts) -> PlannedTemplate {
    PlannedTemplate {
        native_sidecars: model::native::is_native(sidecar_mode(template, &rendered), cluster.native_sidecars),
        sidecar_resize_policy: cluster.sidecar_resize_policy,
        if_added: node_feature_warnings(template, &rendered, cluster),
        rendered,
    }
}

/// The Pod Security levels of a pod's namespace, judging what an injection adds (see
/// `checks::pod_security`). Where the `enforce` level admits the pod as its author wrote it
/// (`before`: the pod without the items an earlier injection provably added) but would refuse
/// it injected, the templates whose additions make it fail are left out: the pod gets the others
/// (or none, with the status saying why), a warning, an Event and a metric; an enforced template
/// among them refuses the pod with the API server's words instead. What the `warn` and `audit`
/// levels would say of the injection is a warning.
struct PodSecurityGuard<'r> {
    enforce: checks::pod_security::Policy,
    reported: Vec<(checks::pod_security::Mode, checks::pod_security::Policy)>,
    pod: &'r Value,
    before: &'r Value,
}

impl<'r> PodSecurityGuard<'r> {
    /// The guard for a request, `None` where its namespace's labels are unknown or set no level.
    fn of(request: &'r PodRequest, before: &'r Value) -> Option<Self> {
        use checks::pod_security::{LATEST_MINOR, Level, Mode, Policy};
        let namespace = &request.namespace;
        // Most namespaces set no level: nothing to read, nothing built.
        let sets_a_level = namespace.labels.keys().any(|key| key.starts_with("pod-security.kubernetes.io/"));
        if !namespace.labels_known || !sets_a_level {
            return None;
        }
        let minor = request.cluster.api_server_minor.unwrap_or(LATEST_MINOR);
        let enforce = Policy::of(&namespace.labels, Mode::Enforce, minor);
        let reported: Vec<_> = [Mode::Warn, Mode::Audit]
            .into_iter()
            .map(|mode| (mode, Policy::of(&namespace.labels, mode, minor)))
            .filter(|(_, policy)| policy.level > Level::Privileged)
            .collect();
        let guard = PodSecurityGuard { enforce, reported, pod: &request.pod, before };
        (guard.enforce.level > Level::Privileged || !guard.reported.is_empty()).then_some(guard)
    }

    /// The pod as `injection` leaves it (`None` where its patch does not apply).
    fn injected(&self, injection: &Injection) -> Option<Value> {
        let mut pod = self.pod.clone();
        json_patch::patch(&mut pod, &injection.patch).ok().map(|()| pod)
    }

    /// Why the `enforce` level would refuse the pod `injection` makes, where it admits `before`.
    fn refusal(&self, injection: &Injection) -> Option<String> {
        self.refusal_of(&self.injected(injection)?)
    }

    /// Why the `enforce` level would refuse `injected`, where it admits `before`.
    fn refusal_of(&self, injected: &Value) -> Option<String> {
        let failed = self.enforce.broken_by(self.before, injected);
        (!failed.is_empty()).then(|| self.enforce.message(&failed))
    }

    /// The outcome for `injection` of `selected`: as planned, with the templates that break the
    /// `enforce` level left out (`replan` plans a subset, with the reason for the status), or a
    /// refusal.
    fn judge(
        &self,
        injection: Injection,
        selected: &[&Arc<Template>],
        mut replan: impl FnMut(&[&Arc<Template>], Option<String>) -> Option<Injection>,
        warnings: &mut Vec<Warning>,
    ) -> Outcome {
        let injected = self.injected(&injection);
        let Some(refusal) = injected.as_ref().and_then(|injected| self.refusal_of(injected)) else {
            if let Some(injected) = injected.filter(|_| !injection.status.templates.is_empty()) {
                self.report(&injected, warnings);
            }
            return Outcome::Inject(injection);
        };
        // The templates whose additions break the level on their own; if none does, it is the
        // combination, and every one of them is left out.
        let mut left_out: Vec<(&Arc<Template>, String)> = selected
            .iter()
            .filter_map(|t| {
                // A template that cannot be planned alone is judged by the whole.
                let alone = replan(&[t], None).map_or_else(|| Some(refusal.clone()), |alone| self.refusal(&alone));
                Some((*t, alone?))
            })
            .collect();
        let mut kept: Vec<&Arc<Template>> =
            selected.iter().copied().filter(|t| !left_out.iter().any(|(out, _)| Arc::ptr_eq(t, out))).collect();
        let names = |left_out: &[(&Arc<Template>, String)]| left_out.iter().map(|(t, _)| t.name.to_string()).collect();
        let mut reason = OutOfScope::PodSecurity { templates: names(&left_out), message: refusal.clone().into() };
        let with_kept = match kept.is_empty() || left_out.is_empty() {
            true => None,
            false => replan(&kept, Some(format!("not injected: {reason}"))).filter(|i| self.refusal(i).is_none()),
        };
        if with_kept.is_none() {
            left_out = selected.iter().map(|t| (*t, refusal.clone())).collect();
            kept.clear();
            reason = OutOfScope::PodSecurity { templates: names(&left_out), message: refusal.clone().into() };
        }
        if let Some((template, message)) = left_out.iter().find(|(t, _)| t.enforced && !t.audit) {
            return Outcome::Denied(Denial::WouldBeInvalid {
                template: template.name.to_string(),
                reasons: vec![message.clone()],
            });
        }
        warnings
            .push(Warning::new(WarningCode::PodSecurityLeftOut, format!("sidecar-injector: not injected: {reason}")));
        let injection = match with_kept {
            Some(injection) => {
                if let Some(injected) = self.injected(&injection) {
                    self.report(&injected, warnings);
                }
                injection
            }
            None => match replan(&[], Some(format!("not injected: {reason}"))) {
                Some(recorded) => Injection { skipped_as: Some(reason), ..recorded },
                None => return Outcome::OutOfScope(reason),
            },
        };
        // A pod this decision was already made for (its status says so, its items are in place)
        // is up to date: the templates left out are not a change to make.
        match self.injected(&injection).is_some_and(|injected| injected == *self.pod) {
            true => Outcome::UpToDate(injection.status),
            false => Outcome::Inject(injection),
        }
    }

    /// What the `warn` and `audit` levels would say of `injected` (a pod with templates
    /// injected), as warnings.
    fn report(&self, injected: &Value, warnings: &mut Vec<Warning>) {
        for (mode, policy) in &self.reported {
            let failed = policy.broken_by(self.before, injected);
            if !failed.is_empty() {
                warnings.push(Warning::new(
                    WarningCode::PodSecurityWarn,
                    format!(
                        "sidecar-injector: the injected containers make the pod fail the namespace's Pod Security {} level: {}",
                        mode.name(),
                        policy.warning(&failed)
                    ),
                ));
            }
        }
    }
}

/// The pod's status annotation read as a claim (see `ownership`); an unreadable one is replaced,
/// with a warning.
fn read_claim(annotations: &BTreeMap<String, String>, warnings: &mut Vec<Warning>) -> Option<InjectionStatus> {
    match annotations.get(names::STATUS_ANNOTATION).map(|s| InjectionStatus::parse(s)) {
        None => None,
        Some(Ok(status)) => Some(status),
        Some(Err(e)) => {
            warnings.push(Warning::new(
                WarningCode::StatusUnreadable,
                format!("the existing {} annotation is not valid ({e}); it is replaced", names::STATUS_ANNOTATION),
            ));
            None
        }
    }
}
