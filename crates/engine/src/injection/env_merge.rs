//! Adding to an env var the app already has (`merge:` on an `appContainers.env` item).
//!
//! Agents are loaded through `JAVA_TOOL_OPTIONS`, `NODE_OPTIONS`, `PYTHONPATH`, `LD_PRELOAD`: a
//! template must add its fragment to the app's value, neither skip it (the default for any other
//! env var: the pod's own wins) nor overwrite it.
//!
//! How: the injection never edits the author's variable. It appends a *second* entry of the same
//! name after it, whose value refers to the first with Kubernetes' own expansion:
//! `{name: JAVA_TOOL_OPTIONS, value: "$(JAVA_TOOL_OPTIONS) -javaagent:/otel/agent.jar"}`. The kubelet
//! builds a container's environment in order, `envFrom` first, then `env` item by item, each
//! `$(NAME)` expanded from what is defined so far, and a later entry of a name replaces an earlier
//! one. So the one mechanism works whatever form the app's value has:
//! - a literal `value`, or `valueFrom` (a Secret, a ConfigMap, the downward API): the earlier entry
//!   is defined when the reference is expanded;
//! - an `envFrom` source that may hold the key (no prefix, or a prefix the name starts with): the
//!   reference is expanded from it when the source has the key. When it does not, Kubernetes
//!   leaves `$(NAME)` as written; the API cannot tell, and `explain` says so;
//! - only the image's `ENV`: invisible to the API and to the kubelet's expansion. The pod spec shows
//!   no value, so the fragment is added as a plain entry, which replaces the image's value;
//!   `explain` says so.
//!
//! Why a second entry rather than a rewritten value: the author's item stays byte for byte what
//! they wrote (the rule every patch keeps), `valueFrom` and `envFrom` work the same way as
//! literals, two templates merging into one variable simply chain (`$(X) a` then `$(X) b`), and
//! taking the injection back is removing an entry, which gives back exactly the author's value.
//! The price: the API server warns that the entry "hides previous definition" of the name.
//!
//! The status records each merged entry as `NAME=VALUE` (`envMerges`): exactly what was added,
//! so re-injection removes that entry and no other, and a copy of it already in the pod (a pod
//! re-created from `kubectl get -o yaml` without its status) is never added twice.

use crate::model::env::{EnvMerge, Piece, Pieces, extends_earlier, refers_to_itself};
use serde_json::Value;

/// The status key of a merged entry: `NAME=VALUE` (an env var name cannot contain `=`).
pub fn key(entry: &Value) -> Option<String> {
    let name = entry.get("name")?.as_str()?;
    let value = entry.get("value")?.as_str()?;
    Some(format!("{name}={value}"))
}

/// The name and value of a status key.
pub fn split_key(key: &str) -> (&str, &str) {
    key.split_once('=').unwrap_or((key, ""))
}

/// The status key of an app's env entry when it refers to its own name, as every merged entry
/// does (`None` for the others, which are identified by name alone). Computed for every env var of
/// every container, so it allocates only for such entries.
pub fn pod_entry_key(entry: &Value) -> Option<String> {
    let name = entry.get("name")?.as_str()?;
    let value = entry.get("value")?.as_str()?;
    (value.len() > name.len() + 3 && refers_to_itself(name, value)).then(|| format!("{name}={value}"))
}

/// The author's own entry of `name` in `container`: of the `env` entries of that name that an
/// earlier injection did not add (`injected`: the indexes of the entries an earlier injection
/// provably added, ascending, which re-injection removes), the one the kubelet takes the value
/// from: the last that does not merely extend the value before it (or the last, when all do).
/// A container may set a name twice (the API server only warns) and the **last** entry wins, so
/// the first is never the one to read. An injected entry is never the author's value: read as
/// one, a template edit that shortens a fragment would find the old fragment "already there" in
/// the very entry it replaces, and drop the merge.
pub fn own_entry<'c>(container: &'c Value, name: &str, injected: &[usize]) -> Option<&'c Value> {
    let env = container.get("env").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let own = env.iter().enumerate().filter(|(index, e)| {
        e.get("name").and_then(Value::as_str) == Some(name) && injected.binary_search(index).is_err()
    });
    let mut last = None;
    let mut defining = None;
    for (_, entry) in own {
        last = Some(entry);
        if !extends_earlier(entry) {
            defining = Some(entry);
        }
    }
    defining.or(last)
}

/// Whether the value the kubelet gives `name` (see [`effective_value`]) already holds `fragment`
/// as one of its `separator`-delimited parts: the agent is loaded already (by hand, or by an
/// injection whose status was lost), and adding it again would load it twice. A part the pod
/// spec cannot show (a `valueFrom`, an `envFrom` key) never counts as the fragment.
pub fn already_has(effective: Option<&str>, merge: &EnvMerge, fragment: &str) -> bool {
    let Some(value) = effective else { return false };
    match merge.separator.is_empty() {
        true => value.contains(fragment),
        false => value.split(merge.separator.as_str()).any(|part| part == fragment),
    }
}

/// Stands for a part of a value the pod spec cannot show (a `valueFrom`, an `envFrom` key, an
/// expansion past [`EXPANSION_BUDGET`]): a private-use character no fragment compares equal to.
pub const UNSEEN: &str = "\u{e000}";

/// The most bytes [`effective_value`] writes for one container: `$(A)$(A)` doubles a value per
/// entry, so a chain of such entries would otherwise grow without bound. Above what a request
/// body may hold (`server.max_body_bytes`), so plain values alone never reach it.
pub const EXPANSION_BUDGET: usize = 8 * 1024 * 1024;

/// The value the kubelet gives `name` in `container`, as far as the pod spec shows it, leaving
/// out the entries at `injected` (ascending): `envFrom` first, then each `env` entry in order,
/// `$(NAME)` expanded from what is defined so far (`$$` is a literal `$`; a reference to nothing
/// defined stays as written), a later entry of a name replacing an earlier one. `None` when no
/// `env` entry sets the name. What the spec cannot show reads as [`UNSEEN`].
pub fn effective_value(container: &Value, name: &str, injected: &[usize]) -> Option<String> {
    let env = container.get("env").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let mut defined: std::collections::HashMap<&str, String> = std::collections::HashMap::new();
    let mut budget = EXPANSION_BUDGET;
    // The `envFrom` sources' prefixes ("" for none), read once: a name only they may define is
    // unseen, whatever number of references a pod writes.
    let sources = container.get("envFrom").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let prefixes: Vec<&str> = sources
        .iter()
        .filter(|source| crate::model::compare::env_from_key(source).is_some())
        .map(|source| source.get("prefix").and_then(Value::as_str).unwrap_or_default())
        .collect();
    for (index, entry) in env.iter().enumerate() {
        let Some(entry_name) = entry.get("name").and_then(Value::as_str) else { continue };
        if injected.binary_search(&index).is_ok() {
            continue;
        }
        let value = match entry.get("value") {
            Some(Value::String(text)) => expand(text, &mut budget, |reference| match defined.get(reference) {
                Some(value) => Some(value.clone()),
                None if prefixes.iter().any(|prefix| reference.starts_with(prefix)) => Some(UNSEEN.to_owned()),
                None => None,
            }),
            None if entry.get("valueFrom").is_some() => UNSEEN.to_owned(),
            _ => String::new(),
        };
        defined.insert(entry_name, value);
    }
    defined.remove(name)
}

/// Kubernetes' `$(VAR)` expansion of `input` ([`Pieces`]): `lookup` gives a defined name's value;
/// an undefined reference stays as written. Past the `budget` of bytes the result is [`UNSEEN`].
fn expand(input: &str, budget: &mut usize, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len().min(*budget));
    for piece in Pieces(input) {
        match piece {
            Piece::Text(text) => out.push_str(text),
            Piece::Reference(name) => match lookup(name) {
                Some(value) => out.push_str(&value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            },
        }
        if out.len() > *budget {
            *budget = 0;
            return UNSEEN.to_owned();
        }
    }
    *budget -= out.len();
    out
}

/// The first entry after `index` of `env`'s entry of its name that extends the value (`$(NAME)`
/// in it) without being one of the `merged` entries (`NAME=VALUE` keys) an injection added: the
/// pod's own change of the value the container runs with.
pub fn extension_after<'e>(env: &'e [Value], index: usize, merged: &[String]) -> Option<&'e Value> {
    let name = env.get(index)?.get("name")?.as_str()?;
    env.iter().skip(index + 1).find(|entry| {
        entry.get("name").and_then(Value::as_str) == Some(name)
            && extends_earlier(entry)
            && !key(entry).is_some_and(|k| merged.contains(&k))
    })
}

/// The last entry of `env` whose status key is `key` (a merged entry), with its index, when no
/// later entry of its name replaces it ([`overridden`]): a merged entry the container runs with.
pub fn merged_in_effect<'e>(env: &'e [Value], key: &str) -> Option<(usize, &'e Value)> {
    let (index, entry) = env.iter().enumerate().rev().find(|(_, e)| self::key(e).as_deref() == Some(key))?;
    (!overridden(env, index, &[])).then_some((index, entry))
}

/// Whether the entry at `index` of `env` is overridden by a later entry of its name that the
/// kubelet reads instead (one that does not merely extend it), leaving out those at `skip`
/// (ascending): a merged entry so overridden adds nothing to what the container runs with.
pub fn overridden(env: &[Value], index: usize, skip: &[usize]) -> bool {
    let name = |e: &Value| e.get("name").and_then(Value::as_str).map(str::to_owned);
    let Some(own) = env.get(index).and_then(name) else { return false };
    env.iter().enumerate().skip(index + 1).any(|(i, e)| {
        skip.binary_search(&i).is_err()
            && e.get("name").and_then(Value::as_str) == Some(own.as_str())
            && !extends_earlier(e)
    })
}

/// The `envFrom` sources of a container that may define `name` (the API cannot see their keys),
/// as `compare::env_from_key` names them.
pub fn possible_sources(container: &Value, name: &str) -> Vec<String> {
    let sources = container.get("envFrom").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    sources
        .iter()
        .filter(|source| source.get("prefix").and_then(Value::as_str).is_none_or(|prefix| name.starts_with(prefix)))
        .filter_map(crate::model::compare::env_from_key)
        .collect()
}

/// Where the app's own value of a merged variable comes from, as the pod shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppValue {
    /// An `env` entry with a literal value.
    Literal,
    /// An `env` entry with `valueFrom`.
    ValueFrom,
    /// Maybe these `envFrom` sources, if they have the key.
    MaybeFrom(Vec<String>),
    /// Nothing the API shows (it may still be set by the image's `ENV`).
    NotVisible,
}

impl AppValue {
    /// Finds the app's value of `name`: the author's own entry (`own`, from [`own_entry`]), else the
    /// `envFrom` sources of `container`.
    pub fn of(container: &Value, own: Option<&Value>, name: &str) -> Self {
        match own {
            Some(entry) if entry.get("valueFrom").is_some() => AppValue::ValueFrom,
            Some(_) => AppValue::Literal,
            None => match possible_sources(container, name) {
                sources if sources.is_empty() => AppValue::NotVisible,
                sources => AppValue::MaybeFrom(sources),
            },
        }
    }

    /// A sentence for `explain`: what the merged value will be made of.
    pub fn explain(&self, name: &str, merge: &EnvMerge) -> String {
        let how = merge.describe();
        match self {
            AppValue::Literal => format!("{name}: merged into the container's own value ({how})"),
            AppValue::ValueFrom => {
                format!("{name}: merged into the container's own value from valueFrom, through $({name}) ({how})")
            }
            AppValue::MaybeFrom(sources) if sources.len() > 1 => format!(
                "{name}: merged through $({name}) into the value from envFrom {} (the last of them that has the key {name} wins) ({how}); if none has it, Kubernetes leaves $({name}) as written",
                sources.join(", ")
            ),
            AppValue::MaybeFrom(sources) => format!(
                "{name}: merged through $({name}) into the value from envFrom {} ({how}); if that source has no key {name}, Kubernetes leaves $({name}) as written",
                sources.join(", ")
            ),
            AppValue::NotVisible => format!(
                "{name}: the container sets no value the API can see, so the template's value is added alone; a value set only by the image's ENV cannot be seen and is replaced"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::env::Position;
    use serde_json::json;

    #[test]
    fn entries_refer_to_the_app_value() {
        let append = EnvMerge { position: Position::Append, separator: " ".into() };
        let prepend = EnvMerge { position: Position::Prepend, separator: ":".into() };
        assert_eq!(append.entry("J", "-javaagent:/a.jar"), json!({"name": "J", "value": "$(J) -javaagent:/a.jar"}));
        assert_eq!(prepend.entry("PYTHONPATH", "/otel"), json!({"name": "PYTHONPATH", "value": "/otel:$(PYTHONPATH)"}));
        let entry = append.entry("J", "x=y");
        assert_eq!(key(&entry).as_deref(), Some("J=$(J) x=y"));
        assert_eq!(split_key("J=$(J) x=y"), ("J", "$(J) x=y"));
        assert_eq!(pod_entry_key(&entry), key(&entry));
    }

    #[test]
    fn only_self_references_get_a_key() {
        // (entry, has a key)
        let cases = [
            (json!({"name": "J", "value": "$(J) x"}), true),
            (json!({"name": "J", "value": "x:$(J)"}), true),
            (json!({"name": "J", "value": "$(JX) x"}), false),
            (json!({"name": "J", "value": "$(OTHER) x"}), false),
            (json!({"name": "J", "value": "plain"}), false),
            (json!({"name": "J", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}), false),
            (json!({"name": "J", "value": "$(J"}), false),
        ];
        for (entry, keyed) in cases {
            assert_eq!(pod_entry_key(&entry).is_some(), keyed, "{entry}");
        }
    }

    #[test]
    fn where_the_app_value_comes_from() {
        let container = json!({"name": "app",
            "env": [{"name": "LIT", "value": "1"}, {"name": "REF", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
            "envFrom": [{"configMapRef": {"name": "all"}}, {"prefix": "JAVA_", "secretRef": {"name": "java"}},
                {"prefix": "NODE_", "configMapRef": {"name": "node"}}]});
        // (name, where its value comes from)
        let cases = [
            ("LIT", AppValue::Literal),
            ("REF", AppValue::ValueFrom),
            ("JAVA_TOOL_OPTIONS", AppValue::MaybeFrom(vec!["configMap/all".into(), "secret/java+JAVA_".into()])),
            ("PYTHONPATH", AppValue::MaybeFrom(vec!["configMap/all".into()])),
        ];
        for (name, expected) in cases {
            assert_eq!(AppValue::of(&container, own_entry(&container, name, &[]), name), expected, "{name}");
        }
        assert_eq!(AppValue::of(&json!({"name": "bare"}), None, "LD_PRELOAD"), AppValue::NotVisible);
    }

    #[test]
    fn an_entry_an_earlier_injection_added_is_never_the_authors_value() {
        let merge = EnvMerge { position: Position::Prepend, separator: ":".into() };
        // (env, indexes an earlier injection added, index of the author's entry, whether "=" is loaded)
        let injected = json!({"name": "PATH", "value": "=:$(PATH)"});
        let cases = [
            (json!([injected]), vec![], Some(0), true), // no status: a copy of an injection counts
            (json!([injected]), vec![0], None, false),  // re-injection: the entry being replaced does not
            (json!([{"name": "PATH", "value": "/bin:="}, injected]), vec![1], Some(0), true),
            (json!([{"name": "PATH", "value": "/bin"}, injected]), vec![1], Some(0), false),
        ];
        for (env, removed, expected, loaded) in cases {
            let container = json!({"name": "app", "env": env, "envFrom": [{"configMapRef": {"name": "app-env"}}]});
            let own = own_entry(&container, "PATH", &removed);
            assert_eq!(own, expected.map(|i| &container["env"][i]), "{container} {removed:?}");
            let effective = effective_value(&container, "PATH", &removed);
            assert_eq!(already_has(effective.as_deref(), &merge, "="), loaded, "{container} {removed:?}");
        }
        let container = json!({"name": "app", "env": [injected], "envFrom": [{"configMapRef": {"name": "app-env"}}]});
        assert_eq!(
            AppValue::of(&container, own_entry(&container, "PATH", &[0]), "PATH"),
            AppValue::MaybeFrom(vec!["configMap/app-env".into()])
        );
    }

    #[test]
    fn the_kubelet_reads_the_last_entry_of_a_name() {
        let merge = EnvMerge { position: Position::Append, separator: " ".into() };
        let agent = "-javaagent:/a.jar";
        // (env, envFrom, the value the kubelet gives J, whether the agent is loaded already)
        let unseen = UNSEEN;
        let cases = [
            (
                json!([{"name": "J", "value": agent}, {"name": "J", "value": "-Xmx1g"}]),
                json!([]),
                "-Xmx1g".to_owned(),
                false,
            ),
            (
                json!([{"name": "J", "value": "-Xmx1g"}, {"name": "J", "value": agent}]),
                json!([]),
                agent.to_owned(),
                true,
            ),
            (
                json!([{"name": "J", "value": agent}, {"name": "J", "value": "$(J) -Xmx1g"}]),
                json!([]),
                format!("{agent} -Xmx1g"),
                true,
            ),
            (
                json!([{"name": "J", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}, {"name": "J", "value": "$(J) -javaagent:/a.jar"}]),
                json!([]),
                format!("{unseen} {agent}"),
                true,
            ),
            (
                json!([{"name": "J", "value": agent}, {"name": "J", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]),
                json!([]),
                unseen.to_owned(),
                false,
            ),
            (
                json!([{"name": "O", "value": "1"}, {"name": "J", "value": "$(O)$$(O)$(NONE)$(J"}]),
                json!([]),
                "1$(O)$(NONE)$(J".to_owned(),
                false,
            ),
            (
                json!([{"name": "J", "value": "$(FROM) x"}]),
                json!([{"configMapRef": {"name": "cm"}}]),
                format!("{unseen} x"),
                false,
            ),
            (json!([{"name": "J", "value": ""}]), json!([]), String::new(), false),
        ];
        for (env, env_from, value, loaded) in cases {
            let container = json!({"name": "app", "env": env, "envFrom": env_from});
            let effective = effective_value(&container, "J", &[]);
            assert_eq!(effective.as_deref(), Some(value.as_str()), "{container}");
            assert_eq!(already_has(effective.as_deref(), &merge, agent), loaded, "{container}");
        }
    }

    #[test]
    fn an_escaped_reference_is_text_not_an_extension() {
        // `$$(J)` is the literal text `$(J)`: it replaces the value, so it extends nothing.
        let escaped = json!({"name": "J", "value": "$$(J) -Xmx1g"});
        assert!(!extends_earlier(&escaped));
        assert_eq!(pod_entry_key(&escaped), None);
        let env = [json!({"name": "J", "value": "$(J) -javaagent:/a.jar"}), escaped];
        assert!(overridden(&env, 0, &[]));
        let container = json!({"name": "app", "env": env});
        assert_eq!(effective_value(&container, "J", &[]).as_deref(), Some("$(J) -Xmx1g"));
        let pieces: Vec<Piece> = Pieces("a$$b$(C)$(d$").collect();
        assert_eq!(
            pieces,
            [
                Piece::Text("a"),
                Piece::Text("$"),
                Piece::Text("b"),
                Piece::Reference("C"),
                Piece::Text("$"),
                Piece::Text("(d"),
                Piece::Text("$")
            ]
        );
    }

    #[test]
    fn a_doubling_chain_stops_at_the_budget() {
        let mut env = vec![json!({"name": "A", "value": "xxxxxxxx"})];
        env.extend((0..64).map(|_| json!({"name": "A", "value": "$(A)$(A)"})));
        env.push(json!({"name": "B", "value": "$(A) tail"}));
        let container = json!({"name": "app", "env": env});
        assert_eq!(effective_value(&container, "A", &[]).as_deref(), Some(UNSEEN));
        assert_eq!(effective_value(&container, "B", &[]).as_deref(), Some(UNSEEN));
    }

    #[test]
    fn an_entry_is_overridden_only_by_a_later_one_that_replaces_it() {
        let env = [
            json!({"name": "J", "value": "-Xmx1g"}),
            json!({"name": "J", "value": "$(J) -javaagent:/a.jar"}),
            json!({"name": "J", "value": "$(J) -Dmore"}),
            json!({"name": "K", "value": "k"}),
            json!({"name": "J", "value": "off"}),
        ];
        assert!(overridden(&env, 1, &[]));
        assert!(!overridden(&env, 1, &[4]));
        assert!(!overridden(&env, 3, &[]));
        assert!(!overridden(&env, 4, &[]));
        let container = json!({"name": "app", "env": env});
        assert_eq!(own_entry(&container, "J", &[]), Some(&env[4]));
        assert_eq!(own_entry(&container, "J", &[4]), Some(&env[0]));
    }
}
