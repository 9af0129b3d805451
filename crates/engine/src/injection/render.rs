//! Rendering a compiled template for one pod: expressions evaluated, `when:` items dropped,
//! overrides applied, all within hard bounds.
//!
//! Bounds (a hostile or careless template cannot hang the webhook or exhaust its memory):
//! - MiniJinja fuel caps the instructions of each expression ([`FUEL_PER_EXPRESSION`]) and the
//!   template as a whole ([`FUEL_PER_TEMPLATE`]); there are no macros, includes or imports.
//! - Each expression's output is written through a writer that stops at [`MAX_EXPRESSION_OUTPUT`],
//!   and a template's total rendered text is capped at [`MAX_TEMPLATE_OUTPUT`].
//!
//! Undefined values: printing, iterating or filtering an undefined value is an error (so a typo
//! never renders as an empty string); testing one in a condition (`when`, `{% if %}`) is false.
//!
//! Overrides: `sidecar-injector.io/<template>.<value>` on the pod replaces a value listed in
//! `overridable`; the annotation text is converted to the default's scalar type (a number stays a
//! number, a boolean a boolean, anything else a string) and is never parsed as YAML.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use minijinja::Value as JinjaValue;
use minijinja::value::{Enumerator, Object, ObjectRepr, Serde};
use serde_json::Value;

use crate::facts::NamespaceFacts;
use crate::findings::{Warning, WarningCode};
use crate::injection::image_volumes::{self, ImageVolumeChoice, RenderedFallback, VolumeForms};
use crate::model::compare::{POD_DERIVED, env_from_key};
use crate::model::env::EnvMerge;
use crate::model::kinds::{
    ANNOTATIONS, APP_LISTS, AppListKind, ContainerPosition, ENV, ENV_FROM, MAPS, MapKind, PerAppList, PerMap,
    PerPodList, Placement, PodListKind, VOLUME_MOUNTS, VOLUMES,
};
use crate::names;
use crate::templates::expression::{CompiledText, FUEL_PER_EXPRESSION, Failure, MAX_EXPRESSION_OUTPUT, lookup_path};
use crate::templates::template::{AppTargets, Piece, PodResources, SeqItem, SidecarMode, Template, TemplateError};
use crate::workload::Workload;

/// Instructions all expressions of one template may execute for one pod.
pub const FUEL_PER_TEMPLATE: u64 = 500_000;
/// Bytes all expressions of one template may output for one pod.
pub const MAX_TEMPLATE_OUTPUT: usize = 1024 * 1024;

/// What one template adds to one pod, rendered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderedTemplate {
    /// Template name.
    pub name: String,
    /// Template content hash.
    pub hash: String,
    /// The keys each kind of map (`kinds::MAPS`) gets, with their values; see
    /// [`RenderedTemplate::map`].
    pub maps: PerMap<BTreeMap<String, String>>,
    /// Init containers, placed before the pod's own.
    pub init_containers: Vec<Value>,
    /// Sidecar containers (native or classic is decided when planning).
    pub sidecars: Vec<Value>,
    /// The `position:` the template gives its init containers and sidecars, by name.
    pub positions: BTreeMap<String, ContainerPosition>,
    /// The items of each kind of spec list (`kinds::POD_LISTS`), see
    /// [`RenderedTemplate::pod_list`].
    pub pod_lists: PerPodList<Vec<Value>>,
    /// The items of each kind of app-container list (`kinds::APP_LISTS`: env vars, `envFrom`
    /// sources, volume mounts) for the targeted app containers; see [`RenderedTemplate::app_list`].
    pub app_lists: PerAppList<Vec<Value>>,
    /// How the env vars that say `merge:` merge with the app's own, by name.
    pub env_merges: BTreeMap<String, EnvMerge>,
    /// The env vars the `keys:` of its `envFrom` sources name (the source's prefix and the key),
    /// each with the source (`configMap/<name>`), which no `env` entry of the app may replace.
    pub env_from_keys: BTreeMap<String, String>,
    /// Which app containers get `env`, `envFrom` and `volumeMounts` (the pod's choice applied).
    pub targets: AppTargets,
    /// The pod's choice of sidecar mode, when the template lets it choose.
    pub sidecar_mode: Option<SidecarMode>,
    /// Override annotations that were ignored, with the reason.
    pub warnings: Vec<Warning>,
    /// Where each overridden value came from: `<value> from annotation <key>` (the pod's, or
    /// `<key> on namespace <name>`).
    pub value_sources: Vec<String>,
    /// How each value `sizing:` computed was reached, by container: `container <name>:
    /// <field>.<resource> = <value> (...)` (for `explain`).
    pub sized: Vec<(String, String)>,
    /// `(container, field, resource)` of every value a `sizing:` rule decides for the pod (sized,
    /// or left the template's where there was nothing to size from).
    pub sized_fields: Vec<(String, &'static str, String)>,
    /// The form each image volume was given (`image_volumes`).
    pub volume_forms: Vec<ImageVolumeChoice>,
    /// The image volumes with a declared fallback that stay image volumes (what the status
    /// records as `imageVolumes`).
    pub image_volumes: Vec<String>,
}

impl RenderedTemplate {
    /// The rendered items of one kind of spec list.
    pub fn pod_list(&self, kind: &PodListKind) -> &[Value] {
        &self.pod_lists[kind.index]
    }

    /// The rendered entries of one kind of map.
    pub fn map(&self, kind: &MapKind) -> &BTreeMap<String, String> {
        &self.maps[kind.index]
    }

    /// The rendered items of one kind of app-container list.
    pub fn app_list(&self, kind: &AppListKind) -> &[Value] {
        &self.app_lists[kind.index]
    }

    /// The rendered containers that go to `placement` (its init containers, or its sidecars).
    pub fn containers(&self, placement: Placement) -> &[Value] {
        match placement {
            Placement::Init => &self.init_containers,
            Placement::NativeSidecar | Placement::Sidecar => &self.sidecars,
        }
    }

    /// The rendered container `name` of `placement`, as it goes into the pod.
    pub fn placed_container(&self, placement: Placement, name: &str) -> Option<Value> {
        let found = self.containers(placement).iter().find(|c| c.get("name").and_then(Value::as_str) == Some(name));
        found.cloned().map(|mut container| {
            placement.shape(&mut container);
            container
        })
    }
}

/// A render error that is the pod's fault rather than the template's: an override annotation whose
/// text does not fit the value's type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidOverride {
    /// The annotation key.
    pub annotation: String,
    /// What is wrong.
    pub message: String,
}

/// Why rendering failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenderError {
    /// The template failed (undefined value, fuel, output size, bad type).
    Template(TemplateError),
    /// An override annotation on the pod is invalid.
    Override(InvalidOverride),
}

impl std::fmt::Display for RenderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RenderError::Template(e) => e.fmt(f),
            RenderError::Override(o) => write!(f, "annotation {}: {}", o.annotation, o.message),
        }
    }
}

/// The pod as the templates see it: a zero-copy view over the submitted JSON.
pub fn pod_value(pod: Arc<Value>) -> JinjaValue {
    JsonView::root(pod)
}

/// The pod a template is rendered for: the pod itself and the workload it belongs to.
pub struct Subject<'w> {
    /// The pod (see [`pod_value`]).
    pub pod: JinjaValue,
    /// Its workload.
    pub workload: &'w Workload,
}

impl<'w> Subject<'w> {
    /// A pod whose workload is already known.
    pub fn new(pod: Arc<Value>, workload: &'w Workload) -> Self {
        Subject { pod: pod_value(pod), workload }
    }
}

/// Renders `template` for a pod in a namespace, its image volumes in `forms`.
pub fn render(
    template: &Template,
    subject: &Subject<'_>,
    pod_annotations: &BTreeMap<String, String>,
    namespace: &NamespaceFacts,
    forms: VolumeForms<'_>,
) -> Result<RenderedTemplate, RenderError> {
    render_items(template, subject, pod_annotations, namespace, forms, false, false)
}

/// Like [`render`], but every string computed from pod data (other than names and mount paths,
/// which identify items) is [`POD_DERIVED`]: what the validating check compares against.
pub fn render_masked(
    template: &Template,
    subject: &Subject<'_>,
    pod_annotations: &BTreeMap<String, String>,
    namespace: &NamespaceFacts,
    forms: VolumeForms<'_>,
) -> Result<RenderedTemplate, RenderError> {
    render_items(template, subject, pod_annotations, namespace, forms, true, false)
}

/// Like [`render_masked`], but with **every** item, whatever its `when:` says (no `when` is
/// evaluated): what the load check reads so that an item no sample pod selects is checked too,
/// numbered as the template lists its items.
pub fn render_every_item(
    template: &Template,
    subject: &Subject<'_>,
    namespace: &NamespaceFacts,
    forms: VolumeForms<'_>,
) -> Result<RenderedTemplate, RenderError> {
    render_items(template, subject, &BTreeMap::new(), namespace, forms, true, true)
}

/// Renders with pod data masked or not (`mask_pod_reads`), and every item or those whose `when:`
/// holds (`every_item`).
fn render_items(
    template: &Template,
    subject: &Subject<'_>,
    pod_annotations: &BTreeMap<String, String>,
    namespace: &NamespaceFacts,
    forms: VolumeForms<'_>,
    mask_pod_reads: bool,
    every_item: bool,
) -> Result<RenderedTemplate, RenderError> {
    let mut warnings = Vec::new();
    let own = addressed_to(template, pod_annotations, namespace, &mut warnings);
    let mut value_sources = Vec::new();
    let values = effective_values(template, &own, &mut warnings, &mut value_sources).map_err(RenderError::Override)?;
    let (targets, sidecar_mode) = pod_choices(template, &own, &mut warnings).map_err(RenderError::Override)?;
    let overridden = matches!(values, Cow::Owned(_));
    // Most pods override nothing: their values are the defaults, converted once at load.
    let values_view = match &values {
        Cow::Borrowed(_) => template.expressions.default_values.clone(),
        Cow::Owned(values) => JinjaValue::from(Serde(values)),
    };
    let context = JinjaValue::from_pairs([
        ("pod", subject.pod.clone()),
        (
            "workload",
            JinjaValue::from_pairs([
                ("kind", JinjaValue::from(subject.workload.kind.as_str())),
                ("name", JinjaValue::from(subject.workload.name.as_str())),
            ]),
        ),
        (
            "namespace",
            JinjaValue::from_pairs([
                ("name", JinjaValue::from(namespace.name.as_str())),
                ("labels", JinjaValue::from(Serde(&namespace.labels))),
                ("annotations", JinjaValue::from(Serde(&namespace.annotations))),
            ]),
        ),
        ("values", values_view),
        ("template", JinjaValue::from_pairs([("name", JinjaValue::from(&*template.name))])),
    ]);
    let mut renderer = Renderer {
        template,
        context,
        values: &values,
        fuel_left: FUEL_PER_TEMPLATE,
        output_left: MAX_TEMPLATE_OUTPUT,
        mask_pod_reads,
        every_item,
        overridden,
    };
    let spec = &template.inject;
    let err = RenderError::Template;
    let mut app_lists = PerAppList::<Vec<Value>>::default();
    let (mut env_merges, mut env_from_keys) = (BTreeMap::new(), BTreeMap::new());
    for (kind, (rendered, items)) in APP_LISTS.iter().zip(app_lists.iter_mut().zip(&spec.app_lists)) {
        *rendered = match kind.index {
            index if index == ENV.index => {
                let (env, merges) = renderer.env_items(items).map_err(err)?;
                env_merges = merges;
                env
            }
            index if index == ENV_FROM.index => {
                let (sources, keys) = renderer.env_from_items(items).map_err(err)?;
                env_from_keys = keys;
                sources
            }
            _ => renderer.items(items).map_err(err)?,
        };
    }
    let (mut positions, mut sized) = (BTreeMap::new(), Sized::default());
    let app = app_containers(&subject.pod);
    let mut init_containers =
        renderer.containers(&spec.init_containers, &mut positions, app, &mut sized).map_err(err)?;
    let mut sidecars = renderer.containers(&spec.sidecars, &mut positions, app, &mut sized).map_err(err)?;
    if template.pod_resources == PodResources::Share && sets_pod_level_resources(&subject.pod) {
        share_the_pods_budget(init_containers.iter_mut().chain(&mut sidecars));
    }
    let mut maps = PerMap::<BTreeMap<String, String>>::default();
    for (kind, rendered) in MAPS.iter().zip(&mut maps) {
        *rendered = renderer.string_map(&spec.maps[kind.index], kind.section).map_err(err)?;
    }
    name_default_container(&mut maps[ANNOTATIONS.index], &sidecars, &positions, &subject.pod);
    let mut pod_lists = PerPodList::<Vec<Value>>::default();
    let mut fallbacks = Vec::new();
    for (rendered, items) in pod_lists.iter_mut().zip(&spec.pod_lists) {
        *rendered = renderer.items_with_fallbacks(items, &mut fallbacks).map_err(err)?;
    }
    let (volume_forms, image_volumes) = image_volumes::apply(
        forms,
        fallbacks,
        &mut pod_lists[VOLUMES.index],
        &mut init_containers,
        &sidecars,
        &app_lists[VOLUME_MOUNTS.index],
    );
    Ok(RenderedTemplate {
        name: template.name.to_string(),
        hash: template.hash.clone(),
        maps,
        init_containers,
        sidecars,
        positions,
        app_lists,
        env_merges,
        env_from_keys,
        pod_lists,
        targets,
        sidecar_mode,
        warnings,
        value_sources,
        sized: sized.notes,
        sized_fields: sized.fields,
        volume_forms,
        image_volumes,
    })
}

/// `podResources: share` in a pod that sets pod-level resources: the containers run inside the
/// pod's budget, without requests or limits of their own.
fn share_the_pods_budget<'c>(containers: impl Iterator<Item = &'c mut Value>) {
    for container in containers {
        if let Some(Value::Object(resources)) = container.get_mut("resources") {
            resources.remove("requests");
            resources.remove("limits");
            if resources.is_empty() {
                container.as_object_mut().map(|c| c.remove("resources"));
            }
        }
    }
}

/// What `sizing:` did to a template's containers (`RenderedTemplate::sized`, `sized_fields`).
#[derive(Default)]
struct Sized {
    notes: Vec<(String, String)>,
    fields: Vec<(String, &'static str, String)>,
}

/// The pod's app containers (`spec.containers`) as JSON: what `sizing:` reads.
fn app_containers(pod: &JinjaValue) -> &[Value] {
    let pod = pod.downcast_object_ref::<JsonView>().map(JsonView::node);
    pod.and_then(|p| p.get("spec")?.get("containers")?.as_array()).map_or(&[], Vec::as_slice)
}

/// A classic sidecar put first would be `kubectl logs`' and `exec`'s default container: the pod
/// names its first app container instead (the template's or the pod's own key wins).
fn name_default_container(
    annotations: &mut BTreeMap<String, String>,
    sidecars: &[Value],
    positions: &BTreeMap<String, ContainerPosition>,
    pod: &JinjaValue,
) {
    let first_sidecar = sidecars.iter().any(|s| {
        let name = s.get("name").and_then(Value::as_str).unwrap_or_default();
        positions.get(name) == Some(&ContainerPosition::First)
    });
    if first_sidecar && !annotations.contains_key(names::DEFAULT_CONTAINER_ANNOTATION) {
        let first_app =
            pod.get_attr("spec").and_then(|s| s.get_attr("containers")).and_then(|c| c.get_item_by_index(0));
        if let Some(name) =
            first_app.ok().and_then(|c| c.get_attr("name").ok()).and_then(|n| n.as_str().map(str::to_owned))
        {
            annotations.insert(names::DEFAULT_CONTAINER_ANNOTATION.to_owned(), name);
        }
    }
}

/// Whether the pod sets pod-level resources (`spec.resources` with requests or limits).
fn sets_pod_level_resources(pod: &JinjaValue) -> bool {
    let resources = pod.get_attr("spec").and_then(|spec| spec.get_attr("resources"));
    resources.is_ok_and(|r| {
        ["requests", "limits"].iter().any(|f| r.get_attr(f).is_ok_and(|m| m.len().is_some_and(|n| n > 0)))
    })
}

/// Annotation suffix (`sidecar-injector.io/<template>.app-containers`) of the pod's choice of app
/// containers.
pub const APP_CONTAINERS_CHOICE: &str = "app-containers";
/// Annotation suffix of the pod's choice of sidecar mode.
pub const SIDECAR_MODE_CHOICE: &str = "sidecar-mode";

/// The annotations addressed to `template` that apply to a pod, as (annotation as messages name
/// it, suffix, text): the pod's own, and its namespace's where the pod has none of that suffix
/// (namespace defaults; the pod's annotation wins). The namespace's `app-containers` is ignored
/// with a warning: container names are the pod's.
fn addressed_to<'a>(
    template: &Template,
    pod_annotations: &'a BTreeMap<String, String>,
    namespace: &'a NamespaceFacts,
    warnings: &mut Vec<Warning>,
) -> Vec<(String, &'a str, &'a String)> {
    let pod = annotations_for(template, pod_annotations);
    let mut out = Vec::with_capacity(pod.len());
    for (key, suffix, text) in annotations_for(template, &namespace.annotations) {
        let key = format!("{key} on namespace {}", namespace.name);
        if suffix == APP_CONTAINERS_CHOICE {
            warnings.push(Warning::new(
                WarningCode::OverrideIgnored,
                format!("annotation {key} ignored: which app containers get the additions is each pod's choice"),
            ));
        } else if !pod.iter().any(|(_, own, _)| *own == suffix) {
            out.push((key, suffix, text));
        }
    }
    out.extend(pod.into_iter().map(|(key, suffix, text)| (key.clone(), suffix, text)));
    out
}

/// The annotations of `annotations` addressed to `template` (`sidecar-injector.io/<template>.<suffix>`), as
/// (annotation, suffix, text): overrides of values and choices.
fn annotations_for<'a>(
    template: &Template,
    annotations: &'a BTreeMap<String, String>,
) -> Vec<(&'a String, &'a str, &'a String)> {
    let prefix = format!("{}{}.", names::PREFIX, template.name);
    annotations
        .range(prefix.clone()..)
        .map_while(|(key, text)| key.strip_prefix(&prefix).map(|suffix| (key, suffix, text)))
        .collect()
}

/// The pod's choices (see `PodChoices`) where the template allows them; ignored with a warning
/// where it does not, refused when invalid.
fn pod_choices(
    template: &Template,
    own: &[(String, &str, &String)],
    warnings: &mut Vec<Warning>,
) -> Result<(AppTargets, Option<SidecarMode>), InvalidOverride> {
    let mut targets = template.inject.targets.clone();
    let mut mode = None;
    for (annotation, suffix, text) in own {
        let (suffix, text) = (*suffix, *text);
        let (allowed, choice) = match suffix {
            APP_CONTAINERS_CHOICE => (template.pod_choices.app_containers, "appContainers"),
            SIDECAR_MODE_CHOICE => (template.pod_choices.sidecar_mode, "sidecarMode"),
            _ => continue,
        };
        if !allowed {
            warnings.push(Warning::new(
                WarningCode::OverrideIgnored,
                format!(
                    "annotation {annotation} ignored: template {:?} does not let pods choose {choice} (podChoices)",
                    template.name
                ),
            ));
            continue;
        }
        let invalid = |message: String| InvalidOverride { annotation: annotation.clone(), message };
        if suffix == SIDECAR_MODE_CHOICE {
            mode = Some(match text.as_str() {
                "native" => SidecarMode::Native,
                "container" => SidecarMode::Container,
                other => return Err(invalid(format!("{other:?} is not a sidecar mode (native or container)"))),
            });
            continue;
        }
        let chosen: Vec<String> = text.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_owned).collect();
        if let Some(bad) = chosen.iter().find(|n| !crate::model::api_limits::is_dns_label(n)) {
            return Err(invalid(format!("{bad:?} is not a container name")));
        }
        if let Some(excluded) = chosen.iter().find(|n| targets.except.contains(n)) {
            return Err(invalid(format!(
                "template {:?} never adds to container {excluded:?} (excludeContainers)",
                template.name
            )));
        }
        targets.only = Some(chosen);
    }
    Ok((targets, mode))
}

/// Refuses a pod whose `app-containers` choice names a container it does not have (a typo would
/// otherwise silently leave every container without the additions).
pub(crate) fn check_chosen_containers(
    template: &Template,
    annotations: &BTreeMap<String, String>,
    containers: &[&str],
) -> Result<(), InvalidOverride> {
    if !template.pod_choices.app_containers {
        return Ok(());
    }
    let annotation = format!("{}{}.{APP_CONTAINERS_CHOICE}", names::PREFIX, template.name);
    let Some(text) = annotations.get(&annotation) else {
        return Ok(());
    };
    match text.split(',').map(str::trim).find(|n| !n.is_empty() && !containers.contains(n)) {
        None => Ok(()),
        Some(missing) => Err(InvalidOverride {
            annotation,
            message: format!("the pod has no container {missing:?} (containers: {})", containers.join(", ")),
        }),
    }
}

/// Defaults with the overrides applied; borrowed when nothing is overridden. `sources` gets
/// `<value> from <annotation>` for each value overridden.
fn effective_values<'t>(
    template: &'t Template,
    own: &[(String, &str, &String)],
    warnings: &mut Vec<Warning>,
    sources: &mut Vec<String>,
) -> Result<Cow<'t, serde_json::Map<String, Value>>, InvalidOverride> {
    let mut values = Cow::Borrowed(&template.values);
    for (key, value_name, text) in own {
        let (value_name, text) = (*value_name, *text);
        if value_name == APP_CONTAINERS_CHOICE || value_name == SIDECAR_MODE_CHOICE {
            continue;
        }
        let Some(overridable) = template.overridable.iter().find(|o| o.name == value_name) else {
            let allowed = match template.overridable.is_empty() {
                true => String::new(),
                false => {
                    let names: Vec<&str> = template.overridable.iter().map(|o| o.name.as_str()).collect();
                    format!(" (overridable: {})", names.join(", "))
                }
            };
            warnings.push(Warning::new(
                WarningCode::OverrideIgnored,
                format!(
                    "annotation {key} ignored: value {value_name:?} of template {:?} is not overridable{allowed}",
                    template.name
                ),
            ));
            continue;
        };
        let default = &template.values[value_name];
        let value = coerce_override(default, text).ok_or_else(|| InvalidOverride {
            annotation: key.clone(),
            message: format!(
                "{text:?} is not a valid {} (the default of {value_name} in template {:?} is {default})",
                match default {
                    Value::Bool(_) => "boolean",
                    Value::Number(n) if n.is_f64() => "number",
                    _ => "integer",
                },
                template.name
            ),
        })?;
        overridable.check(text, &value).map_err(|message| InvalidOverride {
            annotation: key.clone(),
            message: format!("{message} in template {:?}", template.name),
        })?;
        sources.push(format!("{value_name} from annotation {key}"));
        values.to_mut().insert(value_name.to_owned(), value);
    }
    Ok(values)
}

/// The annotation text as the default's scalar type; never parsed as YAML, so it cannot add
/// structure.
fn coerce_override(default: &Value, text: &str) -> Option<Value> {
    match default {
        Value::Bool(_) => match text {
            "true" => Some(Value::Bool(true)),
            "false" => Some(Value::Bool(false)),
            _ => None,
        },
        Value::Number(n) if n.is_f64() => {
            text.parse::<f64>().ok().and_then(serde_json::Number::from_f64).map(Value::Number)
        }
        Value::Number(_) => text.parse::<i64>().ok().map(Value::from),
        _ => Some(Value::String(text.to_owned())),
    }
}

struct Renderer<'t> {
    template: &'t Template,
    context: JinjaValue,
    values: &'t serde_json::Map<String, Value>,
    fuel_left: u64,
    output_left: usize,
    mask_pod_reads: bool,
    /// Keep every item, evaluating no `when:` (see [`render_every_item`]).
    every_item: bool,
    /// Whether the pod overrides any of the template's values.
    overridden: bool,
}

impl Renderer<'_> {
    fn err(&self, line: u64, message: impl Into<String>) -> TemplateError {
        TemplateError::at(&self.template.name, line, message)
    }

    /// Whether an item is rendered: its `when:` (if any) renders to `true`, or every item is.
    fn keeps(&mut self, item: &SeqItem) -> Result<bool, TemplateError> {
        match &item.when {
            Some(when) if !self.every_item => Ok(self.text(when)? == "true"),
            _ => Ok(true),
        }
    }

    fn text(&mut self, text: &CompiledText) -> Result<String, TemplateError> {
        if let Some(constant) = text.constant.as_ref().filter(|_| !(self.overridden && text.reads_values)) {
            self.charge(text, constant.fuel, constant.output.len())?;
            return Ok(constant.output.clone());
        }
        let limit = self.output_left.min(MAX_EXPRESSION_OUTPUT);
        let output = self.template.expressions.evaluate(text, self.context.clone(), limit).map_err(|failure| {
            let message = match failure {
                Failure::TooLarge => format!(
                    "rendered output of {:?} is larger than {} bytes",
                    text.source,
                    if limit == MAX_EXPRESSION_OUTPUT { MAX_EXPRESSION_OUTPUT } else { MAX_TEMPLATE_OUTPUT }
                ),
                Failure::OutOfFuel => {
                    format!("{:?} did not finish within {FUEL_PER_EXPRESSION} instructions", text.source)
                }
                Failure::Failed(detail) => format!("{detail} in {:?}", text.source),
                Failure::NotUtf8 => "rendered output is not valid UTF-8".to_owned(),
            };
            self.err(text.line, message)
        })?;
        self.charge(text, output.fuel, output.text.len())?;
        Ok(output.text)
    }

    /// Counts an expression's fuel and output against the template's budgets.
    fn charge(&mut self, text: &CompiledText, fuel: u64, output: usize) -> Result<(), TemplateError> {
        self.fuel_left = self.fuel_left.checked_sub(fuel).ok_or_else(|| {
            self.err(
                text.line,
                format!("the template's expressions did not finish within {FUEL_PER_TEMPLATE} instructions"),
            )
        })?;
        self.output_left = self.output_left.checked_sub(output).ok_or_else(|| {
            self.err(text.line, format!("the template's rendered output is larger than {MAX_TEMPLATE_OUTPUT} bytes"))
        })?;
        Ok(())
    }

    fn piece(&mut self, piece: &Piece) -> Result<Value, TemplateError> {
        Ok(match piece {
            Piece::Literal(v) => v.clone(),
            Piece::Text(text) if self.mask_pod_reads && text.reads_pod => Value::String(POD_DERIVED.to_owned()),
            Piece::Text(text) => Value::String(self.text(text)?),
            Piece::ValueRef { line, path } => lookup_path(self.values, path)
                .cloned()
                .ok_or_else(|| self.err(*line, format!("values.{} is not defined", path.join("."))))?,
            Piece::Seq(items) => Value::Array(self.items(items)?),
            Piece::Map(entries) => Value::Object(
                entries.iter().map(|(k, p)| Ok((k.clone(), self.piece(p)?))).collect::<Result<_, TemplateError>>()?,
            ),
        })
    }

    /// Init containers or sidecars, noting the `position:` of those that have one by name, and
    /// sized from `app` where they say `sizing:` (how, in `sized`).
    fn containers(
        &mut self,
        items: &[SeqItem],
        positions: &mut BTreeMap<String, ContainerPosition>,
        app: &[Value],
        sized: &mut Sized,
    ) -> Result<Vec<Value>, TemplateError> {
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            if !self.keeps(item)? {
                continue;
            }
            let mut rendered = self.piece(&item.piece)?;
            if let Some((line, sizing)) = item.sizing.as_deref() {
                let notes = sizing.apply(&mut rendered, app).map_err(|why| self.err(*line, format!("sizing {why}")))?;
                let name = rendered.get("name").and_then(Value::as_str).unwrap_or_default();
                sized.notes.extend(notes.into_iter().map(|note| (name.to_owned(), note)));
                let fields = sizing.fields().map(|(field, resource)| (name.to_owned(), field, resource.to_owned()));
                sized.fields.extend(fields);
            }
            if let (Some(position), Some(name)) = (item.position, rendered.get("name").and_then(Value::as_str)) {
                positions.insert(name.to_owned(), position);
            }
            out.push(rendered);
        }
        Ok(out)
    }

    /// `appContainers.env`: the items, and the `merge:` of those that have one, by rendered name.
    fn env_items(&mut self, items: &[SeqItem]) -> Result<(Vec<Value>, BTreeMap<String, EnvMerge>), TemplateError> {
        let mut out = Vec::with_capacity(items.len());
        let mut merges = BTreeMap::new();
        for item in items {
            if !self.keeps(item)? {
                continue;
            }
            let rendered = self.piece(&item.piece)?;
            if let (Some(merge), Some(name)) = (&item.merge, rendered.get("name").and_then(Value::as_str)) {
                merges.insert(name.to_owned(), merge.clone());
            }
            out.push(rendered);
        }
        Ok((out, merges))
    }

    /// `appContainers.envFrom`: the sources, and the env var each `keys:` entry names (the
    /// rendered prefix and the key) with its source.
    fn env_from_items(&mut self, items: &[SeqItem]) -> Result<(Vec<Value>, BTreeMap<String, String>), TemplateError> {
        let mut out = Vec::with_capacity(items.len());
        let mut keys = BTreeMap::new();
        for item in items {
            if !self.keeps(item)? {
                continue;
            }
            let rendered = self.piece(&item.piece)?;
            let prefix = rendered.get("prefix").and_then(Value::as_str).unwrap_or_default();
            let source = env_from_key(&rendered).unwrap_or_default();
            for key in &item.keys {
                keys.insert(format!("{prefix}{key}"), source.clone());
            }
            out.push(rendered);
        }
        Ok((out, keys))
    }

    fn items(&mut self, items: &[SeqItem]) -> Result<Vec<Value>, TemplateError> {
        self.items_with_fallbacks(items, &mut Vec::new())
    }

    /// Items of a list; the `fallback:` of each kept image volume that declares one goes to
    /// `fallbacks`.
    fn items_with_fallbacks(
        &mut self,
        items: &[SeqItem],
        fallbacks: &mut Vec<RenderedFallback>,
    ) -> Result<Vec<Value>, TemplateError> {
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            if !self.keeps(item)? {
                continue;
            }
            let rendered = self.piece(&item.piece)?;
            if let Some(fallback) = &item.fallback {
                fallbacks.push(RenderedFallback {
                    volume: rendered.get(VOLUMES.key).and_then(Value::as_str).unwrap_or_default().to_owned(),
                    empty_dir: match &fallback.empty_dir {
                        Some(piece) => match self.piece(piece)? {
                            Value::Null => Value::Object(Default::default()),
                            empty_dir => empty_dir,
                        },
                        None => Value::Object(Default::default()),
                    },
                    init_container: self.piece(&fallback.init_container)?,
                });
            }
            out.push(rendered);
        }
        Ok(out)
    }

    fn string_map(
        &mut self,
        entries: &[(String, Piece)],
        what: &str,
    ) -> Result<BTreeMap<String, String>, TemplateError> {
        entries
            .iter()
            .map(|(key, piece)| {
                let value = match self.piece(piece)? {
                    Value::String(s) => s,
                    Value::Null => String::new(),
                    v @ (Value::Bool(_) | Value::Number(_)) => v.to_string(),
                    other => {
                        let line = match piece {
                            Piece::ValueRef { line, .. } => *line,
                            _ => 0,
                        };
                        return Err(self.err(line, format!("{what}.{key} must render to a string, not {other}")));
                    }
                };
                Ok((key.clone(), value))
            })
            .collect()
    }
}

/// A lazy MiniJinja view of a JSON value: only the parts an expression touches are converted.
#[derive(Debug)]
struct JsonView {
    root: Arc<Value>,
    path: Vec<PathStep>,
}

#[derive(Debug, Clone)]
enum PathStep {
    Key(String),
    Index(usize),
}

impl JsonView {
    fn root(root: Arc<Value>) -> JinjaValue {
        Self::wrap(&root.clone(), root, Vec::new())
    }

    fn node(&self) -> &Value {
        self.path.iter().fold(&*self.root, |v, step| match step {
            PathStep::Key(k) => &v[k.as_str()],
            PathStep::Index(i) => &v[*i],
        })
    }

    fn wrap(node: &Value, root: Arc<Value>, path: Vec<PathStep>) -> JinjaValue {
        match node {
            Value::Null => JinjaValue::from(()),
            Value::Bool(b) => JinjaValue::from(*b),
            Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => JinjaValue::from(i),
                (None, Some(u), _) => JinjaValue::from(u),
                (_, _, Some(f)) => JinjaValue::from(f),
                _ => JinjaValue::from(()),
            },
            Value::String(s) => JinjaValue::from(s.as_str()),
            Value::Array(_) | Value::Object(_) => JinjaValue::from_object(JsonView { root, path }),
        }
    }

    fn child(&self, step: PathStep) -> JinjaValue {
        let mut path = self.path.clone();
        let node = match &step {
            PathStep::Key(k) => &self.node()[k.as_str()],
            PathStep::Index(i) => &self.node()[*i],
        };
        path.push(step);
        Self::wrap(node, self.root.clone(), path)
    }
}

impl Object for JsonView {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        if self.node().is_array() { ObjectRepr::Seq } else { ObjectRepr::Map }
    }

    fn get_value(self: &Arc<Self>, key: &JinjaValue) -> Option<JinjaValue> {
        match self.node() {
            Value::Object(map) => {
                let key = key.as_str()?;
                // `metadata.labels` and `metadata.annotations` read as empty maps when the pod has
                // none, so `pod.metadata.labels.app is defined` works on every pod.
                let is_metadata_map = matches!(self.path.as_slice(), [PathStep::Key(k)] if k == "metadata")
                    && (key == "labels" || key == "annotations");
                match map.get(key) {
                    None | Some(Value::Null) if is_metadata_map => {
                        Some(JinjaValue::from(BTreeMap::<String, String>::new()))
                    }
                    Some(_) => Some(self.child(PathStep::Key(key.to_owned()))),
                    None => None,
                }
            }
            Value::Array(items) => {
                let index = key.as_i64()?;
                let index = if index < 0 { items.len() as i64 + index } else { index };
                usize::try_from(index).ok().filter(|i| *i < items.len()).map(|i| self.child(PathStep::Index(i)))
            }
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        match self.node() {
            Value::Object(map) => Enumerator::Values(map.keys().map(|k| JinjaValue::from(k.as_str())).collect()),
            Value::Array(items) => Enumerator::Seq(items.len()),
            _ => Enumerator::Empty,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kinds::{ANNOTATIONS, LABELS};
    use crate::test_support::template;
    use serde_json::json;

    fn render_for(t: &Template, pod: Value, annotations: &[(&str, &str)]) -> Result<RenderedTemplate, RenderError> {
        let annotations: BTreeMap<String, String> =
            annotations.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        let namespace = NamespaceFacts::known(
            "shop",
            [("team".to_owned(), "payments".to_owned())].into(),
            [("owner".to_owned(), "alice".to_owned())].into(),
        );
        let owner = Workload::of_pod(&pod);
        render(t, &Subject::new(Arc::new(pod), &owner), &annotations, &namespace, VolumeForms::Recorded(&[]))
    }

    fn pod() -> Value {
        json!({
            "metadata": {"name": "web-1", "labels": {"app": "web"}, "annotations": {"note": "hi"}},
            "spec": {"containers": [{"name": "web", "image": "nginx"}, {"name": "sidecar-2", "image": "x"}]},
        })
    }

    const TYPED: &str = r#"
values:
  port: 15001
  ratio: 0.5
  debug: false
  image: envoy:1
  resources: {limits: {memory: 64Mi}}
overridable: [port, ratio, debug, image]
inject:
  sidecars:
    - name: proxy
      image: "{{ values.image }}"
      ports:
        - containerPort: "{{ values.port }}"
      args: ["--ratio={{ values.ratio }}", "--debug={{ values.debug }}", "{{ values.port + 1 }}"]
      env:
        - {name: DEBUG, value: "{{ values.debug | string }}"}
      resources: "{{ values.resources }}"
"#;

    #[test]
    fn a_plain_value_reference_keeps_its_type_and_everything_else_is_a_string() {
        let rendered = render_for(&template("typed", TYPED), pod(), &[]).unwrap();
        let proxy = &rendered.sidecars[0];
        assert_eq!(proxy["ports"][0]["containerPort"], json!(15001));
        assert_eq!(
            proxy["args"],
            json!(["--ratio=0.5", "--debug=false", "15002"]),
            "an expression is not a plain reference"
        );
        assert_eq!(proxy["env"][0]["value"], json!("false"), "a filter makes it text");
        assert_eq!(proxy["resources"], json!({"limits": {"memory": "64Mi"}}), "trusted structure from values");
    }

    #[test]
    fn overrides_take_the_type_of_the_default() {
        let t = template("typed", TYPED);
        // (annotation value for port/ratio/debug/image, expected rendered value or error fragment)
        let ok_cases: &[(&str, &str, Value)] = &[
            ("port", "8080", json!(8080)),
            ("port", "-1", json!(-1)),
            ("ratio", "0.25", json!(0.25)),
            ("ratio", "2", json!(2.0)),
            ("debug", "true", json!(true)),
            ("image", "envoy:2", json!("envoy:2")),
            ("image", "{\"a\": 1}", json!("{\"a\": 1}")),
        ];
        for (value, text, expected) in ok_cases {
            let key = format!("sidecar-injector.io/typed.{value}");
            let rendered = render_for(&t, pod(), &[(&key, text)]).unwrap();
            let proxy = &rendered.sidecars[0];
            let got = match *value {
                "port" => proxy["ports"][0]["containerPort"].clone(),
                "ratio" => {
                    json!(proxy["args"][0].as_str().unwrap().trim_start_matches("--ratio=").parse::<f64>().unwrap())
                }
                "debug" => json!(proxy["env"][0]["value"] == "true"),
                _ => proxy["image"].clone(),
            };
            assert_eq!(&got, expected, "{value}={text}");
        }
        let bad_cases: &[(&str, &str, &str)] = &[
            ("port", "80a", "\"80a\" is not a valid integer"),
            ("port", "1.5", "is not a valid integer"),
            ("ratio", "half", "is not a valid number"),
            ("debug", "yes", "\"yes\" is not a valid boolean"),
        ];
        for (value, text, fragment) in bad_cases {
            let key = format!("sidecar-injector.io/typed.{value}");
            match render_for(&t, pod(), &[(&key, text)]) {
                Err(RenderError::Override(o)) => {
                    assert_eq!(o.annotation, key);
                    assert!(o.message.contains(fragment), "{value}={text}: {}", o.message);
                }
                other => panic!("{value}={text}: expected an override error, got {other:?}"),
            }
        }
    }

    #[test]
    fn overrides_of_values_not_listed_as_overridable_are_ignored_with_a_warning() {
        let t = template(
            "t",
            "values: {image: a, tag: b}\noverridable: [tag]\ninject:\n  labels: {i: \"{{ values.image }}\"}\n",
        );
        let rendered =
            render_for(&t, pod(), &[("sidecar-injector.io/t.image", "evil"), ("sidecar-injector.io/other.image", "x")])
                .unwrap();
        assert_eq!(rendered.map(LABELS)["i"], "a");
        assert_eq!(rendered.warnings.len(), 1, "{:?}", rendered.warnings);
        assert!(
            rendered.warnings[0].code == WarningCode::OverrideIgnored
                && rendered.warnings[0]
                    .message
                    .contains("value \"image\" of template \"t\" is not overridable (overridable: tag)")
        );
    }

    /// The attack Istio had to fix: annotation text with quotes, newlines and YAML must only ever
    /// fill a string, whether it arrives as an override or through an expression.
    #[test]
    fn yaml_in_annotations_never_adds_structure() {
        let attack = "x\"\nprivileged: true\nfoo: \"\n- name: evil\n  image: evil}}{{";
        let t = template(
            "t",
            r#"
values: {tag: "1.0"}
overridable: [tag]
inject:
  labels:
    a: "{{ pod.metadata.annotations['evil'] | default('') }}"
  sidecars:
    - name: s
      image: "repo:{{ values.tag }}"
      args: ["{{ values.tag }}", "{{ pod.metadata.annotations.evil | default('') }}"]
      env:
        - {name: T, value: "{{ values.tag }}"}
"#,
        );
        let mut evil = pod();
        evil["metadata"]["annotations"]["evil"] = json!(attack);
        let clean = render_for(&t, pod(), &[("sidecar-injector.io/t.tag", "2.0")]).unwrap();
        let attacked = render_for(&t, evil, &[("sidecar-injector.io/t.tag", attack)]).unwrap();

        fn shape(v: &Value) -> Value {
            match v {
                Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
                Value::Array(items) => Value::Array(items.iter().map(shape).collect()),
                Value::String(_) => json!("string"),
                other => other.clone(),
            }
        }
        assert_eq!(shape(&json!(attacked.sidecars)), shape(&json!(clean.sidecars)), "no key or item was added");
        assert_eq!(attacked.map(LABELS).keys().collect::<Vec<_>>(), vec!["a"]);
        assert_eq!(attacked.map(LABELS)["a"], attack, "the text is kept verbatim inside the string");
        assert_eq!(attacked.sidecars[0]["env"][0]["value"], json!(attack));
        assert_eq!(attacked.sidecars[0]["image"], json!(format!("repo:{attack}")));
        assert_eq!(attacked.sidecars[0]["args"][1], json!(attack));
        assert!(attacked.sidecars[0].get("privileged").is_none());
    }

    #[test]
    fn pod_structure_renders_as_text_only() {
        let t = template(
            "t",
            "inject:\n  annotations:\n    c: \"{{ pod.spec.containers }}\"\n    n: \"{{ pod.spec.containers | length }}\"\n",
        );
        let rendered = render_for(&t, pod(), &[]).unwrap();
        assert!(
            rendered.map(ANNOTATIONS)["c"].starts_with('['),
            "a list from the pod renders as text: {:?}",
            rendered.map(ANNOTATIONS)["c"]
        );
        assert_eq!(rendered.map(ANNOTATIONS)["n"], "2");
    }

    #[test]
    fn the_context_exposes_pod_namespace_values_and_template() {
        let t = template(
            "ctx",
            r#"
values: {greeting: hello}
inject:
  annotations:
    pod: "{{ pod.metadata.name | default('-') }}/{{ pod.metadata.labels.app }}/{{ pod.spec.containers[0].name }}/{{ pod.spec.containers[-1].name }}"
    ns: "{{ namespace.name }}/{{ namespace.labels['team'] | default('-') }}/{{ namespace.annotations.owner | default('-') }}"
    tpl: "{{ template.name }}: {{ values.greeting }}"
    loop: "{% for c in pod.spec.containers %}{{ c.name }};{% endfor %}"
    keys: "{{ pod.metadata.labels | list | join(',') }}"
    json: "{{ pod.metadata.labels | tojson }}"
"#,
        );
        let rendered = render_for(&t, pod(), &[]).unwrap();
        let a = rendered.map(ANNOTATIONS);
        assert_eq!(a["pod"], "web-1/web/web/sidecar-2");
        assert_eq!(a["ns"], "shop/payments/alice");
        assert_eq!(a["tpl"], "ctx: hello");
        assert_eq!(a["loop"], "web;sidecar-2;");
        assert_eq!(a["keys"], "app");
        assert_eq!(a["json"], r#"{"app": "web"}"#);
    }

    #[test]
    fn when_keeps_or_drops_items() {
        let t = template(
            "t",
            r#"
values: {debug: false}
overridable: [debug]
inject:
  appContainers:
    env:
      - {name: ALWAYS, value: "1"}
      - {name: DEBUG, value: "1", when: "{{ values.debug }}"}
      - {name: APP, value: "{{ pod.metadata.labels.app }}", when: "{{ pod.metadata.labels.app is defined }}"}
      - {name: TIER, value: "x", when: "{{ pod.metadata.labels.tier }}"}
      - {name: NEVER, value: "1", when: false}
"#,
        );
        let names = |r: &RenderedTemplate| {
            r.app_list(ENV).iter().map(|e| e["name"].as_str().unwrap().to_owned()).collect::<Vec<_>>()
        };
        assert_eq!(names(&render_for(&t, pod(), &[]).unwrap()), vec!["ALWAYS", "APP"]);
        assert_eq!(
            names(&render_for(&t, pod(), &[("sidecar-injector.io/t.debug", "true")]).unwrap()),
            vec!["ALWAYS", "DEBUG", "APP"]
        );
        let unlabelled = json!({"metadata": {"name": "x"}, "spec": {"containers": []}});
        assert_eq!(names(&render_for(&t, unlabelled, &[]).unwrap()), vec!["ALWAYS"]);
        assert!(
            render_for(&t, pod(), &[]).unwrap().app_list(ENV).iter().all(|e| e.get("when").is_none()),
            "when is not rendered"
        );
    }

    #[test]
    fn a_template_whose_expressions_together_run_too_long_fails_fast() {
        // An empty loop iteration costs 3 instructions: each expression (45,000) stays under the
        // per-expression fuel, but the twelfth exceeds the template's 500,000.
        let mut text = String::from("inject:\n  annotations:\n");
        for i in 0..40 {
            text.push_str(&format!("    a{i}: \"{{% for i in range(15000) %}}{{% endfor %}}\"\n"));
        }
        let err = Template::load("slow", &text).unwrap_err();
        assert!(err.message.contains("did not finish within 500000 instructions"), "{err}");
    }

    #[test]
    fn a_template_whose_output_adds_up_past_the_cap_fails() {
        let mut text = String::from("inject:\n  annotations:\n");
        for i in 0..20 {
            text.push_str(&format!("    a{i}: \"{{{{ 'x' * 60000 }}}}\"\n"));
        }
        let err = Template::load("big", &text).unwrap_err();
        assert!(err.message.contains("is larger than 1048576 bytes"), "{err}");
    }

    #[test]
    fn templates_are_checked_against_controller_made_pods_and_pod_templates() {
        // Fine for a named pod, but at admission a ReplicaSet's pod has no name: refused at load,
        // with the shape that fails.
        let err = Template::load("named", "inject:\n  labels:\n    owner: \"{{ pod.metadata.name }}\"\n").unwrap_err();
        assert_eq!(err.line, Some(3));
        assert!(err.message.contains("a pod a controller creates") && err.message.contains("no name yet"), "{err}");
        // `default()` on generateName still fails for a workload's pod template.
        let err = Template::load(
            "fallback",
            "inject:\n  annotations:\n    example.com/owner: \"{{ pod.metadata.name | default(pod.metadata.generateName) }}\"\n",
        )
        .unwrap_err();
        assert!(err.message.contains("a workload's pod template"), "{err}");
        // `workload` is defined for every shape and names the owner.
        let t = template("owner", "inject:\n  labels:\n    owner: \"{{ workload.kind }}.{{ workload.name }}\"\n");
        let from_replicaset = json!({"metadata": {"generateName": "web-7d9f8c6b5-", "labels": {"pod-template-hash": "7d9f8c6b5"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web-7d9f8c6b5", "controller": true}]}, "spec": {"containers": []}});
        assert_eq!(render_for(&t, from_replicaset, &[]).unwrap().map(LABELS)["owner"], "Deployment.web");
        let hinted = Workload { kind: "Deployment".into(), name: "web".into() };
        let namespace = NamespaceFacts::unknown("shop");
        let rendered = render(
            &t,
            &Subject::new(Arc::new(json!({"metadata": {}})), &hinted),
            &BTreeMap::new(),
            &namespace,
            VolumeForms::Recorded(&[]),
        );
        assert_eq!(
            rendered.unwrap().map(LABELS)["owner"],
            "Deployment.web",
            "the CLI's pod template renders as its pods will"
        );
    }

    #[test]
    fn expressions_that_read_only_values_are_rendered_once_and_still_follow_overrides() {
        let t = template(
            "pre",
            "values: {port: 1}\noverridable: [port]\ninject:\n  annotations:\n    fixed: \"{{ template.name }}-{{ values.port + 1 }}\"\n    name: \"{{ workload.name }}\"\n    ns: \"{{ namespace.name }}\"\n",
        );
        let constants: BTreeMap<&str, bool> = t.inject.maps[ANNOTATIONS.index]
            .iter()
            .map(|(k, p)| (k.as_str(), matches!(p, Piece::Text(text) if text.constant.is_some())))
            .collect();
        assert_eq!(constants, [("fixed", true), ("name", false), ("ns", false)].into());
        let plain = render_for(&t, pod(), &[]).unwrap();
        assert_eq!(plain.map(ANNOTATIONS)["fixed"], "pre-2");
        assert_eq!((plain.map(ANNOTATIONS)["name"].as_str(), plain.map(ANNOTATIONS)["ns"].as_str()), ("web-1", "shop"));
        let overridden = render_for(&t, pod(), &[(&crate::names::override_annotation("pre", "port"), "41")]).unwrap();
        assert_eq!(overridden.map(ANNOTATIONS)["fixed"], "pre-42", "an override bypasses the pre-rendered output");
    }
}
