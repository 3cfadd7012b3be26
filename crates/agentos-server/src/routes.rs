//! The one table of routes and the permission each needs. The auth layer reads it; tests walk it.

use agentos_core::flags::{Flag, Flags};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// No token needed.
    Public,
    /// Any valid token.
    Authenticated,
    /// This flag.
    Flag(Flag),
    /// Any one of these flags.
    AnyOf(&'static [Flag]),
}

impl Permission {
    pub fn allows(self, flags: Flags) -> bool {
        match self {
            Permission::Public | Permission::Authenticated => true,
            Permission::Flag(f) => flags.has(f),
            Permission::AnyOf(fs) => flags.any_of(fs),
        }
    }
    pub fn describe(self) -> String {
        match self {
            Permission::Public => "nothing".into(),
            Permission::Authenticated => "a valid token".into(),
            Permission::Flag(f) => format!("the '{}' ({}) flag", f.letter(), f.word()),
            Permission::AnyOf(fs) => {
                let letters: Vec<String> = fs.iter().map(|f| format!("'{}'", f.letter())).collect();
                format!("one of the flags {}", letters.join(", "))
            }
        }
    }
}

/// Catalog search and get: granted by any flag that reveals a kind of tool.
pub const CATALOG_READ: &[Flag] = &[
    Flag::Docker,
    Flag::Http,
    Flag::ToolNets,
    Flag::Scripts,
    Flag::Mcp,
];

pub struct RouteSpec {
    pub method: &'static str,
    /// The path as axum matches it.
    pub path: &'static str,
    pub permission: Permission,
}

pub const ROUTES: &[RouteSpec] = &[
    RouteSpec {
        method: "GET",
        path: "/healthz",
        permission: Permission::Public,
    },
    RouteSpec {
        method: "GET",
        path: "/api/openapi.json",
        permission: Permission::Authenticated,
    },
    RouteSpec {
        method: "GET",
        path: "/api/models",
        permission: Permission::Flag(Flag::Read),
    },
    RouteSpec {
        method: "GET",
        path: "/api/tool-catalog",
        permission: Permission::AnyOf(CATALOG_READ),
    },
    RouteSpec {
        method: "GET",
        path: "/api/tool-catalog/{id}",
        permission: Permission::AnyOf(CATALOG_READ),
    },
    RouteSpec {
        method: "GET",
        path: "/api/tool-catalog/{id}/history",
        permission: Permission::AnyOf(CATALOG_READ),
    },
    // Each command type declares its own permission in COMMANDS.
    RouteSpec {
        method: "POST",
        path: "/api/commands",
        permission: Permission::Authenticated,
    },
    RouteSpec {
        method: "GET",
        path: "/api/blobs/{*urn}",
        permission: Permission::Flag(Flag::Read),
    },
];

/// The permission of each command type sent to `POST /api/commands`.
pub const COMMANDS: &[(&str, Permission)] = &[
    (
        "TOOL_CATALOG_REGISTER_SCRIPT",
        Permission::Flag(Flag::Scripts),
    ),
    ("TOOL_CATALOG_SEARCH", Permission::AnyOf(CATALOG_READ)),
    ("TOOL_CATALOG_GET", Permission::AnyOf(CATALOG_READ)),
    // Removing further needs the flag of the entry's kind, checked by the engine.
    ("TOOL_CATALOG_REMOVE", Permission::AnyOf(CATALOG_READ)),
];

pub fn route_permission(method: &str, path: &str) -> Option<Permission> {
    ROUTES
        .iter()
        .find(|r| r.method == method && r.path == path)
        .map(|r| r.permission)
}

pub fn command_permission(kind: &str) -> Option<Permission> {
    COMMANDS.iter().find(|(k, _)| *k == kind).map(|(_, p)| *p)
}
