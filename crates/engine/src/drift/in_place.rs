//! In-place updates (`drift --in-place`): a stale pod brought to the template versions in service
//! by an update of the pod itself, when what changed between the version it was injected with and
//! the one in service is, for this pod, only the images of injected containers. An image is the
//! one container field a running pod's update may change, and the kubelet restarts only the
//! containers whose image changed (a run-to-completion init container is not run again: since
//! Kubernetes 1.20 its new image serves the pod's next start), so the app keeps running.
//!
//! The update is decided from what the pod proves, like every re-injection (`ownership`): the
//! version the pod names must render, for this pod without its injected items, what the pod
//! holds. That version is the one this engine remembers (`TemplateSet::version`), or, when it is
//! not remembered (the offline CLI knows only the ConfigMap's text), the version in service with
//! its images put back to the pod's: rebuilt from the template's text and accepted only when its
//! content hash is the one the pod names, so the pod cannot make it up. Both renderings must then
//! be equal but for the containers' images; anything else (an argument, a volume, a label, the
//! sidecar mode) is left to a restart, and the refusal says which.
//!
//! One function serves the CLI, which writes the update, and `/validate`, which accepts a pod
//! UPDATE of injected images or of the status annotation only when it is exactly this update.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::claims::versions::{self, image_of};
use crate::claims::{ownership, strip::strip_injection};
use crate::drift::{PodDrift, classify};
use crate::injection::image_volumes::VolumeForms;
use crate::injection::render::{self, RenderedTemplate, Subject};
use crate::model::compare::first_difference;
use crate::model::kinds::CONTAINER_LISTS;
use crate::model::status::InjectionStatus;
use crate::templates::template::Template;
use crate::{Engine, PodRequest, names, pod, workload::Workload};

/// The update that brings a stale pod to the template versions in service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InPlaceUpdate {
    /// The injected containers whose image changes, in the pod's order (none when the new
    /// versions render for this pod exactly what the old ones did).
    pub images: Vec<ImageChange>,
    /// The status annotation before the update.
    pub old_status: String,
    /// The status annotation after it: the pod's, naming the versions in service.
    pub status: String,
}

/// One injected container's new image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageChange {
    /// The container.
    pub container: String,
    /// Its list (`containers` or `initContainers`).
    pub list: &'static str,
    /// Its index there.
    pub index: usize,
    /// Its image in the pod (`None`: it has none).
    pub from: Option<String>,
    /// The image the version in service gives it.
    pub to: String,
}

impl InPlaceUpdate {
    /// The JSON patch of the update. It first tests every value it replaces, so that a pod changed
    /// since it was read is refused by the API server rather than overwritten.
    pub fn patch(&self) -> json_patch::Patch {
        let status =
            format!("/metadata/annotations/{}", names::STATUS_ANNOTATION.replace('~', "~0").replace('/', "~1"));
        let mut operations = vec![
            json!({"op": "test", "path": status, "value": self.old_status}),
            json!({"op": "replace", "path": status, "value": self.status}),
        ];
        for change in &self.images {
            let at = format!("/spec/{}/{}", change.list, change.index);
            operations.push(json!({"op": "test", "path": format!("{at}/name"), "value": change.container}));
            if let Some(from) = &change.from {
                operations.push(json!({"op": "test", "path": format!("{at}/image"), "value": from}));
            }
            operations.push(json!({"op": "add", "path": format!("{at}/image"), "value": change.to}));
        }
        serde_json::from_value(Value::Array(operations)).expect("the operations are well-formed")
    }

    /// One line for people: `proxy: proxy:1.0 → proxy:1.1, ...`.
    pub fn describe(&self) -> String {
        if self.images.is_empty() {
            return "no image changes (only the status annotation)".to_owned();
        }
        let changes: Vec<String> = self
            .images
            .iter()
            .map(|c| format!("{}: {} → {}", c.container, c.from.as_deref().unwrap_or("none"), c.to))
            .collect();
        changes.join(", ")
    }
}

/// For a stale pod (see `drift::classify`), its in-place update or why it has none; `None` for any
/// other pod.
pub fn for_stale(engine: &Engine, request: &PodRequest) -> Option<Result<InPlaceUpdate, String>> {
    let pod = &*request.pod;
    // Most pods `inject` and `explain` read were never injected: no claim, nothing to classify.
    pod.get("metadata")?.get("annotations")?.get(names::STATUS_ANNOTATION)?;
    let (labels, annotations) = (pod::string_map(pod, "labels").ok()?, pod::string_map(pod, "annotations").ok()?);
    match classify(engine, &labels, &annotations, &request.namespace) {
        PodDrift::Stale { .. } => Some(in_place_update(engine, request)),
        _ => None,
    }
}

/// The in-place update of a pod, or why it has none (a sentence).
pub fn in_place_update(engine: &Engine, request: &PodRequest) -> Result<InPlaceUpdate, String> {
    let pod = &*request.pod;
    let (labels, annotations) = match (pod::string_map(pod, "labels"), pod::string_map(pod, "annotations")) {
        (Ok(l), Ok(a)) => (l, a),
        (Err(e), _) | (_, Err(e)) => return Err(format!("the pod is malformed: {e}")),
    };
    let stale = match classify(engine, &labels, &annotations, &request.namespace) {
        PodDrift::Stale { templates } => templates,
        PodDrift::NotInjected { .. } => return Err("it was never injected: only a new pod can be".to_owned()),
        PodDrift::Current | PodDrift::Conflicts { .. } | PodDrift::EnforcementAudit { .. } => {
            return Err("it has the template versions in service".to_owned());
        }
        PodDrift::OutOfScope => return Err("it is not in the injector's scope".to_owned()),
    };
    for template in &stale {
        match (&template.injected, &template.current) {
            (Some(_), Some(_)) => {}
            (None, _) => {
                return Err(format!(
                    "template {} applies to it now, and a running pod cannot be given one",
                    template.name
                ));
            }
            (_, None) => {
                return Err(format!(
                    "template {} no longer applies to it, and a running pod cannot lose one",
                    template.name
                ));
            }
        }
    }
    let old_status = annotations.get(names::STATUS_ANNOTATION).cloned().unwrap_or_default();
    let claim = InjectionStatus::parse(&old_status).map_err(|e| format!("its status annotation is not valid: {e}"))?;
    let base = Arc::new(strip_injection(pod, &claim));
    let base_annotations = pod::string_map(&base, "annotations").unwrap_or_default();
    let owner = request.workload.clone().unwrap_or_else(|| Workload::of_pod(pod));
    let render = |template: &Template| {
        // Volumes cannot change on a running pod: both versions in the forms it was given.
        let forms = VolumeForms::Recorded(&claim.image_volumes);
        render::render(template, &Subject::new(base.clone(), &owner), &base_annotations, &request.namespace, forms)
            .map_err(|e| format!("template {} does not render for it: {e}", template.name))
    };

    // The claimed versions as they render for the pod (for the proof), and the new ones.
    let mut claimed = Vec::with_capacity(claim.templates.len());
    let mut new = Vec::with_capacity(stale.len());
    for (reference, first) in claim.templates.iter().zip(versions::first_of_each_name(&claim)) {
        if !first {
            return Err(format!("its status annotation names template {} more than once", reference.name));
        }
        let Some(target) = stale.iter().find(|s| s.name == reference.name).and_then(|s| s.current.as_deref()) else {
            claimed.push(engine.templates.version(&reference.name, &reference.hash).and_then(|t| render(t).ok()));
            continue;
        };
        // The version `classify` names, which is not always the one in service: while a rollout
        // is halted (or at share 0) pods go back to the version it rolls from.
        let current = engine
            .templates
            .version(&reference.name, target)
            .ok_or_else(|| format!("template {} version {target} is not known here", reference.name))?;
        let rendered_now = render(current)?;
        let version = versions::claimed_version(&engine.templates, reference, pod, &claim, |_| Some(&rendered_now))
            .ok_or_else(|| {
                    format!(
                        "template {} changed more than images since the version it was injected with ({}), or that version is not known here: its containers cannot be proven the injector's",
                        reference.name, reference.hash
                    )
            })?;
        let rendered_then = render(&version)?;
        if let Some(difference) = change_beyond_images(&version, &rendered_then, current, &rendered_now) {
            return Err(format!(
                "template {} changed more than images for it ({} → {}): {difference}",
                reference.name, reference.hash, current.hash
            ));
        }
        claimed.push(Some(rendered_then));
        new.push((reference.name.as_str(), rendered_now));
    }
    let claimed_renderings: Vec<Option<&RenderedTemplate>> = claimed.iter().map(Option::as_ref).collect();
    let assessed = ownership::assess(pod, &claim, &claimed_renderings, ownership::Moment::Running);
    if let Some(reason) = assessed.altered.first().or(assessed.doubts.first()) {
        return Err(reason.clone());
    }

    let mut images = Vec::new();
    for list in &CONTAINER_LISTS {
        let containers = pod::list(pod, list.field).ok().flatten().map(Vec::as_slice).unwrap_or_default();
        for (index, container) in containers.iter().enumerate() {
            let Some(name) = container.get("name").and_then(Value::as_str) else { continue };
            if !(list.claimed)(&claim).iter().any(|n| n == name) {
                continue;
            }
            // The template that injected it: the first claimed one that renders it and did not
            // skip it; its new version's image, when it is stale.
            let owner = claim.templates.iter().zip(&claimed).find_map(|(reference, rendered)| {
                let renders = rendered.as_ref().is_some_and(|r| versions::container_in(r, name).is_some());
                (renders && versions::injected_by(&claim, &reference.name, name)).then_some(reference.name.as_str())
            });
            let to = new.iter().filter(|(template, _)| Some(*template) == owner).find_map(|(_, r)| image_of(r, name));
            let from = container.get("image").and_then(Value::as_str);
            if let Some(to) = to.filter(|to| Some(*to) != from) {
                images.push(ImageChange {
                    container: name.to_owned(),
                    list: list.field,
                    index,
                    from: from.map(str::to_owned),
                    to: to.to_owned(),
                });
            }
        }
    }
    let mut status = claim.clone();
    for reference in &mut status.templates {
        if let Some(current) = stale.iter().find(|s| s.name == reference.name).and_then(|s| s.current.clone()) {
            reference.hash = current;
        }
    }
    Ok(InPlaceUpdate { images, old_status, status: status.to_annotation() })
}

/// What differs between two versions' renderings for one pod besides their containers' images,
/// and between the template settings that decide how a rendering is placed; `None` when nothing.
fn change_beyond_images(
    then: &Template,
    rendered_then: &RenderedTemplate,
    now: &Template,
    rendered_now: &RenderedTemplate,
) -> Option<String> {
    if then.sidecar_mode != now.sidecar_mode {
        return Some("its sidecarMode changed".to_owned());
    }
    if then.pod_resources != now.pod_resources {
        return Some("its podResources changed".to_owned());
    }
    // A fallback's init container ran when the pod started and does not run again: its files in
    // the emptyDir would stay the old image's under a status naming the new one.
    for choice in &rendered_now.volume_forms {
        let Some(init) = &choice.fallback else { continue };
        if image_of(rendered_then, init) != image_of(rendered_now, init) {
            return Some(format!(
                "volume {} is its fallback, filled by init container {init:?} when the pod starts, which a new image does not run again",
                choice.volume
            ));
        }
    }
    let without_images = |rendered: &RenderedTemplate| {
        let mut rendered = RenderedTemplate {
            hash: String::new(),
            warnings: Vec::new(),
            value_sources: Vec::new(),
            sized: Vec::new(),
            ..rendered.clone()
        };
        for container in rendered.init_containers.iter_mut().chain(&mut rendered.sidecars) {
            if let Value::Object(fields) = container {
                fields.remove("image");
            }
        }
        rendered
    };
    let (then, now) = (without_images(rendered_then), without_images(rendered_now));
    if then == now {
        return None;
    }
    for (what, before, after) in
        [("init container", &then.init_containers, &now.init_containers), ("sidecar", &then.sidecars, &now.sidecars)]
    {
        let named = |list: &Vec<Value>| -> BTreeMap<String, Value> {
            list.iter()
                .map(|c| (c.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(), c.clone()))
                .collect()
        };
        let (before, after) = (named(before), named(after));
        for (name, container) in &after {
            match before.get(name) {
                None => return Some(format!("it adds {what} {name:?}")),
                Some(old) => {
                    let difference = first_difference(container, old).or_else(|| first_difference(old, container));
                    if let Some(difference) = difference.filter(|_| old != container) {
                        return Some(format!("{what} {name:?}: {difference}"));
                    }
                    if old != container {
                        return Some(format!("{what} {name:?} changed"));
                    }
                }
            }
        }
        if let Some(name) = before.keys().find(|n| !after.contains_key(*n)) {
            return Some(format!("it no longer adds {what} {name:?}"));
        }
    }
    if then.positions != now.positions {
        return Some("the position of its containers changed".to_owned());
    }
    Some(
        "what it adds besides containers changed (volumes, labels, annotations, or the app containers' env and mounts)"
            .to_owned(),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::injection::image_volumes::ImageVolumeSupport;
    use crate::review::validate::{Verdict, validate_pod, validate_pod_update};
    use crate::test_support::{apply, engine, opted_in, request};
    use crate::{Outcome, TemplateSet, TemplateSource};

    /// A mesh-like template: an init container and a native sidecar from one image value, a
    /// classic-looking log shipper whose tag is a YAML number, a volume and a label.
    fn mesh(image: &str, tag: &str, proxy_args: &str, extra: &str) -> String {
        format!(
            r#"default: true
sidecarMode: native
values: {{image: "{image}", logsTag: {tag}}}
inject:
  labels: {{mesh.example.com/proxy: "on"}}
  initContainers:
    - {{name: mesh-init, image: "{{{{ values.image }}}}", args: [iptables]}}
  sidecars:
    - {{name: proxy, image: "{{{{ values.image }}}}", args: [{proxy_args}]}}
    - {{name: logs, image: "registry.example/logs:{{{{ values.logsTag }}}}-alpine"}}
  volumes:
    - {{name: mesh-certs, emptyDir: {{}}}}
{extra}"#
        )
    }

    fn app() -> Value {
        json!({
            "metadata": {"generateName": "web-", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]}
        })
    }

    /// The pod as the API server stores it after injection with `text`: with the fields it
    /// defaults on every container.
    fn stored(text: &str) -> Value {
        let engine = engine(&[("mesh", text)]);
        let Outcome::Inject(injection) = engine.evaluate(&request(app(), opted_in("shop", &[]))).outcome else {
            panic!("not injected")
        };
        let mut pod = apply(&app(), &injection.patch);
        pod["metadata"]["name"] = json!("web-x7k2p");
        for list in ["initContainers", "containers"] {
            for container in pod["spec"][list].as_array_mut().unwrap() {
                container["terminationMessagePath"] = json!("/dev/termination-log");
                container["imagePullPolicy"] = json!("IfNotPresent");
            }
        }
        pod
    }

    /// The engine of a replica that served `before` and then `after`.
    fn replica(before: &str, after: &str) -> Engine {
        let source = |text: &str| [TemplateSource { name: "mesh".into(), text: text.to_owned() }];
        let (served, _) = TemplateSet::load(source(before));
        let (served, errors) = served.update(source(after), &crate::templates::set::InProcess);
        assert!(errors.is_empty(), "{errors:?}");
        Engine::new(served, vec![])
    }

    fn update(engine: &Engine, pod: &Value) -> Result<InPlaceUpdate, String> {
        in_place_update(engine, &request(pod.clone(), opted_in("shop", &[])))
    }

    #[test]
    fn an_image_only_change_is_made_in_place_and_leaves_the_pod_current() {
        let before = mesh("proxy:1.0", "2.1", "run", "");
        let pod = stored(&before);
        /// (case, new text, the images expected to change: container, from, to)
        type Case = (&'static str, String, &'static [(&'static str, &'static str, &'static str)]);
        let cases: [Case; 3] = [
            (
                "an image value (whole images put back)",
                mesh("proxy:1.1", "2.1", "run", ""),
                &[("mesh-init", "proxy:1.0", "proxy:1.1"), ("proxy", "proxy:1.0", "proxy:1.1")],
            ),
            (
                "a tag written as a YAML number (the differing part put back)",
                mesh("proxy:1.0", "2.2", "run", ""),
                &[("logs", "registry.example/logs:2.1-alpine", "registry.example/logs:2.2-alpine")],
            ),
            (
                "a digest",
                mesh("proxy@sha256:0123456789abcdef", "2.1", "run", ""),
                &[
                    ("mesh-init", "proxy:1.0", "proxy@sha256:0123456789abcdef"),
                    ("proxy", "proxy:1.0", "proxy@sha256:0123456789abcdef"),
                ],
            ),
        ];
        for (case, after, expected) in cases {
            // The CLI's engine knows only the text in service: the pod's version is rebuilt.
            let now = engine(&[("mesh", &after)]);
            let update = update(&now, &pod).unwrap_or_else(|e| panic!("{case}: {e}"));
            let changed: Vec<(&str, &str, &str)> = update
                .images
                .iter()
                .map(|c| (c.container.as_str(), c.from.as_deref().unwrap(), c.to.as_str()))
                .collect();
            assert_eq!(changed, expected, "{case}");
            let updated = apply(&pod, &update.patch());
            // Only images and the status annotation changed.
            let changes = json_patch::diff(&pod, &updated);
            for change in changes.iter() {
                let path = change.path().to_string();
                assert!(path.ends_with("/image") || path.ends_with("sidecar-injector.io~1status"), "{case}: {path}");
            }
            // The pod is now exactly what the versions in service inject, by every check.
            let checked = request(updated.clone(), opted_in("shop", &[]));
            assert!(matches!(now.evaluate(&checked).outcome, Outcome::UpToDate(_)), "{case}: re-admission");
            assert_eq!(validate_pod(&now, &checked), Verdict::Allowed(Vec::new()), "{case}: /validate");
            assert_eq!(
                validate_pod_update(&now, &pod, &checked).verdict,
                Verdict::Allowed(Vec::new()),
                "{case}: UPDATE"
            );
            let labels = crate::pod::string_map(&updated, "labels").unwrap();
            let annotations = crate::pod::string_map(&updated, "annotations").unwrap();
            assert_eq!(classify(&now, &labels, &annotations, &opted_in("shop", &[])), PodDrift::Current, "{case}");
            // Its status is the one a new pod gets.
            let Outcome::Inject(fresh) = now.evaluate(&request(app(), opted_in("shop", &[]))).outcome else { panic!() };
            assert_eq!(update.status, fresh.status.to_annotation(), "{case}: status");
            // A patch made for this pod does not apply to one changed since.
            let mut changed_since = pod.clone();
            let first = &update.images[0];
            changed_since["spec"][first.list][first.index]["image"] = json!("other:1");
            let mut target = changed_since.clone();
            assert!(json_patch::patch(&mut target, &update.patch()).is_err(), "{case}: a stale patch");
        }
    }

    #[test]
    fn anything_else_is_left_to_a_restart_saying_why() {
        let before = mesh("proxy:1.0", "2.1", "run", "");
        let pod = stored(&before);
        let cases = [
            ("an argument", mesh("proxy:1.1", "2.1", "run, --debug", ""), "sidecar \"proxy\": args"),
            ("a volume", mesh("proxy:1.1", "2.1", "run", "    - {name: more, emptyDir: {}}\n"), "besides containers"),
            ("a label", mesh("proxy:1.1", "2.1", "run", "").replace("\"on\"", "\"yes\""), "besides containers"),
            (
                "the sidecar mode",
                mesh("proxy:1.1", "2.1", "run", "").replace("sidecarMode: native", "sidecarMode: container"),
                "sidecarMode",
            ),
        ];
        for (case, after, reason) in cases {
            // A replica that served the pod's version remembers it and names the change.
            let replica = replica(&before, &after);
            match update(&replica, &pod) {
                Ok(update) => panic!("{case}: in place: {}", update.describe()),
                Err(why) => assert!(why.contains(reason), "{case}: {why}"),
            }
            // The CLI knows only the text in service.
            let why = update(&engine(&[("mesh", &after)]), &pod).unwrap_err();
            assert!(why.contains("changed more than images since the version"), "{case}: {why}");
        }
        // An image whose value was renamed: the text in service with the old image is not the
        // pod's version, but a replica that remembers it proves it.
        let renamed = mesh("proxy:1.1", "2.1", "run", "")
            .replace("values: {image:", "values: {img:")
            .replace("values.image", "values.img");
        assert!(update(&engine(&[("mesh", &renamed)]), &pod).is_err());
        assert_eq!(update(&replica(&before, &renamed), &pod).unwrap().images.len(), 2);

        let now = engine(&[("mesh", &mesh("proxy:1.1", "2.1", "run", ""))]);
        // A container the author changed is not the template's: its image is not rewritten.
        let mut edited = pod.clone();
        edited["spec"]["initContainers"][1]["args"] = json!(["run", "--mine"]);
        assert!(update(&now, &edited).unwrap_err().contains("\"proxy\""));
        // A pod that is current has nothing to update.
        assert!(update(&engine(&[("mesh", &before)]), &pod).unwrap_err().contains("versions in service"));
        // A template that applies now cannot be added to a running pod.
        let more = engine(&[("mesh", &before), ("more", "default: true\ninject:\n  labels: {more: \"1\"}\n")]);
        assert!(update(&more, &pod).unwrap_err().contains("template more applies to it now"));
    }

    #[test]
    fn an_agent_delivered_by_a_volume_is_not_upgraded_in_place() {
        let template = |image: &str| {
            format!(
                "default: true\nvalues: {{image: \"{image}\"}}\ninject:\n  sidecars:\n    - {{name: agent, image: \"{{{{ values.image }}}}\"}}\n  volumes:\n    - name: agent-files\n      image: {{reference: \"{{{{ values.image }}}}\"}}\n      fallback:\n        initContainer: {{name: copy, image: \"{{{{ values.image }}}}\", volumeMounts: [{{name: agent-files, mountPath: /c}}]}}\n"
            )
        };
        let then = engine(&[("agent", &template("agent:1"))]);
        let now = engine(&[("agent", &template("agent:2"))]);
        // (image volumes where the pod was injected, why no update in place)
        let cases = [(true, "besides containers"), (false, "filled by init container \"copy\" when the pod starts")];
        for (image_volumes, reason) in cases {
            let support = match image_volumes {
                true => ImageVolumeSupport::EVERYWHERE,
                false => ImageVolumeSupport::of_api_server(Some((1, 34))),
            };
            let injected = |engine: &Engine| {
                let cluster = crate::ClusterFacts { image_volumes: support, ..crate::ClusterFacts::api_server(true) };
                let request = PodRequest { cluster, ..request(app(), opted_in("shop", &[])) };
                let Outcome::Inject(injection) = engine.evaluate(&request).outcome else { panic!("not injected") };
                apply(&app(), &injection.patch)
            };
            let why = update(&now, &injected(&then)).unwrap_err();
            assert!(why.contains(reason), "{image_volumes}: {why}");
        }
    }

    #[test]
    fn an_in_place_update_cannot_carry_another_image_for_an_enforced_copy() {
        // The pod brought its own exact copy of an enforced sidecar: it stands, recorded as skipped,
        // and its image is guarded like an injected one.
        const AUDIT: &str =
            "enforced: true\nsidecarMode: container\ninject:\n  sidecars:\n    - {name: audit, image: \"audit:1\"}\n";
        let before = mesh("proxy:1.0", "2.1", "run", "");
        let mut own = app();
        own["spec"]["containers"].as_array_mut().unwrap().push(json!({"name": "audit", "image": "audit:1"}));
        let then = engine(&[("mesh", &before), ("audit", AUDIT)]);
        let Outcome::Inject(injection) = then.evaluate(&request(own.clone(), opted_in("shop", &[]))).outcome else {
            panic!("not injected")
        };
        let pod = apply(&own, &injection.patch);
        let now = engine(&[("mesh", &mesh("proxy:1.1", "2.1", "run", "")), ("audit", AUDIT)]);
        let update = update(&now, &pod).expect("only the mesh's images changed");
        let mut new = apply(&pod, &update.patch());
        let check = |new: &Value| validate_pod_update(&now, &pod, &request(new.clone(), opted_in("shop", &[]))).verdict;
        assert_eq!(check(&new), Verdict::Allowed(Vec::new()));
        new["spec"]["containers"][1]["image"] = json!("evil:1");
        assert_eq!(new["spec"]["containers"][1]["name"], "audit");
        let verdict = check(&new);
        let refused =
            matches!(&verdict, Verdict::Denied(m) if m.contains("the one update to the versions in service is"));
        assert!(refused, "the enforced copy's image: {verdict:?}");
    }

    #[test]
    fn an_update_of_what_was_injected_must_be_exactly_the_in_place_one() {
        let pod = stored(&mesh("proxy:1.0", "2.1", "run", ""));
        let now = engine(&[("mesh", &mesh("proxy:1.1", "2.1", "run", ""))]);
        let expected = update(&now, &pod).unwrap();
        let check = |change: &dyn Fn(&mut Value)| {
            let mut new = apply(&pod, &expected.patch());
            change(&mut new);
            validate_pod_update(&now, &pod, &request(new, opted_in("shop", &[]))).verdict
        };
        assert_eq!(check(&|_| {}), Verdict::Allowed(Vec::new()));
        let denied = |verdict: Verdict, part: &str| match verdict {
            Verdict::Denied(message) => assert!(message.contains(part), "{part:?} not in {message}"),
            Verdict::Allowed(_) => panic!("allowed: {part}"),
        };
        denied(check(&|p| p["spec"]["initContainers"][1]["image"] = json!("evil")), "proxy: proxy:1.0 → proxy:1.1");
        denied(
            check(&|p| p["spec"]["initContainers"][0]["image"] = json!("proxy:1.0")),
            "mesh-init: proxy:1.0 → proxy:1.1",
        );
        let old_status = expected.old_status.clone();
        denied(check(&|p| p["metadata"]["annotations"][names::STATUS_ANNOTATION] = json!(old_status)), "status");
        // The images without the status, or the status without the images.
        let mut images_only = apply(&pod, &expected.patch());
        images_only["metadata"]["annotations"][names::STATUS_ANNOTATION] = json!(expected.old_status);
        let verdict = validate_pod_update(&now, &pod, &request(images_only, opted_in("shop", &[]))).verdict;
        assert!(matches!(verdict, Verdict::Denied(_)), "{verdict:?}");
        // Where no in-place update exists, the refusal says why.
        let args = replica(&mesh("proxy:1.0", "2.1", "run", ""), &mesh("proxy:1.1", "2.1", "run, --debug", ""));
        let mut new = pod.clone();
        new["spec"]["initContainers"][1]["image"] = json!("proxy:1.1");
        let verdict = validate_pod_update(&args, &pod, &request(new, opted_in("shop", &[]))).verdict;
        denied(verdict, "changed more than images");
    }
}
