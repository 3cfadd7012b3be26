//! The commands of the catalog by their `type`: each one's name, the flags it needs, and its
//! parsing. The catalog's own commands are rows here; each binding kind adds its registration
//! command through its binder (`crate::bindings`). The server derives the command permissions
//! it checks and documents from this one table.

use serde_json::Value;

use agentos_core::CoreError;
use agentos_core::command::{GetArgs, RemoveArgs, SearchArgs, fields};
use agentos_core::entry::CATALOG_READ_FLAGS;
use agentos_core::flags::Flag;

use crate::bindings::{BINDERS, by_command};

/// The flags a command needs, checked on its type alone before its fields are judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    Flag(Flag),
    /// Any one of these.
    AnyOf(&'static [Flag]),
}

/// One command.
#[derive(Debug, Clone, Copy)]
pub struct CommandSpec {
    pub name: &'static str,
    pub needs: Needs,
}

/// The catalog's own commands. Search and get show only the kinds the caller's flags reveal;
/// removing further needs the flag that registers the entry's kind, checked by the engine.
const CATALOG_COMMANDS: [CommandSpec; 3] = [
    CommandSpec { name: "TOOL_CATALOG_SEARCH", needs: Needs::AnyOf(CATALOG_READ_FLAGS) },
    CommandSpec { name: "TOOL_CATALOG_GET", needs: Needs::AnyOf(CATALOG_READ_FLAGS) },
    CommandSpec { name: "TOOL_CATALOG_REMOVE", needs: Needs::AnyOf(CATALOG_READ_FLAGS) },
];

/// Every command: each binding kind's registration, then the catalog's own.
pub fn commands() -> Vec<CommandSpec> {
    let registrations = BINDERS.iter().filter_map(|b| {
        b.register_command().map(|name| CommandSpec { name, needs: Needs::Flag(b.kind().registering_flag()) })
    });
    registrations.chain(CATALOG_COMMANDS).collect()
}

/// The command named `name`.
pub fn command(name: &str) -> Option<CommandSpec> {
    commands().into_iter().find(|c| c.name == name)
}

/// A parsed command.
#[derive(Debug, Clone)]
pub enum Command {
    /// A registration of some binding kind: its fields are the kind's binder's to judge.
    Register {
        command: &'static str,
        body: Value,
    },
    Search(SearchArgs),
    Get(GetArgs),
    Remove(RemoveArgs),
}

impl Command {
    /// Parses a command body. Errors name the command type and the offending field.
    pub fn parse(mut body: Value) -> Result<Command, CoreError> {
        let obj = body.as_object_mut().ok_or_else(|| {
            CoreError::bad_input("invalid_command", "a command must be a JSON object with a \"type\" field")
        })?;
        let names = || commands().iter().map(|c| c.name).collect::<Vec<_>>().join(", ");
        let kind = match obj.remove("type") {
            Some(Value::String(s)) => s,
            Some(_) => return Err(CoreError::bad_input("invalid_command", "the command \"type\" must be a string")),
            None => {
                return Err(CoreError::bad_input(
                    "invalid_command",
                    format!("the command has no \"type\"; expected one of {}", names()),
                ));
            }
        };
        if let Some(b) = by_command(&kind) {
            let command = b.register_command().unwrap_or_default();
            return Ok(Command::Register { command, body });
        }
        match kind.as_str() {
            "TOOL_CATALOG_SEARCH" => Ok(Command::Search(fields(&kind, body)?)),
            "TOOL_CATALOG_GET" => Ok(Command::Get(fields(&kind, body)?)),
            "TOOL_CATALOG_REMOVE" => Ok(Command::Remove(fields(&kind, body)?)),
            other => Err(CoreError::bad_input(
                "unknown_command",
                format!("unknown command type {other:?}; expected one of {}", names()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_command_parses_by_its_name_and_unknown_ones_are_named() {
        for c in commands() {
            let parsed = Command::parse(json!({"type": c.name, "id": "x"}));
            assert!(!matches!(&parsed, Err(e) if e.code == "unknown_command"), "{}: {parsed:?}", c.name);
        }
        let err = Command::parse(json!({"type": "NOPE"})).unwrap_err();
        assert_eq!(err.code, "unknown_command");
        assert!(err.message.contains("TOOL_CATALOG_REGISTER_SCRIPT"), "{}", err.message);
        assert_eq!(Command::parse(json!({"id": "x"})).unwrap_err().code, "invalid_command");
        assert!(command("TOOL_CATALOG_REGISTER_SCRIPT").is_some_and(|c| c.needs == Needs::Flag(Flag::Scripts)));
        assert!(command("TOOL_CATALOG_REGISTER_TOOLNET").is_some_and(|c| c.needs == Needs::Flag(Flag::Write)));
    }
}
