//! The running state of nets, folded from net events: each model's applied net, the tokens in
//! its places (with reservations by fires in flight), and each transition's run state.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::CoreError;
use crate::net::{Inscription, NetDoc};

/// A token: JSON data with metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Token {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub created_at: String,
    pub data: Value,
    /// The ids of the principals behind the token: who put it, or the author of the transition
    /// that produced it plus everyone behind that fire's inputs. A fire acts with the flags they
    /// all hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by: Vec<String>,
}

/// A token to be created by an event; its id comes from the event's sequence number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewToken {
    pub place: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub data: Value,
    /// Principal ids behind the token (see [`Token::by`]), sorted and without duplicates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by: Vec<String>,
}

/// A token named by its place.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TokenRef {
    pub place: String,
    pub id: String,
}

/// Id of the `i`-th token created by event `seq`; zero-padded so ids sort in creation order.
pub fn token_id(seq: u64, i: usize) -> String {
    format!("tok-{seq:012}-{i}")
}

/// Id of the fire begun by event `seq`.
pub fn fire_id(seq: u64) -> String {
    format!("fire-{seq:012}")
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlaceState {
    pub tokens: BTreeMap<String, Token>,
    /// token id -> the fire holding it.
    pub reserved: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TransitionRun {
    pub started: bool,
    /// Tokens this transition will not bind again, started or fired by hand, until they are
    /// released (`Unparked`) or its inscription changes: a fire on them failed or matched no
    /// emit rule, and refiring would fail the same way.
    pub parked: BTreeSet<TokenRef>,
    pub last_error: Option<String>,
    pub fires: u64,
    /// token id -> why the fire that parked it failed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parked_why: BTreeMap<String, String>,
    /// token id -> the failed fires of this transition on it, and when it may bind again.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attempts: BTreeMap<String, Attempts>,
}

/// Failed fires of one transition on one token.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempts {
    pub failed: u32,
    /// Unix ms before which the transition does not bind it again (its retry backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<i64>,
}

impl TransitionRun {
    /// Forgets what failed: parked tokens and attempts.
    fn forget_failures(&mut self) {
        self.parked.clear();
        self.parked_why.clear();
        self.attempts.clear();
    }

    /// Forgets one token (consumed, discarded, or released by hand).
    fn forget(&mut self, r: &TokenRef) {
        self.parked.remove(r);
        self.parked_why.remove(&r.id);
        self.attempts.remove(&r.id);
    }

    /// Failed fires on `token` so far.
    pub fn failed(&self, token: &str) -> u32 {
        self.attempts.get(token).map_or(0, |a| a.failed)
    }
}

/// A fire whose action runs: its bound tokens are reserved.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InFlight {
    pub transition: String,
    /// preset -> bound tokens, in binding order.
    pub bound: BTreeMap<String, Vec<TokenRef>>,
    pub started_at: i64,
    /// The id of the principal who fired it by hand; its authority joins the fire's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firer: Option<String>,
}

/// What a tool net instance runs for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    pub toolnet: String,
    /// The id of the principal that invoked it: the instance is its alone.
    #[serde(default)]
    pub invoker: String,
    /// Scripts inside resolve local first in this model.
    pub resolve_model: String,
    pub output_place: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelNet {
    pub doc: NetDoc,
    pub places: BTreeMap<String, PlaceState>,
    pub transitions: BTreeMap<String, TransitionRun>,
    pub in_flight: BTreeMap<String, InFlight>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<Instance>,
    /// transition -> the id of the principal who applied its current inscription.
    #[serde(default)]
    pub authors: BTreeMap<String, String>,
}

impl ModelNet {
    pub fn inscription(&self, id: &str) -> Option<&Inscription> {
        self.doc.transitions.iter().find(|t| t.id == id)
    }

    pub fn token(&self, r: &TokenRef) -> Option<&Token> {
        self.places.get(&r.place).and_then(|p| p.tokens.get(&r.id))
    }

    /// Whether a token is there and free for `transition` to bind.
    pub fn available(&self, r: &TokenRef, transition: &str) -> bool {
        // Catalog tokens are only ever read (a consuming arc on them is refused when applied).
        if r.place == crate::CATALOG_PLACE {
            return true;
        }
        let Some(place) = self.places.get(&r.place) else { return false };
        place.tokens.contains_key(&r.id)
            && !place.reserved.contains_key(&r.id)
            && !self.transitions.get(transition).is_some_and(|t| t.parked.contains(r))
    }

    /// The principal ids behind a fire: the transition's author, everyone behind its bound tokens,
    /// whoever fired it by hand, and in a tool-net instance its invoker, so a fire that binds
    /// none of the invoker's tokens (a scheduled one, one reading only the catalog) still acts
    /// with no more than the invoker holds. Sorted, without duplicates.
    pub fn behind(
        &self,
        transition: &str,
        bound: &BTreeMap<String, Vec<TokenRef>>,
        firer: Option<&str>,
    ) -> Vec<String> {
        let mut ids: BTreeSet<String> = BTreeSet::new();
        if let Some(a) = self.authors.get(transition) {
            ids.insert(a.clone());
        }
        for r in bound.values().flatten() {
            if let Some(t) = self.token(r) {
                ids.extend(t.by.iter().cloned());
            }
        }
        if let Some(f) = firer {
            ids.insert(f.to_string());
        }
        // Instances recorded before invokers were (an empty id) have none to add.
        if let Some(i) = self.instance.as_ref().filter(|i| !i.invoker.is_empty()) {
            ids.insert(i.invoker.clone());
        }
        ids.into_iter().collect()
    }

    pub fn in_flight_of(&self, transition: &str) -> usize {
        self.in_flight.values().filter(|f| f.transition == transition).count()
    }

    fn add(&mut self, seq: u64, time: &str, tokens: &[NewToken]) {
        for (i, t) in tokens.iter().enumerate() {
            let token = Token {
                id: token_id(seq, i),
                name: t.name.clone(),
                created_at: time.to_string(),
                data: t.data.clone(),
                by: t.by.clone(),
            };
            self.places.entry(t.place.clone()).or_default().tokens.insert(token.id.clone(), token);
        }
    }

    fn take(&mut self, refs: &[TokenRef]) {
        for r in refs {
            if let Some(p) = self.places.get_mut(&r.place) {
                p.tokens.remove(&r.id);
                p.reserved.remove(&r.id);
            }
        }
        self.forget(refs);
    }

    /// No transition holds `refs` parked or counts failures on them any more.
    fn forget(&mut self, refs: &[TokenRef]) {
        for run in self.transitions.values_mut() {
            if !run.parked.is_empty() || !run.attempts.is_empty() {
                refs.iter().for_each(|r| run.forget(r));
            }
        }
    }

    fn release(&mut self, fire: &str) {
        for p in self.places.values_mut() {
            p.reserved.retain(|_, f| f != fire);
        }
    }
}

/// Every model's net.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetState {
    /// By model name. (Stored as `nets` in snapshots.)
    #[serde(rename = "nets")]
    pub models: BTreeMap<String, ModelNet>,
}

/// The net events, as the fold sees them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NetEvent {
    /// A net document became the model's net. Changed transitions are stopped.
    Applied {
        doc: NetDoc,
        instance: Option<Instance>,
        /// The id of the principal whose authority the changed transitions carry. Absent in
        /// events written before authors were recorded: the event's principal then.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        author: Option<String>,
    },
    /// The model's net and its tokens are gone (a finished tool net instance).
    Deleted,
    TokensPut {
        tokens: Vec<NewToken>,
    },
    /// A transition fires whenever enabled (or on its schedule). The tokens it parked stay
    /// parked; events written before this rule released them, and replay now keeps them parked
    /// (a person releases them; nothing refires on its own).
    Started {
        transition: String,
    },
    Stopped {
        transition: String,
        /// Why the master stopped it (its author was revoked, say); absent when a person did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// A fire of a synchronous kind, in one step: inputs consumed, outputs produced.
    Fired {
        transition: String,
        consumed: Vec<TokenRef>,
        outputs: Vec<NewToken>,
    },
    /// An asynchronous fire began: its tokens are reserved until it completes or fails.
    FireStarted {
        transition: String,
        bound: BTreeMap<String, Vec<TokenRef>>,
        /// The id of the principal who fired it by hand.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        firer: Option<String>,
    },
    FireCompleted {
        fire: String,
        consumed: Vec<TokenRef>,
        outputs: Vec<NewToken>,
    },
    /// A fire that failed or matched no emit rule: inputs stay where they are, parked for this
    /// transition, or, with `retryAt`, waiting until then for another attempt.
    FireFailed {
        transition: String,
        fire: Option<String>,
        tokens: Vec<TokenRef>,
        reason: String,
        /// Unix ms of the next attempt; absent: the tokens park.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_at: Option<i64>,
    },
    /// Parked tokens released by hand: every transition may bind them again, attempts forgotten.
    Unparked {
        tokens: Vec<TokenRef>,
    },
    /// Parked tokens removed by hand.
    Discarded {
        tokens: Vec<TokenRef>,
    },
}

impl NetEvent {
    /// Whether applying it to `net` is still sound: the tokens it names are there and free.
    /// Checked when an event is decided, so a race between two fires loses cleanly: a conflict
    /// that says what moved.
    pub fn check(&self, net: Option<&ModelNet>) -> Result<(), CoreError> {
        self.unsound(net).map_err(CoreError::conflict)
    }

    /// Why applying it to `net` is not sound, if it is not.
    fn unsound(&self, net: Option<&ModelNet>) -> Result<(), String> {
        let net = match (self, net) {
            (NetEvent::Applied { .. }, _) => return Ok(()),
            (_, None) => return Err("the model has no net".into()),
            (_, Some(n)) => n,
        };
        match self {
            NetEvent::TokensPut { tokens } => {
                for t in tokens {
                    if !net.doc.place_ids().contains(t.place.as_str()) {
                        return Err(format!("the net has no place {:?}", t.place));
                    }
                }
                Ok(())
            }
            NetEvent::Started { transition } | NetEvent::Stopped { transition, .. } => {
                net.inscription(transition).map(|_| ()).ok_or_else(|| format!("no transition {transition:?}"))
            }
            NetEvent::Fired { transition, consumed, .. } => {
                for r in consumed {
                    if !net.available(r, transition) {
                        return Err(format!("token {} in {} is no longer free", r.id, r.place));
                    }
                }
                Ok(())
            }
            NetEvent::FireStarted { transition, bound, .. } => {
                // Checked here as well as where the fire was decided: two starts decided apart
                // (the fire loop's, and one following another fire in its commit) meet here.
                if let Some(t) = net.inscription(transition)
                    && net.in_flight_of(transition) >= t.concurrency as usize
                {
                    return Err(format!(
                        "transition {transition} has {} fire(s) in flight, its concurrency limit",
                        t.concurrency
                    ));
                }
                for r in bound.values().flatten() {
                    if !net.available(r, transition) {
                        return Err(format!("token {} in {} is no longer free", r.id, r.place));
                    }
                }
                Ok(())
            }
            NetEvent::FireCompleted { fire, .. } => {
                if net.in_flight.contains_key(fire) {
                    Ok(())
                } else {
                    Err(format!("fire {fire} is not in flight"))
                }
            }
            NetEvent::FireFailed { fire: Some(fire), .. } => {
                if net.in_flight.contains_key(fire) {
                    Ok(())
                } else {
                    Err(format!("fire {fire} is not in flight"))
                }
            }
            NetEvent::Unparked { tokens } | NetEvent::Discarded { tokens } => {
                for r in tokens {
                    if net.token(r).is_none() {
                        return Err(format!("token {} in {} is gone", r.id, r.place));
                    }
                    if net.places.get(&r.place).is_some_and(|p| p.reserved.contains_key(&r.id)) {
                        return Err(format!("token {} in {} is held by a fire in flight", r.id, r.place));
                    }
                }
                Ok(())
            }
            NetEvent::FireFailed { fire: None, .. } | NetEvent::Deleted | NetEvent::Applied { .. } => Ok(()),
        }
    }
}

impl NetState {
    /// Folds one net event of `model`, committed as `seq` at `time` by the principal whose id is
    /// `by` (`None`: the master itself).
    pub fn apply(&mut self, model: &str, seq: u64, time_ms: i64, by: Option<&str>, ev: &NetEvent) {
        let time = crate::time::format_time(time_ms);
        if let NetEvent::Deleted = ev {
            self.models.remove(model);
            return;
        }
        let net = self.models.entry(model.to_string()).or_default();
        match ev {
            NetEvent::Applied { doc, instance, author } => {
                let author = author.as_deref().or(by);
                let old: BTreeMap<String, Inscription> =
                    net.doc.transitions.iter().map(|t| (t.id.clone(), t.clone())).collect();
                for place in doc.place_ids() {
                    net.places.entry(place.to_string()).or_default();
                }
                let keep: BTreeSet<&str> = doc.place_ids();
                net.places.retain(|p, state| keep.contains(p.as_str()) || !state.tokens.is_empty());
                let mut runs = BTreeMap::new();
                for t in &doc.transitions {
                    let mut run = net.transitions.remove(&t.id).unwrap_or_default();
                    // A changed inscription stops its transition until it is started again.
                    let changed = old.get(&t.id) != Some(t);
                    if changed {
                        run.started = false;
                        run.forget_failures();
                    }
                    // A changed inscription carries the authority of whoever applied it.
                    if changed || !net.authors.contains_key(&t.id) {
                        match author {
                            Some(a) => net.authors.insert(t.id.clone(), a.to_string()),
                            None => net.authors.remove(&t.id),
                        };
                    }
                    runs.insert(t.id.clone(), run);
                }
                net.transitions = runs;
                net.authors.retain(|t, _| net.transitions.contains_key(t));
                net.doc = doc.clone();
                if instance.is_some() {
                    net.instance = instance.clone();
                }
            }
            NetEvent::Deleted => {}
            NetEvent::TokensPut { tokens } => {
                // A put written before provenance was recorded is the putter's.
                if let Some(b) = by.filter(|_| tokens.iter().any(|t| t.by.is_empty())) {
                    let tokens: Vec<NewToken> = tokens
                        .iter()
                        .cloned()
                        .map(|mut t| {
                            if t.by.is_empty() {
                                t.by = vec![b.to_string()];
                            }
                            t
                        })
                        .collect();
                    net.add(seq, &time, &tokens)
                } else {
                    net.add(seq, &time, tokens)
                }
            }
            NetEvent::Started { transition } => {
                // Parked tokens and their attempts outlive a start: releasing them is `Unparked`'s
                // job, one token at a time. A start that released them refired every poison
                // token at once, and fed a transition stopped for crashing the master the very
                // inputs it crashed on.
                let run = net.transitions.entry(transition.clone()).or_default();
                run.started = true;
                run.last_error = None;
            }
            NetEvent::Stopped { transition, reason } => {
                let run = net.transitions.entry(transition.clone()).or_default();
                run.started = false;
                if reason.is_some() {
                    run.last_error = reason.clone();
                }
            }
            NetEvent::Fired { transition, consumed, outputs } => {
                net.take(consumed);
                net.add(seq, &time, outputs);
                let run = net.transitions.entry(transition.clone()).or_default();
                run.fires += 1;
                run.last_error = None;
            }
            NetEvent::FireStarted { transition, bound, firer } => {
                let fire = fire_id(seq);
                // Only what the fire will consume is reserved; a read arc leaves its token free.
                let consuming: BTreeSet<String> = net
                    .inscription(transition)
                    .map(|t| t.presets.iter().filter(|(_, p)| p.consume).map(|(n, _)| n.clone()).collect())
                    .unwrap_or_default();
                for (preset, refs) in bound {
                    if !consuming.contains(preset) {
                        continue;
                    }
                    for r in refs {
                        net.places.entry(r.place.clone()).or_default().reserved.insert(r.id.clone(), fire.clone());
                    }
                }
                net.in_flight.insert(
                    fire,
                    InFlight {
                        transition: transition.clone(),
                        bound: bound.clone(),
                        started_at: time_ms,
                        firer: firer.clone(),
                    },
                );
            }
            NetEvent::FireCompleted { fire, consumed, outputs } => {
                let transition = net.in_flight.remove(fire).map(|f| f.transition);
                net.take(consumed);
                net.release(fire);
                net.add(seq, &time, outputs);
                if let Some(t) = transition {
                    let run = net.transitions.entry(t).or_default();
                    run.fires += 1;
                    run.last_error = None;
                }
            }
            NetEvent::FireFailed { transition, fire, tokens, reason, retry_at } => {
                if let Some(f) = fire {
                    net.in_flight.remove(f);
                    net.release(f);
                }
                let run = net.transitions.entry(transition.clone()).or_default();
                for r in tokens {
                    let a = run.attempts.entry(r.id.clone()).or_default();
                    a.failed += 1;
                    a.retry_at = *retry_at;
                    if retry_at.is_none() {
                        run.parked.insert(r.clone());
                        run.parked_why.insert(r.id.clone(), reason.clone());
                    }
                }
                run.last_error = Some(reason.clone());
            }
            NetEvent::Unparked { tokens } => net.forget(tokens),
            NetEvent::Discarded { tokens } => net.take(tokens),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::NetDoc;
    use serde_json::json;

    #[test]
    fn a_start_keeps_the_tokens_its_transition_parked_and_their_attempts() {
        let doc: NetDoc = serde_json::from_value(json!({
            "places": ["p"],
            "transitions": [{"id": "t", "kind": "pass", "presets": {"i": {"place": "p"}}}]
        }))
        .unwrap();
        let mut st = NetState::default();
        st.apply("m", 1, 0, None, &NetEvent::Applied { doc, instance: None, author: None });
        let poison = NewToken { place: "p".into(), name: None, data: json!({"bad": true}), by: Vec::new() };
        st.apply("m", 2, 0, None, &NetEvent::TokensPut { tokens: vec![poison] });
        let r = TokenRef { place: "p".into(), id: token_id(2, 0) };
        let failed = NetEvent::FireFailed {
            transition: "t".into(),
            fire: None,
            tokens: vec![r.clone()],
            reason: "poison".into(),
            retry_at: None,
        };
        st.apply("m", 3, 0, None, &failed);
        st.apply("m", 4, 0, None, &NetEvent::Started { transition: "t".into() });
        let net = &st.models["m"];
        let run = &net.transitions["t"];
        assert!(run.started);
        assert!(run.parked.contains(&r), "a start released the parked token: {run:?}");
        assert_eq!((run.failed(&r.id), run.parked_why.get(&r.id).map(String::as_str)), (1, Some("poison")));
        assert!(!net.available(&r, "t"), "the started transition may bind its parked token again");
        // Released by hand, it binds again, its attempts forgotten.
        st.apply("m", 5, 0, None, &NetEvent::Unparked { tokens: vec![r.clone()] });
        assert!(st.models["m"].available(&r, "t"));
        assert_eq!(st.models["m"].transitions["t"].failed(&r.id), 0);
    }

    #[test]
    fn a_start_beyond_its_transitions_concurrency_is_refused_as_a_conflict() {
        let doc: NetDoc = serde_json::from_value(json!({
            "places": ["p"],
            "transitions": [{"id": "run", "kind": "command", "concurrency": 1, "presets": {"c": {"place": "p"}}}]
        }))
        .unwrap();
        let mut st = NetState::default();
        st.apply("m", 1, 0, None, &NetEvent::Applied { doc, instance: None, author: None });
        let put = |n| NewToken { place: "p".into(), name: None, data: json!(n), by: Vec::new() };
        st.apply("m", 2, 0, None, &NetEvent::TokensPut { tokens: vec![put(1), put(2)] });
        let start = |seq: u64| NetEvent::FireStarted {
            transition: "run".into(),
            bound: BTreeMap::from([(
                "c".to_string(),
                vec![TokenRef { place: "p".into(), id: token_id(2, seq as usize) }],
            )]),
            firer: None,
        };
        assert!(start(0).check(st.models.get("m")).is_ok());
        st.apply("m", 3, 0, None, &start(0));
        // The second token is free, but the one fire allowed is in flight.
        let refused = start(1).check(st.models.get("m")).unwrap_err();
        assert_eq!(refused.kind, crate::ErrorKind::Conflict);
        assert!(refused.message.contains("concurrency"), "{}", refused.message);
    }
}
