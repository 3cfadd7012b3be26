//! The API's OpenAPI document, generated from the handlers and wire types.

use axum::Json;
use utoipa::openapi::path::ParameterIn;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::error::ErrorBody;
use crate::wire;

#[derive(OpenApi)]
#[openapi(
    info(title = "agentos", description = "A durable tool platform for AI agents: the tool catalog API."),
    paths(
        crate::api::healthz,
        openapi_json,
        crate::api::list_models,
        crate::api::search_catalog,
        crate::api::get_entry,
        crate::api::entry_history,
        crate::api::run_command,
        crate::api::get_blob,
        crate::api::invoke_tool,
        crate::api::call_tool,
        crate::api::list_executors,
        crate::api::get_job,
        crate::api::cancel_job,
        crate::api::job_stdout,
        crate::api::job_stderr,
        crate::api::recent_jobs,
        crate::api::me,
        crate::api::entry_help,
        crate::admin_api::create_agent,
        crate::admin_api::list_agents,
        crate::admin_api::revoke_agent,
        crate::admin_api::set_secret,
        crate::admin_api::list_secrets,
        crate::admin_api::grant_model,
        crate::admin_api::revoke_model_grant,
        crate::admin_api::grant_secret,
        crate::admin_api::list_secret_grants,
        crate::admin_api::revoke_secret_grant,
        crate::admin_api::list_events,
        crate::nets_api::create_model,
        crate::nets_api::apply_net,
        crate::nets_api::get_net,
        crate::nets_api::list_tokens,
        crate::nets_api::put_token,
        crate::nets_api::list_links,
        crate::nets_api::start,
        crate::nets_api::stop,
        crate::nets_api::fire,
        crate::nets_api::list_parked,
        crate::nets_api::retry_parked,
        crate::nets_api::discard_parked,
        crate::nets_api::watch,
        crate::api::create_executor_token,
        crate::api::executor_poll,
        crate::api::executor_stopped,
        crate::api::executor_heartbeat,
        crate::api::executor_release,
        crate::api::executor_result,
    ),
    components(schemas(
        wire::RegisterScript,
        wire::RegisterToolnet,
        wire::RegisterHttp,
        wire::RegisterMcp,
        wire::ImportImage,
        wire::NetDoc,
        wire::SearchArgs,
        wire::GetArgs,
        wire::RemoveArgs,
        wire::CatalogEntry,
        wire::EntryView,
        ErrorBody,
        wire::CommandToken,
    )),
    modifiers(&Bearer, &RefusalsFromTheRouteTable, &CommandsFromTheCommandTable),
    security(("bearer" = []))
)]
struct ApiDoc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Documents, on every operation, the refusals its entry in the route table can give: 401
/// without a valid token, 403 when a valid token may still lack the permission. The table is
/// the one the auth layer enforces, so the document cannot drift from it.
struct RefusalsFromTheRouteTable;

/// The rule of `agentos_core::name::is_valid_id`, as a schema.
fn id_schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some("^[a-z0-9][a-z0-9-]{0,63}$"))
        .min_length(Some(1))
        .max_length(Some(64))
        .into()
}

impl Modify for RefusalsFromTheRouteTable {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        use crate::routes::{Permission, ROUTES};
        // The document writes a catch-all `{*urn}` as `{urn}`.
        let route_permission = |method: &str, path: &str| {
            ROUTES.iter().find(|r| r.method == method && r.path.replace("{*", "{") == path).map(|r| r.permission)
        };
        use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
        let error = |description: &str| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build(),
                )
                .build()
        };
        for (path, item) in api.paths.paths.iter_mut() {
            let operations = [
                ("GET", item.get.as_mut()),
                ("POST", item.post.as_mut()),
                ("PUT", item.put.as_mut()),
                ("DELETE", item.delete.as_mut()),
                ("PATCH", item.patch.as_mut()),
            ];
            for (method, op) in operations {
                let (Some(op), Some(permission)) = (op, route_permission(method, path)) else { continue };
                if permission == Permission::Public {
                    op.security = Some(Vec::new());
                    continue;
                }
                for param in op.parameters.iter_mut().flatten() {
                    // Ids, model, place, transition and agent names all follow one rule
                    // (`agentos_core::name::is_valid_id`); secret names follow another.
                    let named = matches!(param.name.as_str(), "id" | "model" | "place" | "transition")
                        || (param.name == "name" && path.starts_with("/api/agents/"));
                    if param.parameter_in == ParameterIn::Path && named {
                        param.schema = Some(id_schema());
                    }
                }
                let responses = &mut op.responses.responses;
                responses.entry("401".into()).or_insert_with(|| error("No valid bearer token").into());
                if permission != Permission::Authenticated {
                    let why = format!("The token's principal lacks {}", permission.describe());
                    responses.entry("403".into()).or_insert_with(|| error(&why).into());
                }
            }
        }
    }
}

/// The wire schema of each command's fields. A command of the table without one here is named
/// by the test below: a binding's registration command needs its wire type.
const COMMAND_SCHEMAS: &[(&str, &str)] = &[
    ("TOOL_CATALOG_REGISTER_SCRIPT", "RegisterScript"),
    ("TOOL_CATALOG_REGISTER_TOOLNET", "RegisterToolnet"),
    ("TOOL_CATALOG_REGISTER_HTTP", "RegisterHttp"),
    ("TOOL_CATALOG_REGISTER_MCP", "RegisterMcp"),
    ("TOOL_CATALOG_IMPORT_IMAGE", "ImportImage"),
    ("TOOL_CATALOG_SEARCH", "SearchArgs"),
    ("TOOL_CATALOG_GET", "GetArgs"),
    ("TOOL_CATALOG_REMOVE", "RemoveArgs"),
];

/// Documents `POST /api/commands` from the engine's command table: the body is one of the
/// commands, each its fields' schema with `type` fixed to its name, and the description names
/// each command with the flags it needs, as the permission check reads them.
struct CommandsFromTheCommandTable;

impl Modify for CommandsFromTheCommandTable {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::request_body::RequestBodyBuilder;
        use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
        use utoipa::openapi::{ContentBuilder, RefOr, Required};
        let schemas = api.components.as_ref().map(|c| c.schemas.clone()).unwrap_or_default();
        let (mut one_of, mut lines) = (OneOfBuilder::new(), Vec::new());
        for c in agentos_engine::commands::commands() {
            let fields = COMMAND_SCHEMAS.iter().find(|(n, _)| *n == c.name).and_then(|(_, s)| schemas.get(*s));
            let Some(RefOr::T(Schema::Object(fields))) = fields else { continue };
            let mut schema = fields.clone();
            let name = ObjectBuilder::new().schema_type(Type::String).enum_values(Some([c.name]));
            schema.properties.insert("type".into(), name.into());
            schema.required.insert(0, "type".into());
            one_of = one_of.item(Schema::Object(schema));
            let needs = crate::routes::command_permission(c.name).map(|p| p.describe()).unwrap_or_default();
            lines.push(format!("`{}` (needs {needs})", c.name));
        }
        let Some(op) = api.paths.paths.get_mut("/api/commands").and_then(|item| item.post.as_mut()) else { return };
        let description = format!("A command: a JSON object whose `type` is one of {}.", lines.join(", "));
        let content = ContentBuilder::new().schema(Some(Schema::OneOf(one_of.build()))).build();
        op.request_body = Some(
            RequestBodyBuilder::new()
                .description(Some(description))
                .content("application/json", content)
                .required(Some(Required::True))
                .build(),
        );
    }
}

pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// This document.
#[utoipa::path(get, path = "/api/openapi.json", tag = "system",
    responses((status = 200, description = "The OpenAPI document", body = Object), (status = 401, body = ErrorBody)))]
pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(document())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::{Permission, ROUTES};

    #[test]
    fn every_route_is_documented_with_the_refusals_it_can_give() {
        let doc = serde_json::to_value(document()).unwrap();
        for r in ROUTES {
            let path = r.path.replace("{*", "{");
            let op = &doc["paths"][&path][r.method.to_lowercase()];
            assert!(op.is_object(), "{} {} is not in the document", r.method, r.path);
            let responses = &op["responses"];
            let public = r.permission == Permission::Public;
            assert_eq!(responses.get("401").is_some(), !public, "{} {}: 401", r.method, r.path);
            // An `Authenticated` route may still refuse by what it is asked (commands do).
            if !public && r.permission != Permission::Authenticated {
                assert!(responses.get("403").is_some(), "{} {}: 403", r.method, r.path);
            }
        }
        let id = &doc["paths"]["/api/tool-catalog/{id}"]["get"]["parameters"][0]["schema"];
        assert_eq!(id["pattern"], "^[a-z0-9][a-z0-9-]{0,63}$", "{id}");
    }

    /// Every command of the engine's table is one body of `POST /api/commands`, with its fields.
    #[test]
    fn the_commands_body_is_the_command_table() {
        let doc = serde_json::to_value(document()).unwrap();
        let body = &doc["paths"]["/api/commands"]["post"]["requestBody"];
        let one_of = body["content"]["application/json"]["schema"]["oneOf"].as_array().expect("one of the commands");
        let names: Vec<_> =
            one_of.iter().map(|s| s["properties"]["type"]["enum"][0].as_str().unwrap_or_default()).collect();
        let table: Vec<_> = agentos_engine::commands::commands().iter().map(|c| c.name).collect();
        assert_eq!(names, table, "each command of the table needs its wire schema in COMMAND_SCHEMAS");
        for s in one_of {
            assert_eq!(s["required"][0], "type", "{s}");
            assert!(s["properties"].as_object().is_some_and(|p| p.len() > 1), "the command's fields: {s}");
        }
        let description = body["description"].as_str().unwrap();
        assert!(description.contains("`TOOL_CATALOG_REGISTER_SCRIPT` (needs the 's' (scripts) flag)"), "{description}");
    }
}
