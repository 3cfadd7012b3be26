//! The net engine: applies nets, binds tokens, fires transitions (synchronous kinds in one
//! event, command and http with a reservation first), routes results by emit rules, runs
//! schedules, recovers fires that were in flight when the master stopped, and runs tool nets.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use agentos_core::entry::BindingKind;
use agentos_core::event::GrantTarget;
use agentos_core::event::{Event, EventBody};
use agentos_core::expr::{ExprError, Runner};
use agentos_core::flags::{Flag, Flags};
use agentos_core::job::{CommandToken, JobResult, PINNED_SHA256, RESOLVED_ARGS};
use agentos_core::name::{check_model_name, shown};
use agentos_core::net::{Inscription, Mode, NetDoc, Take};
use agentos_core::net_state::{Instance, ModelNet, NetEvent, NewToken, Token, TokenRef, fire_id};
use agentos_core::{CoreError, ErrorKind};

pub mod runtime;

#[cfg(test)]
mod by_hand_tests;
#[cfg(test)]
mod chain_tests;
#[cfg(test)]
mod instance_tests;

pub use runtime::{CATALOG_PLACE, NetLimits, default_memory_cap};
use runtime::{Candidate, Candidates, Compiled, FireError, HttpCompiled, OperationCompiled};

use agentos_core::decide::{
    decide_apply_net, decide_create_instance, decide_create_model, decide_net_events, decide_stop_crash_looping,
    decide_token_put,
};

use crate::access::{Authority, check_model_in, may_use_model, require};
use crate::firing_marker::CrashLooping;
use crate::outbound::describe;
use crate::redact::Redactor;
use crate::{Engine, EngineError, Nets, Principal};

/// A tool net invocation.
pub(crate) struct ToolnetCall<'a> {
    pub id: &'a str,
    /// The id of the principal that owns the tool net entry: its transitions act with its authority.
    pub author: String,
    /// Scripts inside resolve local first in this model.
    pub resolve_model: &'a str,
    pub doc: NetDoc,
    pub input_place: &'a str,
    pub output_place: &'a str,
    pub input: Value,
    pub timeout: Duration,
}

/// Where a fire acts and with whose authority.
struct FireRun<'a> {
    /// The model whose net fires (an instance's own model for a tool net).
    model: &'a str,
    /// The model the fire acts for: the model whose net fires, or for a tool-net instance the
    /// model it was invoked from. Scripts resolve local first in it, and a secret grant narrowed
    /// to a model is checked against it, for commands and http alike.
    resolve_model: &'a str,
    authority: &'a Authority,
}

/// A command fire's job: its result, when the fire records it (with its outcome, in one
/// commit), and the job known as the transition's step until then.
#[derive(Default)]
struct CommandJob {
    record: Option<(String, EventBody)>,
    step: Option<crate::engine::NetStep>,
}

/// What a secret would be used for.
enum SecretUse {
    Script { id: String, model: String, sha256: String },
    Origin(String),
}

/// Where a net stands: its document, places with token counts, transitions with their run state.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetView {
    pub model: String,
    pub doc: Value,
    pub places: Vec<PlaceSummary>,
    pub transitions: Vec<TransitionSummary>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlaceSummary {
    pub id: String,
    pub tokens: usize,
    pub reserved: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransitionSummary {
    pub id: String,
    pub kind: String,
    pub started: bool,
    pub in_flight: usize,
    pub fires: u64,
    pub parked: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// A link, as listed from either end.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkView {
    pub id: String,
    /// The model whose net declares it.
    pub model: String,
    pub relation: String,
    pub from: Value,
    pub to: Value,
}

/// What a manual fire did.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FireOutcome {
    pub transition: String,
    /// `fired` (done), `started` (a command or http action runs), `failed` (inputs kept),
    /// `stopped` (a limit was hit: the transition stopped, inputs kept), `not-enabled`.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fire: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A token a transition will not bind again by itself, with why and how often its fires failed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParkedToken {
    pub transition: String,
    pub place: String,
    pub token: Token,
    /// Why the fire that parked it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Failed fires of this transition on it.
    pub attempts: u32,
}

fn token_json(t: &Token) -> Value {
    serde_json::to_value(t).unwrap_or(Value::Null)
}

fn need(p: &Principal, flag: Flag, what: &str) -> Result<(), EngineError> {
    Ok(require(p, flag, what)?)
}

/// A model that was never made (by `POST /api/models`, a net or a registration) is not found:
/// a misspelt name would otherwise watch or list nothing, without a word. Asked after access,
/// so a model the caller may not use is refused the same whether it exists or not.
fn model_exists(st: &agentos_core::state::State, model: &str) -> Result<(), CoreError> {
    if st.model_exists(model) {
        return Ok(());
    }
    Err(CoreError::not_found(format!(
        "no model {model:?}; `POST /api/models` makes one, as putting its net or registering a tool in it does"
    )))
}

/// Model names the master keeps for tool-net instances.
pub(crate) const INSTANCE_PREFIX: &str = "tni-";

/// Most tokens the places a model's transitions read from may hold for a fire's follow-on start
/// to be decided in its commit (those places are copied to decide it; the tokens of places no
/// transition reads are only counted).
const CHAIN_MAX_TOKENS: usize = 128;

/// Most fires decided into one commit after the fire or result that leads them.
const CHAIN_MAX_FIRES: usize = 8;

impl Nets<'_> {
    fn net_event(&self, model: &str, ev: NetEvent) -> crate::committer::Decide {
        let model = model.to_string();
        Box::new(move |st| decide_net_events(st, &model, std::slice::from_ref(&ev)))
    }

    /// Commits one net event; answers its sequence number.
    async fn commit_net(&self, principal: &str, model: &str, ev: NetEvent) -> Result<u64, EngineError> {
        let events = self.submit(principal, self.net_event(model, ev)).await?;
        Ok(events.last().map(|e| e.seq).unwrap_or(0))
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.inner.ledger.events.subscribe()
    }

    /// Creates an empty model. Needs `w`.
    pub async fn create_model(&self, p: &Principal, name: &str) -> Result<(), EngineError> {
        need(p, Flag::Write, "create models")?;
        check_model_name(name)?;
        if name.starts_with(INSTANCE_PREFIX) {
            return Err(CoreError::bad_input(
                "invalid_model",
                format!("model names starting with {INSTANCE_PREFIX:?} are kept for tool-net instances"),
            )
            .into());
        }
        check_model_in(&self.read_state(), p, name)?;
        let name = name.to_string();
        self.submit(&p.name, Box::new(move |st| decide_create_model(st, &name))).await?;
        Ok(())
    }

    /// Validates a whole net document first, then makes it the model's net. Needs `w`.
    pub async fn apply_net(&self, p: &Principal, model: &str, doc: NetDoc) -> Result<NetView, EngineError> {
        need(p, Flag::Write, "author nets")?;
        check_model_name(model)?;
        // Decided before anything is written: a refused apply leaves no trace but its answer.
        check_model_in(&self.read_state(), p, model)?;
        if let Some(m) = &doc.model
            && m != model
        {
            return Err(CoreError::bad_input(
                "invalid_net",
                format!("the document names model {m:?} but is applied to {model:?}"),
            )
            .into());
        }
        doc.validate()?;
        // A link's far end in another model says something of that model, which every reader
        // of its links is shown: only a model its author may use.
        {
            let st = self.read_state();
            for t in doc.transitions.iter().filter(|t| t.kind == "link") {
                for end in [&t.from, &t.to].into_iter().flatten() {
                    if let Some(far) = end.model.as_deref().filter(|far| *far != model) {
                        check_model_in(&st, p, far)
                            .map_err(|e| CoreError::forbidden(format!("link {}: {}", shown(&t.id), e.message)))?;
                    }
                }
            }
        }
        // An operation the named tool does not have could never fire: said now, when the tool
        // is there for the author to see (one registered later is checked when it fires).
        {
            let st = self.read_state();
            for (i, t) in doc.transitions.iter().enumerate() {
                let Ok(o) = serde_json::from_value::<agentos_core::net::OperationAction>(t.action.clone()) else {
                    continue;
                };
                if !matches!(t.kind.as_str(), "http" | "mcp")
                    || !agentos_core::net::OperationAction::named_in(&t.action)
                {
                    continue;
                }
                let Some((e, _)) = st.resolve(model, &o.tool) else { continue };
                let ops = &e.entry.contract().operations;
                if e.entry.binding.kind().visible_to(p.flags) && !ops.is_empty() && !ops.contains_key(&o.operation) {
                    let known: Vec<&str> = ops.keys().map(String::as_str).take(20).collect();
                    return Err(CoreError::bad_input(
                        "invalid_net",
                        format!(
                            "the net has 1 fault(s): /transitions/{i}/action/operation: {} has no operation {}; its operations: {}{}",
                            o.tool,
                            shown(&o.operation),
                            known.join(", "),
                            if ops.len() > known.len() { ", …" } else { "" }
                        ),
                    )
                    .into());
                }
            }
        }
        let transitions: Vec<String> = doc.transitions.iter().map(|t| t.id.clone()).collect();
        let m = model.to_string();
        let author = p.clone();
        self.submit(
            &p.name,
            Box::new(move |st| {
                // Again at commit time: a grant may have been revoked since.
                check_model_in(st, &author, &m)?;
                decide_apply_net(st, &m, &doc, &author.id)
            }),
        )
        .await?;
        self.inner.nets.compiled.lock().unwrap_or_else(|e| e.into_inner()).retain(|(mm, _), _| mm != model);
        self.inner.nets.forget_rates_except(model, &transitions.iter().map(String::as_str).collect());
        // The author may see what it wrote, whether or not it holds 'r'.
        self.view_of(model)
    }

    pub fn net_view(&self, p: &Principal, model: &str) -> Result<NetView, EngineError> {
        need(p, Flag::Read, "read nets")?;
        check_model_name(model)?;
        self.check_model(p, model)?;
        let mut view = self.view_of(model)?;
        // A net that names the catalog's place holds none of its tokens: they are the
        // catalog's entries the caller may see, counted as `GET …/places/p-tool-catalog/tokens`
        // lists them (the view said 0).
        if let Some(place) = view.places.iter_mut().find(|s| s.id == CATALOG_PLACE) {
            place.tokens = self.read_state().catalog_tokens_page(model, p.flags, 0, 0).1;
        }
        Ok(view)
    }

    fn view_of(&self, model: &str) -> Result<NetView, EngineError> {
        let st = self.read_state();
        let net =
            st.nets.models.get(model).ok_or_else(|| CoreError::not_found(format!("model {model:?} has no net")))?;
        Ok(NetView {
            model: model.to_string(),
            doc: serde_json::to_value(&net.doc).unwrap_or_default(),
            places: net
                .places
                .iter()
                .map(|(id, p)| PlaceSummary { id: id.clone(), tokens: p.tokens.len(), reserved: p.reserved.len() })
                .collect(),
            transitions: net
                .doc
                .transitions
                .iter()
                .map(|t| {
                    let run = net.transitions.get(&t.id).cloned().unwrap_or_default();
                    TransitionSummary {
                        id: t.id.clone(),
                        kind: t.kind.clone(),
                        started: run.started,
                        in_flight: net.in_flight_of(&t.id),
                        fires: run.fires,
                        parked: run.parked.len(),
                        last_error: run.last_error,
                    }
                })
                .collect(),
        })
    }

    pub fn tokens(&self, p: &Principal, model: &str, place: &str) -> Result<Vec<Token>, EngineError> {
        Ok(self.tokens_page(p, model, place, 0, usize::MAX)?.0)
    }

    /// Up to `limit` of a place's tokens after the first `offset`, oldest first, and how many
    /// it holds: only the page is copied out of the state.
    pub fn tokens_page(
        &self,
        p: &Principal,
        model: &str,
        place: &str,
        offset: usize,
        limit: usize,
    ) -> Result<(Vec<Token>, usize), EngineError> {
        need(p, Flag::Read, "read tokens")?;
        let st = self.read_state();
        check_model_in(&st, p, model)?;
        if place == CATALOG_PLACE {
            model_exists(&st, model)?;
            return Ok(st.catalog_tokens_page(model, p.flags, offset, limit));
        }
        let net =
            st.nets.models.get(model).ok_or_else(|| CoreError::not_found(format!("model {model:?} has no net")))?;
        let place = net
            .places
            .get(place)
            .ok_or_else(|| CoreError::not_found(format!("model {model:?} has no place {place:?}")))?;
        Ok((place.tokens.values().skip(offset).take(limit).cloned().collect(), place.tokens.len()))
    }

    /// Puts a token into a place. Needs `w`.
    pub async fn put_token(
        &self,
        p: &Principal,
        model: &str,
        place: &str,
        data: Value,
        name: Option<String>,
    ) -> Result<Token, EngineError> {
        need(p, Flag::Write, "put tokens")?;
        check_model_name(model)?;
        if place == CATALOG_PLACE {
            return Err(CoreError::bad_input(
                "read_only_place",
                format!(
                    "{CATALOG_PLACE} is read-only: its tokens are the catalog's entries; register a tool to add one"
                ),
            )
            .into());
        }
        agentos_core::name::check_token_name(name.as_deref())?;
        agentos_core::depth::check_token_depth(&data)?;
        let by = vec![p.id.clone()];
        let put = NetEvent::TokensPut {
            tokens: vec![NewToken { place: place.to_string(), name: name.clone(), data: data.clone(), by: by.clone() }],
        };
        self.inner.nets.check_token_bytes(&data)?;
        let max_tokens = self.inner.nets.limits.max_tokens_per_place;
        let (who, m, pl) = (p.clone(), model.to_string(), place.to_string());
        let engine = self.0.clone();
        let guarded: crate::committer::Decide = Box::new(move |st| {
            check_model_in(st, &who, &m)?;
            let mut out = decide_token_put(st, &m, &pl, &put, max_tokens)?;
            // The fires the token enables go in the same commit (see `follow_on`), recorded
            // as the master's own, not the putter's.
            if let (Some((_, EventBody::Net(put))), seq @ 1..) = (out.last(), crate::committer::next_seq()) {
                let at = out.len() - 1;
                let more = engine.nets().follow_on(st, &m, std::slice::from_ref(put), seq + at as u64);
                if !more.is_empty() {
                    crate::committer::system_from(out.len());
                    out.extend(more.into_iter().map(|ev| (m.clone(), EventBody::Net(ev))));
                }
            }
            Ok(out)
        });
        // In a task of its own: a caller that goes away (its connection dropped) must not
        // leave a fire its put started unrun until the next start.
        let (engine, putter, m) = (self.0.clone(), p.name.clone(), model.to_string());
        let committed = tokio::spawn(async move {
            let nets = engine.nets();
            let events = nets.submit(&putter, guarded).await?;
            nets.count_chained(&m, &events, 0);
            for fire in Self::started_in(&events) {
                nets.spawn_fire(m.clone(), fire);
            }
            Ok::<_, EngineError>(events)
        });
        let events = committed
            .await
            .map_err(|e| CoreError::internal(format!("a token put's commit stopped: {e}")))?
            .map_err(|e| match e {
                EngineError::Core(c) if c.kind == ErrorKind::Conflict && c.code != "place_full" => {
                    CoreError::not_found(c.message).into()
                }
                other => other,
            })?;
        // Answered from the committed event: by now a transition may already have taken the token.
        let ev = events
            .iter()
            .find(|e| matches!(e.body, EventBody::Net(NetEvent::TokensPut { .. })))
            .ok_or_else(|| CoreError::internal("a token put committed no event"))?;
        Ok(Token {
            id: agentos_core::net_state::token_id(ev.seq, 0),
            name,
            created_at: agentos_core::event::format_time(ev.time),
            data,
            by,
        })
    }

    /// Links declared in any model whose either end is in `model`.
    pub fn links(&self, p: &Principal, model: &str) -> Result<Vec<LinkView>, EngineError> {
        need(p, Flag::Read, "read links")?;
        let st = self.read_state();
        check_model_in(&st, p, model)?;
        model_exists(&st, model)?;
        let mut out = Vec::new();
        // Only links declared in models the caller may use: the others would show their nets.
        for (owner, net) in st.nets.models.iter().filter(|(m, _)| may_use_model(&st, p, m)) {
            for t in net.doc.transitions.iter().filter(|t| t.kind == "link") {
                let end_model = |r: &Option<agentos_core::net::PlaceRef>| {
                    r.as_ref().map(|r| r.model.clone().unwrap_or_else(|| owner.clone()))
                };
                let (from, to) = (end_model(&t.from), end_model(&t.to));
                if from.as_deref() == Some(model) || to.as_deref() == Some(model) {
                    let end = |r: &Option<agentos_core::net::PlaceRef>, m: Option<String>| json!({"model": m, "place": r.as_ref().map(|r| r.place.clone())});
                    out.push(LinkView {
                        id: t.id.clone(),
                        model: owner.clone(),
                        relation: t.relation.clone().unwrap_or_default(),
                        from: end(&t.from, from),
                        to: end(&t.to, to),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Starts (fires whenever enabled, or on its schedule) or stops a transition. Needs `x`.
    ///
    /// A manual transition without a schedule is refused a start (400 `manual_transition`): the
    /// fire loop never fires it, so an answer "started" would promise fires that never come. A
    /// start leaves the transition's parked tokens parked (see [`NetEvent::Started`]).
    pub async fn set_started(
        &self,
        p: &Principal,
        model: &str,
        transition: &str,
        started: bool,
    ) -> Result<(), EngineError> {
        need(p, Flag::Execute, "start or stop transitions")?;
        self.check_model(p, model)?;
        if started {
            let st = self.read_state();
            let inscription = st.nets.models.get(model).and_then(|n| n.inscription(transition));
            // A start promises fires: a link never fires (it only says how two places relate).
            if inscription.is_some_and(|t| t.kind == "link") {
                return Err(CoreError::bad_input(
                    "not_firing",
                    format!(
                        "transition {} is a link: a link never fires, so there is nothing to start",
                        shown(transition)
                    ),
                )
                .into());
            }
            let manual = inscription.filter(|t| t.mode == Mode::Manual && t.schedule.is_none());
            if manual.is_some() {
                return Err(CoreError::bad_input(
                    "manual_transition",
                    format!(
                        "transition {transition:?} is manual (mode: manual, no schedule): it fires only when fired by hand, with `agentos net fire {transition} --model {model}`; give it mode auto or a schedule to have a start run it"
                    ),
                )
                .into());
            }
        }
        let t = transition.to_string();
        let ev = if started {
            NetEvent::Started { transition: t }
        } else {
            NetEvent::Stopped { transition: t, reason: None }
        };
        self.commit_net(&p.name, model, ev).await.map_err(|e| match e {
            EngineError::Core(c) if c.kind == ErrorKind::Conflict => CoreError::not_found(c.message).into(),
            other => other,
        })?;
        self.inner
            .nets
            .due
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(model.to_string(), transition.to_string()));
        self.inner.nets.wake.notify_one();
        Ok(())
    }

    /// Fires a transition once, started or not. It binds as the fire loop does: tokens parked for
    /// the transition are skipped (released by [`Nets::retry_parked`]); a retry backoff is not
    /// waited out. Needs `x`.
    pub async fn fire_once(&self, p: &Principal, model: &str, transition: &str) -> Result<FireOutcome, EngineError> {
        need(p, Flag::Execute, "fire transitions")?;
        {
            let st = self.read_state();
            check_model_in(&st, p, model)?;
            let net =
                st.nets.models.get(model).ok_or_else(|| CoreError::not_found(format!("model {model:?} has no net")))?;
            let t = net
                .inscription(transition)
                .ok_or_else(|| CoreError::not_found(format!("no transition {transition:?} in {model:?}")))?;
            if t.kind == "link" {
                return Err(CoreError::bad_input("not_firing", "a link never fires").into());
            }
        }
        self.try_fire(model, transition, Some(p)).await
    }

    /// The parked tokens of a model, of one transition or all. Needs `r`.
    pub fn parked(
        &self,
        p: &Principal,
        model: &str,
        transition: Option<&str>,
    ) -> Result<Vec<ParkedToken>, EngineError> {
        need(p, Flag::Read, "read parked tokens")?;
        let st = self.read_state();
        check_model_in(&st, p, model)?;
        let net =
            st.nets.models.get(model).ok_or_else(|| CoreError::not_found(format!("model {model:?} has no net")))?;
        if let Some(t) = transition
            && net.inscription(t).is_none()
        {
            return Err(CoreError::not_found(format!("no transition {t:?} in {model:?}")).into());
        }
        let mut out = Vec::new();
        for (id, run) in net.transitions.iter().filter(|(id, _)| transition.is_none_or(|t| t == id.as_str())) {
            for r in &run.parked {
                let Some(token) = net.token(r) else { continue };
                out.push(ParkedToken {
                    transition: id.clone(),
                    place: r.place.clone(),
                    token: token.clone(),
                    reason: run.parked_why.get(&r.id).cloned(),
                    attempts: run.failed(&r.id),
                });
            }
        }
        Ok(out)
    }

    /// The places where `token` is parked, or 404.
    fn parked_refs(&self, model: &str, token: &str) -> Result<Vec<TokenRef>, EngineError> {
        let st = self.read_state();
        let net =
            st.nets.models.get(model).ok_or_else(|| CoreError::not_found(format!("model {model:?} has no net")))?;
        let mut refs: Vec<TokenRef> =
            net.transitions.values().flat_map(|r| r.parked.iter().filter(|r| r.id == token).cloned()).collect();
        refs.dedup();
        if refs.is_empty() {
            return Err(CoreError::not_found(format!("token {token:?} is not parked in {model:?}")).into());
        }
        Ok(refs)
    }

    /// Releases a parked token: every transition may bind it again, its attempts forgotten. Needs `x`.
    pub async fn retry_parked(&self, p: &Principal, model: &str, token: &str) -> Result<(), EngineError> {
        need(p, Flag::Execute, "retry parked tokens")?;
        self.check_model(p, model)?;
        let tokens = self.parked_refs(model, token)?;
        self.commit_net(&p.name, model, NetEvent::Unparked { tokens }).await?;
        self.inner.nets.wake.notify_one();
        Ok(())
    }

    /// Removes a parked token from its place. Needs `w`.
    pub async fn discard_parked(&self, p: &Principal, model: &str, token: &str) -> Result<(), EngineError> {
        need(p, Flag::Write, "discard parked tokens")?;
        self.check_model(p, model)?;
        let tokens = self.parked_refs(model, token)?;
        self.commit_net(&p.name, model, NetEvent::Discarded { tokens }).await?;
        Ok(())
    }

    /// Checks that `p` may watch `model`'s stream. Needs `r` and the model.
    pub fn check_watch(&self, p: &Principal, model: &str) -> Result<(), EngineError> {
        need(p, Flag::Read, "watch nets")?;
        check_model_name(model)?;
        let st = self.read_state();
        check_model_in(&st, p, model)?;
        Ok(model_exists(&st, model)?)
    }

    fn compiled(&self, model: &str, t: &Inscription) -> Result<Arc<Compiled>, ExprError> {
        let key = (model.to_string(), t.id.clone());
        let mut cache = self.inner.nets.compiled.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = cache.get(&key)
            && c.inscription == *t
        {
            return Ok(c.clone());
        }
        let c = Arc::new(Compiled::new(t)?);
        cache.insert(key, c.clone());
        Ok(c)
    }

    /// What every preset may bind, read under the state's lock; `None` when a consuming preset
    /// has nothing free. Filters are not run here: an expression round trip per token under the
    /// read lock held every commit back while a slow filter ran.
    fn candidates(net: &ModelNet, c: &Compiled, manual: bool, catalog: &[Token]) -> Option<Vec<(String, Candidates)>> {
        let t = &c.inscription;
        let now = now_ms();
        // Tokens waiting out a retry backoff bind again only when it is over (or by hand).
        let waiting = |id: &str| {
            !manual
                && net
                    .transitions
                    .get(&t.id)
                    .and_then(|r| r.attempts.get(id))
                    .and_then(|a| a.retry_at)
                    .is_some_and(|at| at > now)
        };
        let mut out = Vec::new();
        let mut used = std::collections::BTreeSet::new();
        let empty = agentos_core::net_state::PlaceState::default();
        let verdicts = c.verdicts.lock().unwrap_or_else(|e| e.into_inner());
        for (name, preset) in &t.presets {
            let in_catalog = preset.place == CATALOG_PLACE;
            let place = if in_catalog { &empty } else { net.places.get(&preset.place)? };
            let tokens: Box<dyn Iterator<Item = &Token>> =
                if in_catalog { Box::new(catalog.iter()) } else { Box::new(place.tokens.values()) };
            let limit = match preset.take {
                Take::First => 1,
                Take::All => preset.limit.unwrap_or(usize::MAX),
            };
            let filtered = c.filters.contains_key(name);
            let kept = verdicts.get(name);
            let mut refs = Vec::new();
            let mut free_tokens = Vec::new();
            for token in tokens {
                if !filtered && refs.len() >= limit {
                    break;
                }
                let r = TokenRef { place: preset.place.clone(), id: token.id.clone() };
                // A fire by hand binds as the loop does: a token parked for this transition
                // stays out until someone releases it (`net retry`), or the fire would bind the
                // same poison token each time and never reach the good ones behind it.
                let free = in_catalog || net.available(&r, &t.id);
                if !free || used.contains(&r) || (preset.consume && waiting(&token.id)) {
                    continue;
                }
                if filtered {
                    let keep = !in_catalog && c.pure_filters.contains(name);
                    let known = if keep { kept.and_then(|k| k.get(token.id.as_str())) } else { None };
                    let candidate = match known {
                        Some(v) => Candidate::Known(*v),
                        None => Candidate::Ask { json: token_json(token), keep },
                    };
                    free_tokens.push((r, candidate));
                } else {
                    used.insert(r.clone());
                    refs.push(r);
                }
            }
            if refs.is_empty() && free_tokens.is_empty() && preset.consume {
                return None;
            }
            out.push((name.clone(), if filtered { Candidates::Filter(free_tokens) } else { Candidates::Bound(refs) }));
        }
        Some(out)
    }

    /// Runs the filters over the candidates, one round trip per filtered preset, outside any lock;
    /// `None` when a consuming preset binds nothing.
    fn select(
        runner: &Runner,
        c: &Compiled,
        candidates: Vec<(String, Candidates)>,
    ) -> Result<Option<BTreeMap<String, Vec<TokenRef>>>, ExprError> {
        let t = &c.inscription;
        let mut bound = BTreeMap::new();
        let mut used: std::collections::BTreeSet<TokenRef> = candidates
            .iter()
            .filter_map(|(_, c)| if let Candidates::Bound(r) = c { Some(r.clone()) } else { None })
            .flatten()
            .collect();
        for (name, cand) in candidates {
            let Some(preset) = t.presets.get(&name) else { continue };
            let refs = match cand {
                Candidates::Bound(refs) => refs,
                Candidates::Filter(tokens) => {
                    let limit = match preset.take {
                        Take::First => 1,
                        Take::All => preset.limit.unwrap_or(usize::MAX),
                    };
                    let lost = || ExprError::Compile(format!("preset {name}: its filter is not compiled"));
                    let f = c.filters.get(&name).ok_or_else(lost)?;
                    // Only the tokens the filter was not asked about yet go to it, in one round trip.
                    let mut asked = Vec::new();
                    let mut refs = Vec::with_capacity(tokens.len());
                    let mut verdicts: Vec<Value> = Vec::with_capacity(tokens.len());
                    let mut keep = Vec::new();
                    for (i, (r, cand)) in tokens.into_iter().enumerate() {
                        match cand {
                            Candidate::Known(v) => verdicts.push(Value::Bool(v)),
                            Candidate::Ask { json, keep: k } => {
                                asked.push(json);
                                keep.push((i, k));
                                verdicts.push(Value::Null);
                            }
                        }
                        refs.push(r);
                    }
                    if !asked.is_empty() {
                        let n = asked.len();
                        let answered = match f
                            .eval(runner, &Value::Array(asked))
                            .map_err(|e| e.within(format_args!("preset {name}: filter failed")))?
                        {
                            Some(Value::Array(v)) if v.len() == n => v,
                            other => {
                                let why = format!("preset {name}: the filter answered {other:?} over its tokens");
                                return Err(ExprError::Raised(why));
                            }
                        };
                        let mut all = c.verdicts.lock().unwrap_or_else(|e| e.into_inner());
                        let kept = all.entry(name.clone()).or_default();
                        if kept.len() + n > runtime::VERDICTS_KEPT {
                            // Let go of the verdicts of tokens no longer among the candidates.
                            let live: std::collections::HashSet<&str> = refs.iter().map(|r| r.id.as_str()).collect();
                            kept.retain(|id, _| live.contains(id.as_str()));
                        }
                        for ((i, k), verdict) in keep.into_iter().zip(answered) {
                            // An error is not kept: it is reported now, and asked again next time.
                            if k && let Value::Bool(b) = verdict {
                                kept.insert(refs[i].id.clone(), b);
                            }
                            verdicts[i] = verdict;
                        }
                    }
                    let mut chosen = Vec::new();
                    for (r, verdict) in refs.into_iter().zip(verdicts) {
                        if chosen.len() >= limit {
                            break;
                        }
                        match verdict {
                            Value::Bool(true) if !used.contains(&r) => {
                                used.insert(r.clone());
                                chosen.push(r);
                            }
                            Value::String(e) => {
                                return Err(ExprError::Raised(format!(
                                    "preset {name}: filter failed on token {}: {}",
                                    r.id,
                                    e.trim_start_matches("error: ")
                                )));
                            }
                            _ => {}
                        }
                    }
                    chosen
                }
            };
            if refs.is_empty() && preset.consume {
                return Ok(None);
            }
            bound.insert(name, refs);
        }
        Ok(Some(bound))
    }

    /// Whose catalog a transition reads and what its author's flags reveal of it: its model's
    /// entries (for a tool-net instance, the invoking model's). `None` when it reads no catalog.
    fn catalog_of<'a>(
        st: &agentos_core::state::State,
        model: &'a str,
        net: &'a ModelNet,
        t: &Inscription,
    ) -> Option<(&'a str, Flags)> {
        if !t.presets.values().any(|p| p.place == CATALOG_PLACE) {
            return None;
        }
        let flags = net
            .authors
            .get(&t.id)
            .and_then(|a| st.principal_by_id(a))
            .map(|r| Principal::from_record(r).flags)
            .unwrap_or_default();
        Some((net.instance.as_ref().map_or(model, |i| i.resolve_model.as_str()), flags))
    }

    /// The catalog tokens a transition may bind: as many of the first as its catalog presets can
    /// take (each token binds one preset; a filter may pass over any of them, so a filtered
    /// preset takes the whole catalog). Empty when it reads no catalog.
    fn catalog_for(st: &agentos_core::state::State, model: &str, net: &ModelNet, t: &Inscription) -> Vec<Token> {
        let Some((model, flags)) = Self::catalog_of(st, model, net, t) else { return Vec::new() };
        let need = t
            .presets
            .values()
            .filter(|p| p.place == CATALOG_PLACE)
            .map(|p| match (&p.filter, p.take) {
                (Some(_), _) => usize::MAX,
                (None, Take::First) => 1,
                (None, Take::All) => p.limit.unwrap_or(usize::MAX),
            })
            .fold(0usize, usize::saturating_add);
        st.catalog_tokens(model, flags, need)
    }

    /// Looks up the catalog tokens a fire bound, one by one, as [`Nets::context`] needs them.
    fn catalog_lookup<'a>(
        st: &'a agentos_core::state::State,
        model: &'a str,
        net: &'a ModelNet,
        t: &Inscription,
    ) -> impl Fn(&str) -> Option<Token> + 'a {
        let of = Self::catalog_of(st, model, net, t);
        move |id| of.and_then(|(model, flags)| st.catalog_token(model, flags, id))
    }

    /// The outputs of a `pass` (the data of what it consumed) or `map` (its template) fire,
    /// routed by its emit rules.
    fn pass_or_map(
        runner: &Runner,
        c: &Compiled,
        consumed: &[TokenRef],
        ctx: &Value,
        by: &[String],
    ) -> Result<Vec<NewToken>, FireError> {
        let result = if c.inscription.kind == "map" {
            let tpl = c.template.as_ref().ok_or("a map without a template")?;
            // A map never reads credentials (refused when the net is applied, and here too).
            tpl.render(runner, ctx, &|_| None).map_err(|e| FireError::Failed(format!("the template failed: {e}")))?
        } else {
            let first = consumed.first().and_then(|r| {
                ctx.as_object()?.values().find(|v| v.get("id").and_then(Value::as_str) == Some(&r.id)).cloned()
            });
            first.and_then(|tok| tok.get("data").cloned()).unwrap_or(Value::Null)
        };
        Self::route(runner, c, &result, &result, ctx, by)
    }

    fn binds_nothing(t: &Inscription) -> String {
        let consuming: Vec<&str> = t.presets.iter().filter(|(_, p)| p.consume).map(|(n, _)| n.as_str()).collect();
        format!("a consuming preset binds no token (presets: {})", consuming.join(", "))
    }

    /// Why a fire by hand binds nothing, naming the tokens parked for the transition in the
    /// places it consumes from and how to release them: a person who fires sees a full place
    /// and needs to know why none of its tokens binds. Only for fires by hand; the fire loop
    /// tries transitions that bind nothing on every commit and drops the reason.
    fn binds_nothing_by_hand(model: &str, net: Option<&ModelNet>, t: &Inscription) -> String {
        let why = Self::binds_nothing(t);
        let Some(run) = net.and_then(|n| n.transitions.get(&t.id)) else { return why };
        let consumed: std::collections::BTreeSet<&str> =
            t.presets.values().filter(|p| p.consume).map(|p| p.place.as_str()).collect();
        let parked: Vec<&str> =
            run.parked.iter().filter(|r| consumed.contains(r.place.as_str())).map(|r| r.id.as_str()).collect();
        let Some(first) = parked.first() else { return why };
        const NAMED: usize = 3;
        let more = if parked.len() > NAMED { format!(" and {} more", parked.len() - NAMED) } else { String::new() };
        let (n, id) = (parked.len(), &t.id);
        let named = parked.iter().take(NAMED).copied().collect::<Vec<_>>().join(", ");
        format!(
            "{why}: {n} token(s) there are parked for {id} after failed fires ({named}{more}); release one with `agentos net retry {first} --model {model}` or remove it with `agentos net discard {first} --model {model}` (`agentos net parked {id} --model {model}` lists them)"
        )
    }

    /// The jq input of a fire: preset -> token (take first) or [tokens] (take all). A catalog
    /// token is looked up by `catalog`, by its id.
    fn context(
        net: &ModelNet,
        t: &Inscription,
        bound: &BTreeMap<String, Vec<TokenRef>>,
        catalog: &dyn Fn(&str) -> Option<Token>,
    ) -> Value {
        let mut ctx = serde_json::Map::new();
        for (name, refs) in bound {
            let tokens: Vec<Value> = refs
                .iter()
                .filter_map(|r| {
                    if r.place == CATALOG_PLACE {
                        catalog(&r.id).map(|t| token_json(&t))
                    } else {
                        net.token(r).map(token_json)
                    }
                })
                .collect();
            let v = match t.presets.get(name).map(|p| p.take) {
                Some(Take::All) => Value::Array(tokens),
                _ => tokens.into_iter().next().unwrap_or(Value::Null),
            };
            ctx.insert(name.clone(), v);
        }
        Value::Object(ctx)
    }

    fn consumed(t: &Inscription, bound: &BTreeMap<String, Vec<TokenRef>>) -> Vec<TokenRef> {
        bound
            .iter()
            .filter(|(n, _)| t.presets.get(*n).is_some_and(|p| p.consume))
            .flat_map(|(_, r)| r.clone())
            .collect()
    }

    /// Routes a result by the emit rules. `Err` with the reason when no rule matches.
    fn route(
        runner: &Runner,
        c: &Compiled,
        result: &Value,
        response: &Value,
        input: &Value,
        by: &[String],
    ) -> Result<Vec<NewToken>, FireError> {
        let t = &c.inscription;
        if t.emit.is_empty() {
            return Ok(Vec::new());
        }
        let scope = json!({"result": result, "response": response, "input": input});
        let mut why = Vec::new();
        for (i, rule) in t.emit.iter().enumerate() {
            if let Some(w) = &c.when[i] {
                match w.truthy(runner, &scope) {
                    Ok(true) => {}
                    Ok(false) => {
                        let hint = null_field_hint(w.source(), &scope).map(|h| format!(" ({h})")).unwrap_or_default();
                        why.push(format!("rule {i} (when {}) is false{hint}", w.source()));
                        continue;
                    }
                    Err(e) => {
                        let hint = null_field_hint(w.source(), &scope).map(|h| format!(" ({h})")).unwrap_or_default();
                        why.push(format!("rule {i}: {e}{hint}"));
                        continue;
                    }
                }
            }
            let values: Vec<Value> = match rule.from.as_str() {
                "@result" => vec![result.clone()],
                "@response" => vec![response.clone()],
                other => {
                    let preset = other.trim_start_matches("@input.");
                    match input.get(preset) {
                        Some(Value::Array(a)) => {
                            a.iter().map(|tok| tok.get("data").cloned().unwrap_or(Value::Null)).collect()
                        }
                        Some(Value::Null) | None => Vec::new(),
                        Some(tok) => vec![tok.get("data").cloned().unwrap_or(Value::Null)],
                    }
                }
            };
            if values.is_empty() {
                why.push(format!("rule {i}: {} is empty", rule.from));
                continue;
            }
            let place = t.postsets.get(&rule.to).map(|p| p.place.clone()).unwrap_or_default();
            values.iter().try_for_each(agentos_core::depth::check_token_depth).map_err(|e| e.message)?;
            return Ok(values
                .into_iter()
                .map(|data| NewToken { place: place.clone(), name: None, data, by: by.to_vec() })
                .collect());
        }
        Err(FireError::Failed(format!(
            "no emit rule matched the result ({}); the inputs stay in place",
            why.join("; ")
        )))
    }

    /// What a failed fire commits, by its transition's `retry` and `onError`: its consumed inputs
    /// wait for another attempt, park, or (after the last attempt) go to the error place as one
    /// token `{input, error, attempts, transition}`, consumed in the same event that makes it.
    /// A refusal for want of a flag or a grant (`retry` false) is not attempted again: it goes
    /// to the error place, or parks, at once.
    #[allow(clippy::too_many_arguments)]
    fn on_failure(
        &self,
        model: &str,
        c: &Compiled,
        fire: Option<&str>,
        consumed: Vec<TokenRef>,
        ctx: &Value,
        by: &[String],
        reason: String,
        retry: bool,
        response: Option<Value>,
    ) -> NetEvent {
        let t = &c.inscription;
        let failed_before = {
            let st = self.read_state();
            st.nets
                .models
                .get(model)
                .and_then(|n| n.transitions.get(&t.id))
                .map_or(0, |run| consumed.iter().map(|r| run.failed(&r.id)).max().unwrap_or(0))
        };
        let attempts = failed_before + 1;
        let error_place = t.on_error.as_ref().and_then(|e| t.postsets.get(&e.to)).map(|p| p.place.clone());
        if retry && attempts < t.max_attempts() && !consumed.is_empty() {
            let backoff = t.retry.map_or(0, |r| r.backoff_ms);
            let at = now_ms().saturating_add(i64::try_from(backoff).unwrap_or(i64::MAX));
            return NetEvent::FireFailed {
                transition: t.id.clone(),
                fire: fire.map(str::to_string),
                tokens: consumed,
                reason,
                retry_at: Some(at),
            };
        }
        match error_place {
            Some(place) if !consumed.is_empty() => {
                let mut data = json!({"input": ctx, "error": reason, "attempts": attempts, "transition": t.id});
                // The error token wraps the inputs, so it is deeper and larger than any of them:
                // one that a put would refuse parks the inputs instead, with both reasons.
                let fits = |data: &Value| {
                    agentos_core::depth::check_token_depth(data).and_then(|()| self.inner.nets.check_token_bytes(data))
                };
                // The service's answer goes with it when the token can hold it; else its status and
                // content type without the body; else the token goes without it.
                if let Some(response) = response {
                    let bare = json!({"status": response["status"], "contentType": response["contentType"]});
                    for r in [response, bare] {
                        let mut with = data.clone();
                        with["response"] = r;
                        if fits(&with).is_ok() {
                            data = with;
                            break;
                        }
                    }
                }
                let fits = fits(&data);
                if let Err(e) = fits {
                    return NetEvent::FireFailed {
                        transition: t.id.clone(),
                        fire: fire.map(str::to_string),
                        tokens: consumed,
                        reason: format!(
                            "{reason}; after {attempts} attempt(s) the inputs stay parked: the error token for {place} would be refused ({})",
                            e.message
                        ),
                        retry_at: None,
                    };
                }
                let outputs = vec![NewToken { place, name: None, data, by: by.to_vec() }];
                match fire {
                    None => NetEvent::Fired { transition: t.id.clone(), consumed, outputs },
                    Some(f) => NetEvent::FireCompleted { fire: f.to_string(), consumed, outputs },
                }
            }
            _ => NetEvent::FireFailed {
                transition: t.id.clone(),
                fire: fire.map(str::to_string),
                tokens: consumed,
                reason,
                retry_at: None,
            },
        }
    }

    /// Stops a transition that hit a limit, with the reason: an event, so it stays stopped after a restart.
    async fn stop_for(&self, model: &str, transition: &str, stop: FireError) -> Result<FireOutcome, EngineError> {
        let reason = stop.into_reason();
        tracing::warn!(%model, %transition, %reason, "transition stopped");
        let ev = NetEvent::Stopped { transition: transition.to_string(), reason: Some(reason.clone()) };
        self.commit_net("system", model, ev).await?;
        Ok(FireOutcome {
            transition: transition.to_string(),
            outcome: "stopped".into(),
            fire: None,
            reason: Some(reason),
        })
    }

    /// Tries to fire `transition` once. Synchronous kinds complete here; command and http begin here
    /// and complete in a task of their own.
    async fn try_fire(
        &self,
        model: &str,
        transition: &str,
        firer: Option<&Principal>,
    ) -> Result<FireOutcome, EngineError> {
        let manual = firer.is_some();
        let principal = firer.map_or("system", |p| p.name.as_str());
        let firer_id = firer.map(|p| p.id.clone());
        let outcome = |o: &str, fire: Option<String>, reason: Option<String>| FireOutcome {
            transition: transition.to_string(),
            outcome: o.to_string(),
            fire,
            reason,
        };
        let prepared = {
            let st = self.read_state();
            let Some(net) = st.nets.models.get(model) else {
                return Ok(outcome("not-enabled", None, Some("no net".into())));
            };
            let Some(t) = net.inscription(transition) else {
                return Ok(outcome("not-enabled", None, Some("no such transition".into())));
            };
            // A transition acts with its author's authority; one whose author is gone stops.
            let author = net.authors.get(transition).filter(|a| st.principal_by_id(a).is_some()).cloned();
            if author.is_none() {
                Err(format!(
                    "stopped: the principal who applied transition {transition:?} ({}) was revoked; apply it again to run it with someone's authority",
                    net.authors.get(transition).map_or("unknown", String::as_str)
                ))
            } else {
                let c = self
                    .compiled(model, t)
                    .map_err(|e| CoreError::internal(format!("inscription does not compile: {e}")))?;
                if net.in_flight_of(transition) >= t.concurrency as usize {
                    return Ok(outcome(
                        "not-enabled",
                        None,
                        Some(format!("{} fire(s) in flight, the concurrency limit", t.concurrency)),
                    ));
                }
                let catalog = Self::catalog_for(&st, model, net, t);
                match Self::candidates(net, &c, manual, &catalog) {
                    Some(candidates) => Ok((c, candidates)),
                    None if manual => {
                        return Ok(outcome(
                            "not-enabled",
                            None,
                            Some(Self::binds_nothing_by_hand(model, Some(net), t)),
                        ));
                    }
                    None => return Ok(outcome("not-enabled", None, Some(Self::binds_nothing(t)))),
                }
            }
        };
        let (c, candidates) = match prepared {
            Ok(p) => p,
            Err(reason) => {
                let ev = NetEvent::Stopped { transition: transition.to_string(), reason: Some(reason.clone()) };
                self.commit_net("system", model, ev).await?;
                return Ok(outcome("not-enabled", None, Some(reason)));
            }
        };
        // Filters run here, with no lock held; the commit checks that what they chose is still free.
        let bound = match Self::select(&self.inner.nets.expressions, &c, candidates) {
            Ok(Some(bound)) => bound,
            Ok(None) if manual => {
                let st = self.read_state();
                let reason = Self::binds_nothing_by_hand(model, st.nets.models.get(model), &c.inscription);
                return Ok(outcome("not-enabled", None, Some(reason)));
            }
            Ok(None) => return Ok(outcome("not-enabled", None, Some(Self::binds_nothing(&c.inscription)))),
            Err(e) => return Ok(outcome("not-enabled", None, Some(e.to_string()))),
        };
        let key = (model.to_string(), transition.to_string());
        let (ctx, by, counted) = {
            let st = self.read_state();
            let Some(net) = st.nets.models.get(model) else {
                return Ok(outcome("not-enabled", None, Some("no net".into())));
            };
            let catalog = Self::catalog_lookup(&st, model, net, &c.inscription);
            // Counted under the read lock, with the net still there: a deleted net's runtime
            // entries are forgotten after its deletion is folded, so none comes back after.
            (
                Self::context(net, &c.inscription, &bound, &catalog),
                net.behind(transition, &bound, firer_id.as_deref()),
                self.inner.nets.count_fire(&key),
            )
        };
        if let Err(reason) = counted {
            return self.stop_for(model, transition, reason).await;
        }
        if let Err(refused) = self.inner.nets.check_memory() {
            // Parked, not retried: the master is short of memory now, and a person should look.
            let reason = refused.into_reason();
            let tokens = Self::consumed(&c.inscription, &bound);
            let ev = NetEvent::FireFailed {
                transition: transition.to_string(),
                fire: None,
                tokens,
                reason: reason.clone(),
                retry_at: None,
            };
            self.commit_net(principal, model, ev).await?;
            return Ok(outcome("failed", None, Some(reason)));
        }
        // Held until the fire is committed (or, for command and http, begun): a master that dies
        // in between counts a death against this transition.
        let _firing = self.inner.nets.marker.enter(key);
        let t = &c.inscription;
        let consumed = Self::consumed(t, &bound);
        match t.kind.as_str() {
            "pass" | "map" => {
                let routed = Self::pass_or_map(&self.inner.nets.expressions, &c, &consumed, &ctx, &by);
                if let Ok(outputs) = &routed {
                    let limit = {
                        let st = self.read_state();
                        st.nets
                            .models
                            .get(model)
                            .map_or(Ok(()), |net| self.inner.nets.check_outputs(net, &consumed, outputs))
                    };
                    if let Err(reason) = limit {
                        return self.stop_for(model, transition, reason).await;
                    }
                }
                match routed {
                    Ok(outputs) => {
                        let ev = NetEvent::Fired { transition: transition.to_string(), consumed, outputs };
                        let decide = if manual {
                            self.net_event(model, ev)
                        } else {
                            Self::while_started(model, transition, self.leading(model, ev, 0))
                        };
                        match self.commit_chain(principal, model, decide).await {
                            Ok(started) => {
                                for fire in started {
                                    self.spawn_fire(model.to_string(), fire);
                                }
                                Ok(outcome("fired", None, None))
                            }
                            Err(EngineError::Core(e)) if e.kind == ErrorKind::Conflict => {
                                Ok(outcome("not-enabled", None, Some(e.message)))
                            }
                            Err(e) => Err(e),
                        }
                    }
                    Err(failed) => {
                        let retry = failed.retries();
                        let reason = failed.into_reason();
                        let ev = self.on_failure(model, &c, None, consumed, &ctx, &by, reason.clone(), retry, None);
                        self.commit_net(principal, model, ev).await?;
                        Ok(outcome("failed", None, Some(reason)))
                    }
                }
            }
            _ => {
                let ev = NetEvent::FireStarted { transition: transition.to_string(), bound, firer: firer_id };
                let decide = if manual {
                    self.net_event(model, ev)
                } else {
                    Self::while_started(model, transition, self.net_event(model, ev))
                };
                let seq = match self.submit(principal, decide).await {
                    Ok(events) => events.last().map(|e| e.seq).unwrap_or(0),
                    Err(EngineError::Core(e)) if e.kind == ErrorKind::Conflict => {
                        return Ok(outcome("not-enabled", None, Some(e.message)));
                    }
                    Err(e) => return Err(e),
                };
                let fire = fire_id(seq);
                self.spawn_fire(model.to_string(), fire.clone());
                Ok(outcome("started", Some(fire), None))
            }
        }
    }

    /// Commits a `pass` or `map` fire, and in the same commit the fires that follow it (see
    /// [`Nets::follow_on`]). Answers the fires started.
    ///
    /// Follow-on fires are the master's own: a fire by hand (`by_hand`) is recorded under its
    /// firer's name, and so would they be in its commit, so it takes none. (The fire loop
    /// builds the same decision in `try_fire`, where a fire it chose also checks its transition
    /// is still started.)
    #[cfg(test)]
    async fn commit_fired(
        &self,
        principal: &str,
        model: &str,
        fired: NetEvent,
        by_hand: bool,
    ) -> Result<Vec<String>, EngineError> {
        let decide = if by_hand { self.net_event(model, fired) } else { self.leading(model, fired, 0) };
        self.commit_chain(principal, model, decide).await
    }

    /// Commits a `pass` or `map` fire decided by `decide` (with the fires that follow it);
    /// answers the fires started.
    async fn commit_chain(
        &self,
        principal: &str,
        model: &str,
        decide: crate::committer::Decide,
    ) -> Result<Vec<String>, EngineError> {
        let events = self.submit(principal, decide).await?;
        // The leading fire was counted when it was decided.
        self.count_chained(model, &events, 1);
        Ok(Self::started_in(&events))
    }

    /// A fire the master chose (not one by hand) commits only while its transition is still
    /// started: the fire loop decides from a state read before the commit, and a stop answered
    /// in between must mean no fire after it. Refused as a conflict (the fire is not made).
    fn while_started(model: &str, transition: &str, decide: crate::committer::Decide) -> crate::committer::Decide {
        let (m, t) = (model.to_string(), transition.to_string());
        Box::new(move |st| {
            let started = st.nets.models.get(&m).and_then(|n| n.transitions.get(&t)).is_some_and(|r| r.started);
            if !started {
                return Err(CoreError::conflict(format!("transition {t:?} was stopped before its fire was committed")));
            }
            decide(st)
        })
    }

    /// Counts the chained fires a commit made (see `follow_on`) against their transitions'
    /// fires per second, past the first `skip` fires (counted by whoever decided them). A
    /// decision may be made again before it is committed, so a chain only looks at the rate
    /// and its fires count once they are in the log; a transition over its limit is stopped
    /// at its next fire by the loop.
    fn count_chained(&self, model: &str, events: &[Event], skip: usize) {
        let fires = events.iter().filter_map(|e| match &e.body {
            EventBody::Net(NetEvent::Fired { transition, .. } | NetEvent::FireStarted { transition, .. }) => {
                Some(transition)
            }
            _ => None,
        });
        // Counted under the read lock, with the net still there: a deleted net's runtime
        // entries are forgotten after its deletion is folded, so none comes back after.
        let st = self.read_state();
        if !st.nets.models.contains_key(model) {
            return;
        }
        for transition in fires.skip(skip) {
            let _ = self.inner.nets.count_fire(&(model.to_string(), transition.clone()));
        }
    }

    /// Decides `ev` and, in the same commit, the fires that follow it (see
    /// [`Nets::follow_on`]); `ahead` events of the same command are numbered before it.
    fn leading(&self, model: &str, ev: NetEvent, ahead: u64) -> crate::committer::Decide {
        let (engine, m) = (self.0.clone(), model.to_string());
        Box::new(move |st| {
            let mut out = decide_net_events(st, &m, std::slice::from_ref(&ev))?;
            let seq = match crate::committer::next_seq() {
                0 => 0,
                seq => seq + ahead,
            };
            let more = engine.nets().follow_on(st, &m, std::slice::from_ref(&ev), seq);
            out.extend(more.into_iter().map(|ev| (m.clone(), EventBody::Net(ev))));
            Ok(out)
        })
    }

    /// The fires that follow `decided` (net events of `model` to be committed from number `seq`
    /// on), decided on the net as it will be once they are folded, to go in the same commit: a
    /// command's result, the map that builds the next command from it and that command's start
    /// cost one sync to the disk instead of three, and the fire loop no turn.
    ///
    /// Only what the fire loop itself would fire next, and only while deciding it needs nothing
    /// but the net and the path lookups of plain expressions: automatic, started transitions
    /// with no filter and no catalog preset, their concurrency not reached, their author still
    /// there, their rate within the master's limit and the master below its memory cap; a
    /// `pass`, a `map` whose template and emit rules are plain paths, or the start of a
    /// command, http or mcp fire. At the first enabled transition that cannot be decided so (a
    /// filter, an expression that computes, a template that fails, outputs over a limit) the
    /// chain ends and the fire loop goes on as before, recording what it finds. The places
    /// transitions read from are copied to decide on them, so only while they hold few tokens.
    fn follow_on(&self, st: &agentos_core::state::State, model: &str, decided: &[NetEvent], seq: u64) -> Vec<NetEvent> {
        let mut out = Vec::new();
        if seq == 0 || decided.is_empty() || !self.inner.nets.runs(model) {
            return out;
        }
        let Some(net) = st.nets.models.get(model) else { return out };
        // Looked at only when some transition could follow at all, before the net is copied.
        let could = net.doc.transitions.iter().any(|t| {
            t.mode == Mode::Auto
                && matches!(t.kind.as_str(), "pass" | "map" | "command" | "http" | "mcp")
                && t.presets.values().any(|p| p.consume)
                && t.presets.values().all(|p| p.filter.is_none() && p.place != CATALOG_PLACE)
                && net.transitions.get(&t.id).is_some_and(|r| r.started)
        });
        if !could {
            return out;
        }
        // Only the places some transition reads from decide a fire: the tokens of the others (a
        // net's results, say, piling up where nothing takes them) are counted, not copied, so
        // that a net does not stop chaining once its outputs fill up.
        let read: std::collections::BTreeSet<&str> =
            net.doc.transitions.iter().flat_map(|t| t.presets.values().map(|p| p.place.as_str())).collect();
        let copied = |name: &str| read.contains(name);
        if net.places.iter().filter(|(name, _)| copied(name)).map(|(_, p)| p.tokens.len()).sum::<usize>()
            > CHAIN_MAX_TOKENS
        {
            return out;
        }
        let left_out: BTreeMap<&str, usize> = net
            .places
            .iter()
            .filter(|(name, _)| !copied(name))
            .map(|(name, p)| (name.as_str(), p.tokens.len()))
            .collect();
        let thin = agentos_core::net_state::ModelNet {
            doc: net.doc.clone(),
            places: net
                .places
                .iter()
                .map(|(name, p)| (name.clone(), if copied(name) { p.clone() } else { Default::default() }))
                .collect(),
            transitions: net.transitions.clone(),
            in_flight: net.in_flight.clone(),
            instance: net.instance.clone(),
            authors: net.authors.clone(),
        };
        let mut after = agentos_core::net_state::NetState::default();
        after.models.insert(model.to_string(), thin);
        // Tokens made in the chain carry the commit's time, as the fold will give them.
        let now = Some(crate::committer::next_time()).filter(|t| *t > 0).unwrap_or_else(now_ms);
        let mut next = seq;
        for ev in decided {
            after.apply(model, next, now, None, ev);
            next += 1;
        }
        while out.len() < CHAIN_MAX_FIRES {
            let Some(net) = after.models.get(model) else { break };
            let Some(ev) = self.next_of_chain(st, model, net, &left_out) else { break };
            after.apply(model, next, now, None, &ev);
            next += 1;
            out.push(ev);
        }
        out
    }

    /// The next fire of a chain on `net` (see [`Nets::follow_on`]), `None` when there is none
    /// or the next cannot be decided from the net alone.
    /// `net` holds no tokens of the places in `left_out`, which tells how many they hold.
    fn next_of_chain(
        &self,
        st: &agentos_core::state::State,
        model: &str,
        net: &ModelNet,
        left_out: &BTreeMap<&str, usize>,
    ) -> Option<NetEvent> {
        for t in &net.doc.transitions {
            let runs = t.mode == Mode::Auto
                && t.kind != "link"
                && t.presets.values().any(|p| p.consume)
                && net.transitions.get(&t.id).is_some_and(|r| r.started)
                && net.in_flight_of(&t.id) < t.concurrency as usize;
            if !runs {
                continue;
            }
            let c = self.compiled(model, t).ok()?;
            let Some(candidates) = Self::candidates(net, &c, false, &[]) else { continue };
            // Enabled, or blocked only by a filter not asked yet: either way the loop's business
            // unless everything below holds.
            let plain = c.filters.is_empty()
                && t.presets.values().all(|p| p.place != CATALOG_PLACE)
                && net.authors.get(&t.id).is_some_and(|a| st.principal_by_id(a).is_some());
            if !plain {
                return None;
            }
            let bound = Self::select(&self.inner.nets.expressions, &c, candidates).ok()??;
            let key = (model.to_string(), t.id.clone());
            match t.kind.as_str() {
                "pass" | "map" => {
                    let paths = c.template.as_ref().is_none_or(|tpl| tpl.paths_only())
                        && c.when.iter().flatten().all(|w| w.is_path_only());
                    if !paths || self.inner.nets.check_memory().is_err() {
                        return None;
                    }
                    let ctx = Self::context(net, t, &bound, &|_| None);
                    let by = net.behind(&t.id, &bound, None);
                    let consumed = Self::consumed(t, &bound);
                    let outputs = Self::pass_or_map(&self.inner.nets.expressions, &c, &consumed, &ctx, &by).ok()?;
                    let held = |place: &str| {
                        net.places.get(place).map_or(0, |p| p.tokens.len()) + left_out.get(place).copied().unwrap_or(0)
                    };
                    self.inner.nets.check_outputs_held(held, &consumed, &outputs).ok()?;
                    if !self.inner.nets.rate_left(&key) {
                        return None;
                    }
                    let fired = NetEvent::Fired { transition: t.id.clone(), consumed, outputs };
                    return fired.check(Some(net)).is_ok().then_some(fired);
                }
                "command" | "http" | "mcp" => {
                    if self.inner.nets.check_memory().is_err() {
                        return None;
                    }
                    if !self.inner.nets.rate_left(&key) {
                        return None;
                    }
                    let start = NetEvent::FireStarted { transition: t.id.clone(), bound, firer: None };
                    return start.check(Some(net)).is_ok().then_some(start);
                }
                _ => return None,
            }
        }
        None
    }

    /// The fires a commit's events started, from the events committed.
    fn started_in(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .filter(|e| matches!(e.body, EventBody::Net(NetEvent::FireStarted { .. })))
            .map(|e| fire_id(e.seq))
            .collect()
    }

    /// Runs the action of a fire in flight to its end: after a fresh start, or after a restart.
    fn spawn_fire(&self, model: String, fire: String) {
        let engine = self.0.clone();
        tokio::spawn(async move {
            if let Err(e) = engine.nets().complete_fire(&model, &fire).await {
                tracing::error!(%model, %fire, error = %e, "a fire could not be completed; it stays in flight until the next start");
            }
        });
    }

    async fn complete_fire(&self, model: &str, fire: &str) -> Result<(), EngineError> {
        let (c, bound, ctx, resolve_model, by, authority) = {
            let st = self.read_state();
            let net = st.nets.models.get(model).ok_or_else(|| CoreError::internal("the net is gone"))?;
            let f = net.in_flight.get(fire).ok_or_else(|| CoreError::internal("the fire is gone"))?;
            let t = net.inscription(&f.transition).ok_or_else(|| CoreError::internal("the transition is gone"))?;
            let c = self.compiled(model, t).map_err(|e| CoreError::internal(e.to_string()))?;
            let resolve = net.instance.as_ref().map(|i| i.resolve_model.clone()).unwrap_or_else(|| model.to_string());
            // Decided when the action runs (again after a restart), from who holds what now.
            let by = net.behind(&f.transition, &f.bound, f.firer.as_deref());
            let authority = Authority::of(&st, by.iter().map(String::as_str));
            let catalog = Self::catalog_lookup(&st, model, net, t);
            (c, f.bound.clone(), Self::context(net, t, &f.bound, &catalog), resolve, by, authority)
        };
        let t = &c.inscription;
        let mut secrets = Vec::new();
        // The command's job: its result, when this fire records it (with its outcome, in one
        // commit), and the step it is known as until then.
        let mut job = CommandJob::default();
        let run = FireRun { model, resolve_model: &resolve_model, authority: &authority };
        let key = (model.to_string(), t.id.clone());
        // An http answer is read into the master's memory, so the whole request counts as firing; a
        // command runs on an executor, and only what the master does with its result counts (a
        // long command under a master restarted by hand is no crash loop).
        let mut firing = matches!(t.kind.as_str(), "http" | "mcp").then(|| self.inner.nets.marker.enter(key.clone()));
        let action = match t.kind.as_str() {
            "command" => self.fire_command(&c, &bound, &ctx, &run, &mut secrets, &mut job).await,
            "http" | "mcp" if c.operation.is_some() => self.fire_operation(&c, &ctx, &run).await,
            "http" => self.fire_http(&c, &ctx, &run, &mut secrets).await,
            other => Err(FireError::Failed(format!("kind {other} does not run asynchronously"))),
        };
        let _firing = firing.take().unwrap_or_else(|| self.inner.nets.marker.enter(key));
        let failed = |reason: String, retry: bool, response: Option<Value>| {
            self.on_failure(model, &c, Some(fire), Self::consumed(t, &bound), &ctx, &by, reason, retry, response)
        };
        let ev = match action {
            Ok((result, response)) => {
                let redactor = self.principals().redactor(&secrets);
                let (result, response) = (redactor.value(result), redactor.value(response));
                match Self::route(&self.inner.nets.expressions, &c, &result, &response, &ctx, &by) {
                    Ok(outputs) => {
                        let consumed = Self::consumed(t, &bound);
                        let limit = {
                            let st = self.read_state();
                            st.nets
                                .models
                                .get(model)
                                .map_or(Ok(()), |net| self.inner.nets.check_outputs(net, &consumed, &outputs))
                        };
                        if let Err(stop) = limit {
                            let reason = stop.into_reason();
                            // The fire ends failed, its inputs parked, and the transition stops.
                            tracing::warn!(%model, transition = %t.id, %reason, "transition stopped");
                            let stop = NetEvent::Stopped { transition: t.id.clone(), reason: Some(reason.clone()) };
                            let park = NetEvent::FireFailed {
                                transition: t.id.clone(),
                                fire: Some(fire.to_string()),
                                tokens: consumed,
                                reason: reason.clone(),
                                retry_at: None,
                            };
                            let evs = [park, stop];
                            let m = model.to_string();
                            let decide: crate::committer::Decide = Box::new(move |st| decide_net_events(st, &m, &evs));
                            return self.commit_with_job(decide, job.record).await.map(|_| ());
                        }
                        NetEvent::FireCompleted { fire: fire.to_string(), consumed, outputs }
                    }
                    Err(reason) => {
                        let retry = reason.retries();
                        failed(reason.into_reason(), retry, None)
                    }
                }
            }
            Err(reason) => {
                let retry = reason.retries();
                let response = reason.response().map(|v| self.principals().redactor(&secrets).value(v.clone()));
                failed(Redactor::new(&secrets).text(reason.reason()), retry, response)
            }
        };
        // A completed fire takes the fires that follow it into its commit (see `follow_on`).
        let decide = if matches!(ev, NetEvent::FireCompleted { .. }) {
            // Its result, when recorded with it, is numbered first.
            self.leading(model, ev, u64::from(job.record.is_some()))
        } else {
            self.net_event(model, ev)
        };
        let events = self.commit_with_job(decide, job.record).await?;
        self.count_chained(model, &events, 0);
        for fire in Self::started_in(&events) {
            self.spawn_fire(model.to_string(), fire);
        }
        Ok(())
    }

    /// Commits a fire's outcome, with its command's result first when the fire records it. An
    /// outcome the log refuses (the net changed under the fire, say) leaves the result to be
    /// recorded alone: every job's result is in the log.
    async fn commit_with_job(
        &self,
        decide: crate::committer::Decide,
        job: Option<(String, EventBody)>,
    ) -> Result<Vec<Event>, EngineError> {
        let Some(job) = job else {
            return self.submit("system", decide).await;
        };
        let job_id = match &job.1 {
            EventBody::JobFinished { job_id, .. } => job_id.clone(),
            _ => String::new(),
        };
        let committed = self.commit_job_with(decide, job).await;
        // Committed, or it will not be: the job no longer reads as running.
        self.inner.dispatch.jobs.recorded_here(&job_id);
        committed
    }

    /// The commit itself: the result and the outcome in one, or the result alone when the log
    /// refuses the outcome.
    async fn commit_job_with(
        &self,
        decide: crate::committer::Decide,
        job: (String, EventBody),
    ) -> Result<Vec<Event>, EngineError> {
        let first = job.clone();
        let both: crate::committer::Decide = Box::new(move |st| {
            let mut events = vec![first.clone()];
            events.extend(decide(st)?);
            Ok(events)
        });
        match self.submit("system", both).await {
            Ok(events) => Ok(events),
            // A storage outage leaves it unknown whether the commit happened: no second try,
            // which could record the result twice. The fire stays reserved and runs again.
            Err(e @ EngineError::Core(CoreError { kind: ErrorKind::Unavailable, .. })) => Err(e),
            Err(e) => {
                let alone: crate::committer::Decide = Box::new(move |_| Ok(vec![job.clone()]));
                if let Err(e2) = self.submit("system", alone).await {
                    tracing::error!(error = %e2, "recording a net job's result failed");
                }
                Err(e)
            }
        }
    }

    /// A secret's value for one use, when the operator granted it to that use: `pinned`, a
    /// script's (id, catalog model, sha256), or `origin`, an http request's origin. `model` is
    /// the model the fire acts for (`FireRun::resolve_model`: in a tool-net instance, the model
    /// it was invoked from, never `tni-…`), against which a grant narrowed to a model is checked.
    fn granted_secret(&self, name: &str, model: &str, use_: &SecretUse) -> Result<String, FireError> {
        let granted = self.read_state().secret_grants.values().any(|g| {
            g.secret == name
                && g.model.as_deref().is_none_or(|m| m == model)
                && match (&g.to, use_) {
                    (GrantTarget::Tool { id, model, sha256 }, SecretUse::Script { id: i, model: m, sha256: s }) => {
                        id == i && model == m && sha256 == s
                    }
                    (GrantTarget::Origin { origin }, SecretUse::Origin(o)) => origin == o,
                    _ => false,
                }
        });
        if !granted {
            let (what, how) = match use_ {
                SecretUse::Script { id, model: m, .. } => {
                    let narrow = if m == agentos_core::DEFAULT_MODEL { String::new() } else { format!(" --model {m}") };
                    (format!("script {id:?} as it is pinned now"), format!("--tool {id}{narrow}"))
                }
                SecretUse::Origin(o) => (format!("requests to {o}"), format!("--origin {o}")),
            };
            // Whether the master holds the secret at all is not said: whoever reads a net's
            // errors could otherwise learn which secrets exist. The way out covers both.
            return Err(FireError::Denied(format!(
                "secret {name:?} is not granted to {what}; the operator grants it with `agentos secret grant {name} {how}` (after `agentos secret set {name}` if the master does not hold it yet)"
            )));
        }
        self.principals()
            .secret(name)
            .ok_or_else(|| FireError::Failed(format!("secret {name:?} is not set on the master")))
    }

    async fn fire_command(
        &self,
        c: &Compiled,
        bound: &BTreeMap<String, Vec<TokenRef>>,
        ctx: &Value,
        run: &FireRun<'_>,
        secrets: &mut Vec<String>,
        job: &mut CommandJob,
    ) -> Result<(Value, Value), FireError> {
        run.authority.need(Flag::Execute, "a command")?;
        let resolve_model = run.resolve_model;
        let t = &c.inscription;
        let action = c.command.clone().unwrap_or_default();
        let preset = action
            .from
            .clone()
            .or_else(|| t.presets.iter().find(|(_, p)| p.consume).map(|(n, _)| n.clone()))
            .ok_or("no preset holds the command")?;
        if bound.get(&preset).is_none_or(|r| r.is_empty()) {
            return Err(FireError::Failed(format!("preset {preset} bound no command token")));
        }
        let data = match ctx.get(&preset) {
            Some(Value::Array(a)) => a.first().and_then(|t| t.get("data")).cloned(),
            Some(tok) => tok.get("data").cloned(),
            None => None,
        }
        .ok_or("the command token has no data")?;
        let mut token: CommandToken = serde_json::from_value(data)
            .map_err(|e| format!("the token is not a command ({{executor, command, args}}): {e}"))?;
        if !token.args.is_object() {
            token.args = json!({});
        }
        let args = token.args.as_object_mut().expect("made an object above");
        for k in RESOLVED_ARGS {
            args.remove(k);
        }
        if let Some(ms) = action.timeout_ms {
            args.entry("timeoutMs").or_insert(json!(ms));
        }
        args.remove(PINNED_SHA256);
        let mut declared_env = Vec::new();
        // What the command runs decides the flag it needs: a registered script must be visible to
        // everyone behind the fire; anything else is an unregistered script.
        let script = match (token.executor.as_str(), token.command.as_str()) {
            ("script", "invoke") => {
                let id = args.get("toolId").and_then(Value::as_str).unwrap_or_default().to_string();
                let st = self.read_state();
                match st.resolve(resolve_model, &id) {
                    Some((e, _)) if e.entry.binding.kind().visible_to(run.authority.flags) => match &e.entry.binding {
                        agentos_core::entry::Binding::Script(b) => {
                            declared_env = b.env.clone();
                            Some(SecretUse::Script { id, model: e.model.to_string(), sha256: b.sha256.clone() })
                        }
                        _ => None,
                    },
                    Some(_) => {
                        return Err(FireError::Failed(format!(
                            "refused: tool {id:?} is not visible to the principals behind this fire ({})",
                            run.authority.names.join(", ")
                        )));
                    }
                    // Shipped as it is: the executor fails it with the reason, like any unresolved tool.
                    None => None,
                }
            }
            _ => {
                run.authority.need(Flag::Scripts, "a command that is not a registered script")?;
                None
            }
        };
        let env = args.entry("env").or_insert(json!({}));
        if !env.is_object() {
            *env = json!({});
        }
        if !action.credentials.is_empty() {
            let Some(use_ @ SecretUse::Script { sha256, .. }) = &script else {
                return Err(
                    "refused: credentials go only to a registered script the operator granted them to, not to a command from a token"
                        .into(),
                );
            };
            // A run that carries a secret takes from the caller's environment only the names the
            // script declared at registration.
            if let Some(vars) = env.as_object_mut() {
                vars.retain(|k, _| declared_env.contains(k));
            }
            for name in &action.credentials {
                // Resolved now, carried only in the job handed to the executor: never in a token or an event.
                let value = self.granted_secret(name, resolve_model, use_)?;
                secrets.push(value.clone());
                env[name.as_str()] = Value::String(value);
            }
            // The hand-out resolves the tool again; it must still be the script the secrets were granted to.
            args.insert(PINNED_SHA256.into(), Value::String(sha256.clone()));
        }
        let timeout_ms = token
            .args
            .get("timeoutMs")
            .and_then(Value::as_u64)
            .unwrap_or(self.inner.dispatch.config.default_timeout_ms);
        let tool_id = token.args.get("toolId").and_then(Value::as_str).map(str::to_string);
        let (job_id, mut rx) = self
            .inner
            .dispatch
            .jobs
            .enqueue_for(resolve_model.to_string(), token, action.executor.clone(), secrets.clone())
            .await
            .map_err(|e| FireError::Failed(format!("the job could not be queued: {e}")))?;
        // Known as this transition's step until the fire's outcome is recorded with its result
        // (the caller holds it), so that whoever tries to cancel it alone is told what it is.
        let of = crate::engine::NetStepOf {
            model: run.model.to_string(),
            transition: t.id.clone(),
            instance: run.model != run.resolve_model,
        };
        job.step = Some(crate::engine::NetStep::enter(&self.inner.dispatch.net_steps, &job_id, of));
        let wait = Duration::from_millis(timeout_ms) + self.inner.dispatch.config.queue_grace;
        let result: JobResult = match tokio::time::timeout(wait, &mut rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => return Err("the job ended without a result".into()),
            Err(_) => {
                self.inner.dispatch.jobs.cancel(&job_id).await;
                // Closed first: a result that comes from now on is recorded by the dispatcher,
                // and one that came just now is taken (and recorded) here.
                rx.close();
                match rx.try_recv() {
                    Ok(r) => r,
                    Err(_) => {
                        return Err(FireError::Failed(format!(
                            "no executor finished job {job_id} within {} ms",
                            wait.as_millis()
                        )));
                    }
                }
            }
        };
        if !self.inner.dispatch.jobs.is_shared() {
            // Handed over unrecorded (see `Dispatch::finish`): recorded with this fire's outcome.
            job.record = Some((
                resolve_model.to_string(),
                EventBody::JobFinished { job_id: job_id.clone(), tool_id, result: result.clone(), invoker: None },
            ));
        }
        let response = serde_json::to_value(&result).map_err(|e| e.to_string())?;
        if let Some(e) = &result.error {
            return Err(FireError::Failed(format!("command failed: {e}")));
        }
        if result.exit_code != Some(0) {
            let tail: String = result.stderr.chars().rev().take(300).collect::<Vec<_>>().into_iter().rev().collect();
            let how = match (result.exit_code, &result.signal) {
                (Some(code), _) => format!("exited with {code}"),
                (None, Some(signal)) => format!("was killed by signal {signal}"),
                (None, None) => "ended without an exit code".to_string(),
            };
            let tail = tail.trim();
            return Err(FireError::Failed(if tail.is_empty() {
                format!("command {how}")
            } else {
                format!("command {how}: {tail}")
            }));
        }
        let out = result.stdout.trim();
        let parsed = serde_json::from_str(out).unwrap_or_else(|_| Value::String(result.stdout.clone()));
        Ok((parsed, response))
    }

    async fn fire_http(
        &self,
        c: &Compiled,
        ctx: &Value,
        run: &FireRun<'_>,
        secrets: &mut Vec<String>,
    ) -> Result<(Value, Value), FireError> {
        run.authority.need(Flag::Execute, "an http action")?;
        run.authority.need(Flag::Http, "an http action")?;
        let HttpCompiled { action: h, url, headers, body } = c.http.as_ref().ok_or("no http action")?;
        let runner = &self.inner.nets.expressions;
        let no_credentials = |_: &str| None;
        let url = url.render(runner, ctx, &no_credentials)?;
        let url = url.as_str().ok_or("the url must render to a string")?.to_string();
        let parsed = reqwest::Url::parse(&url).map_err(|e| format!("the url {} is not valid: {e}", shown(&url)))?;
        // Said here, in words (reqwest says "builder error for url (…): URL scheme is not allowed").
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!(
                "the url {} has the scheme {}: an http action fetches http:// and https:// URLs only",
                shown(&url),
                shown(parsed.scheme())
            )
            .into());
        }
        // Credentials (in headers only) are resolved for this request's origin, if granted there.
        let mut values = BTreeMap::new();
        let names: std::collections::BTreeSet<String> = headers.values().flat_map(|t| t.credentials()).collect();
        if !names.is_empty() {
            let origin = crate::outbound::origin_of(&parsed).ok_or("the url has no host")?;
            for name in names {
                let v = self.granted_secret(&name, run.resolve_model, &SecretUse::Origin(origin.clone()))?;
                secrets.push(v.clone());
                values.insert(name, v);
            }
        }
        let resolve = |name: &str| values.get(name).cloned();
        let carries_secret = !values.is_empty();
        let method = reqwest::Method::from_bytes(h.method.to_uppercase().as_bytes()).map_err(|e| e.to_string())?;
        let shown_url = Redactor::new(secrets).text(&url);
        // Names are checked when they resolve; an IP literal never reaches the resolver.
        self.inner.nets.outbound.check_url(&parsed).map_err(|e| format!("{method} {shown_url} refused: {e}"))?;
        // A request that carries a secret follows redirects within its origin only: the secret
        // goes to the granted origin alone.
        let client = if carries_secret { &self.inner.nets.sealed_http } else { &self.inner.nets.http };
        let target = parsed.clone();
        let timeout_ms = h.timeout_ms.unwrap_or(30_000);
        let mut req = client.request(method.clone(), parsed).timeout(Duration::from_millis(timeout_ms));
        for (k, tpl) in headers {
            let v = tpl.render(runner, ctx, &resolve)?;
            let v = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            // Said here, naming the header (reqwest says only "failed to parse header value"
            // when it sends); the value is not shown, as it may hold a secret.
            let v = reqwest::header::HeaderValue::from_str(&v).map_err(|_| {
                format!(
                    "{method} {shown_url}: header {} is not a valid header value (a line break or another control character in it?)",
                    shown(k)
                )
            })?;
            req = req.header(k.as_str(), v);
        }
        if let Some(b) = body {
            req = req.json(&b.render(runner, ctx, &no_credentials)?);
        }
        let mut resp = crate::outbound::sending(&target, req.send()).await.map_err(|e| {
            if e.is_timeout() {
                format!("{method} {shown_url} timed out after {timeout_ms} ms")
            } else {
                format!("{method} {shown_url} failed: {}", describe(&e))
            }
        })?;
        let status = resp.status().as_u16();
        let ok = match &h.success_status {
            Some(list) => list.contains(&status),
            None => (200..300).contains(&status),
        };
        let content_type = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        if !ok {
            let reason = format!("{method} {shown_url} answered {status}");
            // What it answered goes with the error token, as a success's goes to the emit rules:
            // its JSON, else its text, else its size (an answer that cannot be read is left out).
            let Ok(bytes) = crate::bindings::http::read_answer(&mut resp).await else {
                return Err(FireError::Failed(reason));
            };
            // Redacted here too, before and after reading it as text (the result is redacted again).
            let redactor = self.principals().redactor(secrets);
            let (content_type, bytes) = crate::bindings::http::redacted_text(&redactor, content_type, bytes);
            // Cut as a named operation's is: at the inline limit, the token's own limit
            // deciding after.
            let inline = self.inner.dispatch.config.inline_output_bytes;
            let parsed = serde_json::from_slice(&bytes).ok();
            let response = crate::bindings::http::failed_response(status, &content_type, None, parsed, &bytes, inline);
            return Err(FireError::Answered(reason, Box::new(response)));
        }
        // At most as much as a named operation's answer: an endless body fails the fire rather
        // than fill the master.
        use crate::bindings::http::{AnswerError, MAX_ANSWER_BYTES, read_answer};
        let bytes = read_answer(&mut resp).await.map_err(|e| match e {
            AnswerError::TooLarge => format!("{method} {shown_url}: the answer is over {MAX_ANSWER_BYTES} bytes"),
            AnswerError::TimedOut => format!("{method} {shown_url} timed out after {timeout_ms} ms"),
            AnswerError::Failed(e) => format!("{method} {shown_url}: reading the answer: {}", describe(&e)),
        })?;
        // Redacted here too, before and after reading it as text (the result is redacted again).
        let redactor = self.principals().redactor(secrets);
        let (content_type, bytes) = crate::bindings::http::redacted_text(&redactor, content_type, bytes);
        let body_value = match serde_json::from_slice(&bytes) {
            Ok(v) => v,
            Err(_) => match String::from_utf8(bytes) {
                Ok(text) => Value::String(text),
                Err(e) => {
                    // Bytes that are not text (an image, a PDF) would be mangled in a string: they
                    // go to the blob store, readable in the model the fire acts for, and the
                    // result is the blob's reference, as for a named operation's answer.
                    let bytes = e.into_bytes();
                    let size = bytes.len();
                    let (_, blob) = self
                        .dispatch()
                        .shape_output_kept(run.resolve_model, bytes, true)
                        .await
                        .map_err(|e| format!("keeping the answer of {method} {shown_url}: {e}"))?;
                    let blob = serde_json::to_value(blob).map_err(|e| e.to_string())?;
                    let of = if content_type.is_empty() { String::new() } else { format!(" of {content_type}") };
                    let body = format!("{size} bytes{of}, not text: the bytes are in bodyBlob");
                    let response =
                        json!({"status": status, "contentType": content_type, "body": body, "bodyBlob": blob});
                    return Ok((blob, response));
                }
            },
        };
        let response = json!({"status": status, "contentType": content_type, "body": body_value});
        Ok((body_value, response))
    }

    /// An `http` or `mcp` action naming a registered operation: called as a shell command calls
    /// it, with the flags of everyone behind the fire (`x`, and `h` for an http service or `m`
    /// for an MCP server, and the entry visible to them), in the model the fire acts for. An
    /// http answer is `@response` and its body the result; an MCP tool's output is both.
    async fn fire_operation(&self, c: &Compiled, ctx: &Value, run: &FireRun<'_>) -> Result<(Value, Value), FireError> {
        let t = &c.inscription;
        let (kind, flag, what) = match t.kind.as_str() {
            "mcp" => (BindingKind::Mcp, Flag::Mcp, "an mcp action"),
            _ => (BindingKind::Http, Flag::Http, "an http action"),
        };
        run.authority.need(Flag::Execute, what)?;
        run.authority.need(flag, what)?;
        let OperationCompiled { action, input } = c.operation.as_ref().ok_or("no named operation")?;
        let no_credentials = |_: &str| None;
        let input = match input {
            Some(t) => t.render(&self.inner.nets.expressions, ctx, &no_credentials)?,
            None => json!({}),
        };
        let entry = {
            let st = self.read_state();
            st.resolve(run.resolve_model, &action.tool).map(|(e, _)| e.clone())
        };
        // A container serves HTTP as a service does: an `http` action calls it too, with `d`.
        let entry = entry.filter(|e| {
            let k = e.entry.binding.kind();
            (k == kind || (kind == BindingKind::Http && k == BindingKind::Docker)) && k.visible_to(run.authority.flags)
        });
        if let Some(e) = &entry
            && e.entry.binding.kind() == BindingKind::Docker
        {
            run.authority.need(Flag::Docker, "an http action calling a container")?;
        }
        let entry = entry
            .ok_or_else(|| {
                let service = if kind == BindingKind::Mcp { "MCP server" } else { "http service" };
                FireError::Failed(format!(
                    "no {service} {:?} visible to the principals behind this fire ({}) in model {:?} nor in the global catalog",
                    action.tool,
                    run.authority.names.join(", "),
                    run.resolve_model
                ))
            })?;
        let (tool, name) = (action.tool.as_str(), action.operation.as_str());
        // A template's hole over a field the token lacks renders `null`: taken as left out, as the
        // request's build has always taken it, not as a value of the wrong type.
        // The rendered input is checked against the operation's whole schema, as a shell
        // command's or an MCP client's call is, before anything is sent, with the defaults they
        // get filled in.
        let op = self.inner.catalog.prepared.find(&entry, tool, name).map_err(|e| FireError::Failed(e.to_string()))?;
        let input = match input {
            Value::Object(o) => {
                Value::Object(op.table.with_defaults(o.into_iter().filter(|(_, v)| !v.is_null()).collect()))
            }
            other => other,
        };
        op.validate(&input).map_err(|e| FireError::Failed(format!("the input of {tool} {name}: {}", e.0)))?;
        let call = crate::bindings::ValueCall {
            id: tool,
            model: run.resolve_model,
            entry,
            tool: name,
            op,
            input,
            timeout_ms: action.timeout_ms,
        };
        // A credential not granted to the service is the operator's to grant: not retried.
        let failed = |e: EngineError| match e {
            e if e.kind() == ErrorKind::Forbidden => FireError::Denied(e.to_string()),
            EngineError::Core(CoreError { message, response: Some(response), .. }) => {
                FireError::Answered(message, response)
            }
            e => FireError::Failed(e.to_string()),
        };
        if kind == BindingKind::Mcp {
            let output = crate::bindings::mcp::call_operation(self, &call).await.map_err(failed)?;
            return Ok((output.clone(), output));
        }
        let answer = if call.entry.entry.binding.kind() == BindingKind::Docker {
            crate::bindings::docker::call_operation(self, &call).await
        } else {
            crate::bindings::http::call_operation(self, &call).await
        }
        .map_err(failed)?;
        let body = self.whole_body(&answer).await?;
        Ok((body, answer))
    }

    /// An http answer's body as a fire's result. The answer shows a large body, or one that is
    /// not text, as a preview beside its blob (`bodyBlob`); the result is what the blob holds
    /// instead: its JSON parsed when the answer is JSON, its text when it is text, or the blob's
    /// reference when the bytes are not text or are more than a token holds.
    async fn whole_body(&self, answer: &Value) -> Result<Value, FireError> {
        let Some(blob) = answer.get("bodyBlob") else {
            return Ok(answer.get("body").cloned().unwrap_or(Value::Null));
        };
        let size = blob.get("sizeBytes").and_then(Value::as_u64).unwrap_or(u64::MAX);
        // The body's own size first, so a body far too large is not read at all (0: no limit).
        let max = self.inner.nets.limits.max_token_bytes;
        if max != 0 && size > max as u64 {
            return Ok(blob.clone());
        }
        let urn = blob.get("urn").and_then(Value::as_str).unwrap_or_default();
        let bytes = self
            .dispatch()
            .read_output(urn, size)
            .await
            .map_err(|e| FireError::Failed(format!("reading the answer's body back: {e}")))?;
        let json = answer.get("contentType").and_then(Value::as_str).is_some_and(|t| t.contains("json"));
        let value =
            match (json.then(|| serde_json::from_slice::<Value>(&bytes).ok()).flatten(), String::from_utf8(bytes)) {
                (Some(v), _) => v,
                (None, Ok(text)) => Value::String(text),
                (None, Err(_)) => return Ok(blob.clone()),
            };
        // Then as a token stores it: escaping can make text longer than its bytes.
        Ok(if self.inner.nets.check_token_bytes(&value).is_ok() { value } else { blob.clone() })
    }

    /// Whether an automatic transition is worth a try: each place it consumes from holds a
    /// token (free or not), or its author is gone (the try stops it). Every commit runs the
    /// loop, and a try of a transition that binds nothing built its catalog and its reason for
    /// nothing: with several started transitions per net, most of the loop's time.
    fn may_bind(st: &agentos_core::state::State, net: &ModelNet, t: &Inscription) -> bool {
        let author_gone = net.authors.get(&t.id).is_none_or(|a| st.principal_by_id(a).is_none());
        author_gone
            || t.presets
                .values()
                .filter(|p| p.consume && p.place != CATALOG_PLACE)
                .all(|p| net.places.get(&p.place).is_some_and(|place| !place.tokens.is_empty()))
    }

    /// One pass over every started transition that may bind: fire what is enabled, until
    /// nothing more fires.
    async fn run_enabled(&self) {
        for _round in 0..10_000 {
            let candidates: Vec<(String, String)> = {
                let st = self.read_state();
                st.nets
                    .models
                    .iter()
                    .filter(|(m, _)| self.inner.nets.runs(m))
                    .flat_map(|(m, net)| {
                        net.doc
                            .transitions
                            .iter()
                            .filter(|t| t.mode == Mode::Auto && t.kind != "link")
                            .filter(|t| t.presets.values().any(|p| p.consume))
                            .filter(|t| net.transitions.get(&t.id).is_some_and(|r| r.started))
                            .filter(|t| net.in_flight_of(&t.id) < t.concurrency as usize)
                            .filter(|t| Self::may_bind(&st, net, t))
                            .map(|t| (m.clone(), t.id.clone()))
                            .collect::<Vec<_>>()
                    })
                    .collect()
            };
            let mut fired = false;
            for (m, t) in candidates {
                match self.try_fire(&m, &t, None).await {
                    Ok(o) if o.outcome != "not-enabled" => fired = true,
                    Ok(_) => {}
                    Err(e) => tracing::warn!(model = %m, transition = %t, error = %e, "fire failed"),
                }
            }
            if !fired {
                return;
            }
        }
    }

    /// Fires the scheduled transitions that are due; answers how long until the next is.
    async fn run_schedules(&self) -> Duration {
        let now = tokio::time::Instant::now();
        let scheduled: Vec<(String, String, agentos_core::net::Schedule)> = {
            let st = self.read_state();
            st.nets
                .models
                .iter()
                .filter(|(m, _)| self.inner.nets.runs(m))
                .flat_map(|(m, net)| {
                    net.doc
                        .transitions
                        .iter()
                        .filter(|t| t.schedule.is_some() && net.transitions.get(&t.id).is_some_and(|r| r.started))
                        .map(|t| (m.clone(), t.id.clone(), t.schedule.clone().expect("filtered")))
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        let mut next = Duration::from_secs(1);
        let mut fire_now = Vec::new();
        {
            let mut due = self.inner.nets.due.lock().unwrap_or_else(|e| e.into_inner());
            due.retain(|k, _| scheduled.iter().any(|(m, t, _)| &k.0 == m && &k.1 == t));
            for (m, t, s) in &scheduled {
                let key = (m.clone(), t.clone());
                let Some(step) = interval_of(s) else {
                    due.insert(key.clone(), now + NEVER_DUE);
                    continue;
                };
                let step = step.max(Duration::from_millis(1));
                let at = *due.entry(key.clone()).or_insert(now + step);
                if at <= now {
                    fire_now.push(key.clone());
                    // An interval keeps its rhythm from the last due time; a cron time is computed afresh.
                    let next_at = if s.every_ms.is_some() { (at + step).max(now) } else { now + step };
                    due.insert(key, next_at);
                }
                let at = due[&(m.clone(), t.clone())];
                next = next.min(at.saturating_duration_since(now));
            }
        }
        for (m, t) in fire_now {
            if let Err(e) = self.try_fire(&m, &t, None).await {
                tracing::warn!(model = %m, transition = %t, error = %e, "scheduled fire failed");
            }
        }
        next
    }

    /// Stops the transitions that were firing at the master's last deaths in a row, before
    /// anything fires or any request is answered (`Engine::open` calls it): their fires in
    /// flight fail (inputs parked) instead of running again.
    pub(crate) async fn stop_crash_looping(&self) {
        let looping = std::mem::take(&mut *self.inner.nets.crash_looping.lock().unwrap_or_else(|e| e.into_inner()));
        for CrashLooping { model, transition, deaths } in looping {
            let reason = format!(
                "stopped at start: the master died {deaths} times in a row while transition {transition:?} was firing; its inputs are parked: look at them with `agentos net parked --model {model}`, release each with `agentos net retry TOKEN --model {model}` (or drop it with `net discard`), then start it again"
            );
            tracing::error!(%model, %transition, deaths, "a transition was firing at every recent death of the master; it starts stopped");
            let (m, t, why) = (model.clone(), transition.clone(), reason.clone());
            let stopped = self.submit("system", Box::new(move |st| decide_stop_crash_looping(st, &m, &t, &why))).await;
            if let Err(e) = stopped {
                tracing::error!(%model, %transition, error = %e, "stopping a crash-looping transition failed");
            }
        }
    }

    /// How long until the first token waiting out a retry backoff may bind again.
    fn next_retry(&self) -> Option<Duration> {
        let st = self.read_state();
        let now = now_ms();
        // Only backoffs still running: one already over waits for whatever else keeps it from firing.
        let first = st
            .nets
            .models
            .values()
            .flat_map(|n| n.transitions.values().filter(|r| r.started))
            .flat_map(|r| r.attempts.values().filter_map(|a| a.retry_at))
            .filter(|at| *at > now)
            .min()?;
        Some(Duration::from_millis(u64::try_from(first - now).unwrap_or(0)))
    }

    /// On a shared log: takes the locks of the models with a net this master does not run yet
    /// and nobody else holds, and resumes their fires in flight (whose master died).
    async fn claim_models(&self) {
        let Some(owners) = self.inner.nets.owners.clone() else { return };
        let wanted: Vec<String> = {
            let st = self.read_state();
            st.nets
                .models
                .iter()
                .filter(|(m, n)| {
                    !m.starts_with(INSTANCE_PREFIX)
                        && !owners.holds(m)
                        && (!n.in_flight.is_empty() || n.transitions.values().any(|r| r.started))
                })
                .map(|(m, _)| m.clone())
                .collect()
        };
        if wanted.is_empty() {
            return;
        }
        let taken = owners.claim(&wanted).await;
        if !taken.is_empty() {
            tracing::info!(models = ?taken, "running the fires of these models from now on");
            self.inner.dispatch.jobs.drop_orphans(&taken).await;
            self.resume_fires(Some(&taken));
        }
    }

    /// Re-runs the fires that were in flight when the master stopped (or, on a shared log,
    /// when the master that ran a model now taken over stopped), of the models this master runs
    /// (`only`: of these models alone).
    fn resume_fires(&self, only: Option<&[String]>) {
        // Fires that were in flight when the master stopped are run to their end.
        let pending: Vec<(String, String)> = {
            let st = self.read_state();
            st.nets
                .models
                .iter()
                .filter(|(m, _)| self.inner.nets.runs(m) && only.is_none_or(|o| o.contains(m)))
                .flat_map(|(m, n)| n.in_flight.keys().map(move |f| (m.clone(), f.clone())))
                .collect()
        };
        for (m, f) in pending {
            tracing::info!(model = %m, fire = %f, "resuming a fire that was in flight");
            self.spawn_fire(m, f);
        }
    }

    /// Runs a tool net: an isolated instance of its net, the input in its input place, the
    /// first token of its output place as the answer.
    pub(crate) async fn invoke_toolnet(&self, p: &Principal, call: ToolnetCall<'_>) -> Result<Value, EngineError> {
        let ToolnetCall { id, author, resolve_model, doc, input_place, output_place, input, timeout } = call;
        // The input becomes a token: the same rules as a put, before an instance exists.
        agentos_core::depth::check_token_depth(&input)?;
        self.inner.nets.check_token_bytes(&input)?;
        let n = self.inner.nets.next_instance.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let instance_model = format!(
            "{INSTANCE_PREFIX}{:x}-{}-{n}",
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0),
            self.inner.nets.instance_tag
        );
        let mut events = self.subscribe();
        let inst = Instance {
            toolnet: id.to_string(),
            invoker: p.id.clone(),
            resolve_model: resolve_model.to_string(),
            output_place: output_place.to_string(),
        };
        let (m, ip) = (instance_model.clone(), input_place.to_string());
        self.submit(&p.name, Box::new(move |_| decide_create_instance(&m, &doc, &inst, &author, &ip, &input))).await?;
        // A caller that goes away drops this future wherever it waits: the instance goes then,
        // rather than running on (and a schedule or a loop in it firing) until the next start.
        let mut abandoned = AbandonedInstance { engine: Some(self.0.clone()), instance: instance_model.clone() };
        let deadline = tokio::time::Instant::now() + timeout;
        // Since when a step failed and nothing has run since (see `stuck`).
        let mut stuck_since: Option<tokio::time::Instant> = None;
        let answer = loop {
            let stuck_now = {
                let st = self.read_state();
                let net = st.nets.models.get(&instance_model);
                if let Some(tok) = net.and_then(|n| n.places.get(output_place)).and_then(|pl| pl.tokens.values().next())
                {
                    break Ok(tok.data.clone());
                }
                net.is_some_and(stuck)
            };
            let now = tokio::time::Instant::now();
            stuck_since = if stuck_now { stuck_since.or(Some(now)) } else { None };
            let failed = stuck_since.is_some_and(|since| now >= since + STUCK_QUIET);
            let wake = match stuck_since {
                Some(since) if !failed => deadline.min(since + STUCK_QUIET),
                _ => deadline,
            };
            let heard =
                if failed { Err(()) } else { tokio::time::timeout_at(wake, events.recv()).await.map_err(|_| ()) };
            match heard {
                Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => continue,
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    break Err(CoreError::internal("the engine stopped").into());
                }
                // Quiet for a while after a step failed: looked at again, and said if still stuck.
                Err(()) if !failed && tokio::time::Instant::now() < deadline => continue,
                Err(()) => {
                    let st = self.read_state();
                    let held: Vec<String> = st
                        .nets
                        .models
                        .get(&instance_model)
                        .map(|n| {
                            n.places
                                .iter()
                                .filter(|(_, pl)| !pl.tokens.is_empty())
                                .map(|(id, pl)| format!("{id} ({} token(s))", pl.tokens.len()))
                                .collect()
                        })
                        .unwrap_or_default();
                    let errors: Vec<String> = st
                        .nets
                        .models
                        .get(&instance_model)
                        .map(|n| {
                            n.transitions
                                .iter()
                                .filter_map(|(t, r)| r.last_error.as_ref().map(|e| format!("{t}: {e}")))
                                .collect()
                        })
                        .unwrap_or_default();
                    let stopped_at =
                        if held.is_empty() { "no place (no token left)".to_string() } else { held.join(", ") };
                    let errors =
                        if errors.is_empty() { String::new() } else { format!("; errors: {}", errors.join("; ")) };
                    break Err(if failed {
                        CoreError::new(
                            ErrorKind::ToolFailed,
                            "toolnet_failed",
                            format!(
                                "tool net {id:?} failed: a step failed and nothing else can run, so no output will come in {output_place:?}; it stopped at {stopped_at}{errors}"
                            ),
                        )
                    } else {
                        CoreError::new(
                            ErrorKind::Unavailable,
                            "toolnet_timeout",
                            format!(
                                "tool net {id:?} gave no output in {output_place:?} within {} ms; it stopped at {stopped_at}{errors}",
                                timeout.as_millis(),
                            ),
                        )
                    }
                    .into());
                }
            }
        };
        // The instance is done either way; its events stay in the log.
        self.delete_instance(&instance_model).await;
        abandoned.engine = None;
        answer
    }

    /// Deletes a tool-net instance: its model and net leave the state (one `Deleted` event) and
    /// the runtime forgets what it kept for its transitions. One already gone is left as it is.
    async fn delete_instance(&self, instance: &str) {
        if !self.read_state().nets.models.contains_key(instance) {
            return;
        }
        match self.commit_net("system", instance, NetEvent::Deleted).await {
            // After the fold: a fire that read the net before it went has counted by now.
            Ok(_) => self.inner.nets.forget_model(instance),
            Err(e) => tracing::warn!(%instance, error = %e, "removing a tool net instance failed"),
        }
    }

    /// Deletes the tool-net instances a master that died left behind, before anything fires
    /// (`Engine::open` calls it). An instance answers its invoker synchronously and is no job, so
    /// its invoker heard of the failure as its connection dropped with the master; nobody waits
    /// for the instance now, and its fires in flight must not run again.
    pub(crate) async fn sweep_instances(&self) {
        // On a shared log, only this master's own: the others' may be under way.
        let shared = self.inner.nets.owners.is_some();
        let left: Vec<(String, String, String)> = {
            let st = self.read_state();
            st.nets
                .models
                .iter()
                .filter(|(m, _)| !shared || self.inner.nets.made(m))
                .filter_map(|(m, n)| n.instance.as_ref().map(|i| (m.clone(), i.toolnet.clone(), i.invoker.clone())))
                .collect()
        };
        if left.is_empty() {
            return;
        }
        self.inner
            .nets
            .crash_looping
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|c| !left.iter().any(|(m, _, _)| *m == c.model));
        for (instance, toolnet, invoker) in left {
            tracing::warn!(%instance, %toolnet, %invoker, "deleting a tool-net instance left by a master that stopped during its invocation");
            self.delete_instance(&instance).await;
        }
    }
}

/// A tool-net instance whose invocation has not answered: deleted, on a task of its own, if the
/// invocation is dropped first (its caller's connection closed, an MCP call cancelled).
struct AbandonedInstance {
    /// `None` once the invocation deleted the instance itself.
    engine: Option<Engine>,
    instance: String,
}

impl Drop for AbandonedInstance {
    fn drop(&mut self) {
        let Some(engine) = self.engine.take() else { return };
        let instance = std::mem::take(&mut self.instance);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            tracing::info!(%instance, "a tool-net invocation was abandoned: deleting its instance");
            runtime.spawn(async move { engine.nets().delete_instance(&instance).await });
        }
    }
}

/// How often a master of a shared log tries to take the models nobody runs.
const CLAIM_EVERY: Duration = Duration::from_secs(1);

/// Whether a committed event may enable a transition, so that the fire loop looks again. Only
/// the result of a job a caller invoked directly, never a net's, cannot: it is the one event
/// most commits of a master that runs tools hold, and waking the loop for it cost a task switch
/// per call.
pub(crate) fn may_enable_a_fire(ev: &Event) -> bool {
    !matches!(&ev.body, EventBody::JobFinished { invoker: Some(_), .. })
}

/// The fire loop: woken by every commit that may enable a fire (see [`may_enable_a_fire`]), by
/// start and stop, and by schedules. It holds the engine only while it works, so dropping every
/// `Engine` ends it.
pub(crate) async fn net_loop(weak: std::sync::Weak<crate::engine::Inner>) {
    let wake = match weak.upgrade() {
        Some(inner) => {
            let engine = Engine { inner };
            engine.nets().resume_fires(None);
            engine.inner.clone()
        }
        None => return,
    };
    let wake = Arc::downgrade(&wake);
    let mut last_claim: Option<tokio::time::Instant> = None;
    loop {
        let wait = {
            let Some(inner) = weak.upgrade() else { return };
            let engine = Engine { inner };
            let nets = engine.nets();
            // On a shared log, take over the models no live master runs (about every second).
            if engine.inner.nets.owners.is_some() && last_claim.is_none_or(|t| t.elapsed() >= CLAIM_EVERY) {
                last_claim = Some(tokio::time::Instant::now());
                nets.claim_models().await;
            }
            nets.run_enabled().await;
            let wait = nets.run_schedules().await;
            let wait = if engine.inner.nets.owners.is_some() { wait.min(CLAIM_EVERY) } else { wait };
            nets.next_retry().map_or(wait, |r| wait.min(r))
        };
        let Some(w) = wake.upgrade() else { return };
        // A wake while the loop worked is kept (one permit), so no commit goes unseen; several
        // are one pass.
        tokio::select! {
            _ = w.nets.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// When an emit rule's expression reads a field at the top of its input, where the input holds
/// only `result`, `response` and `input`, and that field is present in the result or a bound
/// token: says where it is. `when: ".v > 10"` was false for every token, with a reason that
/// named the rule and not the mistake.
fn null_field_hint(src: &str, scope: &Value) -> Option<String> {
    let bytes = src.as_bytes();
    for (i, _) in src.match_indices('.') {
        // A path's first field: not after a name, a closing bracket, a string or another dot.
        let after_path = i > 0
            && matches!(bytes[i - 1], b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b']' | b')' | b'"' | b'.' | b'$' | b'?');
        if after_path {
            continue;
        }
        let name: String = src[i + 1..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if name.is_empty() || scope.get(&name).is_some() {
            continue;
        }
        let mut guesses = Vec::new();
        if scope["result"].get(&name).is_some() {
            guesses.push(format!("`.result.{name}`"));
        }
        for (preset, bound) in scope["input"].as_object().into_iter().flatten() {
            match bound {
                Value::Array(tokens) if tokens.iter().any(|t| t["data"].get(&name).is_some()) => {
                    guesses.push(format!("`.input.{preset}[].data.{name}`"))
                }
                token if token["data"].get(&name).is_some() => guesses.push(format!("`.input.{preset}.data.{name}`")),
                _ => {}
            }
        }
        if !guesses.is_empty() {
            return Some(format!(
                "`.{name}` is null here; rules see {{result, response, input}}: did you mean {}?",
                guesses.join(" or ")
            ));
        }
    }
    None
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn interval_of(s: &agentos_core::net::Schedule) -> Option<Duration> {
    if let Some(ms) = s.every_ms {
        return Some(Duration::from_millis(ms));
    }
    let cron: cron::Schedule = s.cron.as_deref()?.parse().ok()?;
    let next = cron.upcoming(chrono::Utc).next()?;
    // A time already passed (the clock moved): due now.
    Some((next - chrono::Utc::now()).to_std().unwrap_or_default())
}

/// A schedule that never comes due (refused when a net is applied; one applied before that rule
/// may still be in the log) waits this long between looks, and never fires.
const NEVER_DUE: Duration = Duration::from_secs(3600);

/// How long a tool-net instance stays [`stuck`] before its caller is told it failed: the loop
/// that fires what is enabled runs after each commit, so a step that can still take the failed
/// step's token (an error path) starts well within it.
const STUCK_QUIET: Duration = Duration::from_secs(1);

/// Whether a tool-net instance can no longer give an output by itself: a step failed on a token
/// and parked it, no fire is under way, none waits to retry, no transition runs on a schedule,
/// and no started automatic transition has a token free for each of its input arcs (one that
/// does could still fire: an error path that takes the failed step's token, say; a filter it
/// may not pass counts as passing, so the check errs towards waiting). Its caller is then told
/// at once (after [`STUCK_QUIET`]) rather than at its timeout.
fn stuck(net: &agentos_core::net_state::ModelNet) -> bool {
    let could_fire = |t: &agentos_core::net::Inscription| {
        t.mode == agentos_core::net::Mode::Auto
            && net.transitions.get(&t.id).is_some_and(|r| r.started)
            && t.presets.values().all(|arc| {
                arc.place == CATALOG_PLACE
                    || net.places.get(&arc.place).is_some_and(|p| {
                        p.tokens.keys().any(|id| {
                            net.available(
                                &agentos_core::net_state::TokenRef { place: arc.place.clone(), id: id.clone() },
                                &t.id,
                            )
                        })
                    })
            })
    };
    net.in_flight.is_empty()
        && net.transitions.values().any(|t| !t.parked.is_empty())
        && net.transitions.values().all(|t| t.attempts.values().all(|a| a.retry_at.is_none()))
        && net.doc.transitions.iter().all(|t| t.schedule.is_none() && !could_fire(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(src: &str, scope: Value, expected: Option<&str>) {
        assert_eq!(null_field_hint(src, &scope).as_deref(), expected, "{src}");
    }

    #[test]
    fn a_rule_reading_a_field_of_the_token_at_the_top_is_told_where_it_is() {
        let scope = json!({"result": {"v": 11}, "response": {"v": 11}, "input": {"x": {"id": "t", "data": {"v": 11}}}});
        check(
            ".v > 10",
            scope.clone(),
            Some(
                "`.v` is null here; rules see {result, response, input}: did you mean `.result.v` or `.input.x.data.v`?",
            ),
        );
        check(".result.v > 10", scope.clone(), None);
        check(".input.x.data.v > 10", scope.clone(), None);
        check(".nowhere > 1", scope, None);
        let all = json!({"result": 1, "response": 1, "input": {"xs": [{"data": {"n": 1}}]}});
        check(
            "(.n // 0) > 0",
            all,
            Some("`.n` is null here; rules see {result, response, input}: did you mean `.input.xs[].data.n`?"),
        );
    }
}
