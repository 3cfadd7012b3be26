//! Catalog search: local entries first, then global ones, with shadowing marked.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde::Serialize;
use std::sync::Arc;

use crate::DEFAULT_MODEL;
use crate::catalog_index::{Filter, Needle, kind_bit};
use crate::entry::{BindingKind, EntryView, Scope, StoredEntry};
use crate::flags::Flags;
use crate::state::State;

pub const DEFAULT_LIMIT: usize = 50;
pub const MAX_LIMIT: usize = 1000;

#[derive(Debug, Clone, Default)]
pub struct SearchQuery {
    /// The model whose local catalog is searched before the global one.
    pub model: Option<String>,
    pub kind: Option<BindingKind>,
    pub capability: Option<String>,
    /// Free text, matched case-insensitively against id, name, description and capabilities.
    pub q: Option<String>,
    pub limit: usize,
    pub offset: usize,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SearchPage {
    pub items: Vec<EntryView>,
    /// Number of matching entries in all pages.
    pub total: usize,
    pub limit: usize,
    pub offset: usize,
}

/// Runs `query` against `state`, showing only the binding kinds `visible` reveals.
/// Entries come ordered by id; where a local and a global entry share an id the local one comes first.
/// A page holds `query.limit` entries at most, whatever it is: a caller's page is bounded by
/// `MAX_LIMIT` where the caller's query is taken, and a walk over every entry asks for all.
pub fn search(state: &State, query: &SearchQuery, visible: Flags) -> SearchPage {
    let index = state.search_index();
    if !index.is_built() {
        return scan(state, query, visible);
    }
    let lowercase = query.q.as_deref().map(str::to_lowercase).filter(|q| !q.is_empty());
    let needle = lowercase.as_deref().map(Needle::new);
    let kinds = BindingKind::ALL
        .into_iter()
        .filter(|k| k.visible_to(visible) && query.kind.is_none_or(|q| q == *k))
        .fold(0, |set, k| set | kind_bit(k));
    let filter = Filter { kinds, capability: query.capability.as_deref(), needle: needle.as_ref() };
    let limit = query.limit.max(1);
    // The page's items are among the first `offset + limit` of each catalog, whatever the merge takes from each.
    let want = query.offset.saturating_add(limit);

    let local_model = query.model.as_deref().filter(|m| *m != DEFAULT_MODEL);
    let first = |model: &str| {
        let c = index.catalog(model);
        debug_assert_eq!(
            c.map_or(0, |c| c.len()),
            state.catalog(model).map_or(0, |c| c.len()),
            "search index of {model} out of step with its catalog"
        );
        c.map_or((0, Vec::new()), |c| c.first(&filter, want))
    };
    let (local_total, local) = local_model.map_or((0, Vec::new()), first);
    let (global_total, global) = first(DEFAULT_MODEL);
    // A global entry is shadowed by the existence of the local id, whether or not the local entry matched,
    // but only when the caller may see the local entry: otherwise `shadowed` would reveal it.
    let shadows = |id: &str| {
        local_model
            .and_then(|m| state.catalog(m))
            .and_then(|c| c.get(id))
            .is_some_and(|e| e.entry.binding.kind().visible_to(visible))
    };

    let mut items = Vec::with_capacity(limit.min(local.len() + global.len()));
    let (mut l, mut g) = (local.into_iter().peekable(), global.into_iter().peekable());
    for position in 0..want {
        let local_next = match (l.peek(), g.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(le), Some(ge)) => le.entry.id <= ge.entry.id,
        };
        let (e, scope) = if local_next { (l.next(), Scope::Local) } else { (g.next(), Scope::Global) };
        let e = e.expect("peeked");
        if position >= query.offset {
            items.push(e.view(scope, scope == Scope::Global && shadows(&e.entry.id)));
        }
    }
    SearchPage { items, total: local_total + global_total, limit, offset: query.offset }
}

/// The search without an index: a filter over every entry. It defines what the indexed search answers, and serves
/// a state whose index is not built.
fn scan(state: &State, query: &SearchQuery, visible: Flags) -> SearchPage {
    let needle = query.q.as_deref().map(str::to_lowercase).filter(|q| !q.is_empty());
    let finder = needle.as_deref().map(|n| memchr::memmem::Finder::new(n.as_bytes()));
    let matches = |e: &StoredEntry| {
        let kind = e.entry.binding.kind();
        kind.visible_to(visible)
            && query.kind.is_none_or(|k| k == kind)
            && query.capability.as_deref().is_none_or(|c| e.entry.capabilities.iter().any(|x| **x == *c))
            && finder.as_ref().is_none_or(|f| f.find(e.entry.haystack().as_bytes()).is_some())
    };
    let limit = query.limit.max(1);
    let empty = BTreeMap::new();
    let local = match query.model.as_deref() {
        Some(m) if m != DEFAULT_MODEL => state.catalog(m).unwrap_or(&empty),
        _ => &empty,
    };
    let global = state.catalog(DEFAULT_MODEL).unwrap_or(&empty);
    let (mut total, mut items) = (0, Vec::new());
    let mut take = |e: &Arc<StoredEntry>, scope: Scope, shadowed: bool| {
        if matches(e) {
            if total >= query.offset && items.len() < limit {
                items.push(e.view(scope, shadowed));
            }
            total += 1;
        }
    };
    let (mut l, mut g) = (local.iter().peekable(), global.iter().peekable());
    loop {
        match (l.peek(), g.peek()) {
            (None, None) => break,
            (Some((_, le)), None) => {
                take(le, Scope::Local, false);
                l.next();
            }
            (None, Some((_, ge))) => {
                take(ge, Scope::Global, false);
                g.next();
            }
            (Some((lid, le)), Some((gid, ge))) => match lid.cmp(gid) {
                Ordering::Less => {
                    take(le, Scope::Local, false);
                    l.next();
                }
                Ordering::Greater => {
                    take(ge, Scope::Global, false);
                    g.next();
                }
                Ordering::Equal => {
                    take(le, Scope::Local, false);
                    take(ge, Scope::Global, le.entry.binding.kind().visible_to(visible));
                    l.next();
                    g.next();
                }
            },
        }
    }
    SearchPage { items, total, limit, offset: query.offset }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::{Binding, CatalogEntry, Contract, Runtime, ScriptBinding, Status, ToolnetBinding};
    use crate::event::{Event, EventBody};
    use crate::flags::Flag;

    fn check(state: &State, query: &SearchQuery, visible: Flags, context: &str) {
        assert!(state.search_index().is_built(), "{context}: the index would not be used");
        let got = serde_json::to_value(search(state, query, visible)).unwrap();
        let want = serde_json::to_value(scan(state, query, visible)).unwrap();
        assert!(got == want, "{context}: {query:?} visible {visible}\n got: {got}\nwant: {want}");
    }

    /// splitmix64: a fixed seed gives the same catalogs and queries on every run.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn pick<T: Clone>(&mut self, from: &[T]) -> T {
            from[self.below(from.len())].clone()
        }
    }

    const MODELS: [&str; 4] = [DEFAULT_MODEL, "team-0", "team-1", "team-2"];
    const CAPS: [&str; 6] = ["cap-1", "cap-2", "cap-10", "ledger", "group.a", "x_y"];
    /// Mixed case, non-ASCII case pairs, and the bytes that separate fields ('\n') and rows ('\0') in the index.
    const WORDS: [&str; 14] = [
        "Ledger",
        "LEDGER",
        "weather",
        "forum",
        "Ärger",
        "İstanbul",
        "straße",
        "tool",
        "cap",
        "line\nbreak",
        "nul\0byte",
        "tab\there",
        "-",
        "records",
    ];
    const NEEDLES: [&str; 22] = [
        "",
        "ledger",
        "LEDGER",
        "Ledg",
        "tool-1",
        "tool-",
        "t",
        "e",
        "\n",
        "r\nt",
        "\0",
        "l\0b",
        "ärg",
        "ÄRGER",
        "i̇",
        "STRASSE",
        "straße",
        "cap-1",
        "group.a",
        "records\ncap",
        "zzz",
        "1",
    ];

    fn entry(rng: &mut Rng, id: &str) -> CatalogEntry {
        let words = |rng: &mut Rng, n: usize| (0..n).map(|_| rng.pick(&WORDS)).collect::<Vec<_>>().join(" ");
        let name = format!("{} {}", words(rng, 1), rng.below(50));
        let n = rng.below(4);
        let description = words(rng, n);
        // Up to three, duplicates included, so a capability listed twice is covered.
        let capabilities = (0..rng.below(4)).map(|_| rng.pick(&CAPS).to_string()).collect();
        CatalogEntry {
            id: id.to_string(),
            name,
            version: "1".into(),
            description,
            capabilities,
            status: Status::Registered,
            contract: Contract { kind: "script-io".into(), operations: BTreeMap::new() },
            // Re-registrations may change the kind too: the fold allows it even where commands refuse it.
            binding: if rng.below(4) == 0 {
                Binding::Toolnet(ToolnetBinding {
                    net_urn: "urn:agentos:blob:nets/0.yaml".into(),
                    sha256: "0".into(),
                    size_bytes: 1,
                    input_place: "in".into(),
                    output_place: "out".into(),
                })
            } else {
                Binding::Script(ScriptBinding {
                    runtime: Runtime::Sh,
                    script_urn: "urn:agentos:blob:tool-catalog/scripts/0.sh".into(),
                    sha256: "0".into(),
                    filename: "run.sh".into(),
                    size_bytes: 1,
                    env: Vec::new(),
                })
            },
        }
    }

    fn apply(state: &mut State, model: &str, body: EventBody) {
        let seq = state.last_seq + 1;
        state.apply(&Event {
            seq,
            model: model.to_string(),
            body,
            principal: "tester".into(),
            time: seq as i64 * 1000,
            schema: 1,
        });
    }

    /// Registrations (new ids and changed re-registrations) and removals, spread over several models.
    fn mutate(state: &mut State, rng: &mut Rng, ids: usize, remove_percent: usize) {
        let model = rng.pick(&MODELS);
        let id = format!("tool-{}", rng.below(ids));
        if rng.below(100) < remove_percent {
            apply(state, model, EventBody::ToolRemoved { id });
        } else {
            let entry = entry(rng, &id);
            apply(state, model, EventBody::ToolRegistered { entry, owner: None });
        }
    }

    fn random_query(state: &State, rng: &mut Rng) -> (SearchQuery, Flags) {
        let mut needles: Vec<String> = NEEDLES.iter().map(|n| n.to_string()).collect();
        // An id that exists, so one-match needles are covered too.
        if let Some(c) = state.catalog(rng.pick(&MODELS))
            && !c.is_empty()
        {
            needles.push(c.keys().nth(rng.below(c.len())).unwrap().clone());
        }
        let query = SearchQuery {
            model: rng
                .pick(&[None, Some(DEFAULT_MODEL), Some("team-0"), Some("team-1"), Some("team-2"), Some("nobody")])
                .map(str::to_string),
            kind: rng.pick(&[
                None,
                None,
                Some(BindingKind::Script),
                Some(BindingKind::Toolnet),
                Some(BindingKind::Http),
            ]),
            capability: rng
                .pick(&[None, None, None, Some("cap-1"), Some("ledger"), Some("x_y"), Some("missing")])
                .map(str::to_string),
            q: if rng.below(3) == 0 { None } else { Some(rng.pick(&needles)) },
            limit: rng.pick(&[0, 1, 2, 3, 7, 50, 5000]),
            offset: rng.pick(&[0, 0, 0, 1, 2, 5, 30, 200, usize::MAX]),
        };
        let all_but_scripts = Flag::ALL.into_iter().filter(|f| *f != Flag::Scripts).fold(Flags::empty(), Flags::with);
        let visible = rng.pick(&[
            Flags::all(),
            Flags::all(),
            Flags::empty(),
            Flags::empty().with(Flag::Scripts),
            Flags::empty().with(Flag::ToolNets),
            all_but_scripts,
        ]);
        (query, visible)
    }

    fn check_many(state: &State, rng: &mut Rng, n: usize, context: &str) {
        for _ in 0..n {
            let (query, visible) = random_query(state, rng);
            check(state, &query, visible, context);
        }
    }

    #[test]
    fn indexed_search_answers_as_the_full_scan() {
        struct Case {
            seed: u64,
            /// Size of the id space: a small one re-registers and removes the same ids often, forcing compactions.
            ids: usize,
            ops: usize,
            remove_percent: usize,
        }
        let cases = [
            Case { seed: 1, ids: 3, ops: 200, remove_percent: 30 },
            Case { seed: 2, ids: 40, ops: 400, remove_percent: 10 },
            Case { seed: 3, ids: 400, ops: 1500, remove_percent: 5 },
            Case { seed: 4, ids: 150, ops: 1500, remove_percent: 45 },
            Case { seed: 5, ids: 2000, ops: 2500, remove_percent: 0 },
        ];
        for case in cases {
            let mut rng = Rng(case.seed);
            let mut state = State::new();
            let mut copy = None;
            for op in 0..case.ops {
                mutate(&mut state, &mut rng, case.ids, case.remove_percent);
                if op % 50 == 49 {
                    check_many(&state, &mut rng, 40, &format!("seed {} after {} events", case.seed, op + 1));
                }
                if op == case.ops / 2 {
                    // A copy, as for a snapshot, carries no index: it must answer as the original did when taken,
                    // whatever is written to the original afterwards.
                    let queries: Vec<_> = (0..100).map(|_| random_query(&state, &mut rng)).collect();
                    let pages: Vec<_> =
                        queries.iter().map(|(q, v)| serde_json::to_value(search(&state, q, *v)).unwrap()).collect();
                    copy = Some((state.clone(), queries, pages));
                }
            }
            let (copy, queries, pages) = copy.unwrap();
            assert!(!copy.search_index().is_built());
            for ((query, visible), page) in queries.iter().zip(pages) {
                assert_eq!(serde_json::to_value(search(&copy, query, *visible)).unwrap(), page, "copy: {query:?}");
            }
            check_many(&state, &mut rng, 300, &format!("seed {}: end", case.seed));

            let json = serde_json::to_string(&state).unwrap();
            let mut loaded: State = serde_json::from_str(&json).unwrap();
            loaded.after_load();
            // The index is not part of the snapshot (it has no `Serialize`), so loading and indexing adds nothing.
            assert_eq!(
                serde_json::to_value(&loaded).unwrap(),
                serde_json::from_str::<serde_json::Value>(&json).unwrap()
            );
            check_many(&loaded, &mut rng, 300, &format!("seed {}: after a serde round trip", case.seed));
            for _ in 0..200 {
                mutate(&mut loaded, &mut rng, case.ids, case.remove_percent);
            }
            check_many(&loaded, &mut rng, 300, &format!("seed {}: writes after the round trip", case.seed));
        }
    }

    #[test]
    fn a_local_entry_the_caller_may_not_see_shadows_nothing_it_shows() {
        let mut state = State::new();
        let mut rng = Rng(3);
        // A global script `dup`, and a local tool net `dup` in model m.
        let mut global = entry(&mut rng, "dup");
        global.binding = Binding::Script(ScriptBinding {
            runtime: Runtime::Sh,
            script_urn: "urn:agentos:blob:tool-catalog/scripts/0.sh".into(),
            sha256: "0".into(),
            filename: "run.sh".into(),
            size_bytes: 1,
            env: Vec::new(),
        });
        let mut local = entry(&mut rng, "dup");
        local.binding = Binding::Toolnet(ToolnetBinding {
            net_urn: "urn:agentos:blob:nets/0.yaml".into(),
            sha256: "0".into(),
            size_bytes: 1,
            input_place: "in".into(),
            output_place: "out".into(),
        });
        let (gk, lk) = (global.binding.kind(), local.binding.kind());
        assert_ne!(gk, lk);
        apply(&mut state, DEFAULT_MODEL, EventBody::ToolRegistered { entry: global, owner: None });
        apply(&mut state, "m", EventBody::ToolRegistered { entry: local, owner: None });
        let query = SearchQuery { model: Some("m".into()), limit: 10, ..Default::default() };
        let only_global = Flags::empty().with(gk.revealing_flags()[0]);
        for st in [&state, &{
            let mut s = state.clone();
            s.after_load();
            s
        }] {
            let page = search(st, &query, only_global);
            let got: Vec<_> = page.items.iter().map(|i| (i.entry().id.to_string(), i.scope, i.shadowed)).collect();
            assert_eq!(got, [("dup".to_string(), Scope::Global, false)], "a hidden local entry showed through");
            let page = scan(st, &query, only_global);
            assert!(page.items.iter().all(|i| !i.shadowed));
            let page = search(st, &query, Flags::all());
            assert!(page.items.iter().any(|i| i.scope == Scope::Global && i.shadowed));
        }
    }

    #[test]
    fn local_shadows_global_whatever_the_filters() {
        let mut state = State::new();
        let mut rng = Rng(9);
        for (model, id) in [(DEFAULT_MODEL, "a"), (DEFAULT_MODEL, "b"), ("m", "b"), ("m", "c")] {
            let mut e = entry(&mut rng, id);
            e.description = if model == DEFAULT_MODEL { "global".into() } else { "local".into() };
            apply(&mut state, model, EventBody::ToolRegistered { entry: e, owner: None });
        }
        let query =
            |q: &str| SearchQuery { model: Some("m".into()), q: Some(q.into()), limit: 10, ..Default::default() };
        let ids = |page: SearchPage| {
            page.items.iter().map(|i| (i.entry().id.to_string(), i.scope, i.shadowed)).collect::<Vec<_>>()
        };
        let page = search(&state, &query("global"), Flags::all());
        assert_eq!(ids(page), [("a".into(), Scope::Global, false), ("b".into(), Scope::Global, true)]);
        let page = search(&state, &query(""), Flags::all());
        assert_eq!(page.total, 4);
        assert_eq!(
            ids(page),
            [
                ("a".into(), Scope::Global, false),
                ("b".into(), Scope::Local, false),
                ("b".into(), Scope::Global, true),
                ("c".into(), Scope::Local, false)
            ]
        );
        for q in ["global", "local", "", "b"] {
            check(&state, &query(q), Flags::all(), "fixed");
        }
    }
}
