//! The policy's program: from the compiled templates (`Plan`s), the claims of names between them
//! and the pod (`Claims`), the JSONPatch operations, the status annotation, the skips and the
//! match condition, as CEL variables and mutations (`ProgramBuilder`).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::cel::*;
use super::expressions::*;
use crate::model::kinds::{
    APP_LISTS, CONTAINER_LISTS, CONTAINERS, INIT_CONTAINERS, MAPS, POD_LISTS, PerAppList, PerMap, PerPodList,
    Placement, PodListKind, VOLUMES, WhenHeld,
};
use crate::model::status::ItemKind;
use crate::names;
use crate::names::SERVICE_ACCOUNT_TOKEN_PATH;
use crate::templates::template::AppTargets;

pub(super) struct Program {
    pub(super) variables: Vec<Value>,
    pub(super) patch: String,
}

/// One item a template adds, with what identifies it.
#[derive(Debug, Clone)]
pub(super) struct Item {
    pub(super) kind: ItemKind,
    pub(super) key: String,
    pub(super) when: Option<String>,
    pub(super) value: String,
}

#[derive(Debug, Clone)]
pub(super) struct Plan {
    /// Per kind of spec list, the template's items that something of the template refers to (the
    /// volumes it mounts; all of them when a reference is an expression).
    pub(super) referenced: PerPodList<Vec<String>>,
    pub(super) name: String,
    pub(super) hash: String,
    pub(super) selected: String,
    /// When the pod's annotations for this template let the policy inject it (see `Cx::admissible`).
    pub(super) admissible: String,
    pub(super) enforced: bool,
    /// The entries of each kind of map (`kinds::MAPS`).
    pub(super) maps: PerMap<Vec<(String, Val)>>,
    /// The template's init containers, then its sidecars, each with where it goes.
    pub(super) containers: Vec<(Placement, Item)>,
    /// The items of each kind of spec list (`kinds::POD_LISTS`; none of a kind the policy mode
    /// does not add, see `compile_template`).
    pub(super) pod_lists: PerPodList<Vec<Item>>,
    /// The items of each app-container list (`kinds::APP_LISTS`).
    pub(super) app: PerAppList<Vec<Item>>,
    pub(super) targets: AppTargets,
}

/// Each map of the pod (`kinds::MAPS`) in CEL.
pub(super) const MAP_CEL_OF_POD: PerMap<&str> = ["variables.podLabels", "object.metadata.?annotations.orValue({})"];

/// The identity of an app-container list's item in CEL (`x` the pod's item), per description of
/// `kinds::APP_LISTS`: what `AppListKind::identity` computes, written for the API server.
pub(super) const APP_LIST_CEL_IDENTITY: PerAppList<&str> = [
    "x.name",
    "((has(x.configMapRef) && x.configMapRef.?name.orValue(\"\") != \"\" && !(has(x.secretRef) && x.secretRef.?name.orValue(\"\") != \"\")) ? \"configMap/\" + x.configMapRef.name : ((has(x.secretRef) && x.secretRef.?name.orValue(\"\") != \"\" && !(has(x.configMapRef) && x.configMapRef.?name.orValue(\"\") != \"\")) ? \"secret/\" + x.secretRef.name : \"\")) + (x.?prefix.orValue(\"\") != \"\" ? \"+\" + x.prefix : \"\")",
    "x.mountPath",
];

/// What holds a name at admission: the pod, or (by index into the flags) an earlier item.
#[derive(Default)]
pub(super) struct Claims<'p> {
    /// (key, flag variable, template) of items added so far, per name space.
    pub(super) earlier: BTreeMap<&'static str, Vec<(String, String, &'p str)>>,
}

impl<'p> Claims<'p> {
    /// The flags of earlier items with this key, and the owner text (CEL) for a skip given
    /// `pod_has`.
    pub(super) fn earlier(&self, space: &'static str, key: &str) -> Vec<(&str, &'p str)> {
        self.earlier
            .get(space)
            .into_iter()
            .flatten()
            .filter(|(k, _, _)| k == key)
            .map(|(_, f, t)| (f.as_str(), *t))
            .collect()
    }
    pub(super) fn add(&mut self, space: &'static str, key: &str, flag: String, template: &'p str) {
        self.earlier.entry(space).or_default().push((key.to_owned(), flag, template));
    }
}

/// The owner of a skipped item: the pod when it has the name, else the first earlier template.
pub(super) fn owner_cel(pod_has: &str, earlier: &[(String, &str)]) -> String {
    let mut owner = lit("pod");
    for (flag, template) in earlier.iter().rev() {
        owner = format!("({flag} ? {} : {owner})", lit(&format!("template:{template}")));
    }
    format!("({pod_has} ? {} : {owner})", lit("pod"))
}

/// A skipped item's status entry (the `Skipped` field order: template, kind, name, container,
/// owner) as CEL; `container` is CEL (a container's name, put in unescaped: one that is not a DNS
/// label — the only way to break the JSON — makes the API server's validation, which runs after the
/// policy, refuse the pod, so such a status is never stored).
pub(super) fn skip_json(template: &str, kind: ItemKind, name: &str, container: Option<&str>, owner: &str) -> String {
    let json = |s: &str| serde_json::to_string(s).expect("strings serialize");
    let head = format!("{{\"template\":{},\"kind\":\"{}\",\"name\":{}", json(template), kind_name(kind), json(name));
    let tail = format!("{} + {owner} + {}", lit(",\"owner\":\""), lit("\"}"));
    match container {
        Some(container) => {
            format!("{} + {container} + {}", lit(&format!("{head},\"container\":\"")), lit("\"") + " + " + &tail)
        }
        None => format!("{} + {tail}", lit(&head)),
    }
}

impl Program {
    /// The policy's variables and its patch for the compiled `plans`, in the engine's order; a pod
    /// that selects a template of `leave_to_webhook` (their selections, CEL) is the webhook's.
    pub(super) fn new(plans: &[Plan], leave_to_webhook: &[String]) -> Program {
        let mut program = ProgramBuilder::new(plans);
        for i in 0..plans.len() {
            program.add_metadata(i);
            program.add_containers(i);
            program.add_pod_lists(i);
            program.add_app_items(i);
        }
        let any_skip = any(program.skip_any_by_plan.iter().flatten().cloned());
        program.vars.push(("anySkip".into(), any_skip));
        let handled = program.handled(leave_to_webhook);
        program.vars.push(("handled".into(), handled));
        let status = program.status();
        program.vars.push(("status".into(), status));
        let variables =
            program.vars.iter().map(|(name, expression)| json!({"name": name, "expression": expression})).collect();
        Program { variables, patch: program.patch() }
    }
}

/// The variables every policy starts with: the pod's and namespace's maps and names that the
/// items' conditions read, and the service-account token mount containers get.
pub(super) fn pod_variables() -> Vec<(String, String)> {
    let mut vars: Vec<(String, String)> = vec![
        ("podLabels".into(), "object.metadata.?labels.orValue({})".into()),
        ("namespaceLabels".into(), "namespaceObject.metadata.?labels.orValue({})".into()),
        ("namespaceAnnotations".into(), "namespaceObject.metadata.?annotations.orValue({})".into()),
        ("containerNames".into(), "object.spec.containers.map(c, c.name)".into()),
        ("allContainers".into(), "object.spec.containers + object.spec.?initContainers.orValue([])".into()),
    ];
    // The identities of the pod's items of each kind of spec list the policy adds.
    for kind in POD_LISTS.iter().filter(|kind| kind.in_policy) {
        let key = match kind.key_required {
            true => format!("x.{}", kind.key),
            false => format!("x.?{}.orValue(\"\")", kind.key),
        };
        vars.push((pod_list_keys(kind), format!("object.spec.?{}.orValue([]).map(x, {key})", kind.field)));
    }
    vars.extend([
        (
            "tokenVolumes".into(),
            format!("variables.{}.filter(n, n.startsWith(\"kube-api-access-\"))", pod_list_keys(VOLUMES)),
        ),
        // `plan::service_account_token_mount`: the mount the ServiceAccount plugin gave
        // every container, when it gave it to all and is allowed to.
        (
            "tokenMounts".into(),
            format!(
                "(object.spec.?automountServiceAccountToken.orValue(true) && size(variables.tokenVolumes) > 0 \
                 && variables.allContainers.all(c, c.?volumeMounts.orValue([]).exists(m, m.mountPath == {p})) \
                 && variables.allContainers.exists(c, c.?volumeMounts.orValue([]).exists(m, m.name == variables.tokenVolumes[0] \
                 && m.?readOnly.orValue(false) && m.mountPath == {p} && !has(m.subPath) && !has(m.subPathExpr) \
                 && !has(m.mountPropagation) && !has(m.recursiveReadOnly)))) \
                 ? [{{\"name\": dyn(variables.tokenVolumes[0]), \"readOnly\": dyn(true), \"mountPath\": dyn({p})}}] : []",
                p = lit(SERVICE_ACCOUNT_TOKEN_PATH)
            ),
        ),
    ]);
    vars
}

/// An item whose key is the same for every pod (a map entry, container, volume or pull secret),
/// as `ProgramBuilder::static_item` flags it.
pub(super) struct StaticItem<'a> {
    /// The name space its key is unique in (`containers`, `volumes`, a map's field, ...).
    pub(super) space: &'static str,
    pub(super) kind: ItemKind,
    pub(super) key: &'a str,
    pub(super) when: &'a Option<String>,
    /// Whether the pod has an item with the key (CEL).
    pub(super) pod_has: String,
    /// Whether a skip gets a status entry (a pull secret's does not).
    pub(super) report_skip: bool,
}

/// `Program::new`'s work in progress: the variables so far, and what the plans' items add to the
/// patch and to the status, gathered plan by plan in the engine's order.
#[derive(Default)]
pub(super) struct ProgramBuilder<'p> {
    pub(super) plans: &'p [Plan],
    /// `variables.s<i>`: whether plan `i`'s template is selected.
    pub(super) selected: Vec<String>,
    /// The policy's variables (name, CEL), in order.
    pub(super) vars: Vec<(String, String)>,
    /// Flags of the items with static identities: added or not.
    pub(super) claims: Claims<'p>,
    pub(super) flag_count: usize,
    /// Per metadata map (labels, annotations): the operations, and the keys added (for the
    /// status) with the flags that add them.
    pub(super) metadata_ops: [Vec<String>; 2],
    pub(super) metadata_status: [BTreeMap<String, Vec<String>>; 2],
    /// Per list of containers (`kinds::CONTAINER_LISTS`): (flag, value) of the containers added
    /// there, and (flag, name as JSON text) for its status list.
    pub(super) container_ops: [Vec<(String, String)>; CONTAINER_LISTS.len()],
    pub(super) container_status: [Vec<(String, String)>; CONTAINER_LISTS.len()],
    /// (flag, name as JSON text) of the native sidecars, for their status list.
    pub(super) native_status: Vec<(String, String)>,
    /// Per kind of spec list (`kinds::POD_LISTS`): (flag, value) of the items added, and (flag,
    /// identity as JSON text) for its status list.
    pub(super) pod_list_ops: PerPodList<Vec<(String, String)>>,
    pub(super) pod_list_status: PerPodList<Vec<(String, String)>>,
    /// Status entries of skipped items (CEL strings, empty when not skipped), in the engine's
    /// order: per template, its own items, then its app-container items.
    pub(super) skips: Vec<String>,
    /// Per plan, the conditions under which one of its items is skipped.
    pub(super) skip_any_by_plan: Vec<Vec<String>>,
    /// The conditions under which a referenced item (a mounted volume) is displaced (see
    /// `add_displacement`).
    pub(super) displacements: Vec<String>,
    /// Per app-container list (`kinds::APP_LISTS`): the operations, and (added(c) CEL, key JSON).
    pub(super) app_ops: [Vec<String>; 3],
    pub(super) app_added: [Vec<(String, String)>; 3],
}

impl<'p> ProgramBuilder<'p> {
    /// The common variables and each plan's selection (`s<i>`), nothing gathered yet.
    pub(super) fn new(plans: &'p [Plan]) -> Self {
        let mut vars = pod_variables();
        let selected: Vec<String> = (0..plans.len()).map(|i| format!("variables.s{i}")).collect();
        for (i, plan) in plans.iter().enumerate() {
            vars.push((format!("s{i}"), plan.selected.clone()));
        }
        ProgramBuilder { plans, selected, vars, skip_any_by_plan: vec![Vec::new(); plans.len()], ..Default::default() }
    }

    /// A new flag variable (`a<n>`) with this CEL, as the expression that reads it.
    pub(super) fn flag(&mut self, cel: String) -> String {
        let name = format!("a{}", self.flag_count);
        self.flag_count += 1;
        self.vars.push((name.clone(), cel));
        format!("variables.{name}")
    }

    /// The flag of a static item of plan `i`: added when its template is selected, its `when:`
    /// holds and neither the pod nor an earlier item has the key; a skip is recorded if reported.
    pub(super) fn static_item(&mut self, i: usize, item: StaticItem<'_>) -> String {
        let plans = self.plans;
        let (s, t) = (self.selected[i].clone(), plans[i].name.as_str());
        let StaticItem { space, kind, key, when, pod_has, report_skip } = item;
        let earlier = self.claims.earlier(space, key);
        let earlier: Vec<(String, &str)> = earlier.into_iter().map(|(f, t)| (f.to_owned(), t)).collect();
        let taken = any(earlier.iter().map(|(f, _)| f.clone()));
        let added = self.flag(format!("{s}{} && !{pod_has} && !{taken}", when_and(when)));
        self.claims.add(space, key, added.clone(), t);
        if report_skip {
            let cond = format!("({s}{} && !{added})", when_and(when));
            self.skips
                .push(format!("({cond} ? {} : \"\")", skip_json(t, kind, key, None, &owner_cel(&pod_has, &earlier))));
            self.skip_any_by_plan[i].push(cond);
        }
        added
    }

    /// Plan `i`'s labels and annotations: the operations that add them, and who adds each key.
    pub(super) fn add_metadata(&mut self, i: usize) {
        let plan = &self.plans[i];
        // Labels, then annotations, each in key order (the rendered maps are sorted); the
        // injector's own key is always taken.
        for (kind, pod_map) in MAPS.iter().zip(MAP_CEL_OF_POD) {
            let (index, field, own_key) = (kind.index, kind.field, kind.own_key);
            let mut entries = plan.maps[index].clone();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            for (key, value) in &entries {
                let pod_has = match key.as_str() {
                    k if k == own_key => "true".to_owned(),
                    _ => format!("({} in {pod_map})", lit(key)),
                };
                let item = StaticItem { space: field, kind: kind.kind, key, when: &None, pod_has, report_skip: true };
                let added = self.static_item(i, item);
                self.metadata_ops[index].push(format!(
                    "({added} ? [{}] : [])",
                    patch_op(&lit(&format!("/metadata/{field}/{}", pointer(key))), &value.cel())
                ));
                self.metadata_status[index].entry(key.clone()).or_default().push(added);
            }
        }
    }

    /// Plan `i`'s init containers and sidecars: their operations and status entries.
    pub(super) fn add_containers(&mut self, i: usize) {
        let plans = self.plans;
        for (placement, item) in &plans[i].containers {
            let pod_has = format!("({} in variables.allContainers.map(c, c.name))", lit(&item.key));
            let (key, when) = (&item.key, &item.when);
            let added = self.static_item(
                i,
                StaticItem { space: "containers", kind: item.kind, key, when, pod_has, report_skip: true },
            );
            let (list, name_json) = (placement.list().index, json_text_lit(&item.key));
            if *placement == Placement::NativeSidecar {
                self.native_status.push((added.clone(), name_json.clone()));
            }
            self.container_ops[list].push((added.clone(), item.value.clone()));
            self.container_status[list].push((added, name_json));
        }
    }

    /// Plan `i`'s items of each kind of spec list: their operations and status entries, and when
    /// a referenced item (a mounted volume) is displaced (`displacements`).
    pub(super) fn add_pod_lists(&mut self, i: usize) {
        let plans = self.plans;
        for kind in &POD_LISTS {
            for item in &plans[i].pod_lists[kind.index] {
                let pod_has = format!("({} in variables.{})", lit(&item.key), pod_list_keys(kind));
                let (key, when) = (&item.key, &item.when);
                let report_skip = kind.when_held == WhenHeld::Skip;
                let static_item =
                    StaticItem { space: kind.field, kind: kind.kind, key, when, pod_has: pod_has.clone(), report_skip };
                let added = self.static_item(i, static_item);
                if plans[i].referenced[kind.index].contains(&item.key) {
                    self.add_displacement(kind, i, item, pod_has);
                }
                self.pod_list_ops[kind.index].push((added.clone(), item.value.clone()));
                self.pod_list_status[kind.index].push((added, json_text_lit(&item.key)));
            }
        }
    }

    /// When plan `i`'s referenced `item` of `kind` (a mounted volume) is displaced: an item skipped
    /// for another of its identity displaces what refers to it (`inject`), the webhook's to
    /// decide, when the pod has one (`pod_has`), or an earlier template one that is not the same.
    pub(super) fn add_displacement(&mut self, kind: &PodListKind, i: usize, item: &Item, pod_has: String) {
        let selected = &self.selected;
        let differing_earlier = self.plans[..i].iter().enumerate().flat_map(|(j, earlier)| {
            earlier.pod_lists[kind.index]
                .iter()
                .filter(|v| v.key == item.key && v.value != item.value)
                .map(move |v| format!("({}{})", selected[j], when_and(&v.when)))
        });
        let displaced = any(std::iter::once(pod_has).chain(differing_earlier));
        self.displacements.push(format!("({}{} && {displaced})", self.selected[i], when_and(&item.when)));
    }

    /// Plan `i`'s app-container items: the operations on each targeted app container's lists, what
    /// they add for the status, and the status entries of those skipped.
    pub(super) fn add_app_items(&mut self, i: usize) {
        let plans = self.plans;
        let (plan, s, t) = (&plans[i], &self.selected[i], plans[i].name.as_str());
        // App containers: per container, so inline over `c`.
        let includes = targets_cel(&plan.targets);
        let mut this_plan_app_skips = Vec::new();
        for (list, pod_key) in APP_LISTS.iter().zip(APP_LIST_CEL_IDENTITY) {
            let (list_index, field, kind) = (list.index, list.field, &list.kind);
            for item in &plan.app[list_index] {
                let pod_has = format!("c.?{field}.orValue([]).exists(x, {pod_key} == {})", lit(&item.key));
                let earlier_plans: Vec<(String, &str)> = app_claims(plans, i, list_index, &item.key)
                    .into_iter()
                    .map(|(j, when)| {
                        (
                            format!("({}{} && {})", self.selected[j], when_and(&when), targets_cel(&plans[j].targets)),
                            plans[j].name.as_str(),
                        )
                    })
                    .collect();
                let taken = any(earlier_plans.iter().map(|(c, _)| c.clone()));
                let here = format!("{s}{} && {includes}", when_and(&item.when));
                let added = format!("({here} && !{pod_has} && !{taken})");
                self.app_ops[list_index].push(format!(
                    "object.spec.containers.filter(c, {added}).map(c, {})",
                    patch_op(
                        &format!(
                            "\"/spec/containers/\" + string(variables.containerNames.indexOf(c.name)) + \"/{field}/-\""
                        ),
                        &item.value
                    )
                ));
                self.app_added[list_index].push((added.clone(), json_text_lit(&item.key)));
                let skip = format!("({here} && !{added})");
                let json = skip_json(t, *kind, &item.key, Some("c.name"), &owner_cel(&pod_has, &earlier_plans));
                this_plan_app_skips.push(format!("({skip} ? {json} : \"\")"));
                self.skip_any_by_plan[i].push(format!("object.spec.containers.exists(c, {skip})"));
            }
        }
        if !this_plan_app_skips.is_empty() {
            self.skips.push(format!(
                "object.spec.containers.map(c, [{}].filter(x, x != \"\").join(\",\")).filter(x, x != \"\").join(\",\")",
                this_plan_app_skips.join(", ")
            ));
        }
    }

    /// When the policy injects the pod (`variables.handled`): a template is selected and nothing
    /// of the pod is the webhook's to decide.
    pub(super) fn handled(&self, leave_to_webhook: &[String]) -> String {
        let enforced_conflicts = self
            .plans
            .iter()
            .enumerate()
            .filter(|(_, p)| p.enforced)
            .map(|(i, _)| any(self.skip_any_by_plan[i].iter().cloned()));
        let inadmissible = self
            .plans
            .iter()
            .enumerate()
            .filter(|(_, p)| p.admissible != "true")
            .map(|(i, p)| format!("({} && !({}))", self.selected[i], p.admissible));
        // Namespace defaults (`sidecar-injector.io/<template>.<value>` on the namespace) are the
        // webhook's to apply, like the pod's overrides it cannot follow.
        let namespace_defaults = format!(
            "variables.namespaceAnnotations.exists(k, k.matches({}))",
            lit(&format!("^{}[a-z0-9-]+[.]", names::PREFIX.replace('.', "[.]")))
        );
        // So are the namespace's pins (`templates::rollout::Pins`), which name kept versions.
        let namespace_pins = format!("{} in variables.namespaceAnnotations", lit(names::PINS_ANNOTATION));
        format!(
            "{} && !{namespace_defaults} && !({namespace_pins}) && !{} && !{} && !{} && !{} && !object.spec.?resources.hasValue()",
            any(self.selected.iter().cloned()),
            any(leave_to_webhook.iter().map(|c| format!("({c})"))),
            any(enforced_conflicts),
            any(inadmissible),
            any(self.displacements.iter().cloned()),
        )
    }

    /// The status annotation, byte for byte what `InjectionStatus::to_annotation` writes.
    pub(super) fn status(&self) -> String {
        let templates = self
            .plans
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let json = serde_json::to_string(&crate::model::status::TemplateRef {
                    name: p.name.clone(),
                    hash: p.hash.clone(),
                })
                .expect("serializes");
                (self.selected[i].clone(), lit(&json))
            })
            .collect::<Vec<_>>();
        let templates_list =
            templates.iter().map(|(c, j)| format!("({c} ? {j} : \"\")")).collect::<Vec<_>>().join(", ");
        let keyed = |m: &BTreeMap<String, Vec<String>>| -> Vec<(String, String)> {
            m.iter().map(|(k, flags)| (any(flags.iter().cloned()), json_text_lit(k))).collect()
        };
        let skipped_list = self.skips.join(", ");
        [format!("\"{{\\\"templates\\\":[\" + [{templates_list}].filter(x, x != \"\").join(\",\") + \"]\"")]
            .into_iter()
            .chain(CONTAINER_LISTS.iter().map(|list| list_part(list.field, &self.container_status[list.index])))
            .chain([list_part("nativeSidecars", &self.native_status)])
            .chain(
                POD_LISTS
                    .iter()
                    .filter(|kind| kind.in_policy)
                    .map(|kind| list_part(kind.field, &self.pod_list_status[kind.index])),
            )
            .chain(MAPS.iter().map(|kind| list_part(kind.field, &keyed(&self.metadata_status[kind.index]))))
            .chain([
                self.app_containers_status(),
                wrap_nonempty(&format!("[{skipped_list}].filter(x, x != \"\").join(\",\")"), ",\"skipped\":[", "]"),
                "\"}\"".to_owned(),
            ])
            .collect::<Vec<_>>()
            .join(" + ")
    }

    /// The status's `appContainers` part: per app container, the keys of each list added to it.
    pub(super) fn app_containers_status(&self) -> String {
        let app_part = |list_index: usize, field: &str| {
            let entries = self.app_added[list_index]
                .iter()
                .map(|(c, j)| format!("({c} ? {j} : \"\")"))
                .collect::<Vec<_>>()
                .join(", ");
            wrap_nonempty(&format!("[{entries}].filter(x, x != \"\").join(\",\")"), &format!("\"{field}\":["), "]")
        };
        // Sorted by container name as the status's map is: `"<name>":` strings sort the same way,
        // since `"` sorts before every character of a container name.
        let parts = APP_LISTS.iter().map(|kind| app_part(kind.index, kind.field)).collect::<Vec<_>>();
        let per_container = format!("[{}].filter(x, x != \"\").join(\",\")", parts.join(", "));
        wrap_nonempty(
            &format!(
                "object.spec.containers.map(c, [{per_container}].filter(p, p != \"\").map(p, \"\\\"\" + c.name + \"\\\":{{\" + p + \"}}\").join(\"\")).filter(x, x != \"\").sort().join(\",\")"
            ),
            ",\"appContainers\":{",
            "}",
        )
    }

    /// The patch, in the order `injection::plan` writes it, for the pods the policy handles.
    pub(super) fn patch(self) -> String {
        let mut ops: Vec<String> = Vec::new();
        ops.push(format!("(has(object.metadata.labels) ? [] : [{}])", patch_op("\"/metadata/labels\"", "{}")));
        let [label_ops, annotation_ops] = self.metadata_ops;
        ops.extend(label_ops);
        ops.push(format!(
            "[{}]",
            patch_op(
                &lit(&format!("/metadata/labels/{}", pointer(names::INJECTED_LABEL))),
                "variables.anySkip ? \"partial\" : \"true\""
            )
        ));
        ops.push(format!(
            "(has(object.metadata.annotations) ? [] : [{}])",
            patch_op("\"/metadata/annotations\"", "{}")
        ));
        ops.extend(annotation_ops);
        ops.push(format!(
            "[{}]",
            patch_op(&lit(&format!("/metadata/annotations/{}", pointer(names::STATUS_ANNOTATION))), "variables.status")
        ));
        push_list_ops(&mut ops, INIT_CONTAINERS.field, &self.container_ops[INIT_CONTAINERS.index], true);
        for kind in &APP_LISTS {
            let (list_index, field) = (kind.index, kind.field);
            if self.app_added[list_index].is_empty() {
                continue;
            }
            let any_added = any(self.app_added[list_index].iter().map(|(a, _)| a.clone()));
            ops.push(format!(
                "object.spec.containers.filter(c, !has(c.{field}) && {any_added}).map(c, {})",
                patch_op(
                    &format!("\"/spec/containers/\" + string(variables.containerNames.indexOf(c.name)) + \"/{field}\""),
                    "[]"
                )
            ));
            ops.extend(self.app_ops[list_index].iter().cloned());
        }
        // The app containers stay, so the list of containers is there and nothing goes in front.
        let container_path = lit(&format!("/spec/{}/-", CONTAINERS.field));
        ops.extend(
            self.container_ops[CONTAINERS.index]
                .iter()
                .map(|(added, value)| format!("({added} ? [{}] : [])", patch_op(&container_path, value))),
        );
        for (kind, items) in POD_LISTS.iter().zip(&self.pod_list_ops) {
            push_list_ops(&mut ops, kind.field, items, false);
        }
        format!("variables.handled ? ({}) : []", ops.join("\n + "))
    }
}

/// The operations adding items (flag, value) to the pod's list `spec.<field>`: the list itself
/// when the pod has none and an item is added, then each item, at the front (`front`) or at the
/// end.
pub(super) fn push_list_ops(ops: &mut Vec<String>, field: &str, items: &[(String, String)], front: bool) {
    if items.is_empty() {
        return;
    }
    let any_added = any(items.iter().map(|(f, _)| f.clone()));
    let path = format!("/spec/{field}");
    ops.push(format!("(!has(object.spec.{field}) && {any_added} ? [{}] : [])", patch_op(&lit(&path), "[]")));
    if front {
        // Inserted at the front in reverse order, so they end up in order before the pod's own.
        for (added, value) in items.iter().rev() {
            ops.push(format!("({added} ? [{}] : [])", patch_op(&lit(&format!("{path}/0")), value)));
        }
    } else {
        for (added, value) in items {
            ops.push(format!("({added} ? [{}] : [])", patch_op(&lit(&format!("{path}/-")), value)));
        }
    }
}

/// The earlier templates (index, `when`) that add an app-list item with this key.
pub(super) fn app_claims(plans: &[Plan], before: usize, list_index: usize, key: &str) -> Vec<(usize, Option<String>)> {
    plans[..before]
        .iter()
        .enumerate()
        .flat_map(|(j, p)| {
            p.app[list_index].iter().filter(|item| item.key == key).map(move |item| (j, item.when.clone()))
        })
        .collect()
}
