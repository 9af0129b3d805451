//! The structures a node pool answers "which nodes may this pod run on" with, at a cost that does
//! not grow with the cluster the way a scan of every node does: a set of nodes is a bit per node,
//! and per label key and value the pool keeps the nodes that carry it (postings), so a
//! `nodeSelector` or a node affinity term is a handful of lookups and word-wide set operations.
//! Label strings are interned: thousands of nodes share a few dozen label keys and values, and a
//! node's own name is usually its `kubernetes.io/hostname` label too.
//!
//! Pure and free of node types: `nodes` builds these from what it keeps of each node.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A node's labels, interned and sorted by key.
pub type Labels = Arc<[(Arc<str>, Arc<str>)]>;

/// A set of nodes, by their slot in a pool (`0..len`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSet {
    words: Vec<u64>,
    len: usize,
}

impl NodeSet {
    /// No node of `len`.
    pub fn empty(len: usize) -> Self {
        NodeSet { words: vec![0; len.div_ceil(64)], len }
    }

    /// Every node of `len`.
    pub fn full(len: usize) -> Self {
        NodeSet::empty(len).complement()
    }

    /// These slots of `len` (slots out of range are ignored).
    pub fn of<'s>(len: usize, slots: impl IntoIterator<Item = &'s u32>) -> Self {
        let mut set = NodeSet::empty(len);
        for &slot in slots {
            set.insert(slot);
        }
        set
    }

    /// Adds one slot.
    pub fn insert(&mut self, slot: u32) {
        if (slot as usize) < self.len {
            self.words[slot as usize / 64] |= 1 << (slot % 64);
        }
    }

    /// Whether the set holds this slot.
    pub fn contains(&self, slot: u32) -> bool {
        self.words.get(slot as usize / 64).is_some_and(|word| word & (1 << (slot % 64)) != 0)
    }

    /// The nodes of `len` not in this set.
    pub fn complement(mut self) -> Self {
        for word in &mut self.words {
            *word = !*word;
        }
        // The bits past `len` in the last word stay clear, so counts and comparisons hold.
        let spare = self.words.len() * 64 - self.len;
        if let Some(last) = self.words.last_mut()
            && spare > 0
        {
            *last &= u64::MAX >> spare;
        }
        self
    }

    /// Keeps only the nodes also in `other`.
    pub fn intersect_with(&mut self, other: &NodeSet) {
        self.words.iter_mut().zip(&other.words).for_each(|(word, other)| *word &= other);
    }

    /// Adds the nodes of `other`.
    pub fn union_with(&mut self, other: &NodeSet) {
        self.words.iter_mut().zip(&other.words).for_each(|(word, other)| *word |= other);
    }

    /// Whether a node is in both sets.
    pub fn intersects(&self, other: &NodeSet) -> bool {
        self.words.iter().zip(&other.words).any(|(word, other)| word & other != 0)
    }

    /// How many nodes the set holds.
    pub fn count(&self) -> u32 {
        self.words.iter().map(|word| word.count_ones()).sum()
    }
}

/// Strings, and sets of labels, shared by every node that carries them.
#[derive(Debug, Default)]
pub struct Interner {
    strings: HashSet<Arc<str>>,
    sets: HashSet<Labels>,
}

impl Interner {
    /// The shared copy of `text`.
    pub fn intern(&mut self, text: &str) -> Arc<str> {
        if let Some(known) = self.strings.get(text) {
            return known.clone();
        }
        let fresh: Arc<str> = Arc::from(text);
        self.strings.insert(fresh.clone());
        fresh
    }

    /// The shared copy of these labels (sorted by key): the nodes of one node group in one zone
    /// carry the same labels but their hostname.
    pub fn labels<'l>(&mut self, pairs: impl IntoIterator<Item = (&'l str, &'l str)>) -> Labels {
        let pairs: Vec<(Arc<str>, Arc<str>)> =
            pairs.into_iter().map(|(key, value)| (self.intern(key), self.intern(value))).collect();
        if let Some(known) = self.sets.get(pairs.as_slice()) {
            return known.clone();
        }
        let fresh: Labels = pairs.into();
        self.sets.insert(fresh.clone());
        fresh
    }

    /// Forgets the strings and sets nothing else holds any more (a removed node's name and
    /// hostname): a cluster whose autoscaler replaces nodes all day must not grow the injector.
    pub fn forget_unused(&mut self) {
        self.sets.retain(|set| Arc::strong_count(set) > 1);
        self.strings.retain(|text| Arc::strong_count(text) > 1);
    }

    /// How many distinct strings and label sets are kept.
    pub fn len(&self) -> usize {
        self.strings.len() + self.sets.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.strings.is_empty() && self.sets.is_empty()
    }
}

/// The nodes that carry one label value: their slots when they are few, a set when they are many
/// (a set costs a bit per node of the pool, a slot 32 bits: the smaller of the two is kept, and a
/// set is also the faster one to combine).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Members {
    /// Slots in increasing order.
    Slots(Vec<u32>),
    /// Every member.
    Set(NodeSet),
}

impl NodeSet {
    /// Adds these members.
    pub fn add(&mut self, members: &Members) {
        match members {
            Members::Slots(slots) => slots.iter().for_each(|&slot| self.insert(slot)),
            Members::Set(set) => self.union_with(set),
        }
    }

    /// Keeps only these members.
    pub fn keep(&mut self, members: &Members) {
        match members {
            Members::Set(set) => self.intersect_with(set),
            Members::Slots(_) => {
                let mut only = NodeSet::empty(self.len);
                only.add(members);
                self.intersect_with(&only);
            }
        }
    }
}

/// Per label key, per value, the nodes carrying that label.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LabelIndex {
    keys: HashMap<Arc<str>, HashMap<Arc<str>, Members>>,
}

impl LabelIndex {
    /// Records the labels of the node in `slot` (slots added in increasing order, then [`seal`]).
    ///
    /// [`seal`]: LabelIndex::seal
    pub fn add<'l>(&mut self, slot: u32, labels: impl IntoIterator<Item = (&'l Arc<str>, &'l Arc<str>)>) {
        for (key, value) in labels {
            let members = self.keys.entry(key.clone()).or_default().entry(value.clone());
            if let Members::Slots(slots) = members.or_insert_with(|| Members::Slots(Vec::new())) {
                slots.push(slot);
            }
        }
    }

    /// Once every node of a pool of `len` is added: the values many nodes carry become sets.
    pub fn seal(&mut self, len: usize) {
        for members in self.keys.values_mut().flat_map(HashMap::values_mut) {
            if let Members::Slots(slots) = members {
                if slots.len() * 32 > len {
                    *members = Members::Set(NodeSet::of(len, slots.iter()));
                } else {
                    slots.shrink_to_fit();
                }
            }
        }
    }

    /// The nodes whose label `key` is `value`.
    pub fn with_value(&self, key: &str, value: &str) -> Option<&Members> {
        self.keys.get(key).and_then(|values| values.get(value))
    }

    /// The nodes that have label `key`, whatever its value, in groups of one value each.
    pub fn with_key(&self, key: &str) -> impl Iterator<Item = &Members> {
        self.keys.get(key).into_iter().flat_map(HashMap::values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_of_nodes_behave_as_sets_at_every_word_boundary() {
        for len in [0, 1, 63, 64, 65, 130] {
            let all: Vec<u32> = (0..len as u32).collect();
            assert_eq!(NodeSet::full(len), NodeSet::of(len, &all), "{len}");
            assert_eq!(NodeSet::full(len).count(), len as u32);
            assert_eq!(NodeSet::empty(len).complement(), NodeSet::full(len));
            assert_eq!(NodeSet::full(len).complement().count(), 0);
            let evens: Vec<u32> = all.iter().copied().filter(|s| s % 2 == 0).collect();
            let odds = NodeSet::of(len, &evens).complement();
            assert_eq!(odds.count() as usize, len / 2, "{len}");
            assert!(all.iter().all(|slot| odds.contains(*slot) == (slot % 2 == 1)));
            assert!(!odds.intersects(&NodeSet::of(len, &evens)));
            let mut union = odds.clone();
            union.union_with(&NodeSet::of(len, &evens));
            assert_eq!(union, NodeSet::full(len));
            let mut both = odds.clone();
            both.intersect_with(&NodeSet::full(len));
            assert_eq!(both, odds);
        }
        // A slot past the end is not a member (a pool never gives one; a set stays in bounds).
        assert_eq!(NodeSet::of(3, &[5]).count(), 0);
    }

    #[test]
    fn strings_are_shared_and_forgotten_when_no_node_holds_them() {
        let mut strings = Interner::default();
        let zone = strings.intern("zone-a");
        let again = strings.intern("zone-a");
        assert!(Arc::ptr_eq(&zone, &again));
        let host = strings.intern("node-1");
        drop(host);
        strings.forget_unused();
        assert_eq!(strings.len(), 1, "the zone is still held");
        let group = strings.labels([("zone", "zone-a"), ("pool", "a")]);
        assert!(Arc::ptr_eq(&group, &strings.labels([("zone", "zone-a"), ("pool", "a")])));
        assert_eq!(strings.len(), 5, "zone, zone-a, pool, a, and the set");
        drop((zone, again));
        strings.forget_unused();
        assert_eq!(strings.len(), 5, "the set holds its strings");
        drop(group);
        strings.forget_unused();
        assert!(strings.is_empty());
    }

    #[test]
    fn postings_give_the_nodes_of_a_value_and_of_a_key_few_or_many() {
        let mut strings = Interner::default();
        let mut labels = |pairs: &[(&str, &str)]| strings.labels(pairs.iter().copied());
        let mut index = LabelIndex::default();
        // 100 nodes: pool a on 0 and 2 (few: slots), zone 1 on every even slot (many: a set).
        for slot in 0..100u32 {
            let pool = if slot == 0 || slot == 2 { "a" } else { "b" };
            let zone = if slot % 2 == 0 { "1" } else { "2" };
            index.add(slot, labels(&[("pool", pool), ("zone", zone)]).iter().map(|(k, v)| (k, v)));
        }
        index.seal(100);
        assert_eq!(index.with_value("pool", "a"), Some(&Members::Slots(vec![0, 2])));
        assert!(
            matches!(index.with_value("zone", "1"), Some(Members::Set(set)) if set.count() == 50 && set.contains(98))
        );
        assert_eq!(index.with_value("pool", "c"), None);
        assert_eq!(index.with_value("gpu", "a"), None);
        let mut zoned = NodeSet::empty(100);
        index.with_key("zone").for_each(|members| zoned.add(members));
        assert_eq!(zoned, NodeSet::full(100));
        let mut both = zoned.clone();
        both.keep(index.with_value("pool", "a").unwrap());
        both.keep(index.with_value("zone", "1").unwrap());
        assert_eq!(both, NodeSet::of(100, &[0, 2]));
        assert_eq!(index.with_key("gpu").count(), 0);
    }
}
