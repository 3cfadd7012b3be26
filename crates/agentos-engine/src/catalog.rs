//! The catalog: registering and removing entries, search, get and history, and the blobs
//! entries pin. Entries live in the ledger's state; their content in the blob store.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use agentos_core::command::{Plan, RemoveArgs, check_may_register, decide_register, decide_remove};
use agentos_core::entry::{Binding, EntryView, Scope};
use agentos_core::event::{Event, EventBody, EventView};
use agentos_core::name::{check_model_name, check_tool_id};
use agentos_core::search::{SearchPage, SearchQuery, search};
use agentos_core::state::ModelView;
use agentos_core::urn::BlobUrn;
use agentos_core::{CoreError, DEFAULT_MODEL};
use agentos_store::BlobStore;

use crate::access::{check_catalog_read, check_catalog_write, require};
use crate::ledger::to_event;
use crate::{Catalog, EngineError, Principal};

/// The definitions an entry has had, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct History {
    pub id: String,
    /// The model whose catalog the history belongs to.
    pub model: String,
    pub scope: Scope,
    pub events: Vec<EventView>,
}

impl Catalog<'_> {
    /// Registers an entry by its kind's registration command (`command` is its type, `body`
    /// its fields): the kind's binder plans it, its blobs are stored, then the entry is committed.
    pub async fn register(&self, principal: &Principal, command: &str, body: Value) -> Result<EntryView, EngineError> {
        let binder = crate::bindings::by_command(command)
            .ok_or_else(|| CoreError::bad_input("unknown_command", format!("{command:?} registers no kind of tool")))?;
        require(principal, binder.kind().registering_flag(), binder.registering())?;
        // Where the entry would go, read from the command's header fields: a registration the
        // caller may not make is refused before its binder contacts anything.
        let model = match body.get("model").and_then(Value::as_str) {
            _ if binder.global_only() => DEFAULT_MODEL,
            Some(m) => m,
            None => principal.home_model.as_str(),
        };
        if check_model_name(model).is_ok() {
            let st = self.read_state();
            check_catalog_write(&st, principal, model)?;
            if let Some(id) = body.get("id").and_then(Value::as_str) {
                check_may_register(&st, model, id, binder.kind(), &principal.actor())?;
            }
        }
        let plan = binder.plan(self, principal, body).await?;
        check_catalog_write(&self.read_state(), principal, &plan.model)?;
        self.store_entry(principal, plan).await
    }

    /// Commits a definition the master drew itself (an MCP server's new tool list), as
    /// `principal`, the entry's owner: its blobs stored, then the entry.
    pub(crate) async fn store_plan(&self, principal: &Principal, plan: Plan) -> Result<EntryView, EngineError> {
        self.store_entry(principal, plan).await
    }

    /// Stores an entry's content, then commits the entry, and answers it as stored.
    async fn store_entry(&self, principal: &Principal, plan: Plan) -> Result<EntryView, EngineError> {
        let Plan { model, entry, blobs } = plan;
        // Blobs are durable before the event that names them; an orphan blob after a crash is harmless.
        for (urn, bytes) in &blobs {
            self.inner.catalog.blobs.put(urn, bytes).await?;
        }
        let id = entry.id.clone();
        let m = model.clone();
        let who = principal.clone();
        let events = self
            .submit(&principal.name, Box::new(move |st| decide_register(st, &m, entry.clone(), &who.actor())))
            .await?;
        let scope = if model == DEFAULT_MODEL { Scope::Global } else { Scope::Local };
        let st = self.read_state();
        let current = st.catalog(&model).and_then(|c| c.get(&id));
        // No event: the same definition was already current.
        let Some(ev) = events.last() else {
            return current
                .map(|s| s.view(scope, false))
                .ok_or_else(|| CoreError::internal("an unchanged entry is missing from the state").into());
        };
        if let Some(stored) = current.filter(|s| s.revision == ev.seq) {
            return Ok(stored.view(scope, false));
        }
        // Another command changed the entry since: answer what this one committed.
        let EventBody::ToolRegistered { entry, owner } = &ev.body else {
            return Err(CoreError::internal("a registration committed another kind of event").into());
        };
        let created_at = current.map(|s| s.created_at).unwrap_or(ev.time);
        let mut stored = agentos_core::entry::StoredEntry::new(
            entry.clone(),
            model,
            ev.seq,
            created_at,
            ev.time,
            ev.principal.clone(),
        );
        if let Some(o) = owner {
            stored.owner = o.as_str().into();
        }
        Ok(std::sync::Arc::new(stored).view(scope, false))
    }

    /// `TOOL_CATALOG_REMOVE`.
    pub async fn remove(&self, principal: &Principal, args: RemoveArgs) -> Result<(), EngineError> {
        check_tool_id(&args.id)?;
        let model = args.model.unwrap_or_else(|| principal.home_model.clone());
        check_model_name(&model)?;
        check_catalog_write(&self.read_state(), principal, &model)?;
        let kind = self.read_state().catalog(&model).and_then(|c| c.get(&args.id)).map(|e| e.entry.binding.kind());
        match kind {
            Some(k) if k.visible_to(principal.flags) => {
                require(principal, k.registering_flag(), "remove this kind of tool")?;
            }
            _ => {
                return Err(
                    CoreError::not_found(format!("no tool {:?} in the catalog of model {model:?}", args.id)).into()
                );
            }
        }
        let id = args.id;
        let who = principal.clone();
        self.submit(&principal.name, Box::new(move |st| decide_remove(st, &model, &id, &who.actor()))).await?;
        Ok(())
    }

    /// Catalog search, local first, showing only the kinds the caller's flags reveal. Without a
    /// model it searches the caller's home model, as register, invoke and call do. A page holds
    /// `MAX_LIMIT` entries at most.
    pub fn search(&self, principal: &Principal, query: &SearchQuery) -> Result<SearchPage, EngineError> {
        let model = query.model.clone().unwrap_or_else(|| principal.home_model.clone());
        check_model_name(&model)?;
        let st = self.read_state();
        check_catalog_read(&st, principal, &model)?;
        let limit = query.limit.clamp(1, agentos_core::search::MAX_LIMIT);
        Ok(search(&st, &SearchQuery { model: Some(model), limit, ..query.clone() }, principal.flags))
    }

    /// Every entry `principal` sees from its home model, local first, a shadowed global one
    /// left out: what an MCP client of this principal is offered. Empty for a principal that
    /// reads no catalog.
    pub fn visible(&self, principal: &Principal) -> Vec<EntryView> {
        let model = &principal.home_model;
        let st = self.read_state();
        if check_catalog_read(&st, principal, model).is_err() {
            return Vec::new();
        }
        let query = SearchQuery { model: Some(model.clone()), limit: usize::MAX, ..Default::default() };
        search(&st, &query, principal.flags).items.into_iter().filter(|e| !e.shadowed).collect()
    }

    /// One entry, local first (in the caller's home model when no model is given).
    pub fn get(&self, principal: &Principal, id: &str, model: Option<&str>) -> Result<EntryView, EngineError> {
        check_tool_id(id)?;
        let model = model.unwrap_or(&principal.home_model);
        check_model_name(model)?;
        let st = self.read_state();
        check_catalog_read(&st, principal, model)?;
        match st.resolve(model, id) {
            Some((e, scope)) if e.entry.binding.kind().visible_to(principal.flags) => Ok(e.view(scope, false)),
            _ => Err(not_found(id, model).into()),
        }
    }

    /// Every definition `id` has had in the scope it resolves to from `model`.
    pub async fn history(&self, principal: &Principal, id: &str, model: Option<&str>) -> Result<History, EngineError> {
        check_tool_id(id)?;
        let model = model.unwrap_or(&principal.home_model);
        check_model_name(model)?;
        check_catalog_read(&self.read_state(), principal, model)?;
        let key = format!("tool:{id}");
        let mut found = None;
        if model != DEFAULT_MODEL {
            let local = self.inner.ledger.log.read_key(model, &key).await?;
            if !local.is_empty() {
                found = Some((model.to_string(), Scope::Local, local));
            }
        }
        if found.is_none() {
            let global = self.inner.ledger.log.read_key(DEFAULT_MODEL, &key).await?;
            if !global.is_empty() {
                found = Some((DEFAULT_MODEL.to_string(), Scope::Global, global));
            }
        }
        let Some((owner, scope, recs)) = found else {
            return Err(not_found(id, model).into());
        };
        let skipped = &self.inner.ledger.skipped;
        let events =
            recs.into_iter().filter(|r| !skipped.contains(&r.seq)).map(to_event).collect::<Result<Vec<_>, _>>()?;
        // Shown only to a caller who may see the kind the entry had.
        let visible = events.iter().all(|e| match &e.body {
            EventBody::ToolRegistered { entry, .. } => entry.binding.kind().visible_to(principal.flags),
            _ => true,
        });
        if !visible {
            return Err(not_found(id, model).into());
        }
        Ok(History { id: id.to_string(), model: owner, scope, events: events.iter().map(Event::view).collect() })
    }

    /// A blob's bytes, verified against its digest.
    pub async fn read_blob(&self, urn: &BlobUrn) -> Result<Vec<u8>, EngineError> {
        Ok(self.inner.catalog.blobs.get_checked(urn, None).await?)
    }

    /// A blob's bytes for `p`: job output of a model it may use, or the content of an entry it
    /// can see in the global catalog or a model it may use. Anything else is as absent as a blob
    /// never stored, so names do not leak.
    pub async fn read_blob_as(&self, p: &Principal, urn: &BlobUrn) -> Result<Vec<u8>, EngineError> {
        if !p.is_operator() && !self.may_read_blob(p, urn) {
            return Err(CoreError::not_found(format!("no blob {urn} that {} may read", p.name)).into());
        }
        self.read_blob(urn).await
    }

    fn may_read_blob(&self, p: &Principal, urn: &BlobUrn) -> bool {
        let st = self.read_state();
        if let Some(model) =
            urn.namespace().strip_prefix(crate::jobs::OUTPUT_NAMESPACE).and_then(|m| m.strip_prefix('/'))
        {
            return crate::access::may_use_model(&st, p, model);
        }
        let wanted = urn.to_string();
        st.catalogs.iter().filter(|(m, _)| *m == DEFAULT_MODEL || crate::access::may_use_model(&st, p, m)).any(
            |(_, c)| {
                c.values().any(|e| {
                    let kind = e.entry.binding.kind();
                    kind.visible_to(p.flags)
                        && crate::bindings::binder(kind)
                            .and_then(|b| b.pinned_blob(&e.entry.binding))
                            .is_some_and(|u| u == wanted)
                })
            },
        )
    }

    /// The script of an entry, verified against the pinned size and sha256.
    pub async fn read_script(&self, model: &str, id: &str) -> Result<Vec<u8>, EngineError> {
        let binding = {
            let st = self.read_state();
            let (e, _) = st.resolve(model, id).ok_or_else(|| not_found(id, model))?;
            e.entry.binding.clone()
        };
        let Binding::Script(s) = binding else {
            return Err(CoreError::bad_input("not_a_script", format!("{id:?} is not a script tool")).into());
        };
        let urn: BlobUrn = s.script_urn.parse()?;
        if urn.sha256() != s.sha256 {
            return Err(CoreError::new(
                agentos_core::ErrorKind::Corrupt,
                "pin_mismatch",
                "the entry's URN and pin disagree",
            )
            .into());
        }
        Ok(self.inner.catalog.blobs.get_checked(&urn, Some(s.size_bytes)).await?)
    }

    pub fn models(&self) -> Vec<ModelView> {
        self.read_state().model_views()
    }

    /// The models `p` may use, and the global catalog's `default`: of `default` without a
    /// grant only its catalog's place, its net being the operator's. A catalog's place counts
    /// the entries `p` may see, as its token list does.
    pub fn models_for(&self, p: &Principal) -> Vec<ModelView> {
        let st = self.read_state();
        st.model_views()
            .into_iter()
            .filter_map(|mut m| {
                let usable = crate::access::may_use_model(&st, p, &m.name);
                if !usable && m.name != DEFAULT_MODEL {
                    return None;
                }
                m.places.retain(|place| usable || place.name == crate::nets::CATALOG_PLACE);
                if let Some(place) = m.places.iter_mut().find(|place| place.name == crate::nets::CATALOG_PLACE) {
                    place.tokens = st.catalog_tokens_page(&m.name, p.flags, 0, 0).1;
                }
                Some(m)
            })
            .collect()
    }

    /// Number of entries in every catalog.
    pub fn entry_count(&self) -> usize {
        self.read_state().catalogs.values().map(|c| c.len()).sum()
    }
}

fn not_found(id: &str, model: &str) -> CoreError {
    if model == DEFAULT_MODEL {
        CoreError::not_found(format!("no tool {id:?} in the global catalog"))
    } else {
        CoreError::not_found(format!("no tool {id:?} in model {model:?} nor in the global catalog"))
    }
}
