//! Who calls: a principal resolved from a bearer token.

use agentos_core::event::{PrincipalKind, PrincipalRecord};
use agentos_core::flags::Flags;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Stable and never reused (see `PrincipalRecord::id`).
    pub id: String,
    pub name: String,
    pub kind: PrincipalKind,
    pub flags: Flags,
    pub home_model: String,
}

impl Principal {
    pub fn from_record(r: &PrincipalRecord) -> Self {
        Principal {
            id: r.id.clone(),
            name: r.name.clone(),
            kind: r.kind,
            // The operator holds every flag, whatever the record says.
            flags: if r.kind == PrincipalKind::Operator { Flags::all() } else { r.parsed_flags() },
            home_model: r.home_model.clone(),
        }
    }
    pub fn is_operator(&self) -> bool {
        self.kind == PrincipalKind::Operator
    }
    /// As the core's decisions see it.
    pub fn actor(&self) -> agentos_core::command::Actor<'_> {
        agentos_core::command::Actor { id: &self.id, name: &self.name, operator: self.is_operator() }
    }
}

/// A new principal id: `p-` and 16 hex characters (64 random bits).
pub fn new_principal_id() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes)?;
    Ok(format!("p-{}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()))
}

/// A new random bearer token: `aos_` and 43 base64url characters (256 bits).
pub fn new_token() -> Result<String, getrandom::Error> {
    use base64::Engine as _;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!("aos_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)))
}
