//! Loading a template: compiled (`template`), test-rendered for the pod shapes that occur at
//! admission (`render`), its constant expressions rendered once, and its warnings collected.
//!
//! This is the one place that needs both the compiler and the renderer, so neither of them depends
//! on the other.

use std::collections::BTreeMap;
use std::sync::Arc;

use minijinja::Value as JinjaValue;
use serde_json::Value;

use crate::facts::NamespaceFacts;
use crate::injection::image_volumes::{ImageVolumeSupport, VolumeForms};
use crate::injection::ports::{self, Running};
use crate::injection::render::{RenderError, RenderedTemplate, Subject, render, render_every_item};
use crate::model::api_limits;
use crate::model::compare::POD_DERIVED;
use crate::model::conformance::{CHECKED_KUBERNETES_VERSION, conforms};
use crate::model::kinds::{APP_LISTS, AppListKind, CONTAINERS, MAPS, POD_LISTS};
use crate::names;
use crate::templates::compiler;
use crate::templates::template::{self, Template, TemplateError};
use crate::workload::Workload;

impl Template {
    /// Whether the template adds sidecars (whose mode `sidecarMode` decides).
    pub fn has_sidecars(&self) -> bool {
        !self.inject.sidecars.is_empty()
    }

    /// Whether the template adds containers (init containers or sidecars).
    pub fn has_containers(&self) -> bool {
        !self.inject.init_containers.is_empty() || self.has_sidecars()
    }

    /// The template rendered for the first sample shape (a named pod), its image volumes as image
    /// volumes: what `check-templates` describes a template by. `None` where it does not render
    /// (a loaded template always does).
    pub fn sample_rendering(&self) -> Option<RenderedTemplate> {
        sample_rendering(self)
    }

    /// Whether one of its image volumes declares a fallback (whose use the nodes decide).
    pub fn has_volume_fallbacks(&self) -> bool {
        self.inject.pod_lists.iter().flatten().any(|item| item.fallback.is_some())
    }

    /// Parses, compiles and test-renders a template. The error names the template, the line and the
    /// problem.
    pub fn load(name: &str, source: &str) -> Result<Template, TemplateError> {
        let mut template = compiler::compile(name, source)?;
        let port_collisions = check(&template)?;
        prerender(&mut template);
        template.warnings.extend(template::resource_warnings(&template.inject));
        template.warnings.extend(template::position_warnings(&template));
        template.warnings.extend(template::image_volume_warnings(&template));
        template
            .warnings
            .extend(port_collisions.into_iter().map(|c| format!("its sidecars collide in every pod: {c}")));
        if template.enforced || template.audit {
            // Native or classic does not change what can be checked.
            let unchecked = crate::checks::enforce::Requirements::of(&template, true).unchecked;
            template.warnings.extend(unchecked.into_iter().map(|what| {
                format!("enforced: while the injector is down, the enforcement policy checks less: {what}")
            }));
            template.warnings.extend(pod_label_permission(&template));
        }
        Ok(template)
    }
}

/// An enforced template whose `podSelector` reads pod labels lets whoever writes a pod's labels
/// (its author, or a controller's template) decide whether the pod gets it: the labels become a
/// permission to skip the template. Said at load (`check-templates`, the ConfigMap check, the
/// log), naming the labels.
fn pod_label_permission(template: &Template) -> Option<String> {
    let keys = template.pod_selector.as_ref()?.label_keys();
    (!keys.is_empty()).then(|| {
        format!(
            "enforced: its podSelector reads pod labels ({}), which a pod's author writes: a pod created with labels that do not match is not given the template, so these labels are a permission to skip it (once created, a pod cannot change them: the enforcement policy refuses the update); select by namespace instead (namespace labels are the operator's), or keep these labels out of authors' hands (an admission policy of your own)",
            keys.join(", ")
        )
    })
}

/// Renders, once, every expression of `template` that reads neither `pod` nor `namespace`, with its
/// default values, and keeps the result in the compiled text. Called when a template is loaded.
fn prerender(template: &mut Template) {
    let context = JinjaValue::from_pairs([
        ("values", template.expressions.default_values.clone()),
        ("template", JinjaValue::from_pairs([("name", JinjaValue::from(&*template.name))])),
    ]);
    for text in template.inject.texts_mut() {
        template.expressions.precompute(text, &context);
    }
}

/// Renders every template against sample pods and a namespace when it is loaded, so that runtime
/// errors (undefined values, runaway loops, huge output, items Kubernetes would reject) are found
/// before any pod is admitted. The samples are the shapes that occur at admission ([`SAMPLE_SHAPES`]):
/// a template that works for a named pod but fails for the pods controllers create would stop every
/// Deployment from creating pods. Each sample satisfies the template's own selectors, so a template
/// may rely on a label its podSelector requires. Returns the ports the template's own sidecars
/// share (`ports`), as rendered for the first sample.
fn check(template: &Template) -> Result<Vec<String>, TemplateError> {
    let mut port_collisions = None;
    let (pod_labels, namespace) = sample_labels(template);
    // Image volumes as image volumes, and (where a template declares fallbacks) as fallbacks.
    let has_fallbacks = template.has_volume_fallbacks();
    let forms = [VolumeForms::Nodes(ImageVolumeSupport::EVERYWHERE), VolumeForms::Recorded(&[])];
    // Every item, whatever its `when:` says (pod data masked, so an item that reads a label only
    // some pods have still renders): its types and each unknown field, by the template's own
    // numbering. Where that cannot be rendered, the passes below look for unknown fields.
    // Once per form the image volumes take, so that a fallback's init container is checked too.
    let (first_pod, first_workload) = SAMPLE_SHAPES[0].sample(&pod_labels);
    let subject = Subject::new(Arc::new(first_pod), &first_workload);
    let mut unknown_fields = false;
    for forms in forms.iter().take(1 + has_fallbacks as usize) {
        match render_every_item(template, &subject, &namespace, *forms) {
            Ok(rendered) => check_rendered_items(template, &rendered, Pass::EveryItem)?,
            Err(_) => unknown_fields = true,
        }
    }
    let shapes =
        SAMPLE_SHAPES.iter().flat_map(|shape| forms.iter().take(1 + has_fallbacks as usize).map(move |f| (shape, *f)));
    for (shape, forms) in shapes {
        let (pod, workload) = shape.sample(&pod_labels);
        let subject = Subject::new(Arc::new(pod), &workload);
        match render(template, &subject, &BTreeMap::new(), &namespace, forms) {
            Ok(rendered) => {
                check_rendered_items(template, &rendered, Pass::Selected { unknown_fields })
                    .and_then(|()| check_fallbacks(template, &rendered))
                    .map_err(|e| TemplateError {
                        message: format!("{} (for {})", e.message, shape.description),
                        ..e
                    })?;
                port_collisions.get_or_insert_with(|| {
                    let sidecars = rendered.sidecars.iter().map(|container| Running { container, injected: true });
                    ports::collisions(&sidecars.collect::<Vec<_>>(), false).warned
                });
            }
            Err(RenderError::Template(e)) => {
                return Err(TemplateError {
                    message: format!("{} (while test-rendering for {})", e.message, shape.description),
                    ..e
                });
            }
            Err(RenderError::Override(o)) => return Err(TemplateError::at(&template.name, 0, o.message)),
        }
    }
    Ok(port_collisions.unwrap_or_default())
}

/// Pod labels and a namespace that satisfy the template's own selectors, so that a template may
/// rely on a label its podSelector requires.
fn sample_labels(template: &Template) -> (BTreeMap<String, String>, NamespaceFacts) {
    let pod_labels = [("app".to_owned(), "example".to_owned())].into();
    let pod_labels: BTreeMap<String, String> = match &template.pod_selector {
        Some(selector) => selector.satisfying_labels(pod_labels),
        None => pod_labels,
    };
    let namespace_labels = [(names::INJECT_LABEL.to_owned(), names::INJECT_ENABLED.to_owned())].into();
    let namespace_labels = match &template.namespace_selector {
        Some(selector) => selector.satisfying_labels(namespace_labels),
        None => namespace_labels,
    };
    (pod_labels, NamespaceFacts::known("default", namespace_labels, BTreeMap::new()))
}

/// See [`Template::sample_rendering`].
fn sample_rendering(template: &Template) -> Option<RenderedTemplate> {
    let (pod_labels, namespace) = sample_labels(template);
    let (pod, workload) = SAMPLE_SHAPES[0].sample(&pod_labels);
    let subject = Subject::new(Arc::new(pod), &workload);
    let forms = VolumeForms::Nodes(ImageVolumeSupport::EVERYWHERE);
    render(template, &subject, &BTreeMap::new(), &namespace, forms).ok()
}

/// Each fallback injected fills its emptyDir: its init container mounts the volume.
fn check_fallbacks(template: &Template, rendered: &RenderedTemplate) -> Result<(), TemplateError> {
    for choice in &rendered.volume_forms {
        let Some(init) = &choice.fallback else { continue };
        let container = rendered.init_containers.iter().find(|c| c.get("name").and_then(Value::as_str) == Some(init));
        let mounts = container.and_then(|c| c.get("volumeMounts")).and_then(Value::as_array).into_iter().flatten();
        if !mounts.into_iter().any(|m| m.get("name").and_then(Value::as_str) == Some(&choice.volume)) {
            return Err(TemplateError::at(
                &template.name,
                0,
                format!(
                    "inject.volumes: the fallback of image volume {:?}: its initContainer {init:?} does not mount {:?}, so the emptyDir that stands in for the image would stay empty",
                    choice.volume, choice.volume
                ),
            ));
        }
    }
    Ok(())
}

/// A pod shape that templates meet at admission.
pub struct SampleShape {
    /// What it is, for messages.
    pub description: &'static str,
    kind: ShapeKind,
}

enum ShapeKind {
    Named,
    ControllerMade,
    PodTemplate,
}

/// The shapes every template is test-rendered against (`check-templates`, the ConfigMap guard, hot
/// reload): docs/templates.md lists them.
pub const SAMPLE_SHAPES: [SampleShape; 3] = [
    SampleShape { description: "a named pod (metadata.name \"example\")", kind: ShapeKind::Named },
    SampleShape {
        description: "a pod a controller creates (a ReplicaSet's: generateName \"example-7d9f8c6b5-\", no name yet, an owner reference)",
        kind: ShapeKind::ControllerMade,
    },
    SampleShape {
        description: "a workload's pod template (no name, no generateName, no namespace, as `inject -f deployment.yaml` reads it)",
        kind: ShapeKind::PodTemplate,
    },
];

impl SampleShape {
    /// The sample pod of this shape with these labels, and its workload.
    pub fn sample(&self, labels: &BTreeMap<String, String>) -> (Value, Workload) {
        let spec = serde_json::json!({"containers": [{"name": "app", "image": "example:latest"}]});
        let (metadata, workload) = match self.kind {
            ShapeKind::Named => (
                serde_json::json!({"name": "example", "namespace": "default", "labels": labels}),
                Workload { kind: "Pod".into(), name: "example".into() },
            ),
            ShapeKind::ControllerMade => {
                let mut labels = labels.clone();
                labels.insert("pod-template-hash".into(), "7d9f8c6b5".into());
                let metadata = serde_json::json!({
                    "generateName": "example-7d9f8c6b5-", "namespace": "default", "labels": labels,
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "example-7d9f8c6b5",
                        "uid": "00000000-0000-0000-0000-000000000000", "controller": true, "blockOwnerDeletion": true}],
                });
                let pod = serde_json::json!({"metadata": metadata});
                let workload = Workload::of_pod(&pod);
                (metadata, workload)
            }
            ShapeKind::PodTemplate => {
                (serde_json::json!({"labels": labels}), Workload { kind: "Deployment".into(), name: "example".into() })
            }
        };
        (serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}), workload)
    }
}

/// One section of a rendered template, for [`check_rendered`].
struct Section<'r> {
    name: String,
    items: &'r [Value],
    conforms: fn(&Value) -> crate::model::conformance::Checked,
    identified: Identified,
}

/// What must identify each item of a section.
#[derive(Clone, Copy)]
enum Identified {
    /// This field, a non-empty string the API server takes (the rule says what it lacks).
    By(&'static str, fn(&str) -> Option<String>),
    /// The app-list kind's identity (derived, as an `envFrom` source's).
    AsAppItem(&'static AppListKind),
}

/// What one check of a rendering looks at.
#[derive(Clone, Copy)]
enum Pass {
    /// The items a sample pod's `when`s select: types, identities, label values; unknown fields
    /// only when `unknown_fields` (when no [`Pass::EveryItem`] could be made).
    Selected { unknown_fields: bool },
    /// Every item whatever its `when` says, numbered as the template lists them: types and
    /// unknown fields (each one), so that no item goes unchecked and `uncheckedFields` paths do
    /// not depend on the pod.
    EveryItem,
}

/// Checks that rendered items are what Kubernetes accepts in their place (a `Container`, a `Volume`,
/// an `EnvVar`, a `VolumeMount`), with the field path of the first mismatch, and carry a name.
/// Strictly, as `kubectl`'s strict field validation does: a field the type does not have (a
/// misspelt `resourcse:`) is an error, not silently dropped by the API server, unless the template
/// lists its path in `uncheckedFields`.
fn check_rendered_items(template: &Template, rendered: &RenderedTemplate, pass: Pass) -> Result<(), TemplateError> {
    use k8s_openapi::api::core::v1::Container;

    // An init container that runs to completion is never resized: a resize policy says nothing
    // there (and the API server refuses `RestartContainer` on it since 1.36).
    if let Some(index) = rendered.init_containers.iter().position(|c| c.get("resizePolicy").is_some()) {
        return Err(TemplateError::at(
            &template.name,
            0,
            format!(
                "inject.initContainers[{index}].resizePolicy: an init container that runs to completion is never resized in place, so a resize policy means nothing there (the API server refuses RestartContainer on it); only sidecars take a resizePolicy"
            ),
        ));
    }
    // A quantity the API server would refuse (`1.5.0`, `12 Gi`) in every pod; a number is one.
    for (section, containers) in
        [("inject.initContainers", &rendered.init_containers), ("inject.sidecars", &rendered.sidecars)]
    {
        for (index, container) in containers.iter().enumerate() {
            for field in ["requests", "limits"] {
                let entries = container.get("resources").and_then(|r| r.get(field)).and_then(Value::as_object);
                for (resource, value) in entries.into_iter().flatten() {
                    // (Masked pod data in the every-item pass is no value to judge.)
                    if let Some(problem) = crate::quantity::problem(value).filter(|_| value != POD_DERIVED) {
                        let message = format!("{section}[{index}].resources.{field}.{resource}: {problem}");
                        return Err(TemplateError::at(&template.name, 0, message));
                    }
                }
            }
        }
    }
    // (section, items, their type, what must identify each item)
    let section = |name: String, items, conforms, identified| Section { name, items, conforms, identified };
    let containers = [
        section(
            "inject.initContainers".into(),
            &rendered.init_containers,
            conforms::<Container>,
            Identified::By("name", CONTAINERS.identity_problem),
        ),
        section(
            "inject.sidecars".into(),
            &rendered.sidecars,
            conforms::<Container>,
            Identified::By("name", CONTAINERS.identity_problem),
        ),
    ];
    let app_lists = APP_LISTS.iter().map(|kind| {
        let identified = kind
            .required
            .first()
            .map_or(Identified::AsAppItem(kind), |key| Identified::By(key, api_limits::no_problem));
        section(kind.section(), rendered.app_list(kind), kind.conforms, identified)
    });
    let pod_lists = POD_LISTS.iter().map(|kind| {
        section(kind.section(), rendered.pod_list(kind), kind.conforms, Identified::By(kind.key, kind.identity_problem))
    });
    for Section { name: section, items, conforms, identified } in
        containers.into_iter().chain(app_lists).chain(pod_lists)
    {
        for (index, item) in items.iter().enumerate() {
            let fail = |message: String| TemplateError::at(&template.name, 0, format!("{section}[{index}]{message}"));
            let unknown = conforms(item).map_err(|e| fail(format!(" is not valid: {e}")))?;
            if matches!(pass, Pass::EveryItem | Pass::Selected { unknown_fields: true }) {
                // Listed by index (as the template lists its items) or by the item's name.
                let name = item.get("name").and_then(Value::as_str);
                let listed = |field: &String| {
                    let by_name = name.map(|name| format!("{section}[{name}].{field}"));
                    template
                        .unchecked_fields
                        .iter()
                        .any(|u| *u == format!("{section}[{index}].{field}") || Some(u) == by_name.as_ref())
                };
                let unlisted: Vec<&String> = unknown.iter().filter(|field| !listed(field)).collect();
                if !unlisted.is_empty() {
                    let paths: Vec<String> = unlisted.iter().map(|f| format!("{section}[{index}].{f}")).collect();
                    return Err(fail(format!(
                        " is not valid: unknown field{} {} (Kubernetes {CHECKED_KUBERNETES_VERSION} has no such field: the API server would drop it; if it is a field newer than that, list {} in the template's uncheckedFields)",
                        if unlisted.len() > 1 { "s" } else { "" },
                        unlisted.iter().map(|f| format!("{f:?}")).collect::<Vec<_>>().join(", "),
                        paths.iter().map(|p| format!("{p:?}")).collect::<Vec<_>>().join(", "),
                    )));
                }
            }
            if matches!(pass, Pass::EveryItem) {
                continue;
            }
            let unidentified = match identified {
                Identified::By(key, rule) => match item.get(key) {
                    Some(Value::String(s)) if !s.is_empty() => {
                        rule(s).map(|problem| format!(".{key} is {s:?}: {problem}"))
                    }
                    _ => Some(format!(".{key} must render to a non-empty string")),
                },
                Identified::AsAppItem(kind) => kind.identity(item).is_none().then(|| kind.unidentified.to_owned()),
            };
            if let Some(message) = unidentified {
                return Err(fail(message));
            }
        }
    }
    if matches!(pass, Pass::EveryItem) {
        return Ok(());
    }
    // A label value the API server refuses here would leave every such pod uninjected.
    for kind in &MAPS {
        for (key, value) in rendered.map(kind) {
            if let Some(problem) = (kind.value_problem)(value) {
                let message = format!("{}.{key} is {value:?}: {problem}", kind.section);
                return Err(TemplateError::at(&template.name, 0, message));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::template;

    #[test]
    fn rendered_items_must_be_what_kubernetes_accepts() {
        let cases = [
            (
                "values: {port: 80}\ninject:\n  sidecars:\n    - {name: s, ports: [{containerPort: \"{{ values.port }}x\"}]}\n",
                "inject.sidecars[0] is not valid: ports[0].containerPort: invalid type: string \"80x\", expected i32",
            ),
            (
                "values: {on: true}\ninject:\n  appContainers:\n    env:\n      - {name: E, value: \"{{ values.on }}\"}\n",
                "inject.appContainers.env[0] is not valid: value: invalid type: boolean `true`, expected a string",
            ),
            (
                "inject:\n  volumes:\n    - {name: v, emptyDir: []}\n",
                "inject.volumes[0] is not valid: emptyDir: invalid type: sequence",
            ),
            // What the API server would refuse in every pod of a shape: such pods would all be
            // left uninjected (`api_limits`).
            (
                "inject:\n  labels:\n    owner: \"{{ pod.metadata.generateName | default('pod') }}\"\n",
                "inject.labels.owner is \"example-7d9f8c6b5-\": a valid label must be an empty string or consist of alphanumeric characters",
            ),
            (
                "inject:\n  sidecars:\n    - {name: s, image: i, resources: {limits: {cpu: 1, memory: 12 Gi}}}\n",
                "inject.sidecars[0].resources.limits.memory: \"12 Gi\" is not a quantity",
            ),
            (
                "inject:\n  initContainers:\n    - {name: s, image: i, resources: {requests: {cpu: 1.5.0}}}\n",
                "inject.initContainers[0].resources.requests.cpu: \"1.5.0\" is not a quantity",
            ),
            (
                "inject:\n  sidecars:\n    - {name: Agent, image: i}\n",
                "inject.sidecars[0].name is \"Agent\": a lowercase RFC 1123 label",
            ),
            (
                "inject:\n  initContainers:\n    - {name: setup, image: i, resizePolicy: [{resourceName: cpu, restartPolicy: NotRequired}]}\n",
                "inject.initContainers[0].resizePolicy: an init container that runs to completion is never resized in place",
            ),
            (
                "inject:\n  hostAliases:\n    - {ip: db.internal, hostnames: [db]}\n",
                "inject.hostAliases[0].ip is \"db.internal\": must be a valid IP address",
            ),
        ];
        for (text, fragment) in cases {
            let err = Template::load("k8s", text).unwrap_err();
            assert!(err.message.contains(fragment), "expected {fragment:?} in {err}");
        }
    }

    #[test]
    fn an_enforced_template_selecting_on_pod_labels_says_they_are_a_permission() {
        let sidecar = "inject:\n  sidecars:\n    - {name: s, image: i}\n";
        let warned = |head: &str| {
            let template = Template::load("t", &format!("{head}{sidecar}")).unwrap();
            template.warnings.into_iter().find(|w| w.contains("a permission to skip it"))
        };
        let labels = "enforced: true\npodSelector:\n  matchLabels: {tier: prod}\n  matchExpressions: [{key: skip, operator: DoesNotExist}]\n";
        let warning = warned(labels).expect("a warning");
        assert!(warning.contains("reads pod labels (skip, tier)"), "{warning}");
        assert!(warned(&labels.replace("enforced: true", "enforced: audit")).is_some());
        assert_eq!(warned(&labels.replace("enforced: true", "default: true")), None, "not enforced");
        assert_eq!(warned("enforced: true\nnamespaceSelector: {matchLabels: {env: prod}}\n"), None, "namespace labels");
    }

    #[test]
    fn a_field_the_kubernetes_type_does_not_have_is_an_error_unless_listed() {
        let cases = [
            // A misspelt field of a sidecar: the API server would drop it, and the limits with it.
            (
                "inject:\n  sidecars:\n    - name: s\n      image: i\n      resourcse: {limits: {memory: 64Mi}}\n",
                "inject.sidecars[0] is not valid: unknown field \"resourcse\"",
            ),
            // Deep inside an item, in a list.
            (
                "inject:\n  initContainers:\n    - name: s\n      image: i\n      ports: [{containerPort: 80}, {containerPort: 81, protocl: TCP}]\n",
                "inject.initContainers[0] is not valid: unknown field \"ports[1].protocl\"",
            ),
            (
                "inject:\n  volumes:\n    - {name: v, emptyDir: {sizeLimt: 1Gi}}\n",
                "inject.volumes[0] is not valid: unknown field \"emptyDir.sizeLimt\"",
            ),
            (
                "inject:\n  appContainers:\n    env:\n      - {name: E, valu: x}\n",
                "inject.appContainers.env[0] is not valid: unknown field \"valu\"",
            ),
            (
                "inject:\n  appContainers:\n    envFrom:\n      - {configMapRef: {name: c}, prefx: P_}\n",
                "inject.appContainers.envFrom[0] is not valid: unknown field \"prefx\"",
            ),
            (
                "inject:\n  appContainers:\n    volumeMounts:\n      - {name: v, mountPath: /v, readonly: true}\n",
                "inject.appContainers.volumeMounts[0] is not valid: unknown field \"readonly\"",
            ),
            (
                "inject:\n  imagePullSecrets:\n    - {name: r, namespace: x}\n",
                "inject.imagePullSecrets[0] is not valid: unknown field \"namespace\"",
            ),
        ];
        for (text, fragment) in cases {
            let err = Template::load("strict", text).unwrap_err();
            assert!(err.message.contains(fragment), "expected {fragment:?} in {err}");
            assert!(err.message.contains("uncheckedFields"), "the way through is named: {err}");
        }
        // Known fields, nulls and every shape of a well-formed item pass.
        template(
            "known",
            "inject:\n  sidecars:\n    - name: s\n      image: i\n      command: null\n      resources: {limits: {memory: 64Mi}, requests: {cpu: 10m}}\n      ports: [{containerPort: 80, protocol: TCP}]\n      securityContext: {runAsNonRoot: true, capabilities: {drop: [ALL]}}\n      env: [{name: A, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]\n",
        );
        // A field newer than the types, listed by the path the error names: passed through.
        let newer = "uncheckedFields: [\"inject.sidecars[0].fromTheFuture\"]\ninject:\n  sidecars:\n    - name: s\n      image: i\n      fromTheFuture: [{action: Restart}]\n";
        template("newer", newer);
        // Listing one path does not let another through.
        let err = Template::load("newer", &newer.replace("fromTheFuture: [", "fromTheFuturz: [")).unwrap_err();
        assert!(err.message.contains("unknown field \"fromTheFuturz\""), "{err}");
    }

    /// Issue 58 part 4: an item behind a `when:` that no sample pod selects is checked all the
    /// same; every unknown field of an item is reported; and `uncheckedFields` paths number items
    /// as the template lists them (or name them), whatever `when` drops for a pod.
    #[test]
    fn every_item_is_checked_whatever_when_decides() {
        let guarded = |item: &str| {
            format!(
                "inject:\n  sidecars:\n    - name: canary\n      image: i\n      when: \"{{{{ pod.metadata.labels.canary is defined }}}}\"\n{item}\n    - name: agent\n      image: i\n      when: \"{{{{ pod.metadata.labels.agent is defined }}}}\"\n      resourcse: {{}}\n      fromTheFuture: 1\n"
            )
        };
        // (the template, what its load says)
        let cases = [
            (guarded("      resourcse: {limits: {cpu: 1}}"), "inject.sidecars[0] is not valid: unknown field \"resourcse\""),
            (
                format!("uncheckedFields: [\"inject.sidecars[1].fromTheFuture\"]\n{}", guarded("      args: [x]")),
                "inject.sidecars[1] is not valid: unknown field \"resourcse\"",
            ),
            (
                format!("uncheckedFields: [\"inject.sidecars[1].resourcse\"]\n{}", guarded("      args: [x]")),
                "inject.sidecars[1] is not valid: unknown field \"fromTheFuture\"",
            ),
            (
                "inject:\n  initContainers:\n    - name: setup\n      image: i\n      when: \"{{ pod.metadata.labels.never is defined }}\"\n      resizePolicy: [{resourceName: cpu, restartPolicy: NotRequired}]\n".to_owned(),
                "inject.initContainers[0].resizePolicy: an init container that runs to completion is never resized",
            ),
        ];
        for (text, fragment) in cases {
            let err = Template::load("guarded", &text).unwrap_err();
            assert!(err.message.contains(fragment), "expected {fragment:?} in {err}");
        }
        let both = guarded("      args: [x]");
        let err = Template::load("guarded", &both).unwrap_err();
        assert!(err.message.contains("unknown fields \"fromTheFuture\", \"resourcse\""), "{err}");
        // Listed by the template's own index, or by the item's name: loads.
        for listed in ["inject.sidecars[1]", "inject.sidecars[agent]"] {
            let text = format!("uncheckedFields: [\"{listed}.resourcse\", \"{listed}.fromTheFuture\"]\n{both}");
            template("guarded", &text);
        }
    }

    #[test]
    fn the_sample_pod_satisfies_the_templates_selectors() {
        // The podSelector guarantees the `team` label, so reading it without a default is fine...
        template(
            "team",
            "podSelector:\n  matchExpressions:\n    - {key: team, operator: Exists}\n    - {key: tier, operator: In, values: [web]}\nnamespaceSelector: {matchLabels: {env: prod}}\ninject:\n  labels:\n    t: \"{{ pod.metadata.labels.team }}-{{ pod.metadata.labels.tier }}-{{ namespace.labels.env }}\"\n",
        );
        // ...and without that guarantee it is an error found at load time, not at admission.
        let err =
            Template::load("team", "inject:\n  labels:\n    t: \"{{ pod.metadata.labels.team }}\"\n").unwrap_err();
        assert!(err.message.contains("undefined value") && err.message.contains("while test-rendering for"), "{err}");
    }
}
