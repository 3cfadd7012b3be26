//! The decisions of principals, grants, secrets and nets: which events a command produces, from
//! the state at the moment the committer takes it, or why it is refused. Pure functions of the
//! state; the engine commits what they answer.

use crate::event::{EventBody, ModelGrant, PrincipalKind, PrincipalRecord, SecretGrant};
use crate::net::NetDoc;
use crate::net_state::{Instance, NetEvent, NewToken};
use crate::state::State;
use crate::{CoreError, DEFAULT_MODEL};

/// Events of one command, each with the model it belongs to.
pub type Decided = Result<Vec<(String, EventBody)>, CoreError>;

/// A new agent or executor credential; its name must be free.
pub fn decide_create_principal(st: &State, record: &PrincipalRecord) -> Decided {
    if st.principals.contains_key(&record.name) {
        return Err(CoreError::conflict(format!("a principal named {:?} exists; revoke it first", record.name)));
    }
    Ok(vec![(DEFAULT_MODEL.to_string(), EventBody::PrincipalCreated(record.clone()))])
}

/// Revokes an agent or executor credential; never the operator.
pub fn decide_revoke_principal(st: &State, name: &str) -> Decided {
    match st.principals.get(name) {
        None => Err(CoreError::not_found(format!("no principal {name:?}"))),
        Some(r) if r.kind == PrincipalKind::Operator => Err(CoreError::bad_input(
            "invalid_name",
            "the operator cannot be revoked; delete <data>/operator.token and restart to rotate its token",
        )),
        Some(_) => Ok(vec![(DEFAULT_MODEL.to_string(), EventBody::PrincipalRevoked { name: name.to_string() })]),
    }
}

/// Grants (or revokes) an agent's use of `model`. Granting what is granted changes nothing;
/// revoking what is not is refused as not found.
pub fn decide_model_grant(st: &State, name: &str, model: &str, grant: bool) -> Decided {
    let r = match st.principals.get(name) {
        Some(r) if r.kind == PrincipalKind::Agent => r,
        Some(_) => {
            return Err(CoreError::bad_input(
                "invalid_name",
                format!("{name:?} is not an agent; the operator acts everywhere already"),
            ));
        }
        None => return Err(CoreError::not_found(format!("no agent {name:?}"))),
    };
    let g = ModelGrant { principal: r.id.clone(), name: name.to_string(), model: model.to_string() };
    let has = st.has_model_grant(&r.id, model);
    Ok(match (grant, has) {
        (true, false) => vec![(DEFAULT_MODEL.to_string(), EventBody::ModelGranted(g))],
        (false, true) => vec![(DEFAULT_MODEL.to_string(), EventBody::ModelGrantRevoked(g))],
        // Revoking what was never granted is most often a mistyped model: said, not taken as done.
        (false, false) => {
            let held: Vec<&str> =
                st.model_grants.get(&r.id).map(|m| m.iter().map(String::as_str).collect()).unwrap_or_default();
            let held = if held.is_empty() { "none".to_string() } else { held.join(", ") };
            return Err(CoreError::not_found(format!(
                "{name} has no grant in model {model:?} to revoke (its grants: {held})"
            )));
        }
        (true, true) => Vec::new(),
    })
}

/// Grants a secret that is set; the same grant again changes nothing.
pub fn decide_secret_grant(st: &State, g: &SecretGrant) -> Decided {
    if !st.secrets.contains_key(&g.secret) {
        return Err(CoreError::not_found(format!(
            "no secret {:?}; set it first with `agentos secret set {}`",
            g.secret, g.secret
        )));
    }
    if st.secret_grants.get(&g.id) == Some(g) {
        return Ok(Vec::new());
    }
    Ok(vec![(DEFAULT_MODEL.to_string(), EventBody::SecretGranted(g.clone()))])
}

pub fn decide_revoke_secret_grant(st: &State, id: &str) -> Decided {
    if !st.secret_grants.contains_key(id) {
        return Err(CoreError::not_found(format!("no secret grant {id:?} (see `agentos secret grants`)")));
    }
    Ok(vec![(DEFAULT_MODEL.to_string(), EventBody::SecretGrantRevoked { id: id.to_string() })])
}

/// An empty model; its name must be free.
pub fn decide_create_model(st: &State, name: &str) -> Decided {
    if st.model_exists(name) {
        return Err(CoreError::conflict(format!("model {name:?} exists")));
    }
    Ok(vec![(name.to_string(), EventBody::ModelCreated { name: name.to_string() })])
}

/// Makes `doc` the net of `model` (creating the model if needed). Refused for a tool-net
/// instance, when a place that would go still holds tokens, and when a transition with a fire
/// in flight would change.
pub fn decide_apply_net(st: &State, model: &str, doc: &NetDoc, author: &str) -> Decided {
    if let Some(net) = st.nets.models.get(model) {
        if net.instance.is_some() {
            return Err(CoreError::conflict(format!("{model:?} is a tool net instance")));
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
            let same = doc.transitions.iter().find(|t| t.id == f.transition) == net.inscription(&f.transition);
            if !same {
                return Err(CoreError::conflict(format!(
                    "transition {:?} has a fire in flight; stop it and wait before changing it",
                    f.transition
                )));
            }
        }
    }
    let mut events = Vec::new();
    if !st.model_exists(model) {
        events.push((model.to_string(), EventBody::ModelCreated { name: model.to_string() }));
    }
    events.push((
        model.to_string(),
        EventBody::Net(NetEvent::Applied { doc: doc.clone(), instance: None, author: Some(author.to_string()) }),
    ));
    Ok(events)
}

/// A tool-net instance: its model, the tool net's net applied there with the instance's record
/// and the entry owner's authority, every transition but links started, and the input as one
/// token of `input_place`, put by `invoker`. The model's name is fresh (the engine makes it), so
/// nothing in the state can refuse it.
pub fn decide_create_instance(
    model: &str,
    doc: &NetDoc,
    instance: &Instance,
    author: &str,
    input_place: &str,
    input: &serde_json::Value,
) -> Decided {
    let m = || model.to_string();
    let mut events = vec![
        (m(), EventBody::ModelCreated { name: m() }),
        (
            m(),
            EventBody::Net(NetEvent::Applied {
                doc: doc.clone(),
                instance: Some(instance.clone()),
                author: Some(author.to_string()),
            }),
        ),
    ];
    for t in doc.transitions.iter().filter(|t| t.kind != "link") {
        events.push((m(), EventBody::Net(NetEvent::Started { transition: t.id.clone() })));
    }
    events.push((
        m(),
        EventBody::Net(NetEvent::TokensPut {
            tokens: vec![NewToken {
                place: input_place.to_string(),
                name: None,
                data: input.clone(),
                by: vec![instance.invoker.clone()],
            }],
        }),
    ));
    Ok(events)
}

/// Net events of one model, each checked against the net as it is now (in order), all or none.
pub fn decide_net_events(st: &State, model: &str, events: &[NetEvent]) -> Decided {
    let net = st.nets.models.get(model);
    let mut out = Vec::with_capacity(events.len());
    for ev in events {
        ev.check(net)?;
        out.push((model.to_string(), EventBody::Net(ev.clone())));
    }
    Ok(out)
}

/// A token put into `place`, refused (409 `place_full`) when the place holds `max_tokens`
/// already (0: no limit; `p-tool-catalog` is exempt: it is the catalog).
pub fn decide_token_put(st: &State, model: &str, place: &str, put: &NetEvent, max_tokens: usize) -> Decided {
    let held = st.nets.models.get(model).and_then(|n| n.places.get(place)).map_or(0, |p| p.tokens.len());
    if max_tokens > 0 && held >= max_tokens && place != crate::CATALOG_PLACE {
        return Err(CoreError::new(
            crate::ErrorKind::Conflict,
            "place_full",
            format!(
                "place {place:?} holds {held} tokens, the most a place may hold (the master's --max-tokens-per-place)"
            ),
        ));
    }
    decide_net_events(st, model, std::slice::from_ref(put))
}

/// Stops a transition found firing at every recent death of the master, failing its fires in
/// flight; nothing when the transition is gone.
pub fn decide_stop_crash_looping(st: &State, model: &str, transition: &str, reason: &str) -> Decided {
    let Some(net) = st.nets.models.get(model) else { return Ok(Vec::new()) };
    if net.inscription(transition).is_none() {
        return Ok(Vec::new());
    }
    let mut out = vec![(
        model.to_string(),
        EventBody::Net(NetEvent::Stopped { transition: transition.to_string(), reason: Some(reason.to_string()) }),
    )];
    for (id, f) in net.in_flight.iter().filter(|(_, f)| f.transition == transition) {
        out.push((
            model.to_string(),
            EventBody::Net(NetEvent::FireFailed {
                transition: transition.to_string(),
                fire: Some(id.clone()),
                tokens: f.bound.values().flatten().cloned().collect(),
                reason: reason.to_string(),
                retry_at: None,
            }),
        ));
    }
    Ok(out)
}
