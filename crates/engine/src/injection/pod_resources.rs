//! Pod-level resources (KEP-2837, on by default since Kubernetes 1.34): a pod may set
//! `spec.resources`, and the API server then requires the containers' aggregate requests to fit
//! the pod's requests, and each container's limits to stay within the pod's limits. An injected
//! sidecar with requests of its own would make such a pod invalid (a Deployment whose every pod
//! create is refused after our patch), or take its share out of the app's budget unseen.
//!
//! So the injection **pads** the pod-level values the pod sets by what its containers add, counted
//! as Kubernetes counts them ([`aggregate`]: containers and native sidecars add up, an init
//! container that runs to completion counts by the largest one at a time), and records the
//! padding in the status so that strip and re-injection give back exactly the author's values.
//! Only the resources the pod sets are padded; a pod without `spec.resources` is untouched. A pod
//! whose pod-level requests equal its limits for a resource (Guaranteed) gets the same padding on
//! both, so it stays Guaranteed; limits grow at least as much as requests, so requests never
//! exceed limits.
//!
//! Before answering, [`violations`] checks the padded pod against the API server's rules for
//! pod-level resources: a pod we would make invalid is left as its author wrote it.
//!
//! Quantities are read by `quantity` (a string or a number, exactly, as Kubernetes reads them) and
//! written back as Kubernetes writes a quantity of the format the author used.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::model::status::{Authored, Padding};
use crate::quantity::{self, format, parse};

/// Which list of `spec.resources`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `requests` (a container without a request for a resource is defaulted to its limit).
    Requests,
    /// `limits`.
    Limits,
}

/// The key of [`PodLevel::numbers`].
fn number_key(field: Field, resource: &str) -> String {
    format!("{}/{resource}", field.key())
}

impl Field {
    /// The field's key in `spec.resources`.
    pub fn key(self) -> &'static str {
        match self {
            Field::Requests => "requests",
            Field::Limits => "limits",
        }
    }
}

/// A container's quantity of `resource`, in nano-units, written as a string or a number (0 when
/// it sets none or one that is no quantity, which the API server refuses anyway and the load check
/// refuses in a template).
fn container_quantity(container: &Value, resource: &str, field: Field) -> i128 {
    let resources = container.get("resources");
    let of = |key: &str| resources.and_then(|r| r.get(key)).and_then(|m| m.get(resource));
    let value = match field {
        Field::Requests => of("requests").or_else(|| of("limits")),
        Field::Limits => of("limits"),
    };
    value.and_then(quantity::of).unwrap_or(0)
}

/// The pod's aggregate of `resource` as Kubernetes computes it for scheduling and for the
/// pod-level check: app containers and native sidecars (`restartPolicy: Always`) add up; an init
/// container that runs to completion needs its own quantity plus the sidecars started before it,
/// and only the largest such moment counts.
pub fn aggregate(init_containers: &[&Value], containers: &[&Value], resource: &str, field: Field) -> i128 {
    // Saturating: quantities reach 10^38 nano-units, and a pod may write several that large.
    let mut sum: i128 = containers.iter().map(|c| container_quantity(c, resource, field)).fold(0, i128::saturating_add);
    let (mut sidecars, mut init_peak) = (0i128, 0i128);
    for init in init_containers {
        let own = container_quantity(init, resource, field);
        let at_start = if crate::model::native::is_native_sidecar(init) {
            sum = sum.saturating_add(own);
            sidecars = sidecars.saturating_add(own);
            sidecars
        } else {
            own.saturating_add(sidecars)
        };
        init_peak = init_peak.max(at_start);
    }
    sum.max(init_peak)
}

/// The pod-level values a pod sets: per field, resource name → (text, nano-units). `None` when the
/// pod sets no `spec.resources` requests or limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodLevel {
    /// `spec.resources.requests`.
    pub requests: BTreeMap<String, (String, i128)>,
    /// `spec.resources.limits`.
    pub limits: BTreeMap<String, (String, i128)>,
    /// The values written as JSON numbers (`requests/cpu`), which are written back as numbers.
    pub numbers: BTreeSet<String>,
}

impl PodLevel {
    /// Reads `spec.resources`, each quantity a string or a number (those that are no quantity are
    /// left alone: never padded).
    pub fn of(pod: &Value) -> Option<PodLevel> {
        let resources = pod.get("spec")?.get("resources")?;
        let read = |field: Field| -> BTreeMap<String, (String, i128)> {
            resources
                .get(field.key())
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| {
                    let text = quantity::text(v)?;
                    let value = parse(&text)?;
                    Some((k.clone(), (text.into_owned(), value)))
                })
                .collect()
        };
        let numbers = [Field::Requests, Field::Limits]
            .into_iter()
            .flat_map(|field| {
                let entries = resources.get(field.key()).and_then(Value::as_object).into_iter().flatten();
                entries.filter(|(_, v)| v.is_number()).map(move |(k, _)| number_key(field, k))
            })
            .collect();
        let level = PodLevel { requests: read(Field::Requests), limits: read(Field::Limits), numbers };
        (!level.requests.is_empty() || !level.limits.is_empty()).then_some(level)
    }

    /// A value as the pod holds it: a number where the author wrote one, else a string.
    pub fn written(&self, field: Field, resource: &str) -> Option<Value> {
        let (text, _) = self.field(field).get(resource)?;
        let number = self.numbers.contains(&number_key(field, resource));
        let as_number = number.then(|| serde_json::from_str::<Value>(text).ok()).flatten();
        Some(as_number.unwrap_or_else(|| Value::from(text.as_str())))
    }

    fn field(&self, field: Field) -> &BTreeMap<String, (String, i128)> {
        match field {
            Field::Requests => &self.requests,
            Field::Limits => &self.limits,
        }
    }

    fn field_mut(&mut self, field: Field) -> &mut BTreeMap<String, (String, i128)> {
        match field {
            Field::Requests => &mut self.requests,
            Field::Limits => &mut self.limits,
        }
    }

    /// These values with `padding` taken away (`sign` -1) or added (`sign` 1); `None` when a
    /// padded resource is not set, or would go below zero (a padding that does not fit the pod).
    /// Taking a padding back (`sign` -1) writes the author's own text where the padding
    /// records it (`Padding::authored`) and it is the value the subtraction comes to.
    pub fn with(&self, padding: &Padding, sign: i128) -> Option<PodLevel> {
        let mut out = self.clone();
        let mut numbers = std::mem::take(&mut out.numbers);
        let fields = [
            (Field::Requests, &padding.requests, &padding.authored.requests),
            (Field::Limits, &padding.limits, &padding.authored.limits),
        ];
        for (field, map, authored) in fields {
            for (resource, amount) in map {
                let amount = parse(amount)?;
                let (text, value) = out.field_mut(field).get_mut(resource)?;
                let new = value.checked_add(sign.checked_mul(amount)?)?;
                if new < 0 {
                    return None;
                }
                let authors = authored.get(resource).filter(|a| sign < 0 && quantity::of(a) == Some(new));
                *text = match authors.and_then(quantity::text) {
                    Some(authors) => authors.into_owned(),
                    None => format(new, text),
                };
                *value = new;
                match authors.is_some_and(Value::is_number) {
                    true => numbers.insert(number_key(field, resource)),
                    false => numbers.remove(&number_key(field, resource)),
                };
            }
        }
        out.numbers = numbers;
        Some(out)
    }
}

/// The containers of a pod: init containers (in order) and app containers.
pub type Containers<'a> = (Vec<&'a Value>, Vec<&'a Value>);

/// What to add to the author's pod-level values (`author`) when the pod's containers go from
/// `before` (the author's) to `after` (with the injected ones).
pub fn padding(author: &PodLevel, before: &Containers<'_>, after: &Containers<'_>) -> Padding {
    let grows = |resource: &str, field: Field| {
        let then = aggregate(&before.0, &before.1, resource, field);
        let now = aggregate(&after.0, &after.1, resource, field);
        now.saturating_sub(then).max(0)
    };
    let mut padding = Padding::default();
    for (resource, (text, value)) in &author.requests {
        let mut amount = grows(resource, Field::Requests);
        // Guaranteed stays Guaranteed: requests padded as the limit is.
        if author.limits.get(resource).is_some_and(|(_, limit)| limit == value) {
            amount = amount.max(grows(resource, Field::Limits));
        }
        if amount > 0 {
            padding.requests.insert(resource.clone(), format(amount, text));
        }
    }
    for (resource, (text, _)) in &author.limits {
        // At least what the requests grow by, so requests never exceed limits.
        let amount = grows(resource, Field::Limits).max(grows(resource, Field::Requests));
        if amount > 0 {
            padding.limits.insert(resource.clone(), format(amount, text));
        }
    }
    // Only values that taking the padding back would not write again by itself (most are).
    let authored = |field: Field, padded: &BTreeMap<String, String>| {
        let values = author.field(field);
        let texts = padded.keys().filter_map(|r| values.get(r).map(|(text, value)| (r, text, *value)));
        texts
            .filter(|(r, text, value)| format(*value, text) != **text || author.numbers.contains(&number_key(field, r)))
            .filter_map(|(r, _, _)| Some((r.clone(), author.written(field, r)?)))
            .collect()
    };
    padding.authored = Authored {
        requests: authored(Field::Requests, &padding.requests),
        limits: authored(Field::Limits, &padding.limits),
    };
    padding
}

/// Whether `claimed` (a status annotation's padding) is exactly what the pod's injected
/// containers account for: only then may it be taken back. `injected` gives, for each container
/// proven to be the injector's, its rendering: the padding was computed from that, and a container
/// resized in place since (or the pod-level values resized, beta since 1.36) does not change it.
/// A claim is the pod author's word otherwise, and taking it back would rewrite values the author
/// wrote.
pub fn proves<'r>(pod: &'r Value, claimed: &Padding, injected: &dyn Fn(&str) -> Option<&'r Value>) -> bool {
    let Some(now) = PodLevel::of(pod) else { return false };
    let Some(authors) = now.with(claimed, -1) else { return false };
    let list = |field: &str| -> Vec<&Value> {
        pod.get("spec").and_then(|s| s.get(field)).and_then(Value::as_array).into_iter().flatten().collect()
    };
    let rendered = |c: &Value| c.get("name").and_then(Value::as_str).and_then(injected);
    let author_only = |items: &[&'r Value]| items.iter().copied().filter(|c| rendered(c).is_none()).collect::<Vec<_>>();
    let as_rendered = |items: &[&'r Value]| items.iter().map(|c| rendered(c).unwrap_or(c)).collect::<Vec<_>>();
    let (init, containers) = (list("initContainers"), list("containers"));
    let before: Containers = (author_only(&init), author_only(&containers));
    let after: Containers = (as_rendered(&init), as_rendered(&containers));
    let recomputed = padding(&authors, &before, &after);
    // The amounts compared as quantities, not as text.
    let same = |a: &BTreeMap<String, String>, b: &BTreeMap<String, String>| {
        a.len() == b.len()
            && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| parse(v).is_some() && parse(v) == parse(w)))
    };
    same(&recomputed.requests, &claimed.requests) && same(&recomputed.limits, &claimed.limits)
}

/// What the API server would refuse in a pod with these pod-level values and containers, one
/// sentence each, in its own words where it has them.
pub fn violations(level: &PodLevel, containers: &Containers<'_>) -> Vec<String> {
    let mut found = Vec::new();
    for (resource, (text, value)) in &level.requests {
        let needed = aggregate(&containers.0, &containers.1, resource, Field::Requests);
        if needed > *value {
            found.push(format!(
                "spec.resources.requests[{resource}] {text} must be greater than or equal to aggregate container requests of {}",
                format(needed, text)
            ));
        }
        if let Some((limit_text, limit)) = level.limits.get(resource)
            && value > limit
        {
            found.push(format!(
                "spec.resources.requests[{resource}] {text} must be less than or equal to the pod's limit {limit_text}"
            ));
        }
    }
    for (resource, (text, value)) in &level.limits {
        for container in containers.0.iter().chain(&containers.1) {
            let own = container_quantity(container, resource, Field::Limits);
            if own > *value {
                let name = container.get("name").and_then(Value::as_str).unwrap_or_default();
                found.push(format!(
                    "container {name}'s limits[{resource}] {} must be less than or equal to the pod's limit {text}",
                    format(own, text)
                ));
            }
        }
    }
    found
}

/// The values of a pod's `spec.resources` and its containers' `resources` that are no Kubernetes
/// quantity (`1.5.0`, `12 Gi`), one sentence each naming the field: padding cannot be computed
/// over them, and the API server refuses the pod for them.
pub fn unreadable(pod: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let mut check = |at: String, resources: Option<&Value>| {
        for field in ["requests", "limits"] {
            let entries = resources.and_then(|r| r.get(field)).and_then(Value::as_object);
            for (resource, value) in entries.into_iter().flatten() {
                if let Some(problem) = quantity::problem(value) {
                    found.push(format!("{at}.{field}[{resource}]: {problem}"));
                }
            }
        }
    };
    let spec = pod.get("spec");
    check("spec.resources".to_owned(), spec.and_then(|s| s.get("resources")));
    for list in ["initContainers", "containers"] {
        let containers = spec.and_then(|s| s.get(list)).and_then(Value::as_array);
        for (index, container) in containers.into_iter().flatten().enumerate() {
            check(format!("spec.{list}[{index}].resources"), container.get("resources"));
        }
    }
    found
}

/// The JSON Patch path of a pod-level quantity.
pub fn path(field: Field, resource: &str) -> String {
    format!("/spec/resources/{}/{}", field.key(), resource.replace('~', "~0").replace('/', "~1"))
}

/// The pod-level values that differ between `from` and `to`: (field, resource, the new value as
/// the pod will hold it).
pub fn changes<'a>(from: &'a PodLevel, to: &'a PodLevel) -> Vec<(Field, &'a str, Value)> {
    [Field::Requests, Field::Limits]
        .into_iter()
        .flat_map(|field| {
            to.field(field).iter().filter_map(move |(resource, (_, value))| {
                let key = number_key(field, resource);
                let same = from.field(field).get(resource).map(|(_, v)| v) == Some(value)
                    && from.numbers.contains(&key) == to.numbers.contains(&key);
                (!same).then(|| Some((field, resource.as_str(), to.written(field, resource)?))).flatten()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::quantity::NANO;

    fn container(name: &str, requests: Value, limits: Value, native: bool) -> Value {
        let mut c = json!({"name": name, "resources": {"requests": requests, "limits": limits}});
        if native {
            c["restartPolicy"] = json!("Always");
        }
        c
    }

    #[test]
    fn the_aggregate_is_what_kubernetes_counts() {
        let app = container("app", json!({"memory": "100Mi"}), json!({}), false);
        let sidecar = container("proxy", json!({"memory": "20Mi"}), json!({}), true);
        let big_init = container("migrate", json!({"memory": "500Mi"}), json!({}), false);
        let small_init = container("wait", json!({"memory": "10Mi"}), json!({}), false);
        let limit_only = container("agent", json!({}), json!({"memory": "30Mi"}), false);
        let mi = |n: i128| n * (1 << 20) * NANO;
        // (init containers, containers, aggregate memory requests)
        let cases: Vec<(Vec<&Value>, Vec<&Value>, i128)> = vec![
            (vec![], vec![&app], mi(100)),
            (vec![&sidecar], vec![&app], mi(120)),
            (vec![&small_init], vec![&app], mi(100)),
            (vec![&big_init], vec![&app], mi(500)),
            (vec![&sidecar, &big_init], vec![&app], mi(520)),
            (vec![&big_init, &sidecar], vec![&app], mi(500)),
            (vec![], vec![&app, &limit_only], mi(130)),
        ];
        for (init, containers, expected) in cases {
            assert_eq!(aggregate(&init, &containers, "memory", Field::Requests), expected, "{init:?} {containers:?}");
        }
        assert_eq!(aggregate(&[], &[&app, &limit_only], "memory", Field::Limits), mi(30));
    }

    #[test]
    fn padding_keeps_the_apps_budget_the_qos_class_and_a_valid_pod() {
        let pod = |resources: Value, app: Value| json!({"spec": {"resources": resources, "containers": [app]}});
        let app = container("app", json!({"cpu": "200m", "memory": "128Mi"}), json!({}), false);
        let shipper =
            container("log-shipper", json!({"cpu": "10m", "memory": "32Mi"}), json!({"memory": "64Mi"}), true);
        let guaranteed =
            json!({"requests": {"cpu": "200m", "memory": "128Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}});
        let limits_only = json!({"requests": {"cpu": "200m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}});
        // (pod-level resources, padding, the padded values)
        let cases = [
            (
                guaranteed,
                json!({"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"cpu": "10m", "memory": "64Mi"}}),
                json!({"requests": {"cpu": "210m", "memory": "192Mi"}, "limits": {"cpu": "210m", "memory": "192Mi"}}),
            ),
            (
                limits_only,
                json!({"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}),
                json!({"requests": {"cpu": "210m", "memory": "160Mi"}, "limits": {"memory": "320Mi"}}),
            ),
        ];
        for (resources, expected, padded) in cases {
            let pod = pod(resources.clone(), app.clone());
            let author = PodLevel::of(&pod).unwrap();
            let before: Containers = (vec![], vec![&app]);
            let after: Containers = (vec![&shipper], vec![&app]);
            assert!(!violations(&author, &after).is_empty(), "unpadded, the pod is invalid: {resources}");
            let padding = padding(&author, &before, &after);
            assert_eq!(serde_json::to_value(&padding).unwrap(), expected, "{resources}");
            let now = author.with(&padding, 1).unwrap();
            let texts = |field: &BTreeMap<String, (String, i128)>| -> Value {
                field.iter().map(|(k, (t, _))| (k.clone(), Value::from(t.as_str()))).collect()
            };
            assert_eq!(json!({"requests": texts(&now.requests), "limits": texts(&now.limits)}), padded);
            assert_eq!(violations(&now, &after), Vec::<String>::new(), "{resources}");
            assert_eq!(now.with(&padding, -1).unwrap(), author, "taking the padding back gives the author's values");
        }
        assert_eq!(PodLevel::of(&json!({"spec": {"containers": []}})), None);
    }

    #[test]
    fn violations_say_what_the_api_server_would_refuse() {
        let app = container("app", json!({"memory": "128Mi"}), json!({}), false);
        let greedy = container("greedy", json!({}), json!({"memory": "1Gi"}), true);
        let pod = json!({"spec": {"resources": {"requests": {"memory": "128Mi"}, "limits": {"memory": "512Mi"}}}});
        let level = PodLevel::of(&pod).unwrap();
        let found = violations(&level, &(vec![&greedy], vec![&app]));
        assert_eq!(
            found,
            vec![
                "spec.resources.requests[memory] 128Mi must be greater than or equal to aggregate container requests of 1152Mi",
                "container greedy's limits[memory] 1Gi must be less than or equal to the pod's limit 512Mi",
            ]
        );
    }
}
