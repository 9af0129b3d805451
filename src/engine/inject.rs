//! Planning an injection and writing it as a JSONPatch.
//!
//! The patch is built operation by operation rather than by diffing two documents (`json_patch::diff`
//! compares lists by index, so inserting init containers at the front would "replace" every existing
//! one). Every operation is an `add` of something the injection brings, except:
//! - `remove` of items that the pod's previous status annotation says an earlier injection added
//!   (re-injection after a template change replaces exactly those), and
//! - the injector's own status annotation and `injected` label, which it owns.
//!
//! Each injected container also gets the service-account token mount that Kubernetes would add
//! after the webhooks ran (see `service_account_token_mount`): the stored pod is the same, and the
//! API server has no reason to call the webhook a second time.
//!
//! Conflicts: when the pod (or an earlier template) already has a container, init container,
//! volume, env var, mount path, label or annotation of the same name, the existing one wins and the
//! status records the skip. Container names are unique across containers and init containers, as
//! Kubernetes requires. The cost is linear in the size of the pod plus the size of the templates.

use std::collections::{BTreeMap, HashMap, HashSet};

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation};
use serde_json::Value;

use super::names;
use super::pod::{self, PodShapeError, shape_error};
use super::render::RenderedTemplate;
use super::status::{AppContainerAdditions, InjectionStatus, ItemKind, Skipped, TemplateRef};

/// A rendered template and whether its sidecars become native sidecars.
#[derive(Debug, Clone)]
pub struct PlannedTemplate {
    /// What the template renders to for this pod.
    pub rendered: RenderedTemplate,
    /// Sidecars as init containers with `restartPolicy: Always`.
    pub native_sidecars: bool,
}

/// The result of planning: the patch and the status it writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Injection {
    /// JSONPatch operations, in order.
    pub patch: Vec<PatchOperation>,
    /// The status annotation the patch writes.
    pub status: InjectionStatus,
}

/// Plans the injection of `templates` into `pod`, replacing what `previous` says was injected.
/// `reason_if_none` is recorded in the status when `templates` is empty.
pub fn plan(
    pod: &Value,
    previous: Option<&InjectionStatus>,
    templates: &[PlannedTemplate],
    reason_if_none: Option<String>,
) -> Result<Injection, PodShapeError> {
    let empty = InjectionStatus::default();
    let previous = previous.unwrap_or(&empty);
    if !matches!(pod.get("metadata"), None | Some(Value::Null | Value::Object(_))) {
        return Err(shape_error("metadata", "must be an object"));
    }
    if !matches!(pod.get("spec"), Some(Value::Object(_))) {
        return Err(shape_error("spec", "must be an object"));
    }
    let labels = pod::string_map(pod, "labels")?;
    let annotations = pod::string_map(pod, "annotations")?;
    let containers = pod::list(pod, "containers")?.ok_or_else(|| shape_error("spec.containers", "is missing"))?;
    let init_containers = pod::list(pod, "initContainers")?;
    let volumes = pod::list(pod, "volumes")?;
    let container_names = pod::names(Some(containers), || "spec.containers".into())?;
    let init_names = pod::names(init_containers, || "spec.initContainers".into())?;
    let volume_names = pod::names(volumes, || "spec.volumes".into())?;

    // What the previous injection added, and so goes away first.
    let removed_containers = indexes_named(&container_names, &previous.containers);
    let removed_init = indexes_named(&init_names, &previous.init_containers);
    let removed_volumes = indexes_named(&volume_names, &previous.volumes);

    let mut builder = Builder::default();
    let mut status = InjectionStatus {
        templates: templates
            .iter()
            .map(|t| TemplateRef { name: t.rendered.name.clone(), hash: t.rendered.hash.clone() })
            .collect(),
        reason: templates.is_empty().then_some(reason_if_none).flatten(),
        ..InjectionStatus::default()
    };

    // Names already taken, by whom ("pod" or "template:<name>").
    let mut taken_containers: Taken = container_names
        .iter()
        .enumerate()
        .filter(|(i, _)| !removed_containers.contains(i))
        .map(|(_, n)| *n)
        .chain(init_names.iter().enumerate().filter(|(i, _)| !removed_init.contains(i)).map(|(_, n)| *n))
        .collect();
    let mut taken_volumes: Taken =
        volume_names.iter().enumerate().filter(|(i, _)| !removed_volumes.contains(i)).map(|(_, n)| *n).collect();
    let kept_labels: BTreeMap<&str, &str> = labels
        .iter()
        .filter(|(k, _)| !previous.labels.contains(k) && k.as_str() != names::INJECTED_LABEL)
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let kept_annotations: BTreeMap<&str, &str> = annotations
        .iter()
        .filter(|(k, _)| !previous.annotations.contains(k) && k.as_str() != names::STATUS_ANNOTATION)
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut taken_labels: Taken = kept_labels.keys().copied().chain([names::INJECTED_LABEL]).collect();
    let mut taken_annotations: Taken = kept_annotations.keys().copied().chain([names::STATUS_ANNOTATION]).collect();

    // App containers that stay, with their index once the previous sidecars are gone.
    let mut app_containers = Vec::new();
    for (index, container) in containers.iter().enumerate() {
        if removed_containers.contains(&index) {
            continue;
        }
        let name = container_names[index];
        let field = || format!("spec.containers[{index}]");
        let prev = previous.app_containers.get(name);
        let env = named_list(container, "env", field)?;
        let mounts = named_list(container, "volumeMounts", field)?;
        let env_names = pod::names(env, || format!("{}.env", field()))?;
        let mount_paths = pod::keys(mounts, "mountPath", || format!("{}.volumeMounts", field()))?;
        let removed_env = prev.map(|p| indexes_named(&env_names, &p.env)).unwrap_or_default();
        let removed_mounts = prev.map(|p| indexes_named(&mount_paths, &p.volume_mounts)).unwrap_or_default();
        app_containers.push(AppContainer {
            name,
            new_index: index - removed_containers.iter().filter(|r| **r < index).count(),
            has_env: container.get("env").is_some_and(|e| !e.is_null()),
            has_mounts: container.get("volumeMounts").is_some_and(|m| !m.is_null()),
            taken_env: Taken::by_pod(&env_names, &removed_env),
            taken_mounts: Taken::by_pod(&mount_paths, &removed_mounts),
            removed_env,
            removed_mounts,
            added_env: Vec::new(),
            added_mounts: Vec::new(),
        });
    }

    // Decide what each template adds.
    let mut added_labels = BTreeMap::new();
    let mut added_annotations = BTreeMap::new();
    let mut new_init = Vec::new();
    let mut new_containers = Vec::new();
    let mut new_volumes = Vec::new();
    for planned in templates {
        let t = &planned.rendered;
        let owner = Owner::Template(&t.name);
        let mut skip = |kind: ItemKind, name: &str, container: Option<&str>, by: Owner| {
            status.skipped.push(Skipped {
                template: t.name.clone(),
                kind,
                name: name.to_owned(),
                container: container.map(str::to_owned),
                owner: by.to_string(),
            });
        };
        for (key, value) in &t.labels {
            match taken_labels.claim(key, owner) {
                Ok(()) => {
                    added_labels.insert(key.clone(), value.clone());
                }
                Err(by) => skip(ItemKind::Label, key, None, by),
            }
        }
        for (key, value) in &t.annotations {
            match taken_annotations.claim(key, owner) {
                Ok(()) => {
                    added_annotations.insert(key.clone(), value.clone());
                }
                Err(by) => skip(ItemKind::Annotation, key, None, by),
            }
        }
        for container in &t.init_containers {
            let name = rendered_name(container);
            match taken_containers.claim(name, owner) {
                Ok(()) => {
                    status.init_containers.push(name.to_owned());
                    new_init.push(container.clone());
                }
                Err(by) => skip(ItemKind::InitContainer, name, None, by),
            }
        }
        for sidecar in &t.sidecars {
            let name = rendered_name(sidecar);
            if let Err(by) = taken_containers.claim(name, owner) {
                skip(ItemKind::Sidecar, name, None, by);
                continue;
            }
            if planned.native_sidecars {
                let mut native = sidecar.clone();
                native["restartPolicy"] = Value::from("Always");
                status.init_containers.push(name.to_owned());
                status.native_sidecars.push(name.to_owned());
                new_init.push(native);
            } else {
                status.containers.push(name.to_owned());
                new_containers.push(sidecar.clone());
            }
        }
        for volume in &t.volumes {
            let name = rendered_name(volume);
            match taken_volumes.claim(name, owner) {
                Ok(()) => {
                    status.volumes.push(name.to_owned());
                    new_volumes.push(volume.clone());
                }
                Err(by) => skip(ItemKind::Volume, name, None, by),
            }
        }
        for app in &mut app_containers {
            for env in &t.env {
                let name = rendered_name(env);
                match app.taken_env.claim(name, owner) {
                    Ok(()) => app.added_env.push(env),
                    Err(by) => skip(ItemKind::Env, name, Some(app.name), by),
                }
            }
            for mount in &t.volume_mounts {
                let path = mount_path(mount);
                match app.taken_mounts.claim(path, owner) {
                    Ok(()) => app.added_mounts.push(mount),
                    Err(by) => skip(ItemKind::VolumeMount, path, Some(app.name), by),
                }
            }
        }
    }
    if !new_init.is_empty() || !new_containers.is_empty() {
        let kept_containers = containers.iter().enumerate().filter(|(i, _)| !removed_containers.contains(i));
        let kept_init = init_containers.into_iter().flatten().enumerate().filter(|(i, _)| !removed_init.contains(i));
        let kept = kept_containers.chain(kept_init).map(|(_, c)| c);
        if let Some(mount) = service_account_token_mount(pod, volumes, kept) {
            for container in new_init.iter_mut().chain(&mut new_containers) {
                mount_unless_path_taken(container, &mount);
            }
        }
    }
    status.labels = added_labels.keys().cloned().collect();
    status.annotations = added_annotations.keys().cloned().collect();
    for app in app_containers.iter().filter(|a| !a.added_env.is_empty() || !a.added_mounts.is_empty()) {
        status.app_containers.insert(
            app.name.to_owned(),
            AppContainerAdditions {
                env: app.added_env.iter().map(|e| rendered_name(e).to_owned()).collect(),
                volume_mounts: app.added_mounts.iter().map(|m| mount_path(m).to_owned()).collect(),
            },
        );
    }

    // Write the operations: metadata, then init containers, containers (with their env and mounts),
    // volumes. Removals go from the highest index down so earlier indexes stay valid.
    if !matches!(pod.get("metadata"), Some(Value::Object(_))) {
        builder.add(&["metadata"], Value::Object(Default::default()));
    }
    let injected = !templates.is_empty();
    let mut label_removals: Vec<&str> =
        previous.labels.iter().map(String::as_str).filter(|k| labels.contains_key(*k)).collect();
    if !injected && labels.contains_key(names::INJECTED_LABEL) && !previous.templates.is_empty() {
        label_removals.push(names::INJECTED_LABEL);
    }
    if injected {
        added_labels.insert(names::INJECTED_LABEL.to_owned(), "true".to_owned());
    }
    builder.string_map("labels", pod.get("metadata").and_then(|m| m.get("labels")), &label_removals, added_labels);
    let annotation_removals: Vec<&str> =
        previous.annotations.iter().map(String::as_str).filter(|k| annotations.contains_key(*k)).collect();
    added_annotations.insert(names::STATUS_ANNOTATION.to_owned(), status.to_annotation());
    builder.string_map(
        "annotations",
        pod.get("metadata").and_then(|m| m.get("annotations")),
        &annotation_removals,
        added_annotations,
    );

    builder.removals(&["spec", "initContainers"], &removed_init);
    builder.insert_front(&["spec", "initContainers"], init_containers.is_some(), new_init);

    builder.removals(&["spec", "containers"], &removed_containers);
    for app in &app_containers {
        let index = app.new_index.to_string();
        builder.removals(&["spec", "containers", &index, "env"], &app.removed_env);
        builder.append(
            &["spec", "containers", &index, "env"],
            app.has_env,
            app.added_env.iter().map(|v| (*v).clone()).collect(),
        );
        builder.removals(&["spec", "containers", &index, "volumeMounts"], &app.removed_mounts);
        builder.append(
            &["spec", "containers", &index, "volumeMounts"],
            app.has_mounts,
            app.added_mounts.iter().map(|v| (*v).clone()).collect(),
        );
    }
    builder.append(&["spec", "containers"], true, new_containers);

    builder.removals(&["spec", "volumes"], &removed_volumes);
    builder.append(&["spec", "volumes"], volumes.is_some(), new_volumes);

    Ok(Injection { patch: builder.ops, status })
}

/// Where Kubernetes' ServiceAccount admission plugin mounts the API token.
const SERVICE_ACCOUNT_TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The API-token mount Kubernetes is about to give the injected containers, when the pod shows that
/// the ServiceAccount admission plugin has mounted the token into the pod's own containers.
///
/// Why: the plugin runs before mutating webhooks and again after them, and on that second run it
/// mounts the token into every container we added. That changes the pod, so the API server calls
/// this webhook a second time (`reinvocationPolicy: IfNeeded`): one more round trip on every pod
/// create. Adding the very mount the plugin would add leaves it nothing to change.
///
/// The plugin's rule: the first volume named `kube-api-access-*`, mounted read-only at the token
/// path into every container and init container that has no mount at that path. It is applied here
/// only when the pod shows the plugin's work: `automountServiceAccountToken` is not false, every
/// kept container has a mount at the path and one of them is exactly the plugin's. A pod that opts
/// out, or a manifest rendered offline, gets nothing.
fn service_account_token_mount<'p>(
    pod: &Value,
    volumes: Option<&Vec<Value>>,
    mut kept_containers: impl Iterator<Item = &'p Value>,
) -> Option<Value> {
    if pod["spec"].get("automountServiceAccountToken") == Some(&Value::Bool(false)) {
        return None;
    }
    let volume = volumes?.iter().map(rendered_name).find(|name| name.starts_with("kube-api-access-"))?;
    let mount = serde_json::json!({"name": volume, "readOnly": true, "mountPath": SERVICE_ACCOUNT_TOKEN_PATH});
    let mut plugin_mounted = false;
    let every_container_mounted = kept_containers.all(|container| {
        let mounts = container.get("volumeMounts").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        plugin_mounted |= mounts.contains(&mount);
        mounts.iter().any(|m| mount_path(m) == SERVICE_ACCOUNT_TOKEN_PATH)
    });
    (every_container_mounted && plugin_mounted).then_some(mount)
}

/// Adds `mount` to an injected container unless the template already mounts something at its path.
fn mount_unless_path_taken(container: &mut Value, mount: &Value) {
    let Some(container) = container.as_object_mut() else { return };
    match container.entry("volumeMounts").or_insert(Value::Null) {
        Value::Array(mounts) if mounts.iter().any(|m| mount_path(m) == mount_path(mount)) => {}
        Value::Array(mounts) => mounts.push(mount.clone()),
        slot @ Value::Null => *slot = Value::Array(vec![mount.clone()]),
        _ => {}
    }
}

struct AppContainer<'p> {
    name: &'p str,
    new_index: usize,
    has_env: bool,
    has_mounts: bool,
    taken_env: Taken<'p>,
    taken_mounts: Taken<'p>,
    removed_env: Vec<usize>,
    removed_mounts: Vec<usize>,
    added_env: Vec<&'p Value>,
    added_mounts: Vec<&'p Value>,
}

/// Who holds a name: the pod itself or an earlier template.
#[derive(Clone, Copy)]
enum Owner<'a> {
    Pod,
    Template(&'a str),
}

impl std::fmt::Display for Owner<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Pod => f.write_str("pod"),
            Owner::Template(name) => write!(f, "template:{name}"),
        }
    }
}

/// Names in use and who holds them. Borrows every name: this is built for every env var of every
/// container, so it must not allocate per name.
#[derive(Default)]
struct Taken<'a>(HashMap<&'a str, Owner<'a>>);

impl<'a> FromIterator<&'a str> for Taken<'a> {
    fn from_iter<I: IntoIterator<Item = &'a str>>(iter: I) -> Self {
        Taken(iter.into_iter().map(|n| (n, Owner::Pod)).collect())
    }
}

impl<'a> Taken<'a> {
    /// The pod's names, except those at the `removed` indexes (ascending).
    fn by_pod(names: &[&'a str], removed: &[usize]) -> Self {
        names.iter().enumerate().filter(|(i, _)| removed.binary_search(i).is_err()).map(|(_, n)| *n).collect()
    }

    /// Takes `name` for `owner`, or says who already holds it.
    fn claim(&mut self, name: &'a str, owner: Owner<'a>) -> Result<(), Owner<'a>> {
        match self.0.entry(name) {
            std::collections::hash_map::Entry::Occupied(holder) => Err(*holder.get()),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(owner);
                Ok(())
            }
        }
    }
}

fn rendered_name(item: &Value) -> &str {
    // Rendered items were checked to carry a string name (render::check_rendered).
    item.get("name").and_then(Value::as_str).unwrap_or_default()
}

fn mount_path(mount: &Value) -> &str {
    mount.get("mountPath").and_then(Value::as_str).unwrap_or_default()
}

fn named_list<'c>(
    container: &'c Value,
    field: &str,
    container_field: impl Fn() -> String,
) -> Result<Option<&'c Vec<Value>>, PodShapeError> {
    match container.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items)),
        Some(_) => Err(shape_error(format!("{}.{field}", container_field()), "must be a list")),
    }
}

/// Indexes of the items whose name is in `wanted` (each wanted name matches once, first first).
fn indexes_named(names: &[&str], wanted: &[String]) -> Vec<usize> {
    let mut wanted: HashSet<&str> = wanted.iter().map(String::as_str).collect();
    names.iter().enumerate().filter(|(_, n)| wanted.remove(**n)).map(|(i, _)| i).collect()
}

#[derive(Default)]
struct Builder {
    ops: Vec<PatchOperation>,
}

impl Builder {
    fn pointer(path: &[&str]) -> PointerBuf {
        PointerBuf::from_tokens(path.iter().copied())
    }

    fn add(&mut self, path: &[&str], value: Value) {
        self.ops.push(PatchOperation::Add(AddOperation { path: Self::pointer(path), value }));
    }

    fn remove(&mut self, path: &[&str]) {
        self.ops.push(PatchOperation::Remove(RemoveOperation { path: Self::pointer(path) }));
    }

    /// Removes the items at `indexes` (ascending) of the list at `path`.
    fn removals(&mut self, path: &[&str], indexes: &[usize]) {
        for index in indexes.iter().rev() {
            let index = index.to_string();
            let mut full = path.to_vec();
            full.push(&index);
            self.remove(&full);
        }
    }

    /// Appends to a list, creating it when the pod has none.
    fn append(&mut self, path: &[&str], exists: bool, items: Vec<Value>) {
        if items.is_empty() {
        } else if exists {
            let mut full = path.to_vec();
            full.push("-");
            for item in items {
                self.add(&full, item);
            }
        } else {
            self.add(path, Value::Array(items));
        }
    }

    /// Inserts at the front of a list, in order, creating it when the pod has none.
    fn insert_front(&mut self, path: &[&str], exists: bool, items: Vec<Value>) {
        if !exists {
            return self.append(path, false, items);
        }
        for (index, item) in items.into_iter().enumerate() {
            let index = index.to_string();
            let mut full = path.to_vec();
            full.push(&index);
            self.add(&full, item);
        }
    }

    /// Labels or annotations: removals, then additions; a missing map is added whole.
    fn string_map(
        &mut self,
        section: &str,
        existing: Option<&Value>,
        removals: &[&str],
        additions: BTreeMap<String, String>,
    ) {
        for key in removals {
            self.remove(&["metadata", section, key]);
        }
        if matches!(existing, Some(Value::Object(_))) {
            for (key, value) in additions {
                self.add(&["metadata", section, &key], Value::String(value));
            }
        } else if !additions.is_empty() {
            let map = additions.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
            self.add(&["metadata", section], Value::Object(map));
        }
    }
}
