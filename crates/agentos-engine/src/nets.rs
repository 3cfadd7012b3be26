//! The net engine: applies nets, binds tokens, fires transitions (synchronous kinds in one
//! event, command and http with a reservation first), routes results by emit rules, runs
//! schedules, recovers fires that were in flight when the master stopped, and runs tool nets.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use agentos_core::event::{Event, EventBody};
use agentos_core::expr::{Expr, Template};
use agentos_core::flags::Flag;
use agentos_core::job::{CommandToken, JobResult, RESOLVED_ARGS};
use agentos_core::name::check_model_name;
use agentos_core::net::{CommandAction, HttpAction, Inscription, MapAction, Mode, NetDoc, Take};
use agentos_core::net_state::{Instance, ModelNet, NetEvent, NewToken, Token, TokenRef, fire_id};
use agentos_core::{CoreError, ErrorKind};

use crate::outbound::describe;
use crate::redact::Redactor;
use crate::{Engine, EngineError, Principal};

/// Compiled expressions of one inscription, built once per applied version.
struct Compiled {
    inscription: Inscription,
    filters: BTreeMap<String, Expr>,
    template: Option<Template>,
    when: Vec<Option<Expr>>,
    http: Option<HttpCompiled>,
    command: Option<CommandAction>,
}

impl Compiled {
    fn new(t: &Inscription) -> Result<Compiled, String> {
        let mut filters = BTreeMap::new();
        for (name, p) in &t.presets {
            if let Some(f) = &p.filter {
                filters.insert(name.clone(), Expr::compile(f)?);
            }
        }
        let when = t.emit.iter().map(|r| r.when.as_deref().map(Expr::compile).transpose()).collect::<Result<_, _>>()?;
        let template = match t.kind.as_str() {
            "map" => {
                let m: MapAction = serde_json::from_value(t.action.clone()).map_err(|e| e.to_string())?;
                Some(Template::compile(&m.template).map_err(|(p, e)| format!("{p}: {e}"))?)
            }
            _ => None,
        };
        let http = match t.kind.as_str() {
            "http" => {
                let h: HttpAction = serde_json::from_value(t.action.clone()).map_err(|e| e.to_string())?;
                let url = Template::compile(&h.url).map_err(|(p, e)| format!("url{p}: {e}"))?;
                let mut headers = BTreeMap::new();
                for (k, v) in &h.headers {
                    headers.insert(k.clone(), Template::compile(v).map_err(|(p, e)| format!("headers/{k}{p}: {e}"))?);
                }
                let body =
                    h.body.as_ref().map(Template::compile).transpose().map_err(|(p, e)| format!("body{p}: {e}"))?;
                Some(HttpCompiled { action: h, url, headers, body })
            }
            _ => None,
        };
        let command = match t.kind.as_str() {
            "command" if t.action.is_null() => Some(CommandAction::default()),
            "command" => Some(serde_json::from_value(t.action.clone()).map_err(|e| e.to_string())?),
            _ => None,
        };
        Ok(Compiled { inscription: t.clone(), filters, template, when, http, command })
    }
}

/// An http action with its templates compiled.
struct HttpCompiled {
    action: HttpAction,
    url: Template,
    headers: BTreeMap<String, Template>,
    body: Option<Template>,
}

/// A tool net invocation.
pub(crate) struct ToolnetCall<'a> {
    pub id: &'a str,
    /// Scripts inside resolve local first in this model.
    pub resolve_model: &'a str,
    pub doc: NetDoc,
    pub input_place: &'a str,
    pub output_place: &'a str,
    pub input: Value,
    pub timeout: Duration,
}

/// The engine's part that runs nets.
#[derive(Default)]
pub(crate) struct NetRuntime {
    compiled: Mutex<HashMap<(String, String), Arc<Compiled>>>,
    /// When each scheduled transition fires next.
    due: Mutex<HashMap<(String, String), tokio::time::Instant>>,
    wake: tokio::sync::Notify,
    next_instance: std::sync::atomic::AtomicU64,
}

/// Where a net stands, for `GET /api/models/{m}/net`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetView {
    pub model: String,
    #[schema(value_type = Object)]
    pub doc: Value,
    pub places: Vec<PlaceSummary>,
    pub transitions: Vec<TransitionSummary>,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlaceSummary {
    pub id: String,
    pub tokens: usize,
    pub reserved: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FireOutcome {
    pub transition: String,
    /// `fired` (done), `started` (a command or http action runs), `failed` (inputs kept), `not-enabled`.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fire: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn token_json(t: &Token) -> Value {
    serde_json::to_value(t).unwrap_or(Value::Null)
}

fn need(p: &Principal, flag: Flag, what: &str) -> Result<(), EngineError> {
    Ok(crate::engine::require(p, flag, what)?)
}

impl Engine {
    fn net_event(&self, model: &str, ev: NetEvent) -> crate::committer::Decide {
        let model = model.to_string();
        Box::new(move |st| {
            ev.check(st.nets.nets.get(&model)).map_err(CoreError::conflict)?;
            Ok(vec![(model.clone(), EventBody::Net(ev.clone()))])
        })
    }

    /// Commits one net event; answers its sequence number.
    async fn commit_net(&self, principal: &str, model: &str, ev: NetEvent) -> Result<u64, EngineError> {
        let events = self.submit(principal, self.net_event(model, ev)).await?;
        Ok(events.last().map(|e| e.seq).unwrap_or(0))
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.inner.events.subscribe()
    }

    /// `POST /api/models`: creates an empty model. Needs `w`.
    pub async fn create_model(&self, p: &Principal, name: &str) -> Result<(), EngineError> {
        need(p, Flag::Write, "create models")?;
        check_model_name(name)?;
        let name = name.to_string();
        self.submit(
            &p.name,
            Box::new(move |st| {
                if st.model_exists(&name) {
                    return Err(CoreError::conflict(format!("model {name:?} exists")));
                }
                Ok(vec![(name.clone(), EventBody::ModelCreated { name: name.clone() })])
            }),
        )
        .await?;
        Ok(())
    }

    /// Validates a whole net document first, then makes it the model's net. Needs `w`.
    pub async fn apply_net(&self, p: &Principal, model: &str, doc: NetDoc) -> Result<NetView, EngineError> {
        need(p, Flag::Write, "author nets")?;
        check_model_name(model)?;
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
        let m = model.to_string();
        self.submit(
            &p.name,
            Box::new(move |st| {
                if let Some(net) = st.nets.nets.get(&m) {
                    if net.instance.is_some() {
                        return Err(CoreError::conflict(format!("{m:?} is a tool net instance")));
                    }
                    let places = doc.place_ids();
                    for (id, place) in &net.places {
                        if !places.contains(id.as_str()) && !place.tokens.is_empty() {
                            return Err(CoreError::conflict(format!(
                                "place {id:?} still holds {} token(s); the new net must keep it",
                                place.tokens.len()
                            )));
                        }
                    }
                    for f in net.in_flight.values() {
                        let same =
                            doc.transitions.iter().find(|t| t.id == f.transition) == net.inscription(&f.transition);
                        if !same {
                            return Err(CoreError::conflict(format!(
                                "transition {:?} has a fire in flight; stop it and wait before changing it",
                                f.transition
                            )));
                        }
                    }
                }
                let mut events = Vec::new();
                if !st.model_exists(&m) {
                    events.push((m.clone(), EventBody::ModelCreated { name: m.clone() }));
                }
                events.push((m.clone(), EventBody::Net(NetEvent::Applied { doc: doc.clone(), instance: None })));
                Ok(events)
            }),
        )
        .await?;
        self.inner.nets.compiled.lock().unwrap_or_else(|e| e.into_inner()).retain(|(mm, _), _| mm != model);
        self.net_view(p, model)
    }

    pub fn net_view(&self, p: &Principal, model: &str) -> Result<NetView, EngineError> {
        need(p, Flag::Read, "read nets")?;
        check_model_name(model)?;
        let st = self.read_state();
        let net = st.nets.nets.get(model).ok_or_else(|| CoreError::not_found(format!("model {model:?} has no net")))?;
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
        need(p, Flag::Read, "read tokens")?;
        let st = self.read_state();
        let net = st.nets.nets.get(model).ok_or_else(|| CoreError::not_found(format!("model {model:?} has no net")))?;
        let place = net
            .places
            .get(place)
            .ok_or_else(|| CoreError::not_found(format!("model {model:?} has no place {place:?}")))?;
        Ok(place.tokens.values().cloned().collect())
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
        let put = NetEvent::TokensPut {
            tokens: vec![NewToken { place: place.to_string(), name: name.clone(), data: data.clone() }],
        };
        let events = self.submit(&p.name, self.net_event(model, put)).await.map_err(|e| match e {
            EngineError::Core(c) if c.kind == ErrorKind::Conflict => CoreError::not_found(c.message).into(),
            other => other,
        })?;
        // Answered from the committed event: by now a transition may already have taken the token.
        let ev = events.last().ok_or_else(|| CoreError::internal("a token put committed no event"))?;
        Ok(Token {
            id: agentos_core::net_state::token_id(ev.seq, 0),
            name,
            created_at: agentos_core::event::format_time(ev.time),
            data,
        })
    }

    /// Links declared in any model whose either end is in `model`.
    pub fn links(&self, p: &Principal, model: &str) -> Result<Vec<LinkView>, EngineError> {
        need(p, Flag::Read, "read links")?;
        let st = self.read_state();
        let mut out = Vec::new();
        for (owner, net) in &st.nets.nets {
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

    /// Starts (fires whenever enabled) or stops a transition. Needs `x`.
    pub async fn set_started(
        &self,
        p: &Principal,
        model: &str,
        transition: &str,
        started: bool,
    ) -> Result<(), EngineError> {
        need(p, Flag::Execute, "start or stop transitions")?;
        let t = transition.to_string();
        let ev = if started { NetEvent::Started { transition: t } } else { NetEvent::Stopped { transition: t } };
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

    /// Fires a transition once, started or not, parked tokens included. Needs `x`.
    pub async fn fire_once(&self, p: &Principal, model: &str, transition: &str) -> Result<FireOutcome, EngineError> {
        need(p, Flag::Execute, "fire transitions")?;
        {
            let st = self.read_state();
            let net =
                st.nets.nets.get(model).ok_or_else(|| CoreError::not_found(format!("model {model:?} has no net")))?;
            let t = net
                .inscription(transition)
                .ok_or_else(|| CoreError::not_found(format!("no transition {transition:?} in {model:?}")))?;
            if t.kind == "link" {
                return Err(CoreError::bad_input("not_firing", "a link never fires").into());
            }
        }
        self.try_fire(model, transition, true, &p.name).await
    }

    fn compiled(&self, model: &str, t: &Inscription) -> Result<Arc<Compiled>, String> {
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

    /// Finds tokens for every preset; `None` when a consuming preset binds nothing.
    fn bind(net: &ModelNet, c: &Compiled, manual: bool) -> Result<Option<BTreeMap<String, Vec<TokenRef>>>, String> {
        let t = &c.inscription;
        let mut bound = BTreeMap::new();
        let mut used = std::collections::BTreeSet::new();
        for (name, preset) in &t.presets {
            let Some(place) = net.places.get(&preset.place) else { return Ok(None) };
            let limit = match preset.take {
                Take::First => 1,
                Take::All => preset.limit.unwrap_or(usize::MAX),
            };
            let mut refs = Vec::new();
            for token in place.tokens.values() {
                if refs.len() >= limit {
                    break;
                }
                let r = TokenRef { place: preset.place.clone(), id: token.id.clone() };
                let free = if manual { !place.reserved.contains_key(&token.id) } else { net.available(&r, &t.id) };
                if !free || used.contains(&r) {
                    continue;
                }
                if let Some(f) = c.filters.get(name) {
                    match f.truthy(&token_json(token)) {
                        Ok(true) => {}
                        Ok(false) => continue,
                        Err(e) => return Err(format!("preset {name}: filter failed on token {}: {e}", token.id)),
                    }
                }
                used.insert(r.clone());
                refs.push(r);
            }
            if refs.is_empty() && preset.consume {
                return Ok(None);
            }
            bound.insert(name.clone(), refs);
        }
        Ok(Some(bound))
    }

    /// The jq input of a fire: preset -> token (take first) or [tokens] (take all).
    fn context(net: &ModelNet, t: &Inscription, bound: &BTreeMap<String, Vec<TokenRef>>) -> Value {
        let mut ctx = serde_json::Map::new();
        for (name, refs) in bound {
            let tokens: Vec<Value> = refs.iter().filter_map(|r| net.token(r)).map(token_json).collect();
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
    fn route(c: &Compiled, result: &Value, response: &Value, input: &Value) -> Result<Vec<NewToken>, String> {
        let t = &c.inscription;
        if t.emit.is_empty() {
            return Ok(Vec::new());
        }
        let scope = json!({"result": result, "response": response, "input": input});
        let mut why = Vec::new();
        for (i, rule) in t.emit.iter().enumerate() {
            if let Some(w) = &c.when[i] {
                match w.truthy(&scope) {
                    Ok(true) => {}
                    Ok(false) => {
                        why.push(format!("rule {i} (when {}) is false", w.source()));
                        continue;
                    }
                    Err(e) => {
                        why.push(format!("rule {i}: {e}"));
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
            return Ok(values.into_iter().map(|data| NewToken { place: place.clone(), name: None, data }).collect());
        }
        Err(format!("no emit rule matched the result ({}); the inputs stay in place", why.join("; ")))
    }

    /// Tries to fire `transition` once. Synchronous kinds complete here; command and http begin here
    /// and complete in a task of their own.
    async fn try_fire(
        &self,
        model: &str,
        transition: &str,
        manual: bool,
        principal: &str,
    ) -> Result<FireOutcome, EngineError> {
        let outcome = |o: &str, fire: Option<String>, reason: Option<String>| FireOutcome {
            transition: transition.to_string(),
            outcome: o.to_string(),
            fire,
            reason,
        };
        let (c, bound, ctx) = {
            let st = self.read_state();
            let Some(net) = st.nets.nets.get(model) else {
                return Ok(outcome("not-enabled", None, Some("no net".into())));
            };
            let Some(t) = net.inscription(transition) else {
                return Ok(outcome("not-enabled", None, Some("no such transition".into())));
            };
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
            match Self::bind(net, &c, manual) {
                Ok(Some(bound)) => {
                    let ctx = Self::context(net, t, &bound);
                    (c, bound, ctx)
                }
                Ok(None) => {
                    let empty: Vec<&str> =
                        t.presets.iter().filter(|(_, p)| p.consume).map(|(n, _)| n.as_str()).collect();
                    return Ok(outcome(
                        "not-enabled",
                        None,
                        Some(format!("a consuming preset binds no token (presets: {})", empty.join(", "))),
                    ));
                }
                Err(e) => return Ok(outcome("not-enabled", None, Some(e))),
            }
        };
        let t = &c.inscription;
        let consumed = Self::consumed(t, &bound);
        match t.kind.as_str() {
            "pass" | "map" => {
                let result = if t.kind == "map" {
                    let tpl = c.template.as_ref().expect("map compiles a template");
                    match tpl.render(&ctx, &|name| self.credential(name)) {
                        Ok(v) => Ok(v),
                        Err(e) => Err(format!("the template failed: {e}")),
                    }
                } else {
                    // pass hands on the data of what it consumed.
                    let first = consumed.first().and_then(|r| {
                        ctx.as_object()?.values().find(|v| v.get("id").and_then(Value::as_str) == Some(&r.id)).cloned()
                    });
                    Ok(first.and_then(|tok| tok.get("data").cloned()).unwrap_or(Value::Null))
                };
                let routed = result.and_then(|r| Self::route(&c, &r, &r, &ctx));
                match routed {
                    Ok(outputs) => {
                        let ev = NetEvent::Fired { transition: transition.to_string(), consumed, outputs };
                        match self.commit_net(principal, model, ev).await {
                            Ok(_) => Ok(outcome("fired", None, None)),
                            Err(EngineError::Core(e)) if e.kind == ErrorKind::Conflict => {
                                Ok(outcome("not-enabled", None, Some(e.message)))
                            }
                            Err(e) => Err(e),
                        }
                    }
                    Err(reason) => {
                        let tokens: Vec<TokenRef> = bound.values().flatten().cloned().collect();
                        let ev = NetEvent::FireFailed {
                            transition: transition.to_string(),
                            fire: None,
                            tokens,
                            reason: reason.clone(),
                        };
                        self.commit_net(principal, model, ev).await?;
                        Ok(outcome("failed", None, Some(reason)))
                    }
                }
            }
            _ => {
                let ev = NetEvent::FireStarted { transition: transition.to_string(), bound };
                let seq = match self.commit_net(principal, model, ev).await {
                    Ok(seq) => seq,
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

    /// Runs the action of a fire in flight to its end: after a fresh start, or after a restart.
    fn spawn_fire(&self, model: String, fire: String) {
        let engine = self.clone();
        tokio::spawn(async move {
            if let Err(e) = engine.complete_fire(&model, &fire).await {
                tracing::error!(%model, %fire, error = %e, "a fire could not be completed; it stays in flight until the next start");
            }
        });
    }

    async fn complete_fire(&self, model: &str, fire: &str) -> Result<(), EngineError> {
        let (c, bound, ctx, resolve_model) = {
            let st = self.read_state();
            let net = st.nets.nets.get(model).ok_or_else(|| CoreError::internal("the net is gone"))?;
            let f = net.in_flight.get(fire).ok_or_else(|| CoreError::internal("the fire is gone"))?;
            let t = net.inscription(&f.transition).ok_or_else(|| CoreError::internal("the transition is gone"))?;
            let c = self.compiled(model, t).map_err(CoreError::internal)?;
            let resolve = net.instance.as_ref().map(|i| i.resolve_model.clone()).unwrap_or_else(|| model.to_string());
            (c, f.bound.clone(), Self::context(net, t, &f.bound), resolve)
        };
        let t = &c.inscription;
        let mut secrets = Vec::new();
        let action = match t.kind.as_str() {
            "command" => self.run_command(&c, &bound, &ctx, &resolve_model, &mut secrets).await,
            "http" => self.run_http(&c, &ctx, &mut secrets).await,
            other => Err(format!("kind {other} does not run asynchronously")),
        };
        let ev = match action {
            Ok((result, response)) => {
                let redactor = Redactor::new(&secrets);
                let (result, response) = (redactor.value(result), redactor.value(response));
                match Self::route(&c, &result, &response, &ctx) {
                    Ok(outputs) => {
                        NetEvent::FireCompleted { fire: fire.to_string(), consumed: Self::consumed(t, &bound), outputs }
                    }
                    Err(reason) => NetEvent::FireFailed {
                        transition: t.id.clone(),
                        fire: Some(fire.to_string()),
                        tokens: bound.values().flatten().cloned().collect(),
                        reason,
                    },
                }
            }
            Err(reason) => {
                let reason = Redactor::new(&secrets).text(&reason);
                NetEvent::FireFailed {
                    transition: t.id.clone(),
                    fire: Some(fire.to_string()),
                    tokens: bound.values().flatten().cloned().collect(),
                    reason,
                }
            }
        };
        self.commit_net("system", model, ev).await?;
        Ok(())
    }

    /// A credential's value, held by the master: a secret of that name, else
    /// `AGENTOS_CREDENTIAL_<NAME>` from the master's environment (upper case, '-' as '_').
    pub(crate) fn credential(&self, name: &str) -> Option<String> {
        self.secret(name).or_else(|| (self.inner.credentials)(name))
    }

    async fn run_command(
        &self,
        c: &Compiled,
        bound: &BTreeMap<String, Vec<TokenRef>>,
        ctx: &Value,
        resolve_model: &str,
        secrets: &mut Vec<String>,
    ) -> Result<(Value, Value), String> {
        let t = &c.inscription;
        let action = c.command.clone().unwrap_or_default();
        let preset = action
            .from
            .clone()
            .or_else(|| t.presets.iter().find(|(_, p)| p.consume).map(|(n, _)| n.clone()))
            .ok_or("no preset holds the command")?;
        if bound.get(&preset).is_none_or(|r| r.is_empty()) {
            return Err(format!("preset {preset} bound no command token"));
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
        let env = args.entry("env").or_insert(json!({}));
        if !env.is_object() {
            *env = json!({});
        }
        for name in &action.credentials {
            // Resolved now, carried only in the job handed to the executor: never in a token or an event.
            let value = self.credential(name).ok_or_else(|| format!("credential {name:?} is not set on the master"))?;
            secrets.push(value.clone());
            env[name.as_str()] = Value::String(value);
        }
        let timeout_ms =
            token.args.get("timeoutMs").and_then(Value::as_u64).unwrap_or(self.inner.dispatch.default_timeout_ms);
        let (job_id, rx) =
            self.inner.jobs.enqueue_for(resolve_model.to_string(), token, action.executor.clone(), secrets.clone());
        let wait = Duration::from_millis(timeout_ms) + self.inner.dispatch.queue_grace;
        let result: JobResult = match tokio::time::timeout(wait, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => return Err("the job ended without a result".into()),
            Err(_) => {
                self.inner.jobs.cancel(&job_id);
                return Err(format!("no executor finished job {job_id} within {} ms", wait.as_millis()));
            }
        };
        let response = serde_json::to_value(&result).map_err(|e| e.to_string())?;
        if let Some(e) = &result.error {
            return Err(format!("command failed: {e}"));
        }
        if result.exit_code != Some(0) {
            let tail: String = result.stderr.chars().rev().take(300).collect::<Vec<_>>().into_iter().rev().collect();
            return Err(format!(
                "command exited with {:?} (signal {:?}): {}",
                result.exit_code,
                result.signal,
                tail.trim()
            ));
        }
        let out = result.stdout.trim();
        let parsed = serde_json::from_str(out).unwrap_or_else(|_| Value::String(result.stdout.clone()));
        Ok((parsed, response))
    }

    async fn run_http(&self, c: &Compiled, ctx: &Value, secrets: &mut Vec<String>) -> Result<(Value, Value), String> {
        let HttpCompiled { action: h, url, headers, body } = c.http.as_ref().ok_or("no http action")?;
        let resolve = |name: &str| self.credential(name);
        for tpl in std::iter::once(url).chain(headers.values()).chain(body.iter()) {
            for name in tpl.credentials() {
                let v =
                    self.credential(&name).ok_or_else(|| format!("credential {name:?} is not set on the master"))?;
                secrets.push(v);
            }
        }
        let url = url.render(ctx, &resolve)?;
        let url = url.as_str().ok_or("the url must render to a string")?.to_string();
        let method = reqwest::Method::from_bytes(h.method.to_uppercase().as_bytes()).map_err(|e| e.to_string())?;
        let shown_url = Redactor::new(secrets).text(&url);
        let parsed = reqwest::Url::parse(&url).map_err(|e| format!("the url {shown_url} is invalid: {e}"))?;
        // Names are checked when they resolve; an IP literal never reaches the resolver.
        self.inner.config.outbound.check_url(&parsed).map_err(|e| format!("{method} {shown_url} refused: {e}"))?;
        let mut req = self
            .inner
            .http
            .request(method.clone(), parsed)
            .timeout(Duration::from_millis(h.timeout_ms.unwrap_or(30_000)));
        for (k, tpl) in headers {
            let v = tpl.render(ctx, &resolve)?;
            let v = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            req = req.header(k.as_str(), v);
        }
        if let Some(b) = body {
            req = req.json(&b.render(ctx, &resolve)?);
        }
        let resp = req.send().await.map_err(|e| format!("{method} {shown_url} failed: {}", describe(&e)))?;
        let status = resp.status().as_u16();
        let content_type = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let bytes = resp.bytes().await.map_err(|e| format!("reading the answer of {shown_url}: {e}"))?;
        let body_value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        let response = json!({"status": status, "contentType": content_type, "body": body_value});
        let ok = match &h.success_status {
            Some(list) => list.contains(&status),
            None => (200..300).contains(&status),
        };
        if !ok {
            return Err(format!("{method} {shown_url} answered {status}"));
        }
        Ok((body_value, response))
    }

    /// One pass over every started transition: fire what is enabled, until nothing more fires.
    async fn run_enabled(&self) {
        for _round in 0..10_000 {
            let candidates: Vec<(String, String)> = {
                let st = self.read_state();
                st.nets
                    .nets
                    .iter()
                    .flat_map(|(m, net)| {
                        net.doc
                            .transitions
                            .iter()
                            .filter(|t| t.mode == Mode::Auto && t.kind != "link")
                            .filter(|t| t.presets.values().any(|p| p.consume))
                            .filter(|t| net.transitions.get(&t.id).is_some_and(|r| r.started))
                            .filter(|t| net.in_flight_of(&t.id) < t.concurrency as usize)
                            .map(|t| (m.clone(), t.id.clone()))
                            .collect::<Vec<_>>()
                    })
                    .collect()
            };
            let mut fired = false;
            for (m, t) in candidates {
                match self.try_fire(&m, &t, false, "system").await {
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
                .nets
                .iter()
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
                let step = interval_of(s).unwrap_or(Duration::from_secs(1)).max(Duration::from_millis(1));
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
            if let Err(e) = self.try_fire(&m, &t, false, "system").await {
                tracing::warn!(model = %m, transition = %t, error = %e, "scheduled fire failed");
            }
        }
        next
    }

    /// Re-runs the fires that were in flight when the master stopped.
    fn resume_fires(&self) {
        // Fires that were in flight when the master stopped are run to their end.
        let pending: Vec<(String, String)> = {
            let st = self.read_state();
            st.nets.nets.iter().flat_map(|(m, n)| n.in_flight.keys().map(move |f| (m.clone(), f.clone()))).collect()
        };
        for (m, f) in pending {
            tracing::info!(model = %m, fire = %f, "resuming a fire that was in flight");
            self.spawn_fire(m, f);
        }
    }

    /// Runs a tool net: an isolated instance of its net, the input in its input place, the
    /// first token of its output place as the answer.
    pub(crate) async fn invoke_toolnet(&self, p: &Principal, call: ToolnetCall<'_>) -> Result<Value, EngineError> {
        let ToolnetCall { id, resolve_model, doc, input_place, output_place, input, timeout } = call;
        let n = self.inner.nets.next_instance.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let instance_model = format!(
            "tni-{:x}-{n}",
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0)
        );
        let mut events = self.subscribe();
        let inst = Instance {
            toolnet: id.to_string(),
            resolve_model: resolve_model.to_string(),
            output_place: output_place.to_string(),
        };
        let (m, ip) = (instance_model.clone(), input_place.to_string());
        self.submit(
            &p.name,
            Box::new(move |_| {
                let mut evs = vec![
                    (m.clone(), EventBody::ModelCreated { name: m.clone() }),
                    (m.clone(), EventBody::Net(NetEvent::Applied { doc: doc.clone(), instance: Some(inst.clone()) })),
                ];
                for t in doc.transitions.iter().filter(|t| t.kind != "link") {
                    evs.push((m.clone(), EventBody::Net(NetEvent::Started { transition: t.id.clone() })));
                }
                evs.push((
                    m.clone(),
                    EventBody::Net(NetEvent::TokensPut {
                        tokens: vec![NewToken { place: ip.clone(), name: None, data: input.clone() }],
                    }),
                ));
                Ok(evs)
            }),
        )
        .await?;
        let deadline = tokio::time::Instant::now() + timeout;
        let answer = loop {
            if let Some(tok) = self
                .read_state()
                .nets
                .nets
                .get(&instance_model)
                .and_then(|n| n.places.get(output_place))
                .and_then(|pl| pl.tokens.values().next().cloned())
            {
                break Ok(tok.data);
            }
            match tokio::time::timeout_at(deadline, events.recv()).await {
                Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => continue,
                Ok(Err(broadcast::error::RecvError::Closed)) => {
                    break Err(CoreError::internal("the engine stopped").into());
                }
                Err(_) => {
                    let st = self.read_state();
                    let held: Vec<String> = st
                        .nets
                        .nets
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
                        .nets
                        .get(&instance_model)
                        .map(|n| {
                            n.transitions
                                .iter()
                                .filter_map(|(t, r)| r.last_error.as_ref().map(|e| format!("{t}: {e}")))
                                .collect()
                        })
                        .unwrap_or_default();
                    break Err(CoreError::new(
                        ErrorKind::Unavailable,
                        "toolnet_timeout",
                        format!(
                            "tool net {id:?} gave no output in {output_place:?} within {} ms; it stopped at {}{}",
                            timeout.as_millis(),
                            if held.is_empty() { "no place (no token left)".to_string() } else { held.join(", ") },
                            if errors.is_empty() { String::new() } else { format!("; errors: {}", errors.join("; ")) }
                        ),
                    )
                    .into());
                }
            }
        };
        // The instance is done either way; its events stay in the log.
        let cleanup = self.commit_net("system", &instance_model, NetEvent::Deleted).await;
        if let Err(e) = cleanup {
            tracing::warn!(instance = %instance_model, error = %e, "removing a tool net instance failed");
        }
        answer
    }
}

/// The fire loop: woken by every commit, by start and stop, and by schedules. It holds the
/// engine only while it works, so dropping every `Engine` ends it.
pub(crate) async fn net_loop(weak: std::sync::Weak<crate::engine::Inner>) {
    let (mut events, wake) = match weak.upgrade() {
        Some(inner) => {
            let engine = Engine { inner };
            engine.resume_fires();
            (engine.subscribe(), engine.inner.clone())
        }
        None => return,
    };
    let wake = Arc::downgrade(&wake);
    loop {
        let wait = {
            let Some(inner) = weak.upgrade() else { return };
            let engine = Engine { inner };
            engine.run_enabled().await;
            engine.run_schedules().await
        };
        let Some(w) = wake.upgrade() else { return };
        tokio::select! {
            r = events.recv() => {
                if let Err(broadcast::error::RecvError::Closed) = r { return; }
                // Take everything already there: one pass serves them all.
                while events.try_recv().is_ok() {}
            }
            _ = w.nets.wake.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

fn interval_of(s: &agentos_core::net::Schedule) -> Option<Duration> {
    if let Some(ms) = s.every_ms {
        return Some(Duration::from_millis(ms));
    }
    let cron: cron::Schedule = s.cron.as_deref()?.parse().ok()?;
    let next = cron.upcoming(chrono::Utc).next()?;
    (next - chrono::Utc::now()).to_std().ok()
}
