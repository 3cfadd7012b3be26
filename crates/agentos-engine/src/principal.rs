//! Who calls: a principal resolved from a bearer token.

use agentos_core::event::{PrincipalKind, PrincipalRecord};
use agentos_core::flags::Flags;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub kind: PrincipalKind,
    pub flags: Flags,
    pub home_model: String,
}

impl Principal {
    pub fn from_record(r: &PrincipalRecord) -> Self {
        Principal {
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
}

/// A new random bearer token: `aos_` and 43 base64url characters (256 bits).
pub fn new_token() -> Result<String, getrandom::Error> {
    use base64::Engine as _;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(format!("aos_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)))
}
