//! How the engine identifies and compares the items it injects, the way the API server sees them:
//! an `envFrom` source by what it references, a stored item against the rendered one field by
//! field (extra fields and canonical rewrites allowed), resource quantities by value. Below
//! `inject`, `ownership`, `enforce` and `validate`, which all decide with these.

use serde_json::Value;

/// What a field rendered from pod data is replaced by in a masked render (`render`, for the
/// validating check): [`first_difference`] accepts any value in its place. It lives here, with the
/// comparison that gives it its meaning, so that comparing needs nothing from rendering.
pub const POD_DERIVED: &str = "\u{1}sidecar-injector:pod-derived\u{1}";

/// What identifies an `envFrom` source: `configMap/<name>` or `secret/<name>`, with `+<prefix>`
/// when it has one; `None` unless exactly one of the two references names something.
pub fn env_from_key(source: &Value) -> Option<String> {
    let name = |field: &str| source.get(field)?.get("name")?.as_str().filter(|n| !n.is_empty());
    let base = match (name("configMapRef"), name("secretRef")) {
        (Some(n), None) => format!("configMap/{n}"),
        (None, Some(n)) => format!("secret/{n}"),
        _ => return None,
    };
    match source.get("prefix").and_then(Value::as_str).filter(|p| !p.is_empty()) {
        Some(prefix) => Some(format!("{base}+{prefix}")),
        None => Some(base),
    }
}

/// The first field of `expected` that `actual` does not hold, as `path: is X, the template sets Y`.
/// A field computed from pod data ([`POD_DERIVED`]) matches anything. Objects may have extra
/// keys; lists of objects are matched by key (mounts by `mountPath`, other named objects by name,
/// any one of several with the key holding the expected item will do); other lists of objects
/// item by item (extra trailing items allowed); an empty list is contained in any list; other lists
/// must be equal. Resource quantities
/// compare by value (`1000m` equals `1`), because the API server rewrites them in canonical form.
pub fn first_difference(expected: &Value, actual: &Value) -> Option<String> {
    difference(expected, actual, At::Item, None)
}

/// [`first_difference`] of two containers but for their `resources`, which change by in-place
/// resizes (`kubectl patch --subresource resize`, vertical autoscalers), not by template changes.
pub fn first_difference_but_resources(expected: &Value, actual: &Value) -> Option<String> {
    difference(expected, actual, At::Item, Some("resources"))
}

/// Where a comparison is, written out only for a difference: most comparisons find none, and a
/// path made at every field would cost an allocation per field compared.
#[derive(Clone, Copy)]
enum At<'a> {
    Item,
    Key(&'a At<'a>, &'a str),
    Index(&'a At<'a>, usize),
}

impl At<'_> {
    /// `.spec.containers[0]`-like, empty for the item itself.
    fn path(&self) -> String {
        match self {
            At::Item => String::new(),
            At::Key(parent, key) => format!("{}.{key}", parent.path()),
            At::Index(parent, index) => format!("{}[{index}]", parent.path()),
        }
    }

    /// The path as a message names it.
    fn here(&self) -> String {
        match self.path() {
            path if path.is_empty() => "the item".to_owned(),
            path => path.trim_start_matches('.').to_owned(),
        }
    }
}

/// [`first_difference`] at `at`, the key `except` of the objects compared left out.
fn difference(expected: &Value, actual: &Value, at: At<'_>, except: Option<&str>) -> Option<String> {
    match (expected, actual) {
        (Value::Object(want), Value::Object(have)) => {
            let compared = want.iter().filter(|(key, _)| Some(key.as_str()) != except);
            compared.into_iter().find_map(|(key, w)| match have.get(key) {
                None if is_implied(key, w) => None,
                None => Some(format!("{} was removed", At::Key(&at, key).here())),
                Some(h) => difference(w, h, At::Key(&at, key), None),
            })
        }
        (Value::Array(want), Value::Array(_)) if want.is_empty() => None,
        (Value::Array(want), Value::Array(have)) if want.iter().all(Value::is_object) => {
            // Items are found by the key Kubernetes merges them by: a mount by its path (one
            // volume may be mounted at several), other named items by name; else by position.
            let key = ["mountPath", "name"]
                .into_iter()
                .find(|key| want.iter().all(|w| w.get(*key).is_some_and(Value::is_string)));
            want.iter().enumerate().find_map(|(i, w)| {
                let item = At::Index(&at, i);
                let mut candidates = have
                    .iter()
                    .enumerate()
                    .filter(|(j, h)| match key {
                        Some(key) => h.get(key) == w.get(key),
                        None => *j == i,
                    })
                    .map(|(_, h)| h);
                let Some(first) = candidates.next() else {
                    return Some(format!("{} was removed", item.here()));
                };
                // Of several items with the key (a pod may repeat a name), one that holds `w` will do.
                let found = difference(w, first, item, None)?;
                candidates.all(|h| difference(w, h, item, None).is_some()).then_some(found)
            })
        }
        (Value::String(w), _) if w == POD_DERIVED => None,
        // Other lists (args, command) must have the same items, each compared (so a pod-derived
        // item matches anything).
        (Value::Array(want), Value::Array(have)) if want.len() == have.len() && !want.iter().all(Value::is_object) => {
            let differs = want
                .iter()
                .zip(have)
                .enumerate()
                .any(|(i, (w, h))| difference(w, h, At::Index(&at, i), None).is_some());
            differs.then(|| format!("{} is {actual}, the template sets {}", at.here(), shown(expected)))
        }
        (w, h) if w != h && at.path().contains("resources") && crate::quantity::equal(w, h) => None,
        (w, h) if w == h => None,
        (w, h) => Some(format!("{} is {h}, the template sets {}", at.here(), shown(w))),
    }
}

/// Whether a field the template (or the injection) sets says what its absence says: a
/// `resizePolicy` that restarts for nothing, as a container without one behaves (a native sidecar
/// injected before the default one was written holds it).
pub fn is_implied(key: &str, value: &Value) -> bool {
    key == "resizePolicy" && crate::model::native::restarts_nothing(value)
}

/// A container without its `resources`, for comparing an injected container with its template:
/// its resources change by in-place resizes (`kubectl patch --subresource resize`, vertical
/// autoscalers), which are not template changes.
pub fn without_resources(container: &Value) -> Value {
    let mut container = container.clone();
    if let Value::Object(fields) = &mut container {
        fields.remove("resources");
    }
    container
}

/// A value for a message, with pod-derived fields shown as such.
fn shown(value: &Value) -> String {
    let placeholder = Value::String(POD_DERIVED.to_owned()).to_string();
    value.to_string().replace(&placeholder, "\"<from the pod>\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn list_items_are_found_by_the_key_kubernetes_merges_them_by() {
        let mounts = json!([{"name": "data", "mountPath": "/a", "subPath": "x"}, {"name": "data", "mountPath": "/b"}]);
        assert_eq!(first_difference(&mounts, &mounts), None, "one volume at two paths");
        let moved = json!([{"name": "data", "mountPath": "/a", "subPath": "x"}, {"name": "data", "mountPath": "/c"}]);
        assert_eq!(first_difference(&mounts, &moved), Some("[1] was removed".to_owned()));
        // A repeated name (the author's env var and a merged entry of it): one holding it will do.
        let want = json!([{"name": "PATH", "value": "/agent"}]);
        let have = json!([{"name": "PATH", "value": "/usr/bin"}, {"name": "PATH", "value": "/agent"}]);
        assert_eq!(first_difference(&want, &have), None);
        let other = json!([{"name": "PATH", "value": "/usr/bin"}]);
        assert_eq!(
            first_difference(&want, &other),
            Some("[0].value is \"/usr/bin\", the template sets \"/agent\"".to_owned())
        );
    }

    #[test]
    fn quantities_compare_by_value_however_written() {
        let equal = [
            (json!("1000m"), json!("1")),
            (json!("0.5"), json!("500m")),
            (json!("1Gi"), json!("1024Mi")),
            (json!("1k"), json!("1000")),
            (json!("1e3"), json!("1k")),
            (json!(1), json!("1000m")),
            (json!(0.5), json!("500m")),
            (json!(1), json!(1.0)),
        ];
        for (a, b) in equal {
            assert!(crate::quantity::equal(&a, &b), "{a} == {b}");
        }
        for (a, b) in [
            (json!("1"), json!("2")),
            (json!("1Gi"), json!("1G")),
            (json!("x"), json!("x1")),
            (json!(true), json!("1")),
        ] {
            assert!(!crate::quantity::equal(&a, &b), "{a} != {b}");
        }
        // A template's `cpu: 1` is what the API server stores as "1".
        let want = json!({"resources": {"limits": {"cpu": 1}}});
        let have = json!({"resources": {"limits": {"cpu": "1"}}});
        assert_eq!(first_difference(&want, &have), None);
    }
}
