//! Catalog search: local entries first, then global ones, with shadowing marked.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::DEFAULT_MODEL;
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

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchPage {
    pub items: Vec<EntryView>,
    /// Number of matching entries in all pages.
    pub total: usize,
    pub limit: usize,
    pub offset: usize,
}

struct Filter<'q> {
    kind: Option<BindingKind>,
    capability: Option<&'q str>,
    finder: Option<memchr::memmem::Finder<'q>>,
    visible: Flags,
}

impl Filter<'_> {
    fn matches(&self, e: &StoredEntry) -> bool {
        let kind = e.entry.binding.kind();
        kind.visible_to(self.visible)
            && self.kind.is_none_or(|k| k == kind)
            && self.capability.is_none_or(|c| e.entry.capabilities.iter().any(|x| x == c))
            && self.finder.as_ref().is_none_or(|f| f.find(e.haystack.as_bytes()).is_some())
    }
}

/// Runs `query` against `state`, showing only the binding kinds `visible` reveals.
/// Entries come ordered by id; where a local and a global entry share an id the local one comes first.
pub fn search(state: &State, query: &SearchQuery, visible: Flags) -> SearchPage {
    let needle = query.q.as_deref().map(str::to_lowercase).filter(|q| !q.is_empty());
    let filter = Filter {
        kind: query.kind,
        capability: query.capability.as_deref(),
        finder: needle.as_deref().map(|n| memchr::memmem::Finder::new(n.as_bytes())),
        visible,
    };
    let limit = query.limit.clamp(1, MAX_LIMIT);
    let empty = BTreeMap::new();
    let local: &BTreeMap<String, Arc<StoredEntry>> = match query.model.as_deref() {
        Some(m) if m != DEFAULT_MODEL => state.catalog(m).unwrap_or(&empty),
        _ => &empty,
    };
    let global = state.catalog(DEFAULT_MODEL).unwrap_or(&empty);

    let mut total = 0usize;
    let mut items = Vec::new();
    let mut take = |e: &StoredEntry, scope: Scope, shadowed: bool| {
        if filter.matches(e) {
            if total >= query.offset && items.len() < limit {
                items.push(e.view(scope, shadowed));
            }
            total += 1;
        }
    };
    let mut l = local.iter().peekable();
    let mut g = global.iter().peekable();
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
                    take(ge, Scope::Global, true);
                    l.next();
                    g.next();
                }
            },
        }
    }
    SearchPage { items, total, limit, offset: query.offset }
}
