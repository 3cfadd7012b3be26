//! Who may act in which model, and with which flags a fire acts: the one place that answers
//! "may this principal do this here" for nets, tokens, watch streams, jobs and model catalogs.

use agentos_core::event::PrincipalKind;
use agentos_core::flags::{Flag, Flags};
use agentos_core::state::State;
use agentos_core::{CoreError, DEFAULT_MODEL};

use crate::nets::runtime::FireError;
use crate::{Engine, EngineError, Principal};

/// Whether `p` may read and act on `model`'s net, tokens, watch stream, jobs and local catalog.
/// The operator acts everywhere; an agent in its home model and in the models the operator
/// granted it; a tool-net instance belongs to its invoker alone; an executor nowhere.
pub(crate) fn may_use_model(st: &State, p: &Principal, model: &str) -> bool {
    if p.is_operator() {
        return true;
    }
    if p.kind == PrincipalKind::Executor {
        return false;
    }
    if let Some(instance) = st.nets.models.get(model).and_then(|n| n.instance.as_ref()) {
        return instance.invoker == p.id;
    }
    model == p.home_model || st.has_model_grant(&p.id, model)
}

pub(crate) fn check_model_in(st: &State, p: &Principal, model: &str) -> Result<(), CoreError> {
    if may_use_model(st, p, model) {
        return Ok(());
    }
    Err(CoreError::forbidden(format!(
        "{} may act only in its home model {:?} and in models the operator grants it (agentos agent grant {} --model {model}), not in {model:?}",
        p.name, p.home_model, p.name
    )))
}

/// The catalog a principal may register into: its home model, a granted one, or the global
/// catalog (`default`), where entries belong to whoever registered them.
pub(crate) fn check_catalog_write(st: &State, p: &Principal, model: &str) -> Result<(), CoreError> {
    if model == DEFAULT_MODEL {
        return Ok(());
    }
    check_model_in(st, p, model)
}

/// Reading a catalog: the global one is open to every reader; a local one needs the model.
pub(crate) fn check_catalog_read(st: &State, p: &Principal, model: &str) -> Result<(), CoreError> {
    if model == DEFAULT_MODEL { Ok(()) } else { check_model_in(st, p, model) }
}

/// A flag the caller must hold.
pub(crate) fn require(p: &Principal, flag: Flag, what: &str) -> Result<(), CoreError> {
    if p.flags.has(flag) {
        Ok(())
    } else {
        Err(CoreError::forbidden(format!(
            "{} may not {what}: that needs the '{}' ({}) flag",
            p.name,
            flag.letter(),
            flag.word()
        )))
    }
}

/// The operator only.
pub(crate) fn operator_only(p: &Principal, what: &str) -> Result<(), CoreError> {
    if p.is_operator() { Ok(()) } else { Err(CoreError::forbidden(format!("only the operator may {what}"))) }
}

/// The authority a fire acts with: the flags that every principal behind it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Authority {
    pub flags: Flags,
    /// The names of the principals behind the fire, for messages.
    pub names: Vec<String>,
}

impl Authority {
    /// Intersects the flags of the principals with these ids. A principal that no longer exists
    /// (revoked) holds nothing, so a fire behind it can do nothing that needs a flag.
    pub fn of<'a>(st: &State, ids: impl IntoIterator<Item = &'a str>) -> Authority {
        let mut flags = Flags::all();
        let mut names = Vec::new();
        for id in ids {
            match st.principal_by_id(id) {
                Some(r) => {
                    let p = Principal::from_record(r);
                    flags = flags.intersect(p.flags);
                    if !names.contains(&p.name) {
                        names.push(p.name);
                    }
                }
                None => {
                    flags = Flags::empty();
                    names.push(format!("revoked principal {id}"));
                }
            }
        }
        Authority { flags, names }
    }

    /// Refuses a fire that needs `flag` when someone behind it does not hold it: the action
    /// fails (its inputs follow retry and onError), naming who lacks what.
    pub(crate) fn need(&self, flag: Flag, what: &str) -> Result<(), FireError> {
        if self.flags.has(flag) {
            return Ok(());
        }
        Err(FireError::Denied(format!(
            "refused: {what} needs the '{}' ({}) flag, and the principals behind this fire ({}) do not all hold it",
            flag.letter(),
            flag.word(),
            self.names.join(", ")
        )))
    }
}

impl Engine {
    /// Whether `p` may read and act on `model` (see [`may_use_model`]).
    pub fn check_model(&self, p: &Principal, model: &str) -> Result<(), EngineError> {
        Ok(check_model_in(&self.read_state(), p, model)?)
    }
}
