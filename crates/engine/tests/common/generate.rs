//! The generator of pods and templates that the properties (`properties.rs`) and the API-server
//! oracle (`tests/e2e/oracle.rs` of the binary crate) draw from: one generator, so that a shape
//! added for the properties is judged by the API server too, and the other way round.
//!
//! Names come from small pools shared by pods and templates, so conflicts happen often; every kind
//! of item comes from its description in `kinds` (`sample` and `authored`), so a new kind is
//! generated without anyone naming it here.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use sidecar_injector_engine::manifest;
use sidecar_injector_engine::model::kinds::{
    APP_LIST_COUNT, APP_LISTS, ENV, MAP_COUNT, MAPS, POD_LIST_COUNT, POD_LISTS, VOLUME_MOUNTS, VOLUMES,
};

pub const NAMES: [&str; 5] = ["a", "b", "app", "logs", "proxy"];
pub const KEYS: [&str; 4] = ["team", "tier", "example.com/x", "sidecar-injector.io/extra"];

pub fn names() -> impl Strategy<Value = Vec<&'static str>> {
    proptest::sample::subsequence(NAMES.to_vec(), 0..=NAMES.len())
}

pub fn string_map() -> impl Strategy<Value = Map<String, Value>> {
    proptest::collection::btree_map(proptest::sample::select(KEYS.to_vec()), "[a-z]{0,3}", 0..=3)
        .prop_map(|m| m.into_iter().map(|(k, v)| (k.to_owned(), Value::from(v))).collect())
}

pub fn named(list: &[&str], prefix: &str) -> Value {
    Value::Array(list.iter().map(|n| json!({"name": format!("{prefix}{n}"), "image": format!("{n}:1")})).collect())
}

/// A pod with unique container names, optional maps and lists, and fields no type knows about.
pub fn pod() -> impl Strategy<Value = Value> {
    (
        // An array of strategies draws as the tuple of them would (the fixed seeds keep their cases).
        [(); MAP_COUNT].map(|()| proptest::option::of(string_map())),
        proptest::sample::subsequence(NAMES.to_vec(), 1..=3),
        proptest::option::of(names()),
        proptest::collection::vec(proptest::option::of((names(), any::<bool>())), POD_LIST_COUNT),
        // Per container (up to 3): per kind of app list, items of the templates' identities.
        proptest::collection::vec(proptest::collection::vec((names(), any::<bool>()), APP_LIST_COUNT), 3),
        // Pod-level resources: how much, Guaranteed or not, and how the quantities are written
        // (0: as the API server writes them; 1: as numbers, as a manifest says `cpu: 0.5`;
        // 2: in another form of the same value, `0.1`, `0.0625Gi`, `64000000`).
        proptest::option::of((1..4u32, any::<bool>(), 0..3u8)),
        // Per container: maybe a second env entry of a name it has, in the other form (the API
        // server accepts a name twice; the kubelet reads the last).
        proptest::collection::vec(proptest::option::of(any::<proptest::sample::Index>()), 3),
    )
        .prop_map(|(maps, containers, init, pod_lists, per_container, pod_level, duplicates)| {
            let mut metadata = Map::new();
            metadata.insert("name".into(), json!("p"));
            // Every kind of map (labels, annotations), keys from the templates' pool.
            for (kind, map) in MAPS.iter().zip(maps) {
                if let Some(map) = map {
                    metadata.insert(kind.field.into(), Value::Object(map));
                }
            }
            let mut containers = named(&containers, "c-");
            // Every kind of app-container list, as its description makes items: the same as the
            // templates' (`sample`), or the author's own definition (`authored`).
            for ((container, lists), duplicate) in
                containers.as_array_mut().unwrap().iter_mut().zip(per_container).zip(duplicates)
            {
                for (kind, (identities, authored)) in APP_LISTS.iter().zip(lists) {
                    let item = if authored { kind.authored } else { kind.sample };
                    container[kind.field] = identities.iter().map(|id| item(id)).collect();
                    if let (Some(at), true, false) = (duplicate, kind.index == ENV.index, identities.is_empty()) {
                        let other = if authored { kind.sample } else { kind.authored };
                        container[kind.field].as_array_mut().unwrap().push(other(at.get::<&str>(&identities)));
                    }
                }
                container["x-unknown"] = json!({"kept": true});
            }
            let mut spec = Map::new();
            spec.insert("containers".into(), containers);
            if let Some(init) = init {
                spec.insert("initContainers".into(), named(&init, "i-"));
            }
            // Every kind of spec list, items of the templates' identities: the same as the
            // templates' (`sample`), or the author's own (`authored`: a volume of the host's root).
            for (kind, list) in POD_LISTS.iter().zip(pod_lists) {
                if let Some((identities, authored)) = list {
                    let item = if authored { kind.authored } else { kind.sample };
                    spec.insert(kind.field.into(), identities.iter().map(|id| item(id)).collect());
                }
            }
            spec.insert("x-future".into(), json!([1, 2]));
            // Pod-level resources (KEP-2837) that the app containers' requests fit: Guaranteed
            // (requests equal limits) or with a memory limit only.
            if let Some((n, guaranteed, written)) = pod_level {
                let (cpu, memory, big_memory, app_cpu): (Value, Value, Value, Value) = match written {
                    0 => (
                        json!(format!("{}m", n * 100)),
                        json!(format!("{}Mi", n * 64)),
                        json!(format!("{}Mi", n * 256)),
                        json!("30m"),
                    ),
                    1 => (json!(f64::from(n) / 10.0), json!((n * 64) << 20), json!((n * 256) << 20), json!(0.03)),
                    _ => (
                        json!(format!("{}", f64::from(n) / 10.0)),
                        json!(format!("{}Gi", f64::from(n) / 16.0)),
                        json!(format!("{}", (n * 256) << 20)),
                        json!("0.03"),
                    ),
                };
                let requests = json!({"cpu": cpu, "memory": memory});
                let limits = if guaranteed { requests.clone() } else { json!({"memory": big_memory}) };
                spec.insert("resources".into(), json!({"requests": requests, "limits": limits}));
                for container in spec["containers"].as_array_mut().unwrap() {
                    container["resources"] = json!({"requests": {"cpu": app_cpu, "memory": "20Mi"}});
                }
            }
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
        })
}

/// A [`pod`], sometimes (one in 25) with each map that has a total size limit (annotations)
/// filled to within 0–2 KiB of it: what a template adds, the status annotation included, fits in
/// some cases and pushes the pod over in others, a refusal the engine predicts
/// (`OutOfScope::WouldBeInvalid`). For the API-server oracle, which can judge that prediction;
/// the properties, which cannot, draw [`pod`].
#[allow(dead_code)] // drawn by the oracle and by the Pod Security property
pub fn pod_near_limits() -> impl Strategy<Value = Value> {
    (pod(), proptest::option::weighted(0.04, 0..2048usize)).prop_map(|(mut pod, room_left)| {
        let Some(room_left) = room_left else { return pod };
        for kind in MAPS.iter() {
            let Some(limit) = kind.total_size_limit else { continue };
            let metadata = pod["metadata"].as_object_mut().unwrap();
            let map = metadata.entry(kind.field).or_insert_with(|| json!({})).as_object_mut().unwrap();
            let used: usize = map.iter().map(|(k, v)| k.len() + v.as_str().map_or(0, str::len)).sum();
            let key = "example.com/filler";
            map.insert(key.into(), json!("f".repeat(limit.saturating_sub(used + key.len() + room_left))));
        }
        pod
    })
}

/// A [`pod_near_limits`] that, one time in two, sets Pod Security fields: a pod-level and a
/// per-container choice among shapes each check of `checks::pod_security` reads (privilege,
/// capabilities, users, seccomp, SELinux, AppArmor, host ports, probe hosts, sysctls, host IPC),
/// allowed and forbidden, so the oracle holds every check against Pod Security Admission. Only
/// combinations the API server accepts at any level (its validation refuses `privileged` beside
/// `allowPrivilegeEscalation: false`, so they are never drawn together).
#[allow(dead_code)] // drawn by the oracle and by the Pod Security property
pub fn pod_with_security_fields() -> impl Strategy<Value = Value> {
    let choices = (0..6usize, proptest::collection::vec(0..14usize, 3));
    (pod_near_limits(), proptest::option::weighted(0.5, choices)).prop_map(|(mut pod, choices)| {
        let Some((pod_level, per_container)) = choices else { return pod };
        let pod_security = [
            json!({}),
            json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}}),
            json!({"runAsUser": 0}),
            json!({"sysctls": [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}, {"name": "kernel.msgmax", "value": "65536"}]}),
            json!({"seLinuxOptions": {"type": "spc_t"}, "appArmorProfile": {"type": "Unconfined"}}),
            json!({"runAsNonRoot": false, "seccompProfile": {"type": "Unconfined"}}),
        ];
        pod["spec"]["securityContext"] = pod_security[pod_level].clone();
        if pod_level == 4 {
            pod["spec"]["hostIPC"] = json!(true);
        }
        let restricted = json!({"allowPrivilegeEscalation": false, "runAsNonRoot": true,
            "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}, "seccompProfile": {"type": "RuntimeDefault"}});
        let containers = pod["spec"]["containers"].as_array_mut().unwrap();
        for (index, (container, choice)) in containers.iter_mut().zip(per_container).enumerate() {
            let security = match choice {
                0 => restricted.clone(),
                1 => json!({"privileged": true}),
                2 => json!({"capabilities": {"add": ["NET_ADMIN", "CHOWN"]}}),
                3 => json!({"capabilities": {"drop": ["ALL"]}, "allowPrivilegeEscalation": false}),
                4 => json!({"runAsUser": 0, "runAsNonRoot": false}),
                5 => json!({"seccompProfile": {"type": "Localhost", "localhostProfile": "agent.json"}}),
                6 => json!({"seLinuxOptions": {"type": "container_t", "user": "system_u"}}),
                7 => json!({"appArmorProfile": {"type": "RuntimeDefault"}, "allowPrivilegeEscalation": true}),
                8 => json!({"windowsOptions": {"hostProcess": false}, "runAsUser": 1000}),
                _ => json!(null),
            };
            if !security.is_null() {
                container["securityContext"] = security;
            }
            match choice {
                // A host port per container: the API server refuses one used twice.
                9 => container["ports"] = json!([{"containerPort": 8080 + index, "hostPort": 8080 + index}]),
                10 => container["readinessProbe"] = json!({"httpGet": {"host": "example.com", "port": 80}}),
                11 => container["livenessProbe"] = json!({"tcpSocket": {"host": "10.0.0.1", "port": 80}}),
                _ => {}
            }
        }
        pod
    })
}

/// A pod that meets Pod Security's `restricted` level: pod-level `runAsNonRoot` and seccomp, and
/// every container without privilege escalation or capabilities (what an injected container must
/// not break).
#[allow(dead_code)] // drawn by the oracle and by the Pod Security property
pub fn restricted_pod() -> impl Strategy<Value = Value> {
    pod().prop_map(|mut pod| {
        pod["spec"]["securityContext"] = json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}});
        for container in pod["spec"]["containers"].as_array_mut().into_iter().flatten() {
            container["securityContext"] =
                json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
        }
        pod
    })
}

/// A generated template whose init containers and sidecars carry one of the security contexts
/// Pod Security's checks read (restricted-ready, none, root, an added capability, privileged),
/// one in five of them enforced.
#[allow(dead_code)] // drawn by the oracle and by the Pod Security property
pub fn secured_template() -> impl Strategy<Value = String> {
    (template(), 0..5usize, 0..5usize, proptest::bool::weighted(0.2)).prop_map(|(text, init, sidecars, enforced)| {
        let mut docs = manifest::read(&text).unwrap();
        let security = |choice: usize| match choice {
            0 => json!({"allowPrivilegeEscalation": false, "runAsNonRoot": true,
                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}),
            1 => Value::Null,
            2 => json!({"runAsUser": 0}),
            3 => json!({"capabilities": {"add": ["NET_ADMIN"]}}),
            _ => json!({"privileged": true}),
        };
        for (list, choice) in [("initContainers", init), ("sidecars", sidecars)] {
            for container in docs[0]["inject"][list].as_array_mut().into_iter().flatten() {
                if !security(choice).is_null() {
                    container["securityContext"] = security(choice);
                }
            }
        }
        if enforced {
            docs[0]["enforced"] = json!(true);
        }
        manifest::write(&docs)
    })
}

/// A template using every section, with names drawn from the same pools as the pod's so that
/// conflicts happen often.
pub fn template() -> impl Strategy<Value = String> {
    (
        [(); MAP_COUNT].map(|()| string_map()),
        names(),
        names(),
        proptest::collection::vec(names(), POD_LIST_COUNT),
        proptest::collection::vec(names(), APP_LIST_COUNT),
        (any::<proptest::sample::Index>(), any::<bool>()),
        proptest::sample::select(vec!["native", "container", "auto"]),
        "[a-z]{1,4}",
        // The sidecars' quantities as YAML numbers (`cpu: 0.01`, a cpu limit of `1`).
        any::<bool>(),
    )
        .prop_map(|(maps, init, sidecars, pod_lists, mut app_lists, (volume, sidecars_mount), mode, value, numbers)| {
            let volumes = &pod_lists[VOLUMES.index];
            // Mounts name one of the template's own volumes (none without volumes).
            let (sidecars_mount, volume) = match volumes.is_empty() {
                true => (false, ""),
                false => (sidecars_mount, *volume.get(volumes)),
            };
            if volume.is_empty() {
                app_lists[VOLUME_MOUNTS.index].clear();
            }
            // Some containers say where they go (`position:`), as their name's length decides.
            let positioned = |mut items: Value| {
                for item in items.as_array_mut().unwrap() {
                    let position = ["", "first", "last"][item["name"].as_str().unwrap().len() % 3];
                    if !position.is_empty() {
                        item["position"] = json!(position);
                    }
                }
                items
            };
            let mut doc = json!({
                "default": true,
                "sidecarMode": mode,
                "values": {"v": value},
                "inject": {
                    "initContainers": positioned(named(&init, "i-")),
                    "sidecars": positioned(Value::Array(sidecars.iter().map(|n| json!({
                        "name": format!("c-{n}"),
                        "image": "{{ values.v }}",
                        // The last two: a flag ending in `:` and one holding `?`, which kubectl's
                        // reader and YAML 1.2 read apart in `[...]` (written, they must read back).
                        "args": ["{{ workload.name }}", "{{ pod.spec.containers | length }}", "{{ namespace.name }}", "--listen=::", "--url=http://x/?a=b"],
                        "volumeMounts": match (sidecars_mount, volume.len() == 4) {
                            (false, _) => json!([]),
                            (true, false) => json!([{"name": volume, "mountPath": "/shared"}]),
                            // A subPath into an image volume takes its fallback unless the nodes apply it.
                            (true, true) => json!([{"name": volume, "mountPath": "/shared", "subPath": "sub"}]),
                        },
                        "resources": match numbers {
                            false => json!({"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "32Mi"}}),
                            true => json!({"requests": {"cpu": 0.01, "memory": 16 << 20}, "limits": {"cpu": 1, "memory": "32Mi"}}),
                        },
                    })).collect())),
                    "appContainers": {},
                },
            });
            // Sidecars of even-length names size themselves from the app (`sizing:`): a share of
            // its CPU and memory, bounded, the memory limit a ceiling where an app sets none.
            for sidecar in doc["inject"]["sidecars"].as_array_mut().unwrap() {
                if sidecar["name"].as_str().unwrap().len() % 2 == 0 {
                    sidecar["sizing"] = json!({
                        "requests": {
                            "cpu": {"from": "sum", "fraction": 0.05, "min": "5m", "max": "200m"},
                            "memory": {"from": "max", "fraction": 0.1, "min": "8Mi", "round": "1Mi"},
                        },
                        "limits": {"memory": {"from": "sum", "fraction": 0.2, "max": "256Mi", "round": "1Mi"}},
                    });
                }
            }
            // Every kind of app-container list, as its description samples it; a mount names the
            // template's volume.
            for (kind, identities) in APP_LISTS.iter().zip(&app_lists) {
                let items = identities.iter().map(|id| ((kind.sample)(id), *id)).map(|(mut item, id)| {
                    if kind.index == VOLUME_MOUNTS.index {
                        item["name"] = json!(volume);
                    }
                    // Items some pods select and others do not (`when:` on a label the pods have
                    // or lack, and templates may add).
                    if id == "logs" {
                        item["when"] = json!("{{ 'team' in (pod.metadata.labels | default({})) }}");
                    }
                    item
                });
                doc["inject"]["appContainers"][kind.field] = items.collect();
            }
            // Every kind of map, with keys the pods use too.
            for (kind, map) in MAPS.iter().zip(maps) {
                doc["inject"][kind.field] = Value::Object(map);
            }
            // Every kind of spec list, as its description samples it (volumes are emptyDirs), but
            // volumes of longer names are image volumes with a fallback (as the nodes decide).
            for (kind, identities) in POD_LISTS.iter().zip(&pod_lists) {
                doc["inject"][kind.field] = identities
                    .iter()
                    .map(|id| match kind.index == VOLUMES.index && id.len() >= 3 {
                        true => image_volume(id),
                        false => (kind.sample)(id),
                    })
                    .collect();
            }
            // Every other kind that containers refer to: the sidecars refer to the template's
            // first item through the description's first reference (a resource claim, under
            // `resources.claims`), when the sidecars mount.
            for (kind, identities) in POD_LISTS.iter().zip(&pod_lists) {
                let (Some(reference), Some(first)) = (kind.referenced_by.first(), identities.first()) else { continue };
                if kind.index == VOLUMES.index || !sidecars_mount {
                    continue;
                }
                for sidecar in doc["inject"]["sidecars"].as_array_mut().unwrap() {
                    let mut at = &mut *sidecar;
                    for field in reference.list {
                        at = at.as_object_mut().unwrap().entry(*field).or_insert_with(|| json!({}));
                    }
                    *at = json!([{ reference.key: first }]);
                }
            }
            manifest::write(&[doc])
        })
}

/// An image volume whose fallback is an emptyDir filled by init container `f-<name>`.
pub fn image_volume(name: &str) -> Value {
    json!({
        "name": name,
        "image": {"reference": format!("agent-{name}:1")},
        "fallback": {"initContainer": {
            "name": format!("f-{name}"),
            "image": format!("agent-{name}:1"),
            "volumeMounts": [{"name": name, "mountPath": "/copy"}],
        }},
    })
}
