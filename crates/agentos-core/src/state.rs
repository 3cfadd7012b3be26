//! The state of the platform as the fold of the event log: models, catalogs, principals.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::catalog_index::SearchIndex;
use crate::entry::{Interner, Scope, StoredEntry};
use crate::event::{Event, EventBody, PrincipalRecord, SecretGrant};
use crate::{CATALOG_PLACE, DEFAULT_MODEL};

/// Bumped whenever the snapshot form of [`State`] changes; a snapshot of another version is ignored and the log replayed.
pub const STATE_SCHEMA_VERSION: u32 = 2;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelInfo {
    pub name: String,
    pub created_at: i64,
    pub created_by: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    /// The sequence number of the last event folded in.
    pub last_seq: u64,
    pub models: BTreeMap<String, ModelInfo>,
    /// model -> tool id -> entry. Entries are shared so that a snapshot copy is cheap.
    /// Changed only by [`State::apply`]: the search index follows it there.
    pub catalogs: HashMap<String, BTreeMap<String, Arc<StoredEntry>>>,
    pub principals: BTreeMap<String, Arc<PrincipalRecord>>,
    /// token sha256 -> principal name. Derived.
    #[serde(skip)]
    token_index: HashMap<String, String>,
    /// principal id -> principal name. Derived.
    #[serde(skip)]
    id_index: HashMap<String, String>,
    /// principal id -> the models the operator granted it besides its home model.
    #[serde(default)]
    pub model_grants: BTreeMap<String, std::collections::BTreeSet<String>>,
    /// Secret grants by id.
    #[serde(default)]
    pub secret_grants: BTreeMap<String, SecretGrant>,
    /// Secrets by name, as ciphertext, with when each was set.
    #[serde(default)]
    pub secrets: BTreeMap<String, (crate::event::SecretRecord, i64)>,
    /// Every model's net: places, tokens, transitions, fires in flight.
    #[serde(default)]
    pub nets: crate::net_state::NetState,
    /// The catalogs indexed for search. Derived, so snapshots do not carry it.
    #[serde(skip)]
    search_index: SearchIndex,
    /// Text the catalog entries share (models, principals, versions, capabilities, contracts). Derived.
    #[serde(skip)]
    strings: Interner,
}

impl Default for State {
    fn default() -> Self {
        Self::new()
    }
}

impl State {
    /// The state before any event: only the `default` model.
    pub fn new() -> Self {
        let mut models = BTreeMap::new();
        models.insert(
            DEFAULT_MODEL.to_string(),
            ModelInfo { name: DEFAULT_MODEL.to_string(), created_at: 0, created_by: "system".into() },
        );
        State {
            last_seq: 0,
            models,
            catalogs: HashMap::new(),
            principals: BTreeMap::new(),
            token_index: HashMap::new(),
            id_index: HashMap::new(),
            model_grants: BTreeMap::new(),
            secret_grants: BTreeMap::new(),
            search_index: SearchIndex::empty(),
            strings: Interner::default(),
            nets: Default::default(),
            secrets: BTreeMap::new(),
        }
    }

    /// Rebuilds what a snapshot does not carry.
    pub fn after_load(&mut self) {
        // Entries read from a snapshot are not shared yet, so this copies none of them.
        for catalog in self.catalogs.values_mut() {
            for entry in catalog.values_mut() {
                Arc::make_mut(entry).intern(&mut self.strings);
            }
        }
        self.search_index = SearchIndex::build(&self.catalogs);
        self.token_index = self.principals.values().map(|p| (p.token_sha256.clone(), p.name.clone())).collect();
        self.id_index = self.principals.values().map(|p| (p.id.clone(), p.name.clone())).collect();
        self.models.entry(DEFAULT_MODEL.to_string()).or_insert_with(|| ModelInfo {
            name: DEFAULT_MODEL.to_string(),
            created_at: 0,
            created_by: "system".into(),
        });
    }

    /// Folds one event in. Events at or below `last_seq` were already folded and are skipped,
    /// which makes replaying a log over a snapshot safe.
    pub fn apply(&mut self, ev: &Event) {
        if ev.seq <= self.last_seq {
            return;
        }
        self.last_seq = ev.seq;
        match &ev.body {
            EventBody::ModelCreated { name } => {
                self.models.entry(name.clone()).or_insert_with(|| ModelInfo {
                    name: name.clone(),
                    created_at: ev.time,
                    created_by: ev.principal.clone(),
                });
            }
            EventBody::ToolRegistered { entry, owner } => {
                self.models.entry(ev.model.clone()).or_insert_with(|| ModelInfo {
                    name: ev.model.clone(),
                    created_at: ev.time,
                    created_by: ev.principal.clone(),
                });
                let catalog = self.catalogs.entry(ev.model.clone()).or_default();
                let created_at = catalog.get(&entry.id).map(|e| e.created_at).unwrap_or(ev.time);
                let stored = Arc::new(StoredEntry::interned(
                    &mut self.strings,
                    entry.clone(),
                    &ev.model,
                    ev.seq,
                    created_at,
                    ev.time,
                    &ev.principal,
                    owner.as_deref(),
                ));
                catalog.insert(entry.id.clone(), stored.clone());
                self.search_index.upsert(&ev.model, stored);
            }
            EventBody::ToolRemoved { id } => {
                if let Some(catalog) = self.catalogs.get_mut(&ev.model)
                    && catalog.remove(id).is_some()
                {
                    self.search_index.remove(&ev.model, id);
                }
            }
            EventBody::PrincipalCreated(p) => {
                if let Some(old) = self.principals.get(&p.name) {
                    self.token_index.remove(&old.token_sha256);
                    self.id_index.remove(&old.id);
                }
                let mut p = p.clone();
                if p.id.is_empty() {
                    p.id = p.legacy_id();
                }
                self.token_index.insert(p.token_sha256.clone(), p.name.clone());
                self.id_index.insert(p.id.clone(), p.name.clone());
                self.principals.insert(p.name.clone(), Arc::new(p));
            }
            EventBody::Net(ne) => {
                // A finished tool-net instance leaves no model behind (its events stay in the log).
                if matches!(ne, crate::net_state::NetEvent::Deleted)
                    && self.nets.models.get(&ev.model).is_some_and(|n| n.instance.is_some())
                {
                    self.models.remove(&ev.model);
                }
                let by = self.principals.get(&ev.principal).map(|p| p.id.clone());
                self.nets.apply(&ev.model, ev.seq, ev.time, by.as_deref(), ne)
            }
            EventBody::PrincipalRevoked { name } => {
                if let Some(old) = self.principals.remove(name) {
                    self.token_index.remove(&old.token_sha256);
                    self.id_index.remove(&old.id);
                    self.model_grants.remove(&old.id);
                }
            }
            EventBody::ModelGranted(g) => {
                self.model_grants.entry(g.principal.clone()).or_default().insert(g.model.clone());
            }
            EventBody::ModelGrantRevoked(g) => {
                if let Some(models) = self.model_grants.get_mut(&g.principal) {
                    models.remove(&g.model);
                    if models.is_empty() {
                        self.model_grants.remove(&g.principal);
                    }
                }
            }
            EventBody::SecretGranted(g) => {
                self.secret_grants.insert(g.id.clone(), g.clone());
            }
            EventBody::SecretGrantRevoked { id } => {
                self.secret_grants.remove(id);
            }
            EventBody::SecretSet(s) => {
                self.secrets.insert(s.name.clone(), (s.clone(), ev.time));
            }
            // A job's result is history, read from the log; it changes no state.
            EventBody::JobFinished { .. } => {}
            // The skipped event itself is left out by the reader of the log; the record changes nothing.
            EventBody::EventSkipped { .. } => {}
        }
    }

    pub fn model_exists(&self, model: &str) -> bool {
        self.models.contains_key(model)
    }

    pub fn catalog(&self, model: &str) -> Option<&BTreeMap<String, Arc<StoredEntry>>> {
        self.catalogs.get(model)
    }

    pub(crate) fn search_index(&self) -> &SearchIndex {
        &self.search_index
    }

    /// Looks `id` up local first: in `model`'s own catalog, then in the global one.
    pub fn resolve(&self, model: &str, id: &str) -> Option<(&Arc<StoredEntry>, Scope)> {
        if model != DEFAULT_MODEL
            && let Some(e) = self.catalogs.get(model).and_then(|c| c.get(id))
        {
            return Some((e, Scope::Local));
        }
        self.catalogs.get(DEFAULT_MODEL).and_then(|c| c.get(id)).map(|e| (e, Scope::Global))
    }

    /// A principal by its id; `None` once it is revoked.
    pub fn principal_by_id(&self, id: &str) -> Option<&Arc<PrincipalRecord>> {
        self.id_index.get(id).and_then(|name| self.principals.get(name))
    }

    /// Whether the operator granted principal `id` the model `model`.
    pub fn has_model_grant(&self, id: &str, model: &str) -> bool {
        self.model_grants.get(id).is_some_and(|m| m.contains(model))
    }

    pub fn principal_by_token_sha256(&self, sha: &str) -> Option<&Arc<PrincipalRecord>> {
        self.token_index.get(sha).and_then(|name| self.principals.get(name))
    }

    /// Up to `limit` of [`State::catalog_tokens`] after the first `offset`, and how many there
    /// are: only the page's tokens are built (a page of a catalog of 100,000 entries used to
    /// build all of them).
    pub fn catalog_tokens_page(
        &self,
        model: &str,
        visible: crate::flags::Flags,
        offset: usize,
        limit: usize,
    ) -> (Vec<crate::net_state::Token>, usize) {
        let scope = catalog_scope(model);
        let Some(catalog) = self.catalogs.get(model) else { return (Vec::new(), 0) };
        let token = |e: &Arc<StoredEntry>| catalog_token(e, scope);
        if crate::entry::BindingKind::ALL.iter().all(|k| k.visible_to(visible)) {
            // Every entry is shown: the count is known, and only the page is walked.
            return (catalog.values().skip(offset).take(limit).map(token).collect(), catalog.len());
        }
        // One pass: every shown entry is counted, and those of the page are built.
        let (mut page, mut total) = (Vec::new(), 0);
        for e in catalog.values().filter(|e| e.entry.binding.kind().visible_to(visible)) {
            if total >= offset && total - offset < limit {
                page.push(token(e));
            }
            total += 1;
        }
        (page, total)
    }

    /// A model's catalog entries as the read-only tokens of its `p-tool-catalog` place (the
    /// global catalog's for `default`), only the kinds `visible` reveals. Derived, never stored:
    /// the catalog is the fact, these are a view a net can read with a read arc. Only the first
    /// `limit` are built: a net that reads one entry of a catalog of 100,000 builds one token.
    pub fn catalog_tokens(
        &self,
        model: &str,
        visible: crate::flags::Flags,
        limit: usize,
    ) -> Vec<crate::net_state::Token> {
        let scope = catalog_scope(model);
        let Some(catalog) = self.catalogs.get(model) else { return Vec::new() };
        catalog
            .values()
            .filter(|e| e.entry.binding.kind().visible_to(visible))
            .take(limit)
            .map(|e| catalog_token(e, scope))
            .collect()
    }

    /// The token of [`State::catalog_tokens`] whose id is `token_id` (`cat-{entry id}`), looked
    /// up by its entry; `None` when there is no such entry or `visible` does not reveal it.
    pub fn catalog_token(
        &self,
        model: &str,
        visible: crate::flags::Flags,
        token_id: &str,
    ) -> Option<crate::net_state::Token> {
        let entry = self.catalogs.get(model)?.get(token_id.strip_prefix("cat-")?)?;
        entry.entry.binding.kind().visible_to(visible).then(|| catalog_token(entry, catalog_scope(model)))
    }

    /// Models with their places and token counts: `p-tool-catalog`, then the places of the
    /// model's net (those it declares, and any it no longer declares that still hold tokens).
    pub fn model_views(&self) -> Vec<ModelView> {
        self.models
            .values()
            .map(|m| {
                let catalog = PlaceView {
                    name: CATALOG_PLACE.to_string(),
                    tokens: self.catalogs.get(&m.name).map_or(0, |c| c.len()),
                };
                let net = self.nets.models.get(&m.name).into_iter().flat_map(|n| &n.places);
                ModelView {
                    name: m.name.clone(),
                    created_at: crate::event::format_time(m.created_at),
                    created_by: m.created_by.clone(),
                    places: std::iter::once(catalog)
                        .chain(
                            net.filter(|(name, _)| name.as_str() != CATALOG_PLACE)
                                .map(|(name, p)| PlaceView { name: name.clone(), tokens: p.tokens.len() }),
                        )
                        .collect(),
                }
            })
            .collect()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelView {
    pub name: String,
    pub created_at: String,
    pub created_by: String,
    pub places: Vec<PlaceView>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlaceView {
    pub name: String,
    /// Number of tokens in the place.
    pub tokens: usize,
}

/// Whose entries a model's `p-tool-catalog` shows: the global catalog's for `default`.
fn catalog_scope(model: &str) -> Scope {
    if model == DEFAULT_MODEL { Scope::Global } else { Scope::Local }
}

/// A catalog entry as a read-only token of `p-tool-catalog`.
fn catalog_token(e: &Arc<StoredEntry>, scope: Scope) -> crate::net_state::Token {
    crate::net_state::Token {
        id: format!("cat-{}", e.entry.id),
        name: Some(e.entry.id.to_string()),
        created_at: crate::event::format_time(e.updated_at),
        data: serde_json::to_value(e.view(scope, false)).unwrap_or_default(),
        by: Vec::new(),
    }
}
