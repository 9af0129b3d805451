//! Planning an injection and writing it as a JSONPatch.
//!
//! The patch is built operation by operation rather than by diffing two documents (`json_patch::diff`
//! compares lists by index, so inserting init containers at the front would "replace" every existing
//! one). Every operation is an `add` of something the injection brings, except:
//! - `remove` of items an earlier injection provably added (`ownership`: the status annotation
//!   claims them *and* they are exactly what the claimed template version renders), so that
//!   re-injection after a template change replaces exactly those and equals a fresh injection (a
//!   list or map that only held such items is removed whole, as if it had never been added), and
//! - the injector's own status annotation and `injected` label, which it always rewrites to say
//!   what really happened.
//!
//! Each injected container also gets the service-account token mount that Kubernetes would add
//! after the webhooks ran (see `service_account_token_mount`): the stored pod is the same, and the
//! API server has no reason to call the webhook a second time.
//!
//! Conflicts: when the pod (or an earlier template) already has a container, init container,
//! volume, env var, mount path, label or annotation of the same name, the existing one wins and the
//! status records the skip. Container names are unique across containers and init containers, as
//! Kubernetes requires. The cost is linear in the size of the pod plus the size of the templates.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};

use json_patch::PatchOperation;
use json_patch::jsonptr::PointerBuf;
use serde_json::Value;

mod names;
mod patch;

use names::{Claimed, Owner, Taken};
use patch::Builder;

use crate::findings::{Warning, WarningCode};
use crate::injection::ports::{self, Running};
use crate::injection::render::RenderedTemplate;
use crate::injection::{env_merge, image_volumes, pod_resources};
use crate::model::compare::env_from_key;
use crate::model::kinds::{
    APP_LISTS, AppListKind, CONTAINER_LISTS, ContainerPosition, ENV, ENV_FROM, Identity, MAPS, POD_LISTS, PerAppList,
    PerMap, PerPodList, Placement, PodListKind, VOLUME_MOUNTS, VOLUMES, WhenHeld,
};
use crate::model::status::{AppContainerAdditions, InjectionStatus, ItemKind, Skipped, TemplateRef};
use crate::model::{api_limits, native};
use crate::pod::{self, PodShapeError, shape_error};

/// A rendered template and whether its sidecars become native sidecars.
#[derive(Debug, Clone)]
pub struct PlannedTemplate {
    /// What the template renders to for this pod.
    pub rendered: RenderedTemplate,
    /// Sidecars as init containers with `restartPolicy: Always`.
    pub native_sidecars: bool,
    /// Whether native sidecars get the default `resizePolicy` where the template gives none (the
    /// API server accepts one on them since 1.33: `ClusterFacts::sidecar_resize_policy`).
    pub sidecar_resize_policy: bool,
    /// Warnings about one of its containers, given only where the injection adds that container
    /// (a pod's own container of the name displaces it), by container name.
    pub if_added: Vec<(String, Warning)>,
}

/// The result of planning: the patch and the status it writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Injection {
    /// JSONPatch operations, in order.
    pub patch: Vec<PatchOperation>,
    /// The status annotation the patch writes.
    pub status: InjectionStatus,
    /// What the patch removes: items an earlier injection provably added (empty on a first
    /// injection).
    pub removed: Box<InjectionStatus>,
    /// How the injected values were arrived at, for `explain`.
    pub notes: Box<Notes>,
    /// Warnings for the pod's creator: merges that rest on an `envFrom` source having the
    /// variable, which the API cannot show, and ports an added container shares with another
    /// (`ports`).
    pub warnings: Vec<Warning>,
    /// What the API server would refuse in the pod this patch makes (pod-level resources the
    /// injected containers do not fit, the rules of `api_limits`), one sentence each: the pod is
    /// then left as it is.
    pub invalid: Vec<String>,
    /// When the templates were not injected for a reason that counts as a skip (the injection
    /// would have made a pod the API server refuses), that reason: the patch then only records it
    /// in the status annotation.
    pub skipped_as: Option<crate::injection::select::OutOfScope>,
}

/// How an injection's values were arrived at, one sentence each (for `explain`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notes {
    /// For each env var a template merges into an app container: where the value it adds to
    /// comes from, as `container <name>: ...`.
    pub merges: Vec<String>,
    /// The form each template's image volumes take.
    pub volumes: Vec<String>,
    /// Where each overridden value came from, as `<template>.<value> from annotation <key>`.
    pub value_sources: Vec<String>,
    /// How each value a template's `sizing:` computed was reached, as `<template>: container
    /// <name>: <field>.<resource> = <value> (...)`.
    pub sized: Vec<String>,
}

/// What an earlier injection left in the pod, as far as it is proven (see `ownership`; never the
/// raw status annotation).
#[derive(Debug, Clone, Copy)]
pub enum Earlier<'s> {
    /// Nothing: a first injection.
    None,
    /// These items are the earlier injection's own, from other template versions or another
    /// template set: they are removed and the templates injected afresh.
    Replace(&'s InjectionStatus),
    /// These items are the current templates' own and present: they stay where they are and count
    /// as injected; only what is missing is added (a reinvocation after another webhook added a
    /// container, or an injected env var that went missing).
    Keep(&'s InjectionStatus),
}

/// Plans the injection of `templates` into `pod` over what an `earlier` injection left.
/// `reason` is recorded in the status (why no template, or not every chosen one, is injected). The rendered containers,
/// volumes and pull secrets the injection adds are moved into the patch, not copied.
pub fn plan(
    pod: &Value,
    earlier: Earlier<'_>,
    mut templates: Vec<PlannedTemplate>,
    reason: Option<String>,
) -> Result<Injection, PodShapeError> {
    let empty = InjectionStatus::default();
    let (previous, kept) = match earlier {
        Earlier::None => (&empty, &empty),
        Earlier::Replace(previous) => (previous, &empty),
        Earlier::Keep(kept) => (&empty, kept),
    };
    let found = PodFound::read(pod, previous)?;
    let container_keys = ContainerKeys::of(found.containers);
    let value_sources = templates
        .iter()
        .flat_map(|t| t.rendered.value_sources.iter().map(|source| format!("{}.{source}", t.rendered.name)))
        .collect();
    let volume_notes = templates
        .iter()
        .flat_map(|t| {
            t.rendered.volume_forms.iter().map(|choice| format!("{}: {}", t.rendered.name, choice.describe()))
        })
        .collect();
    let status = InjectionStatus {
        templates: templates
            .iter()
            .map(|t| TemplateRef { name: t.rendered.name.clone(), hash: t.rendered.hash.clone() })
            .collect(),
        reason,
        // The form of every volume with a fallback, injected or skipped: a skipped one's form
        // decides whether it is displaced when the claim is re-rendered.
        image_volumes: image_volumes::distinct(templates.iter().flat_map(|t| &t.rendered.image_volumes)),
        ..InjectionStatus::default()
    };
    // The templates' whole items, out of the templates: the claims below borrow their names, and
    // once claiming is over the items the injection adds are moved from here into the patch.
    let mut whole_items: Vec<WholeItems> = templates.iter_mut().map(|t| WholeItems::out_of(&mut t.rendered)).collect();
    let template_keys: Vec<TemplateKeys> = templates.iter().map(|t| TemplateKeys::of(&t.rendered)).collect();

    // Decide what each template adds.
    let mut claims = Claims::new(&found, previous, kept, &container_keys, status)?;
    for (template_index, keys) in template_keys.iter().enumerate() {
        let pod_items = found.lists.each_ref().map(|list| list.items);
        claims.claim_template(template_index, &templates, &whole_items, keys, pod_items);
    }
    let Decisions { mut status, picks, added_to_maps, app_containers, merges } = claims.decide();

    // Claiming is over: the added items leave the templates, each with the position its template
    // gives it when that moves it from where its list's additions go by default.
    let mut take = |pick: Pick| -> (Value, bool) {
        let planned = &templates[pick.template];
        let item = whole_items[pick.template].take(pick.kind, pick.index, planned.sidecar_resize_policy);
        let position = item.get("name").and_then(Value::as_str).and_then(|n| planned.rendered.positions.get(n));
        let moved = match pick.kind {
            WholeKind::Container(Placement::Init) => position == Some(&ContainerPosition::Last),
            WholeKind::Container(Placement::Sidecar) => position == Some(&ContainerPosition::First),
            _ => false,
        };
        (item, moved)
    };
    // Init containers: before the pod's own, then the moved ones after them; classic sidecars:
    // the moved ones before the app's, then the others after them.
    let (init_last, mut init): (Vec<_>, Vec<_>) = picks.init.into_iter().map(&mut take).partition(|(_, m)| *m);
    let init_at_end = init_last.len();
    init.extend(init_last);
    let (mut containers, after): (Vec<_>, Vec<_>) = picks.containers.into_iter().map(&mut take).partition(|(_, m)| *m);
    let containers_at_front = containers.len();
    containers.extend(after);
    let (init, containers) =
        (init.into_iter().map(|(i, _)| i).collect(), containers.into_iter().map(|(c, _)| c).collect());
    let mut additions = Additions {
        init,
        init_at_end,
        containers,
        containers_at_front,
        lists: picks.lists.map(|list| list.into_iter().map(|pick| take(pick).0).collect()),
        maps: added_to_maps,
        pod_level: Vec::new(),
    };
    found.give_token_mount(pod, &mut additions);
    let uncertain_merges = merges.warnings.into_iter().map(|w| Warning::new(WarningCode::MergeSourceUncertain, w));
    let port_collisions = found.port_collisions(pod, &additions);
    let port_warnings = port_collisions.warned.into_iter().map(|w| Warning::new(WarningCode::PortCollision, w));
    let added = |name: &str| status.containers.iter().chain(&status.init_containers).any(|n| n == name);
    let of_added = templates.iter().flat_map(|t| &t.if_added).filter(|(name, _)| added(name)).map(|(_, w)| w.clone());
    let warnings = uncertain_merges.chain(port_warnings).chain(of_added).collect();
    let mut invalid = match found.resize_pod_level(pod, previous, kept, &additions) {
        None => Vec::new(),
        Some(Ok(resized)) => {
            additions.pod_level = resized.operations();
            status.pod_resources = (!resized.padding.is_empty()).then_some(resized.padding);
            Vec::new()
        }
        Some(Err(violations)) => violations,
    };
    record_app_additions(&mut status, &app_containers);
    let own_values: PerMap<Option<String>> = std::array::from_fn(|index| (MAPS[index].own_value)(&status));
    invalid.extend(api_violations(&found, previous, &status, &additions.maps, &own_values));
    invalid.extend(port_collisions.refused);

    let (patch, map_removals) = write_patch(pod, &found, previous, own_values, additions, &app_containers);
    let removed = removed_items(previous, &found, &map_removals, &app_containers);
    let sized = sized(&templates, &status);
    Ok(Injection {
        patch,
        status,
        removed: Box::new(removed),
        notes: Box::new(Notes { merges: merges.notes, volumes: volume_notes, value_sources, sized }),
        warnings,
        invalid,
        skipped_as: None,
    })
}

/// How the values of the containers this injection adds were sized (`sizing:`), as
/// `<template>: <note>`: a container the pod's own of that name displaces was not added.
fn sized(templates: &[PlannedTemplate], status: &InjectionStatus) -> Vec<String> {
    let added = |name: &str| status.containers.iter().chain(&status.init_containers).any(|n| n == name);
    let notes = templates.iter().flat_map(|t| t.rendered.sized.iter().map(move |note| (&t.rendered.name, note)));
    notes
        .filter(|(_, (container, _))| added(container))
        .map(|(template, (_, note))| format!("{template}: {note}"))
        .collect()
}

/// The pod as `plan` reads it: its maps and lists, and the items an earlier injection provably
/// added there (and so go away first).
struct PodFound<'p> {
    maps: PerMap<BTreeMap<String, String>>,
    containers: &'p Vec<Value>,
    init_containers: Option<&'p Vec<Value>>,
    container_names: Vec<&'p str>,
    init_names: Vec<&'p str>,
    /// Indexes (ascending) of the containers and init containers the earlier injection added.
    removed_containers: Vec<usize>,
    removed_init: Vec<usize>,
    /// Every kind of spec list (`kinds::POD_LISTS`), as the pod has it.
    lists: PerPodList<PodList<'p>>,
}

impl<'p> PodFound<'p> {
    fn read(pod: &'p Value, previous: &InjectionStatus) -> Result<Self, PodShapeError> {
        if !matches!(pod.get("metadata"), None | Some(Value::Null | Value::Object(_))) {
            return Err(shape_error("metadata", "must be an object"));
        }
        if !matches!(pod.get("spec"), Some(Value::Object(_))) {
            return Err(shape_error("spec", "must be an object"));
        }
        let mut maps = PerMap::<BTreeMap<String, String>>::default();
        for (kind, map) in MAPS.iter().zip(&mut maps) {
            *map = pod::string_map(pod, kind.field)?;
        }
        let containers = pod::list(pod, "containers")?.ok_or_else(|| shape_error("spec.containers", "is missing"))?;
        let init_containers = pod::list(pod, "initContainers")?;
        let container_names = pod::names(Some(containers), || "spec.containers".into())?;
        let init_names = pod::names(init_containers, || "spec.initContainers".into())?;
        Ok(PodFound {
            maps,
            containers,
            init_containers,
            removed_containers: indexes_named(&container_names, &previous.containers),
            removed_init: indexes_named(&init_names, &previous.init_containers),
            container_names,
            init_names,
            lists: PodList::all_of(pod, previous)?,
        })
    }

    /// The containers and init containers that stay, by name.
    fn staying_names(&self) -> impl Iterator<Item = &'p str> + '_ {
        let containers = self.container_names.iter().enumerate().filter(|(i, _)| !self.removed_containers.contains(i));
        let init = self.init_names.iter().enumerate().filter(|(i, _)| !self.removed_init.contains(i));
        containers.chain(init).map(|(_, n)| *n)
    }

    /// Ports an added container shares with another container that runs beside it: the pod's
    /// containers and native sidecars that stay, and the added ones (see `ports`).
    fn port_collisions(&self, pod: &Value, additions: &Additions) -> ports::Collisions {
        let added = additions.init.iter().filter(|c| native::is_native_sidecar(c)).chain(&additions.containers);
        if !added.clone().any(|c| c.get("ports").and_then(Value::as_array).is_some_and(|p| !p.is_empty())) {
            return ports::Collisions::default();
        }
        let own = self.containers.iter().enumerate().filter(|(i, _)| !self.removed_containers.contains(i));
        let own_native = self.init_containers.into_iter().flatten().enumerate();
        let own_native = own_native.filter(|(i, c)| !self.removed_init.contains(i) && native::is_native_sidecar(c));
        let own = own.chain(own_native);
        let running: Vec<Running<'_>> = own
            .map(|(_, container)| Running { container, injected: false })
            .chain(added.map(|container| Running { container, injected: true }))
            .collect();
        let host_network = pod.get("spec").and_then(|spec| spec.get("hostNetwork")) == Some(&Value::Bool(true));
        ports::collisions(&running, host_network)
    }

    /// Gives the injected containers the service-account token mount (see
    /// `service_account_token_mount`).
    fn give_token_mount(&self, pod: &Value, additions: &mut Additions) {
        if additions.init.is_empty() && additions.containers.is_empty() {
            return;
        }
        let kept_containers = self.containers.iter().enumerate().filter(|(i, _)| !self.removed_containers.contains(i));
        let kept_init =
            self.init_containers.into_iter().flatten().enumerate().filter(|(i, _)| !self.removed_init.contains(i));
        let kept = kept_containers.chain(kept_init).map(|(_, c)| c);
        if let Some(mount) = service_account_token_mount(pod, self.lists[VOLUMES.index].items, kept) {
            for container in additions.init.iter_mut().chain(&mut additions.containers) {
                mount_unless_path_taken(container, &mount);
            }
        }
    }

    /// Pod-level resources the pod sets, grown by what the injected containers add to them (most
    /// pods set none: nothing is computed for them); or what the API server would refuse in the
    /// resized pod.
    fn resize_pod_level(
        &self,
        pod: &Value,
        previous: &InjectionStatus,
        kept: &InjectionStatus,
        additions: &Additions,
    ) -> Option<Result<Resized, Vec<String>>> {
        let now = pod_resources::PodLevel::of(pod)?;
        // Nothing is padded over a value that is no quantity (the API server refuses it anyway).
        let unreadable = pod_resources::unreadable(pod);
        if !unreadable.is_empty() {
            return Some(Err(unreadable));
        }
        // Only kept items, no container added: the kept padding stands as recorded, even where
        // the kept containers were resized in place since (a resize is not an injection).
        if let (None, Some(padding), true, true) =
            (&previous.pod_resources, &kept.pod_resources, additions.init.is_empty(), additions.containers.is_empty())
        {
            return Some(Ok(Resized { padded: now.clone(), now, padding: padding.clone() }));
        }
        let earlier = previous.pod_resources.as_ref().or(kept.pod_resources.as_ref());
        // With a proven padding, the author's values are the pod's less that padding, for the
        // author's containers. Without one (none recorded, or a claim that does not prove: a copy
        // with forged amounts), the pod's values are its author's as they stand, for every
        // container it has now: only what the injection adds beyond them grows them, so a
        // sidecar already in the pod is never padded for twice.
        let author: pod_resources::Containers = match earlier {
            Some(_) => (
                staying(self.init_containers, &self.removed_init, &kept.init_containers, true),
                staying(Some(self.containers), &self.removed_containers, &kept.containers, true),
            ),
            None => (staying(self.init_containers, &[], &[], false), staying(Some(self.containers), &[], &[], false)),
        };
        let (init_first, init_last) = additions.init.split_at(additions.init.len() - additions.init_at_end);
        let mut after: pod_resources::Containers = (
            init_first
                .iter()
                .chain(staying(self.init_containers, &self.removed_init, &[], false))
                .chain(init_last)
                .collect(),
            staying(Some(self.containers), &self.removed_containers, &[], false),
        );
        after.1.extend(additions.containers.iter());
        resize_pod_level(now, earlier, &author, &after)
    }
}

/// What a template's rendering yields for claiming beyond its items, computed once and borrowed
/// by the claims: the identities of its app-list items that are derived rather than a field (an
/// `envFrom` source's), and for each env var that says `merge:` the entry it adds when the app
/// container has the variable, with its status key.
struct TemplateKeys {
    derived: PerAppList<Vec<String>>,
    merged_env: Vec<Option<MergedEnvEntry>>,
}

impl TemplateKeys {
    fn of(rendered: &RenderedTemplate) -> Self {
        let merged_env = rendered
            .app_list(ENV)
            .iter()
            .map(|e| {
                let name = rendered_name(e);
                let merge = rendered.env_merges.get(name)?;
                let entry = merge.entry(name, e.get("value").and_then(Value::as_str).unwrap_or_default());
                Some((env_merge::key(&entry)?, entry))
            })
            .collect();
        TemplateKeys { derived: derived_identities(rendered), merged_env }
    }
}

/// Who holds each identity while the templates claim theirs, in order, and what each adds.
/// `'p`: the pod and the templates' renderings; `'w`: the items taken out of them
/// ([`WholeItems`]), which the patch takes once claiming is over.
struct Claims<'p, 'w> {
    status: InjectionStatus,
    /// Container names (containers and init containers share them) in use, by whom.
    containers: Taken<'w>,
    /// Per kind of spec list: identities in use, by whom.
    lists: PerPodList<Taken<'w>>,
    /// Per map: keys in use (the pod's own, and the injector's own key), by whom.
    maps: PerMap<Taken<'p>>,
    /// Per kind of spec list: the identities the templates hold (for the status).
    claimed_in_lists: PerPodList<Vec<String>>,
    /// Per map: keys that stay as injected (no operation, but in the status).
    kept_map_keys: PerMap<Vec<String>>,
    added_to_maps: PerMap<BTreeMap<String, String>>,
    picks: Picks,
    /// App containers that stay, with their index once the previous sidecars are gone.
    app_containers: Vec<AppContainer<'p>>,
    merges: MergeNotes,
}

/// The items the templates add, by where they go in the pod.
#[derive(Default)]
struct Picks {
    init: Vec<Pick>,
    containers: Vec<Pick>,
    lists: PerPodList<Vec<Pick>>,
}

/// What claiming decided, once the claims on the templates' items are let go.
struct Decisions<'p> {
    status: InjectionStatus,
    picks: Picks,
    added_to_maps: PerMap<BTreeMap<String, String>>,
    app_containers: Vec<AppContainer<'p>>,
    merges: MergeNotes,
}

impl<'p: 'w, 'w> Claims<'p, 'w> {
    fn new(
        found: &'p PodFound<'p>,
        previous: &InjectionStatus,
        kept: &'p InjectionStatus,
        container_keys: &'p ContainerKeys,
        status: InjectionStatus,
    ) -> Result<Self, PodShapeError> {
        let mut containers: Taken = found.staying_names().collect();
        containers.keep(kept.containers.iter().chain(&kept.init_containers));
        let maps = MAPS.each_ref().map(|kind| {
            let earlier = (kind.claimed)(previous);
            let authors = found.maps[kind.index].keys().filter(|k| !earlier.contains(k) && *k != kind.own_key);
            let mut taken: Taken = authors.map(String::as_str).chain([kind.own_key]).collect();
            taken.keep((kind.claimed)(kept));
            taken
        });
        Ok(Claims {
            status,
            containers,
            lists: found.lists.each_ref().map(|list| list.taken(kept)),
            maps,
            claimed_in_lists: Default::default(),
            kept_map_keys: Default::default(),
            added_to_maps: Default::default(),
            picks: Picks::default(),
            app_containers: app_containers(found, previous, kept, container_keys)?,
            merges: MergeNotes::default(),
        })
    }

    /// Claims the items of the template at `template_index`: what the pod (or an earlier
    /// template) holds is skipped, naming the holder.
    fn claim_template(
        &mut self,
        template_index: usize,
        templates: &'p [PlannedTemplate],
        whole_items: &'w [WholeItems],
        keys: &'p TemplateKeys,
        pod_items: PerPodList<Option<&'w Vec<Value>>>,
    ) {
        let planned = &templates[template_index];
        let t = &planned.rendered;
        let items = &whole_items[template_index];
        let owner = Owner::Template(&t.name);
        for kind in &MAPS {
            for (key, value) in t.map(kind) {
                match self.maps[kind.index].claim(key, owner) {
                    Ok(Claimed::New) => {
                        self.added_to_maps[kind.index].insert(key.clone(), value.clone());
                    }
                    Ok(Claimed::Kept) => self.kept_map_keys[kind.index].push(key.clone()),
                    Err(by) => skip(&mut self.status, t, kind.kind, key, None, by),
                }
            }
        }
        let displaced: Displaced = POD_LISTS.each_ref().map(|kind| {
            displaced_items(
                kind,
                template_index,
                templates,
                whole_items,
                &self.lists[kind.index],
                pod_items[kind.index],
            )
        });
        self.claim_containers(template_index, planned, items, &displaced);
        for (kind, rendered) in POD_LISTS.iter().zip(&items.pod_lists) {
            for (index, item) in rendered.iter().enumerate() {
                // Rendered items were checked to carry their identity (load::check_rendered).
                let identity = kind.identity(item).unwrap_or_default();
                match self.lists[kind.index].claim(identity, owner) {
                    Ok(claimed) => {
                        self.claimed_in_lists[kind.index].push(identity.to_owned());
                        if claimed == Claimed::New {
                            let pick = Pick { kind: WholeKind::PodList(kind.index), template: template_index, index };
                            self.picks.lists[kind.index].push(pick);
                        }
                    }
                    Err(by) if kind.when_held == WhenHeld::Skip => {
                        skip(&mut self.status, t, kind.kind, identity, None, by)
                    }
                    Err(_) => {}
                }
            }
        }
        claim_app_items(
            t,
            (&keys.derived, &keys.merged_env),
            &mut self.app_containers,
            &displaced,
            &mut self.status.skipped,
            &mut self.merges,
        );
    }

    /// Claims a template's init containers and sidecars (in one name space); the sidecars go
    /// where the sidecar mode puts them. A container that refers to a `displaced` item (mounts a
    /// volume) is skipped naming it.
    fn claim_containers(
        &mut self,
        template_index: usize,
        planned: &'p PlannedTemplate,
        items: &'w WholeItems,
        displaced: &Displaced<'w>,
    ) {
        let t = &planned.rendered;
        let owner = Owner::Template(&t.name);
        let sidecar = Placement::of_sidecars(planned.native_sidecars);
        let init = items.init_containers.iter().enumerate().map(|(index, c)| (Placement::Init, index, c));
        let sidecars = items.sidecars.iter().enumerate().map(|(index, c)| (sidecar, index, c));
        for (placement, index, container) in init.chain(sidecars) {
            let name = rendered_name(container);
            let item_kind = placement.item_kind();
            if let Some((kind, identity)) =
                refers_to_any(container, displaced).filter(|_| !held(&self.containers, name))
            {
                skip(&mut self.status, t, item_kind, name, None, Owner::Referenced(kind, identity));
                // Still this template's name: a later template's item of it must not stand in.
                self.containers.hold(name, owner);
                continue;
            }
            match self.containers.claim(name, owner) {
                Ok(claimed) => {
                    placement.record(&mut self.status, name);
                    if claimed == Claimed::New {
                        let list = match placement {
                            Placement::Sidecar => &mut self.picks.containers,
                            Placement::Init | Placement::NativeSidecar => &mut self.picks.init,
                        };
                        list.push(Pick { kind: WholeKind::Container(placement), template: template_index, index });
                    }
                }
                Err(by) => skip(&mut self.status, t, item_kind, name, None, by),
            }
        }
    }

    /// Lets go of the claims (and so of the templates' items) and fills the status with what the
    /// templates hold.
    fn decide(self) -> Decisions<'p> {
        let mut status = self.status;
        for (kind, claimed) in POD_LISTS.iter().zip(self.claimed_in_lists) {
            *(kind.claimed_mut)(&mut status) = claimed;
        }
        for ((kind, kept_keys), added) in MAPS.iter().zip(self.kept_map_keys).zip(&self.added_to_maps) {
            let keys: std::collections::BTreeSet<String> = added.keys().cloned().chain(kept_keys).collect();
            *(kind.claimed_mut)(&mut status) = keys.into_iter().collect();
        }
        Decisions {
            status,
            picks: self.picks,
            added_to_maps: self.added_to_maps,
            app_containers: self.app_containers,
            merges: self.merges,
        }
    }
}

/// Records that template `t` skipped an item `by` another holder.
fn skip(
    status: &mut InjectionStatus,
    t: &RenderedTemplate,
    kind: ItemKind,
    name: &str,
    container: Option<&str>,
    by: Owner,
) {
    status.skipped.push(Skipped {
        template: t.name.clone(),
        kind,
        name: name.to_owned(),
        container: container.map(str::to_owned),
        owner: by.to_string(),
    });
}

/// Whether `name` is held by the pod or an earlier template (their claim is the reason a
/// same-named item is skipped, before any displaced volume).
fn held(taken: &Taken, name: &str) -> bool {
    !matches!(taken.holder(name), None | Some(Owner::Kept))
}

/// Per kind of spec list, the identities of a template's items that are displaced (see
/// [`displaced_items`]).
type Displaced<'w> = PerPodList<Vec<&'w str>>;

/// The template's items of `kind` that the pod (or an earlier template) holds under the same
/// identity with another definition, for a kind whose items are referred to
/// (`PodListKind::referenced_by`). An identity is one only within its kind: whatever of this
/// template refers to such an item would bind to the holder's instead (the author's hostPath
/// where the template meant an emptyDir), so those references are skipped too, naming the item.
fn displaced_items<'w>(
    kind: &PodListKind,
    template_index: usize,
    templates: &[PlannedTemplate],
    whole_items: &'w [WholeItems],
    taken: &Taken,
    pod_items: Option<&Vec<Value>>,
) -> Vec<&'w str> {
    if kind.referenced_by.is_empty() {
        return Vec::new();
    }
    let identity = |item: &'w Value| kind.identity(item).unwrap_or_default();
    whole_items[template_index].pod_lists[kind.index]
        .iter()
        .filter(|item| {
            let name = identity(item);
            let held: Vec<&Value> = match taken.holder(name) {
                None | Some(Owner::Kept) => return false,
                Some(Owner::Template(other)) => whole_items[..template_index]
                    .iter()
                    .zip(templates)
                    .filter(|(_, t)| t.rendered.name == other)
                    .flat_map(|(items, _)| &items.pod_lists[kind.index])
                    .collect(),
                Some(Owner::Pod | Owner::Referenced(..)) => pod_items.into_iter().flatten().collect(),
            };
            !held.iter().any(|held| kind.identity(held) == Some(name) && *held == *item)
        })
        .map(identity)
        .collect()
}

/// Records in the status what the templates add to each app container.
fn record_app_additions(status: &mut InjectionStatus, app_containers: &[AppContainer<'_>]) {
    for app in app_containers.iter().filter(|a| a.lists.iter().any(|l| !l.added.is_empty())) {
        let mut additions = AppContainerAdditions::default();
        for (kind, list) in APP_LISTS.iter().zip(&app.lists) {
            let identities = list.added.iter().filter(|e| !e.merges).filter_map(|e| kind.identity(e.item));
            *(kind.claimed_mut)(&mut additions) = identities.map(Cow::into_owned).collect();
        }
        let env = &app.lists[ENV.index];
        additions.env_merges = env.added.iter().filter(|e| e.merges).filter_map(|e| env_merge::key(e.item)).collect();
        status.app_containers.insert(app.name.to_owned(), additions);
    }
}

/// What the patch adds, once claiming is over.
struct Additions {
    /// Init containers and native sidecars, in order: the last `init_at_end` go after the pod's
    /// own, the others before them.
    init: Vec<Value>,
    init_at_end: usize,
    /// Classic sidecars, in order: the first `containers_at_front` go before the app's
    /// containers, the others after them.
    containers: Vec<Value>,
    containers_at_front: usize,
    lists: PerPodList<Vec<Value>>,
    maps: PerMap<BTreeMap<String, String>>,
    /// Pod-level resources: each changed value's path and new value.
    pod_level: Vec<(String, Value)>,
}

/// Writes the operations: metadata, then init containers, containers (with their env and
/// mounts), spec lists, pod-level resources. Removals go from the highest index down so earlier
/// indexes stay valid. Returns the operations and the keys each map loses.
fn write_patch<'a>(
    pod: &Value,
    found: &'a PodFound<'_>,
    previous: &'a InjectionStatus,
    own_values: PerMap<Option<String>>,
    additions: Additions,
    app_containers: &[AppContainer<'_>],
) -> (Vec<PatchOperation>, PerMap<Vec<&'a str>>) {
    let mut builder = Builder::default();
    if !matches!(pod.get("metadata"), Some(Value::Object(_))) {
        builder.add(&["metadata"], Value::Object(Default::default()));
    }
    // Each map: the keys an earlier injection added go, the templates' come, and the injector's
    // own key says what this injection did.
    let mut map_removals: PerMap<Vec<&str>> = Default::default();
    let maps = MAPS.iter().zip(additions.maps).zip(own_values);
    for (((kind, mut added), own_value), removals) in maps.zip(&mut map_removals) {
        let map = &found.maps[kind.index];
        removals.extend((kind.claimed)(previous).iter().map(String::as_str).filter(|k| map.contains_key(*k)));
        match own_value {
            Some(value) => {
                added.insert(kind.own_key.to_owned(), value);
            }
            None if map.contains_key(kind.own_key) => removals.push(kind.own_key),
            None => {}
        }
        let empties = removals.len() == map.len();
        let existing = pod.get("metadata").and_then(|m| m.get(kind.field));
        builder.string_map(kind.field, existing, removals, added, empties);
    }

    let init_path = ["spec", "initContainers"];
    let init_left =
        builder.removals(&init_path, &found.removed_init, found.init_names.len(), additions.init.is_empty());
    let mut init = additions.init;
    let init_last = init.split_off(init.len() - additions.init_at_end);
    let init_exists = init_left || !init.is_empty();
    builder.insert_front(&init_path, init_left, init);
    builder.append(&init_path, init_exists, init_last);

    // The app containers stay, so the list is never removed whole.
    builder.removals(&["spec", "containers"], &found.removed_containers, usize::MAX, false);
    for app in app_containers {
        let index = app.new_index.to_string();
        for list in &app.lists {
            let path = ["spec", "containers", &index, list.field];
            let nothing_follows = list.added.iter().all(|a| a.kept);
            let left = list.present && builder.removals(&path, &list.removed, list.count, nothing_follows);
            builder.append(&path, left, list.added.iter().filter(|a| !a.kept).map(|a| a.item.clone()).collect());
        }
    }
    // After the app containers' own operations, which address them by their index before these.
    let mut containers_first = additions.containers;
    let containers_after = containers_first.split_off(additions.containers_at_front);
    builder.append(&["spec", "containers"], true, containers_after);
    builder.insert_front(&["spec", "containers"], true, containers_first);

    for (list, new) in found.lists.iter().zip(additions.lists) {
        let path = ["spec", list.kind.field];
        let left = builder.removals(&path, &list.removed, list.identities.len(), new.is_empty());
        builder.append(&path, left, new);
    }
    for (path, value) in additions.pod_level {
        let path = PointerBuf::parse(&path).expect("pod_resources::path writes a pointer");
        builder.add_at(path, value);
    }
    (builder.into_operations(), map_removals)
}

/// What the API server would refuse in the pod because of what the injection adds (see
/// `api_limits`), one sentence each as the API server words it: the annotations' total size
/// (only when the injection is what pushes it over), the keys and values added to each map, and
/// the identities of the containers and spec-list items the injection puts in the pod.
fn api_violations(
    found: &PodFound<'_>,
    previous: &InjectionStatus,
    status: &InjectionStatus,
    added: &PerMap<BTreeMap<String, String>>,
    own_values: &PerMap<Option<String>>,
) -> Vec<String> {
    let mut violations = Vec::new();
    for kind in &MAPS {
        let (before, added, own_value) = (&found.maps[kind.index], &added[kind.index], &own_values[kind.index]);
        if let Some(limit) = kind.total_size_limit {
            // What the pod keeps of its own, then what the injection writes.
            let replaced = |key: &str| {
                key == kind.own_key || added.contains_key(key) || (kind.claimed)(previous).iter().any(|k| k == key)
            };
            let authored: usize = before.iter().map(api_limits::entry_size).sum();
            let kept: usize = before.iter().filter(|(k, _)| !replaced(k)).map(api_limits::entry_size).sum();
            let own = own_value.as_ref().map_or(0, |v| kind.own_key.len() + v.len());
            let after = kept + added.iter().map(api_limits::entry_size).sum::<usize>() + own;
            if after > limit && authored <= limit {
                violations.push(format!(
                    "metadata.{}: Too long: may not be more than {limit} bytes (the pod's own come to {authored} bytes, with the injection's {after})",
                    kind.field
                ));
            }
        }
        for (key, value) in added {
            let problems = [api_limits::qualified_name_problem(key), (kind.value_problem)(value)];
            for (problem, what) in problems.into_iter().zip([key, value]) {
                if let Some(problem) = problem {
                    violations.push(format!("metadata.{}: Invalid value: {what:?}: {problem}", kind.field));
                }
            }
        }
    }
    for list in &CONTAINER_LISTS {
        for name in (list.claimed)(status) {
            if let Some(problem) = (list.identity_problem)(name) {
                violations.push(format!("spec.{}: the injected {}'s name {name:?}: {problem}", list.field, list.noun));
            }
        }
    }
    for kind in &POD_LISTS {
        for identity in (kind.claimed)(status) {
            if let Some(problem) = (kind.identity_problem)(identity) {
                let noun = kind.kind.describe();
                violations
                    .push(format!("spec.{}: the injected {noun}'s {} {identity:?}: {problem}", kind.field, kind.key));
            }
        }
    }
    violations
}

/// A merging env var's status key and the entry it adds where the app container has the variable.
type MergedEnvEntry = (String, Value);

/// What merging env vars say about the values they merge into: a note per merge (for `explain`),
/// and the merges into a value only an `envFrom` source may hold (warnings for the pod's creator).
#[derive(Default)]
struct MergeNotes {
    notes: Vec<String>,
    warnings: Vec<String>,
}

/// Claims a template's env vars, `envFrom` sources and mounts in every app container it targets,
/// recording the skipped ones: an item that refers to a `displaced` one (a mount of a displaced
/// volume) is skipped naming it, and a merging
/// env var adds the entry that merges into the container's own variable where it has one.
/// `keys`: the template's `envFrom` keys, and each env var's merged entry with its status key.
fn claim_app_items<'a>(
    t: &'a RenderedTemplate,
    (derived_keys, merged_env): (&'a PerAppList<Vec<String>>, &'a [Option<MergedEnvEntry>]),
    app_containers: &mut [AppContainer<'a>],
    displaced: &Displaced<'_>,
    skipped: &mut Vec<Skipped>,
    merge_out: &mut MergeNotes,
) {
    let owner = Owner::Template(&t.name);
    let mut skip = |kind: ItemKind, name: &str, container: &str, by: String| {
        skipped.push(Skipped {
            template: t.name.clone(),
            kind,
            name: name.to_owned(),
            container: Some(container.to_owned()),
            owner: by,
        });
    };
    let held = |taken: &Taken, name: &str| !matches!(taken.holder(name), None | Some(Owner::Kept));
    let mut merged_env = merged_env.iter().map(|m| m.as_ref().map(|(k, e)| (k.as_str(), e)));
    let kinds: PerAppList<(ItemKind, AppItems)> = APP_LISTS.each_ref().map(|kind| {
        let items = t.app_list(kind).iter();
        let items: AppItems = match kind.identity {
            Identity::Field(field) => {
                let identity = |item: &'a Value| item.get(field).and_then(Value::as_str).unwrap_or_default();
                match kind.index == ENV.index {
                    true => items.zip(&mut merged_env).map(|(e, merged)| (e, identity(e), merged)).collect(),
                    false => items.map(|e| (e, identity(e), None)).collect(),
                }
            }
            Identity::Derived(_) => items.zip(&derived_keys[kind.index]).map(|(e, k)| (e, k.as_str(), None)).collect(),
        };
        (kind.kind, items)
    });
    let any_displaced = displaced.iter().any(|identities| !identities.is_empty());
    for app in app_containers.iter_mut().filter(|app| t.targets.includes(app.name)) {
        for ((app_kind, (kind, items)), list) in APP_LISTS.iter().zip(&kinds).zip(&mut app.lists) {
            for (item, key, merged) in items {
                let displacement = || {
                    POD_LISTS.iter().find_map(|pod_kind| {
                        let used = pod_kind.referred_to_by_item(app_kind, item)?;
                        displaced[pod_kind.index].contains(&used).then(|| pod_kind.skip_owner(used))
                    })
                };
                if any_displaced
                    && !held(&list.taken, key)
                    && let Some(by) = displacement()
                {
                    skip(*kind, key, app.name, by);
                    list.taken.hold(key, owner);
                    continue;
                }
                // A merging env var whose name the container (or an earlier template) already
                // defines, or may get from `envFrom`, adds the entry that refers to it instead.
                let merged = merged.filter(|_| match list.taken.holder(key) {
                    Some(Owner::Kept) => false,
                    Some(_) => true,
                    None => !env_merge::possible_sources(app.container, key).is_empty(),
                });
                // For a merging env var: the author's entry of this name, never one an earlier
                // injection added.
                let own = (*kind == ItemKind::Env && t.env_merges.contains_key(*key))
                    .then(|| env_merge::own_entry(app.container, key, &list.removed))
                    .flatten();
                // For `explain`: where the value a merging env var adds to comes from.
                let mut uncertain = false;
                let merge_note = t.env_merges.get(*key).filter(|_| *kind == ItemKind::Env).map(|merge| {
                    let app_value = env_merge::AppValue::of(app.container, own, key);
                    uncertain = merged.is_some() && matches!(app_value, env_merge::AppValue::MaybeFrom(_));
                    let note = match (merged, app_value) {
                        (Some(_), env_merge::AppValue::NotVisible) => {
                            format!("{key}: merged into the value an earlier template adds ({})", merge.describe())
                        }
                        (Some(_), found) => found.explain(key, merge),
                        (None, _) => env_merge::AppValue::NotVisible.explain(key, merge),
                    };
                    format!("container {}: {note}", app.name)
                });
                let fragment = item.get("value").and_then(Value::as_str).unwrap_or_default();
                let (claim_key, item, merges) = match merged {
                    Some((merged_key, entry)) => (merged_key, entry, true),
                    None => (*key, *item, false),
                };
                // Loaded already when the value the kubelet will give the variable (from every entry
                // of the name, the last one winning) holds the fragment.
                let loaded_already = merges
                    && list.taken.holder(claim_key).is_none()
                    && t.env_merges.get(*key).is_some_and(|merge| {
                        let effective = env_merge::effective_value(app.container, key, &list.removed);
                        env_merge::already_has(effective.as_deref(), merge, fragment)
                    });
                let claimed = match loaded_already {
                    true => Err(Owner::Pod),
                    false => list.taken.claim(claim_key, owner),
                };
                match claimed {
                    Ok(claimed) => {
                        list.added.push(Addition { item, kept: claimed == Claimed::Kept, merges });
                        if uncertain {
                            merge_out.warnings.extend(merge_note.clone());
                        }
                        merge_out.notes.extend(merge_note);
                        // A later template's plain item of this name must not replace it.
                        list.taken.hold(key, owner);
                    }
                    Err(by) => {
                        let kind = if merges { ItemKind::EnvMerge } else { *kind };
                        skip(kind, key, app.name, by.to_string())
                    }
                }
            }
        }
    }
}

/// The keys of the pod's app containers' `envFrom` sources, and of their env entries that refer
/// to their own name as merged entries do (`env_merge`): computed once, borrowed by the lists.
struct ContainerKeys {
    env_from: Vec<Vec<String>>,
    env_self: Vec<Vec<Option<String>>>,
}

impl ContainerKeys {
    fn of(containers: &[Value]) -> Self {
        fn list<'c>(container: &'c Value, field: &str) -> impl Iterator<Item = &'c Value> {
            container.get(field).and_then(Value::as_array).into_iter().flatten()
        }
        ContainerKeys {
            env_from: containers.iter().map(|c| list(c, "envFrom").map(pod_env_from_key).collect()).collect(),
            env_self: containers.iter().map(|c| list(c, "env").map(env_merge::pod_entry_key).collect()).collect(),
        }
    }
}

/// The pod's app containers (not the sidecars of an earlier injection, whether they go or stay),
/// with their index once the removed sidecars are gone and their keyed lists.
fn app_containers<'p>(
    found: &PodFound<'p>,
    previous: &InjectionStatus,
    kept: &'p InjectionStatus,
    keys: &'p ContainerKeys,
) -> Result<Vec<AppContainer<'p>>, PodShapeError> {
    let (names, removed) = (&found.container_names, &found.removed_containers);
    let mut app_containers = Vec::new();
    for (index, container) in found.containers.iter().enumerate() {
        if removed.contains(&index) || kept.containers.iter().any(|k| k == names[index]) {
            continue;
        }
        let name = names[index];
        let field = || format!("spec.containers[{index}]");
        let prev = previous.app_containers.get(name);
        let kept_here = kept.app_containers.get(name);
        let env = named_list(container, "env", field)?;
        let mounts = named_list(container, "volumeMounts", field)?;
        named_list(container, "envFrom", field)?;
        let env_names = pod::names(env, || format!("{}.env", field()))?;
        let mount_paths = pod::keys(mounts, "mountPath", || format!("{}.volumeMounts", field()))?;
        let source_keys: Vec<&str> = keys.env_from[index].iter().map(String::as_str).collect();
        app_containers.push(AppContainer {
            name,
            container,
            new_index: index - removed.iter().filter(|r| **r < index).count(),
            lists: [
                AppList::env(container, env_names, &keys.env_self[index], prev, kept_here),
                AppList::new(
                    container,
                    ENV_FROM,
                    source_keys,
                    prev.map(|a| &a.env_from),
                    kept_here.map(|a| &a.env_from),
                ),
                AppList::new(
                    container,
                    VOLUME_MOUNTS,
                    mount_paths,
                    prev.map(|a| &a.volume_mounts),
                    kept_here.map(|a| &a.volume_mounts),
                ),
            ],
        });
    }
    Ok(app_containers)
}

/// The items of a pod's container list that stay (not at `removed`), without the `injected` ones
/// when `author_only`.
fn staying<'p>(
    list: Option<&'p Vec<Value>>,
    removed: &[usize],
    injected: &[String],
    author_only: bool,
) -> Vec<&'p Value> {
    let injected_here = |c: &Value| injected.iter().any(|n| Some(n.as_str()) == c.get("name").and_then(Value::as_str));
    list.into_iter()
        .flatten()
        .enumerate()
        .filter(|(i, c)| !(removed.contains(i) || author_only && injected_here(c)))
        .map(|(_, c)| c)
        .collect()
}

/// A pod's pod-level resources as it sets them, padded for the injected containers, and the
/// padding between them.
struct Resized {
    now: pod_resources::PodLevel,
    padded: pod_resources::PodLevel,
    padding: crate::model::status::Padding,
}

impl Resized {
    /// The patch's operations: each value that changes, at its path.
    fn operations(&self) -> Vec<(String, Value)> {
        pod_resources::changes(&self.now, &self.padded)
            .into_iter()
            .map(|(field, resource, value)| (pod_resources::path(field, resource), value))
            .collect()
    }
}

/// For a pod that sets pod-level resources (`now`): its values now, the values padded for the
/// injected containers, and the padding; or what the API server would refuse in the padded pod.
/// `earlier`: the padding of an earlier injection (proven by `ownership`), taken back first;
/// `author`: the pod's containers without any injected one; `after`: with the injection's.
fn resize_pod_level(
    now: pod_resources::PodLevel,
    earlier: Option<&crate::model::status::Padding>,
    author: &pod_resources::Containers<'_>,
    after: &pod_resources::Containers<'_>,
) -> Option<Result<Resized, Vec<String>>> {
    let authors = match earlier {
        Some(padding) => now.with(padding, -1)?,
        None => now.clone(),
    };
    let padding = pod_resources::padding(&authors, author, after);
    let padded = authors.with(&padding, 1)?;
    let violations = pod_resources::violations(&padded, after);
    Some(match violations.is_empty() {
        true => Ok(Resized { now, padded, padding }),
        false => Err(violations),
    })
}

use crate::names::SERVICE_ACCOUNT_TOKEN_PATH;

/// A template's containers, init containers and spec-list items, taken out of its rendering for
/// `plan`.
struct WholeItems {
    init_containers: Vec<Value>,
    sidecars: Vec<Value>,
    pod_lists: PerPodList<Vec<Value>>,
}

/// Which list of [`WholeItems`] an added item comes from, and how it goes into the pod.
#[derive(Clone, Copy)]
enum WholeKind {
    Container(Placement),
    /// An item of the spec list of this index in `kinds::POD_LISTS`.
    PodList(usize),
}

/// An item `plan` adds: its list, its template's position in the plan and its own in the list.
#[derive(Clone, Copy)]
struct Pick {
    kind: WholeKind,
    template: usize,
    index: usize,
}

impl WholeItems {
    fn out_of(rendered: &mut RenderedTemplate) -> Self {
        WholeItems {
            init_containers: std::mem::take(&mut rendered.init_containers),
            sidecars: std::mem::take(&mut rendered.sidecars),
            pod_lists: std::mem::take(&mut rendered.pod_lists),
        }
    }

    /// Moves one item out (each is added at most once: its name is claimed once), shaped for
    /// where it goes; without the default `resizePolicy` where the API server would refuse it.
    fn take(&mut self, kind: WholeKind, index: usize, sidecar_resize_policy: bool) -> Value {
        let list = match kind {
            WholeKind::Container(Placement::Init) => &mut self.init_containers,
            WholeKind::Container(_) => &mut self.sidecars,
            WholeKind::PodList(index) => &mut self.pod_lists[index],
        };
        let mut item = std::mem::take(&mut list[index]);
        if let WholeKind::Container(placement) = kind {
            let own_policy = item.get("resizePolicy").is_some();
            placement.shape(&mut item);
            if !sidecar_resize_policy
                && !own_policy
                && let Value::Object(fields) = &mut item
            {
                fields.remove("resizePolicy");
            }
        }
        item
    }
}

/// One kind of spec list of the pod (`kinds::POD_LISTS`) and what the injection does to it.
struct PodList<'p> {
    kind: &'static PodListKind,
    /// The pod's items.
    items: Option<&'p Vec<Value>>,
    /// Their identities, in order.
    identities: Vec<&'p str>,
    /// Indexes (ascending) of the items an earlier injection provably added.
    removed: Vec<usize>,
}

impl<'p> PodList<'p> {
    /// Every kind of spec list of the pod, in the order of `kinds::POD_LISTS`.
    fn all_of(pod: &'p Value, previous: &InjectionStatus) -> Result<PerPodList<Self>, PodShapeError> {
        let mut malformed = None;
        let lists = std::array::from_fn(|index| {
            let kind = &POD_LISTS[index];
            PodList::of(pod, kind, previous).unwrap_or_else(|error| {
                malformed.get_or_insert(error);
                PodList { kind, items: None, identities: Vec::new(), removed: Vec::new() }
            })
        });
        match malformed {
            Some(error) => Err(error),
            None => Ok(lists),
        }
    }

    fn of(pod: &'p Value, kind: &'static PodListKind, previous: &InjectionStatus) -> Result<Self, PodShapeError> {
        let items = pod::list(pod, kind.field)?;
        let identities = match kind.key_required {
            true => pod::keys(items, kind.key, || format!("spec.{}", kind.field))?,
            false => items.into_iter().flatten().map(|item| kind.identity(item).unwrap_or_default()).collect(),
        };
        let removed = indexes_named(&identities, (kind.claimed)(previous));
        Ok(PodList { kind, items, identities, removed })
    }

    /// The identities the pod holds once the removed items are gone, and those a kept injection
    /// holds.
    fn taken<'a>(&self, kept: &'a InjectionStatus) -> Taken<'a>
    where
        'p: 'a,
    {
        let mut taken = Taken::by_pod(&self.identities, &self.removed);
        taken.keep((self.kind.claimed)(kept));
        taken
    }
}

/// The items `plan` removes, in the status layout (for `explain` and the warnings of `inject`).
fn removed_items(
    previous: &InjectionStatus,
    pod: &PodFound<'_>,
    map_removals: &PerMap<Vec<&str>>,
    app_containers: &[AppContainer<'_>],
) -> InjectionStatus {
    let present = |names: &[String], from: &[&str]| -> Vec<String> {
        names.iter().filter(|n| from.contains(&n.as_str())).cloned().collect()
    };
    let mut removed = InjectionStatus {
        templates: previous.templates.clone(),
        native_sidecars: present(&previous.native_sidecars, &pod.init_names),
        app_containers: app_containers
            .iter()
            .filter_map(|app| {
                let prev = previous.app_containers.get(app.name)?;
                // `previous` holds only items the pod has (proven by `ownership`).
                (!prev.is_empty()).then(|| (app.name.to_owned(), prev.clone()))
            })
            .collect(),
        ..InjectionStatus::default()
    };
    for (kind, names) in CONTAINER_LISTS.iter().zip([&pod.container_names, &pod.init_names]) {
        *(kind.claimed_mut)(&mut removed) = present((kind.claimed)(previous), names);
    }
    for list in &pod.lists {
        *(list.kind.claimed_mut)(&mut removed) = present((list.kind.claimed)(previous), &list.identities);
    }
    for (kind, removals) in MAPS.iter().zip(map_removals) {
        let keys = removals.iter().filter(|k| **k != kind.own_key).map(|k| (*k).to_owned());
        *(kind.claimed_mut)(&mut removed) = keys.collect();
    }
    removed
}

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

/// The first `displaced` item that `container` refers to (a volume it mounts or attaches), with
/// its kind.
fn refers_to_any<'w>(container: &Value, displaced: &Displaced<'w>) -> Option<(&'static PodListKind, &'w str)> {
    POD_LISTS.iter().filter(|kind| !displaced[kind.index].is_empty()).find_map(|kind| {
        let displaced = &displaced[kind.index];
        let used = kind.referred_to_by(container).find_map(|used| displaced.iter().find(|d| **d == used))?;
        Some((kind, *used))
    })
}

struct AppContainer<'p> {
    name: &'p str,
    container: &'p Value,
    new_index: usize,
    /// `env` (by name), `envFrom` (by `env_from_key`), `volumeMounts` (by mount path).
    lists: [AppList<'p>; 3],
}

/// One keyed list of an app container and what the injection does to it.
struct AppList<'p> {
    field: &'static str,
    /// Whether the container has the field (so additions append rather than create it).
    present: bool,
    /// Items the container has.
    count: usize,
    taken: Taken<'p>,
    /// Indexes (ascending) of the items an earlier injection provably added.
    removed: Vec<usize>,
    added: Vec<Addition<'p>>,
}

impl<'p> AppList<'p> {
    /// The `env` list: entries are identified by name, and merged entries (which repeat a name)
    /// by `NAME=VALUE` (`self_keys`, per entry) as well.
    fn env(
        container: &Value,
        names: Vec<&'p str>,
        self_keys: &'p [Option<String>],
        previous: Option<&AppContainerAdditions>,
        kept: Option<&'p AppContainerAdditions>,
    ) -> Self {
        let keyed: Vec<&str> = self_keys.iter().map(|k| k.as_deref().unwrap_or_default()).collect();
        let entries = container.get("env").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        let mut removed = previous.map(|p| indexes_in_effect(ENV, entries, &p.env)).unwrap_or_default();
        // A merged entry is proven by its last copy (`ownership`), so that is the one removed.
        removed.extend(previous.map(|p| last_indexes_named(&keyed, &p.env_merges)).unwrap_or_default());
        removed.sort_unstable();
        removed.dedup();
        let mut taken = Taken::by_pod(&names, &removed);
        // A copy of a merged entry that a later entry of its name overrides adds nothing to what
        // the container runs with: it does not stand for the merge.
        for (index, key) in self_keys.iter().enumerate() {
            if let Some(key) = key
                && removed.binary_search(&index).is_err()
                && !env_merge::overridden(entries, index, &removed)
            {
                taken.mark_pod(key);
            }
        }
        if let Some(kept) = kept {
            taken.keep(kept.env.iter().chain(&kept.env_merges));
        }
        AppList {
            field: "env",
            present: container.get("env").is_some_and(|v| !v.is_null()),
            count: names.len(),
            taken,
            removed,
            added: Vec::new(),
        }
    }

    fn new(
        container: &Value,
        kind: &AppListKind,
        keys: Vec<&'p str>,
        previous: Option<&Vec<String>>,
        kept: Option<&'p Vec<String>>,
    ) -> Self {
        let field = kind.field;
        let items = container.get(field).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        let removed = previous.map(|p| indexes_in_effect(kind, items, p)).unwrap_or_default();
        let mut taken = Taken::by_pod(&keys, &removed);
        if let Some(kept) = kept {
            taken.keep(kept);
        }
        AppList {
            field,
            present: container.get(field).is_some_and(|v| !v.is_null()),
            count: keys.len(),
            taken,
            removed,
            added: Vec::new(),
        }
    }
}

/// An env var, `envFrom` source or mount a template gives an app container.
struct Addition<'p> {
    item: &'p Value,
    /// Already there from an earlier injection of the same template version: nothing to add.
    kept: bool,
    /// An env entry merged into the container's own variable (`env_merge`).
    merges: bool,
}

/// A merging env var's entry for a container that has the variable: its status key and the entry.
type MergedEntry<'t> = (&'t str, &'t Value);

/// A template's items for one app container list: the item, its key, and for a merging env var
/// the entry it adds instead when the container has the variable.
type AppItems<'t> = Vec<(&'t Value, &'t str, Option<MergedEntry<'t>>)>;

fn rendered_name(item: &Value) -> &str {
    // Rendered items were checked to carry a string name (load::check_rendered).
    item.get("name").and_then(Value::as_str).unwrap_or_default()
}

/// The identities of a template's app-list items of the kinds whose identity is derived (empty
/// lists for the others): rendered items were checked to have one (`load::check_rendered`).
fn derived_identities(rendered: &RenderedTemplate) -> PerAppList<Vec<String>> {
    APP_LISTS.each_ref().map(|kind| match kind.identity {
        Identity::Field(_) => Vec::new(),
        Identity::Derived(derive) => rendered.app_list(kind).iter().filter_map(derive).collect(),
    })
}

/// The key of a pod's own `envFrom` source; one `env_from_key` never yields (so it never matches
/// a template's) when the source has no usable reference.
fn pod_env_from_key(source: &Value) -> String {
    env_from_key(source).unwrap_or_default()
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
/// The indexes (ascending) of the items of a container's list that `claimed` names, each the
/// one in effect where the list holds an identity twice (`AppListKind::in_effect`): the one a
/// claim is proven by.
fn indexes_in_effect(kind: &AppListKind, items: &[Value], claimed: &[String]) -> Vec<usize> {
    let mut indexes: Vec<usize> = claimed.iter().filter_map(|c| kind.in_effect(items, c).map(|(i, _)| i)).collect();
    indexes.sort_unstable();
    indexes.dedup();
    indexes
}

/// The index of the last item of each of the `wanted` names, ascending.
fn last_indexes_named(names: &[&str], wanted: &[String]) -> Vec<usize> {
    let mut indexes: Vec<usize> = wanted.iter().filter_map(|w| names.iter().rposition(|n| *n == w.as_str())).collect();
    indexes.sort_unstable();
    indexes.dedup();
    indexes
}

fn indexes_named(names: &[&str], wanted: &[String]) -> Vec<usize> {
    let mut wanted: HashSet<&str> = wanted.iter().map(String::as_str).collect();
    names.iter().enumerate().filter(|(_, n)| wanted.remove(**n)).map(|(i, _)| i).collect()
}
