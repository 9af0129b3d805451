//! Writing a JSONPatch: pointers escaped as RFC 6901 says, list items removed from the back,
//! appended or put first, maps created whole where the pod has none. What the plan decided is
//! written here; nothing here decides.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, RemoveOperation};
use serde_json::Value;

/// A JSONPatch being written, operation by operation.
#[derive(Default)]
pub(super) struct Builder {
    ops: Vec<PatchOperation>,
}

impl Builder {
    /// The JSON pointer to `path`, written into one allocation of the right size (building it
    /// token by token regrows it several times, and a patch has dozens of pointers).
    pub(super) fn pointer(path: &[&str]) -> PointerBuf {
        // Room for a few escapes; a token with '~' or '/' (an annotation key) is rare.
        let mut text = String::with_capacity(path.iter().map(|token| 1 + token.len()).sum::<usize>() + 8);
        for token in path {
            text.push('/');
            if token.bytes().any(|b| b == b'~' || b == b'/') {
                text.push_str(&token.replace('~', "~0").replace('/', "~1"));
            } else {
                text.push_str(token);
            }
        }
        PointerBuf::parse(text).expect("every '~' and '/' of a token is escaped")
    }

    /// Adds `value` at a pointer already written.
    pub(super) fn add_at(&mut self, path: PointerBuf, value: Value) {
        self.ops.push(PatchOperation::Add(AddOperation { path, value }));
    }

    /// The operations written, in order.
    pub(super) fn into_operations(self) -> Vec<PatchOperation> {
        self.ops
    }

    pub(super) fn add(&mut self, path: &[&str], value: Value) {
        self.ops.push(PatchOperation::Add(AddOperation { path: Self::pointer(path), value }));
    }

    pub(super) fn remove(&mut self, path: &[&str]) {
        self.ops.push(PatchOperation::Remove(RemoveOperation { path: Self::pointer(path) }));
    }

    /// Removes the items at `indexes` (ascending) of the list at `path`, which has `len` items.
    /// When that empties the list and `nothing_follows`, the list itself goes (a fresh injection
    /// would not have created it). Returns whether the list still exists.
    pub(super) fn removals(&mut self, path: &[&str], indexes: &[usize], len: usize, nothing_follows: bool) -> bool {
        if len > 0 && indexes.len() == len && nothing_follows {
            self.remove(path);
            return false;
        }
        for index in indexes.iter().rev() {
            let index = index.to_string();
            let mut full = path.to_vec();
            full.push(&index);
            self.remove(&full);
        }
        len > 0
    }

    /// Appends to a list, creating it when the pod has none.
    pub(super) fn append(&mut self, path: &[&str], exists: bool, items: Vec<Value>) {
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
    pub(super) fn insert_front(&mut self, path: &[&str], exists: bool, items: Vec<Value>) {
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

    /// Labels or annotations: removals, then additions; a missing map is added whole, and a map
    /// the removals empty (`empties`) with nothing to add is removed whole.
    pub(super) fn string_map(
        &mut self,
        section: &str,
        existing: Option<&Value>,
        removals: &[&str],
        additions: BTreeMap<String, String>,
        empties: bool,
    ) {
        if empties && additions.is_empty() && !removals.is_empty() {
            return self.remove(&["metadata", section]);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_escape_like_the_rfc() {
        for path in
            [&["metadata", "annotations", "sidecar-injector.io/status"][..], &["a~b/c", "~", "/", "~1", "", "-"], &[]]
        {
            let expected = PointerBuf::from_tokens(path.iter().copied());
            assert_eq!(Builder::pointer(path), expected, "{path:?}");
        }
        assert_eq!(Builder::pointer(&["a~b/c"]).as_str(), "/a~0b~1c");
    }
}
