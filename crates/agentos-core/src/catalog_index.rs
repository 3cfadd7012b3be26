//! The search index: per catalog, flat arrays that lead a search to its matches without visiting every entry.
//!
//! It is derived from `State::catalogs`: never serialized nor copied with the state, rebuilt by
//! `State::after_load` and kept in step by `State::apply`. Rows are append-only: re-registering or removing an entry kills its row (a tombstone) and
//! a registration appends a new one, so a write costs O(log n) plus the entry's own bytes. When dead rows
//! outnumber live ones the catalog's index is rebuilt, which keeps the amortized cost of a write constant and
//! the index at most about twice the size of its live data.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use memchr::memmem::Finder;

use crate::entry::{BindingKind, StoredEntry};

/// Ends every row of the text buffer. A needle without it cannot match across two rows.
const SEP: u8 = 0;

/// A set of binding kinds, one bit per kind.
pub(crate) type KindSet = u8;
const _: () = assert!(BindingKind::ALL.len() <= KindSet::BITS as usize, "a new binding kind needs a wider KindSet");

pub(crate) fn kind_bit(k: BindingKind) -> KindSet {
    1 << k as u8
}

/// Indexes of every catalog, by model, or none at all: see [`SearchIndex::is_built`].
#[derive(Default)]
pub(crate) struct SearchIndex {
    catalogs: HashMap<String, CatalogIndex>,
    built: bool,
}

/// A copy starts without an index, and searches on it scan (see `search`). The one copy ever made is the
/// snapshot's, which is encoded and dropped; sharing the index with it instead made the next write copy the
/// whole index, and those copies, one per snapshot, cost the master more resident memory than the index itself.
impl Clone for SearchIndex {
    fn clone(&self) -> Self {
        SearchIndex::default()
    }
}

impl SearchIndex {
    /// The index of a state without catalogs.
    pub(crate) fn empty() -> Self {
        SearchIndex { catalogs: HashMap::new(), built: true }
    }

    pub(crate) fn build(catalogs: &HashMap<String, BTreeMap<String, Arc<StoredEntry>>>) -> Self {
        let catalogs = catalogs.iter().map(|(m, c)| (m.clone(), CatalogIndex::build(c.values().cloned()))).collect();
        SearchIndex { catalogs, built: true }
    }

    /// False for a state read from a snapshot before `after_load`, and for a copy; writes then leave it unbuilt.
    pub(crate) fn is_built(&self) -> bool {
        self.built
    }

    pub(crate) fn catalog(&self, model: &str) -> Option<&CatalogIndex> {
        self.catalogs.get(model)
    }

    /// Writes `entry` into `model`'s index, replacing the entry with the same id.
    pub(crate) fn upsert(&mut self, model: &str, entry: Arc<StoredEntry>) {
        if !self.built {
            return;
        }
        match self.catalogs.get_mut(model) {
            Some(c) => c.upsert(entry),
            None => {
                let mut c = CatalogIndex::default();
                c.upsert(entry);
                self.catalogs.insert(model.to_string(), c);
            }
        }
    }

    pub(crate) fn remove(&mut self, model: &str, id: &str) {
        if let Some(c) = self.catalogs.get_mut(model) {
            c.remove(id);
        }
    }
}

impl fmt::Debug for SearchIndex {
    // The index holds every entry again; printing it would bury the state it belongs to.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.built {
            return f.write_str("(not built)");
        }
        let mut m = f.debug_map();
        for (model, c) in &self.catalogs {
            m.entry(model, &format_args!("{} live rows, {} dead", c.by_id.len(), c.dead));
        }
        m.finish()
    }
}

/// A lower-cased search needle, prepared once per search.
pub(crate) struct Needle<'n> {
    finder: Finder<'n>,
    /// The needle contains [`SEP`], so a match in the buffer may span rows and each row is searched alone.
    spans_rows: bool,
}

impl<'n> Needle<'n> {
    pub(crate) fn new(lowercase: &'n str) -> Self {
        let b = lowercase.as_bytes();
        Needle { finder: Finder::new(b), spans_rows: b.contains(&SEP) }
    }
}

/// What one catalog is asked: every condition must hold.
pub(crate) struct Filter<'a> {
    pub kinds: KindSet,
    pub capability: Option<&'a str>,
    pub needle: Option<&'a Needle<'a>>,
}

/// Orders the live entries by id; the key is the entry so that the map holds no copy of the id.
struct ById(Arc<StoredEntry>);

impl Borrow<str> for ById {
    fn borrow(&self) -> &str {
        &self.0.entry.id
    }
}
impl PartialEq for ById {
    fn eq(&self, other: &Self) -> bool {
        self.0.entry.id == other.0.entry.id
    }
}
impl Eq for ById {}
impl PartialOrd for ById {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ById {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.entry.id.cmp(&other.0.entry.id)
    }
}

/// One catalog's index. Row `r` describes one registration; it is dead once its entry was replaced or removed.
pub(crate) struct CatalogIndex {
    /// Live entries by id, to row. Walking its values yields rows in id order without touching the entries.
    by_id: BTreeMap<ById, u32>,
    /// Per row: the entry, `None` once dead.
    entries: Vec<Option<Arc<StoredEntry>>>,
    /// Per row: the kind's bit, 0 once dead, so that one test rejects both dead rows and hidden kinds.
    kinds: Vec<KindSet>,
    /// Every row's lower-cased haystack followed by [`SEP`], so one `memmem` pass searches the whole catalog.
    text: Vec<u8>,
    /// Row `r` is `text[text_starts[r]..text_starts[r + 1] - 1]`.
    text_starts: Vec<usize>,
    /// Every row's id, so that sorting matches reads one contiguous buffer instead of chasing entries.
    ids: Vec<u8>,
    /// Row `r`'s id is `ids[id_starts[r]..id_starts[r + 1]]`.
    id_starts: Vec<usize>,
    /// Capability -> rows that listed it, ascending, dead ones included.
    caps: HashMap<Box<str>, Vec<u32>>,
    /// Live rows per kind, indexed by `BindingKind as usize`.
    kind_counts: [usize; BindingKind::ALL.len()],
    dead: usize,
}

impl Default for CatalogIndex {
    fn default() -> Self {
        CatalogIndex {
            by_id: BTreeMap::new(),
            entries: Vec::new(),
            kinds: Vec::new(),
            text: Vec::new(),
            text_starts: vec![0],
            ids: Vec::new(),
            id_starts: vec![0],
            caps: HashMap::new(),
            kind_counts: [0; BindingKind::ALL.len()],
            dead: 0,
        }
    }
}

impl CatalogIndex {
    fn build(entries: impl ExactSizeIterator<Item = Arc<StoredEntry>> + Clone) -> Self {
        // Sized up front: a catalog loaded at start would otherwise keep up to twice its text in spare capacity.
        let n = entries.len();
        let text_len = entries.clone().map(|e| e.entry.haystack_len() + 1).sum();
        let ids_len = entries.clone().map(|e| e.entry.id.len()).sum();
        let mut c = CatalogIndex::default();
        c.entries.reserve_exact(n);
        c.kinds.reserve_exact(n);
        c.text.reserve_exact(text_len);
        c.text_starts.reserve_exact(n);
        c.ids.reserve_exact(ids_len);
        c.id_starts.reserve_exact(n);
        let rows: Vec<_> = entries.map(|e| (ById(e.clone()), c.push(e))).collect();
        // In bulk: inserting one by one costs a descent per entry, each comparing ids behind pointers.
        c.by_id = rows.into_iter().collect();
        // Lower-casing lengthens some non-ASCII text, and a grown buffer keeps up to half of itself spare.
        c.text.shrink_to_fit();
        c
    }

    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    fn upsert(&mut self, entry: Arc<StoredEntry>) {
        if let Some(row) = self.by_id.remove(&*entry.entry.id) {
            self.kill(row);
        }
        let row = self.push(entry.clone());
        self.by_id.insert(ById(entry), row);
        self.compact_if_sparse();
    }

    fn remove(&mut self, id: &str) {
        if let Some(row) = self.by_id.remove(id) {
            self.kill(row);
            self.compact_if_sparse();
        }
    }

    /// Appends a row for `e` and returns it; the caller enters it in `by_id`.
    fn push(&mut self, e: Arc<StoredEntry>) -> u32 {
        let row = u32::try_from(self.entries.len()).expect("fewer than 2^32 rows per catalog");
        self.text.extend_from_slice(e.entry.haystack().as_bytes());
        self.text.push(SEP);
        self.text_starts.push(self.text.len());
        self.ids.extend_from_slice(e.entry.id.as_bytes());
        self.id_starts.push(self.ids.len());
        let kind = e.entry.binding.kind();
        self.kinds.push(kind_bit(kind));
        self.kind_counts[kind as usize] += 1;
        let caps = &e.entry.capabilities;
        for (i, cap) in caps.iter().enumerate() {
            // A capability listed twice must not make its entry match twice.
            if caps[..i].contains(cap) {
                continue;
            }
            match self.caps.get_mut(&**cap) {
                Some(rows) => rows.push(row),
                None => {
                    self.caps.insert((&**cap).into(), vec![row]);
                }
            }
        }
        self.entries.push(Some(e));
        row
    }

    fn kill(&mut self, row: u32) {
        let r = row as usize;
        if let Some(e) = self.entries[r].take() {
            self.kind_counts[e.entry.binding.kind() as usize] -= 1;
            self.kinds[r] = 0;
            self.dead += 1;
        }
    }

    fn compact_if_sparse(&mut self) {
        if self.dead > self.by_id.len() {
            let live: Vec<_> = self.by_id.keys().map(|k| k.0.clone()).collect();
            *self = CatalogIndex::build(live.into_iter());
        }
    }

    fn text_of(&self, row: usize) -> &[u8] {
        &self.text[self.text_starts[row]..self.text_starts[row + 1] - 1]
    }

    fn id_of(&self, row: u32) -> &[u8] {
        let r = row as usize;
        &self.ids[self.id_starts[r]..self.id_starts[r + 1]]
    }

    /// The number of live entries `filter` accepts, and the first `want` of them in id order.
    pub(crate) fn first(&self, filter: &Filter<'_>, want: usize) -> (usize, Vec<&Arc<StoredEntry>>) {
        let mask = filter.kinds;
        let possible: usize =
            BindingKind::ALL.iter().filter(|k| kind_bit(**k) & mask != 0).map(|k| self.kind_counts[*k as usize]).sum();
        if possible == 0 {
            return (0, Vec::new());
        }
        let matches: Vec<u32> = match (filter.capability, filter.needle) {
            (None, None) => {
                // Counting needs no visit, and the first rows in id order are the first page.
                let all = possible == self.by_id.len();
                let rows = self.by_id.values().filter(|r| all || self.kinds[**r as usize] & mask != 0);
                return (possible, rows.take(want).map(|r| self.entry(*r)).collect());
            }
            (Some(cap), needle) => match self.caps.get(cap) {
                None => return (0, Vec::new()),
                Some(rows) => rows
                    .iter()
                    .copied()
                    .filter(|r| {
                        let r = *r as usize;
                        self.kinds[r] & mask != 0 && needle.is_none_or(|n| n.finder.find(self.text_of(r)).is_some())
                    })
                    .collect(),
            },
            (None, Some(needle)) => self.scan(needle, mask),
        };
        let total = matches.len();
        let rows = self.first_by_id(matches, want);
        (total, rows.into_iter().map(|r| self.entry(r)).collect())
    }

    fn entry(&self, row: u32) -> &Arc<StoredEntry> {
        self.entries[row as usize].as_ref().expect("only live rows are returned")
    }

    /// The rows in `mask` whose text contains the needle, ascending.
    fn scan(&self, needle: &Needle<'_>, mask: KindSet) -> Vec<u32> {
        let rows = self.entries.len();
        if needle.spans_rows {
            return (0..rows)
                .filter(|r| self.kinds[*r] & mask != 0 && needle.finder.find(self.text_of(*r)).is_some())
                .map(|r| r as u32)
                .collect();
        }
        let mut out = Vec::new();
        let (mut pos, mut row) = (0, 0);
        // The bound matters only for an empty needle, which matches even past the last row.
        while pos < self.text.len()
            && let Some(i) = needle.finder.find(&self.text[pos..])
        {
            row = self.row_at(row, pos + i);
            if self.kinds[row] & mask != 0 {
                out.push(row as u32);
            }
            // One match is enough for a row: go on at the next one.
            pos = self.text_starts[row + 1];
        }
        out
    }

    /// The row whose text holds byte `at`, searching forward from row `from` (which starts at or before `at`).
    /// Galloping keeps this cheap both when matches are dense (a step or two) and when they are far apart.
    fn row_at(&self, from: usize, at: usize) -> usize {
        let starts = &self.text_starts;
        let (mut lo, mut step) = (from, 1);
        let mut hi = lo + 1;
        while hi < starts.len() && starts[hi] <= at {
            lo = hi;
            hi = lo + step;
            step *= 2;
        }
        let hi = hi.min(starts.len());
        lo + starts[lo..hi].partition_point(|s| *s <= at) - 1
    }

    /// The first `want` of `matches` in id order.
    fn first_by_id(&self, mut matches: Vec<u32>, want: usize) -> Vec<u32> {
        let n = matches.len();
        let k = want.min(n);
        if k == 0 {
            return Vec::new();
        }
        // Two ways, costed in id comparisons: select and sort the matches, or walk the rows in id order until `k`
        // matches have passed. A step of the walk costs about a fifth of a comparison, and the walk finds `k`
        // matches after about `k * live / n` steps (never more than `live`), so it wins once matches are dense,
        // and always when a deep offset asks for all of them.
        let live = self.by_id.len();
        let select = if k < n { 3 * n } else { 0 };
        let sort = select + k * (usize::BITS - k.leading_zeros()) as usize;
        let walk = if k < n { (k as u128 * live as u128 / n as u128) as usize } else { live } / 5;
        if walk < sort {
            let mut hit = vec![0u64; self.entries.len().div_ceil(64)];
            for r in &matches {
                hit[*r as usize / 64] |= 1 << (r % 64);
            }
            return self
                .by_id
                .values()
                .copied()
                .filter(|r| hit[*r as usize / 64] & (1 << (r % 64)) != 0)
                .take(k)
                .collect();
        }
        let by_id = |a: &u32, b: &u32| self.id_of(*a).cmp(self.id_of(*b));
        if k < n {
            matches.select_nth_unstable_by(k - 1, by_id);
            matches.truncate(k);
        }
        matches.sort_unstable_by(by_id);
        matches
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{Binding, CatalogEntry, Contract, Runtime, ScriptBinding, Status};

    fn stored(id: &str, description: &str) -> Arc<StoredEntry> {
        let entry = CatalogEntry {
            id: id.into(),
            name: id.to_uppercase(),
            version: "1".into(),
            description: description.into(),
            capabilities: vec!["c".into()],
            status: Status::Registered,
            contract: Contract { kind: "script-io".into(), operations: BTreeMap::new() },
            binding: Binding::Script(ScriptBinding {
                runtime: Runtime::Sh,
                script_urn: String::new(),
                sha256: String::new(),
                filename: "x.sh".into(),
                size_bytes: 0,
                env: Vec::new(),
            }),
        };
        Arc::new(StoredEntry::new(entry, "default".into(), 1, 0, 0, "t".into()))
    }

    #[test]
    fn row_at_agrees_with_a_binary_search_from_any_earlier_row() {
        let c = CatalogIndex::build(
            (0..70).map(|i| stored(&format!("t{i}"), &"x".repeat(i % 5))).collect::<Vec<_>>().into_iter(),
        );
        for at in 0..c.text.len() {
            let want = c.text_starts.partition_point(|s| *s <= at) - 1;
            for from in 0..=want {
                assert_eq!(c.row_at(from, at), want, "byte {at} from row {from}");
            }
        }
    }

    #[test]
    fn rewrites_keep_the_index_at_most_about_twice_its_live_size() {
        let mut c = CatalogIndex::default();
        for i in 0..1000 {
            c.upsert(stored(&format!("t{}", i % 10), &format!("revision {i}")));
            if i % 7 == 0 {
                c.remove(&format!("t{}", (i + 3) % 10));
            }
            assert!(c.dead <= c.len(), "{} dead rows for {} live", c.dead, c.len());
            assert_eq!(c.entries.len(), c.len() + c.dead);
        }
    }
}
