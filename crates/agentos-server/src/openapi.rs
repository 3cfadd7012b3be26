//! The API's OpenAPI document, generated from the handlers and wire types.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(title = "agentos", description = "A durable tool platform for AI agents: the tool catalog API."),
    paths(
        crate::api::healthz,
        crate::api::openapi_json,
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
        crate::admin_api::create_agent,
        crate::admin_api::list_agents,
        crate::admin_api::revoke_agent,
        crate::admin_api::set_secret,
        crate::admin_api::list_secrets,
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
        crate::nets_api::watch,
        crate::api::create_executor_token,
        crate::api::executor_poll,
        crate::api::executor_heartbeat,
        crate::api::executor_release,
        crate::api::executor_result,
    ),
    components(schemas(
        agentos_core::command::RegisterScript,
        agentos_core::command::SearchArgs,
        agentos_core::command::GetArgs,
        agentos_core::command::RemoveArgs,
        agentos_core::entry::CatalogEntry,
        agentos_core::entry::EntryView,
        crate::error::ErrorBody,
        agentos_core::job::CommandToken,
    )),
    modifiers(&Bearer),
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

pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}
