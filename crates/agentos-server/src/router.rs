//! The router: every route of `routes.rs` bound to its handler, behind the auth layer.

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{delete, get, post, put};

use crate::error::ApiError;
use crate::state::AppState;
use crate::{admin_api, api, auth, mcp, nets_api, openapi};

/// Builds the router over an engine.
pub fn router(
    engine: agentos_engine::Engine,
    max_body_bytes: usize,
    max_result_bytes: usize,
    mcp_endpoint: mcp::McpEndpoint,
    body_timeout: std::time::Duration,
) -> Router {
    let state = AppState { engine, max_body_bytes, max_result_bytes, body_timeout };
    Router::new()
        .route("/healthz", get(api::healthz))
        .route("/api/openapi.json", get(openapi::openapi_json))
        .route("/api/models", get(api::list_models))
        .route("/api/tool-catalog", get(api::search_catalog))
        .route("/api/tool-catalog/{id}", get(api::get_entry))
        .route("/api/tool-catalog/{id}/history", get(api::entry_history))
        .route("/api/tool-catalog/{id}/help", get(api::entry_help))
        .route("/api/me", get(api::me))
        .route("/api/commands", post(api::run_command))
        .route("/api/blobs/{*urn}", get(api::get_blob))
        .route("/api/tools/{id}/invoke", post(api::invoke_tool))
        .route("/api/tools/{id}/call", post(api::call_tool))
        .route("/api/executors", get(api::list_executors))
        .route("/api/models", post(nets_api::create_model))
        .route("/api/agents", post(admin_api::create_agent).get(admin_api::list_agents))
        .route("/api/agents/{name}", delete(admin_api::revoke_agent))
        .route("/api/agents/{name}/grants", post(admin_api::grant_model))
        .route("/api/agents/{name}/grants/{model}", delete(admin_api::revoke_model_grant))
        .route("/api/secrets", get(admin_api::list_secrets))
        .route("/api/secrets/{name}", put(admin_api::set_secret))
        .route("/api/secrets/{name}/grants", post(admin_api::grant_secret))
        .route("/api/secret-grants", get(admin_api::list_secret_grants))
        .route("/api/secret-grants/{id}", delete(admin_api::revoke_secret_grant))
        .route("/api/events", get(admin_api::list_events))
        .route("/api/models/{model}/net", get(nets_api::get_net).put(nets_api::apply_net))
        .route("/api/models/{model}/places/{place}/tokens", get(nets_api::list_tokens).post(nets_api::put_token))
        .route("/api/models/{model}/links", get(nets_api::list_links))
        .route("/api/models/{model}/watch", get(nets_api::watch))
        .route("/api/models/{model}/transitions/{transition}/start", post(nets_api::start))
        .route("/api/models/{model}/transitions/{transition}/stop", post(nets_api::stop))
        .route("/api/models/{model}/transitions/{transition}/fire", post(nets_api::fire))
        .route("/api/models/{model}/parked", get(nets_api::list_parked))
        .route("/api/models/{model}/parked/{token}/retry", post(nets_api::retry_parked))
        .route("/api/models/{model}/parked/{token}/discard", post(nets_api::discard_parked))
        .route("/api/jobs", get(api::recent_jobs))
        .route("/api/jobs/{id}", get(api::get_job))
        .route("/api/jobs/{id}/cancel", post(api::cancel_job))
        .route("/api/jobs/{id}/stdout", get(api::job_stdout))
        .route("/api/jobs/{id}/stderr", get(api::job_stderr))
        .route("/api/executor-tokens", post(api::create_executor_token))
        .route("/api/executor/poll", post(api::executor_poll))
        .route("/api/executor/stopped", post(api::executor_stopped))
        .route("/api/executor/jobs/{id}/heartbeat", post(api::executor_heartbeat))
        .route("/api/executor/jobs/{id}/release", post(api::executor_release))
        .route("/api/executor/jobs/{id}/result", post(api::executor_result))
        // Layers run outside in: authorization first, then the wait for Agentos-Min-Seq.
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), crate::consistency::read_your_writes))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth::authorize))
        // MCP is a protocol of its own, not a route of the API: its own bearer check, then the
        // engine shows each principal what its flags allow.
        .merge(
            Router::new()
                .route_service("/mcp", mcp::service(state.engine.clone(), mcp_endpoint))
                .route_layer(axum::middleware::from_fn_with_state(state.clone(), mcp::authenticate)),
        )
        // The page: public files, no data; it reads the API with the token a person signs in with.
        .merge(crate::ui::router())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Bodies are bounded by JsonValue against max_body_bytes, which also gives the JSON 413.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(state.clone(), crate::consistency::seq_header))
        .layer(axum::middleware::map_response(kept_private))
        .with_state(state)
}

/// Answers carry tokens, secrets' names and tool output: no cache keeps them (`no-store`) unless
/// a route says otherwise (a blob, named by its digest; the page's files), and no browser reads
/// them as another type than they say.
async fn kept_private(mut res: axum::response::Response) -> axum::response::Response {
    use axum::http::{HeaderValue, header};
    let h = res.headers_mut();
    h.entry(header::CACHE_CONTROL).or_insert(HeaderValue::from_static("no-store"));
    h.entry(header::X_CONTENT_TYPE_OPTIONS).or_insert(HeaderValue::from_static("nosniff"));
    res
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route; the API is described at /api/openapi.json")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method; see /api/openapi.json",
    )
}
