//! The name table of a plan: which names of a list (containers, volumes, env vars of a container,
//! label keys) are in use and who holds each — the pod, an earlier template of this injection, or
//! an earlier injection that stays — so that a template's item either takes a free name or is
//! skipped for its holder. Borrowed names only: it is built for every list the plan touches.

use std::collections::BTreeMap;

use crate::model::kinds::PodListKind;

/// Who holds a name: the pod itself, an earlier template, or an earlier injection of the current
/// templates that stays in place (`Earlier::Keep`).
#[derive(Clone, Copy)]
pub(super) enum Owner<'a> {
    Pod,
    Template(&'a str),
    Kept,
    /// Not a holder of the name: the item refers to this item of its template (mounts a volume),
    /// which was skipped for another of that identity (only ever the cause of a skip).
    Referenced(&'static PodListKind, &'a str),
}

/// How a template got a name.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Claimed {
    /// The name was free: the item is added.
    New,
    /// The item is already there from an earlier injection: nothing to add.
    Kept,
}

impl std::fmt::Display for Owner<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Pod | Owner::Kept => f.write_str("pod"),
            Owner::Template(name) => write!(f, "template:{name}"),
            Owner::Referenced(kind, identity) => f.write_str(&kind.skip_owner(identity)),
        }
    }
}

/// Names in use and who holds them. Borrows every name: this is built for every env var of every
/// container, so it must not allocate per name. A B-tree rather than a hash map: most sets hold a
/// handful of names, where hashing and regrowing cost more than a few string comparisons.
#[derive(Default)]
pub(super) struct Taken<'a>(BTreeMap<&'a str, Owner<'a>>);

impl<'a> FromIterator<&'a str> for Taken<'a> {
    fn from_iter<I: IntoIterator<Item = &'a str>>(iter: I) -> Self {
        Taken(iter.into_iter().map(|n| (n, Owner::Pod)).collect())
    }
}

impl<'a> Taken<'a> {
    /// The pod's names, except those at the `removed` indexes (ascending).
    pub(super) fn by_pod(names: &[&'a str], removed: &[usize]) -> Self {
        names.iter().enumerate().filter(|(i, _)| removed.binary_search(i).is_err()).map(|(_, n)| *n).collect()
    }

    /// Marks names as held by an earlier injection that stays (`Earlier::Keep`).
    pub(super) fn keep(&mut self, names: impl IntoIterator<Item = &'a String>) {
        for name in names {
            self.0.insert(name, Owner::Kept);
        }
    }

    /// Marks `name` as the pod's, whoever held it.
    pub(super) fn mark_pod(&mut self, name: &'a str) {
        self.0.insert(name, Owner::Pod);
    }

    /// Who holds `name`, if anyone.
    pub(super) fn holder(&self, name: &str) -> Option<Owner<'a>> {
        self.0.get(name).copied()
    }

    /// Marks `name` as held by `owner` unless someone holds it already.
    pub(super) fn hold(&mut self, name: &'a str, owner: Owner<'a>) {
        self.0.entry(name).or_insert(owner);
    }

    /// Takes `name` for `owner`, or says who already holds it.
    pub(super) fn claim(&mut self, name: &'a str, owner: Owner<'a>) -> Result<Claimed, Owner<'a>> {
        match self.0.entry(name) {
            std::collections::btree_map::Entry::Occupied(mut holder) => match holder.get() {
                Owner::Kept => {
                    holder.insert(owner);
                    Ok(Claimed::Kept)
                }
                other => Err(*other),
            },
            std::collections::btree_map::Entry::Vacant(slot) => {
                slot.insert(owner);
                Ok(Claimed::New)
            }
        }
    }
}
