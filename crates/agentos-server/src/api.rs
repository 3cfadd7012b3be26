//! The API's routes and handlers.

use axum::extract::{Path, State};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::IntoParams;

use agentos_core::command::{GetArgs, SearchArgs};
use agentos_core::entry::{BindingKind, EntryView};
use agentos_core::job::{ExecutorResult, ExecutorView, InvokeRequest, JobResult, LeaseRef, LeasedJob, PollRequest};
use agentos_core::search::{DEFAULT_LIMIT, MAX_LIMIT, SearchPage, SearchQuery};
use agentos_core::state::ModelView;
use agentos_core::urn::BlobUrn;
use agentos_engine::commands::Command;
use agentos_engine::{Engine, History, Principal};

use crate::extract::{JsonValue, QueryParams, ResultBody, typed};
use crate::routes::command_permission;
use crate::{ApiError, auth, openapi};

#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub max_body_bytes: usize,
    pub max_result_bytes: usize,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/api/openapi.json", get(openapi_json))
        .route("/api/models", get(list_models))
        .route("/api/tool-catalog", get(search_catalog))
        .route("/api/tool-catalog/{id}", get(get_entry))
        .route("/api/tool-catalog/{id}/history", get(entry_history))
        .route("/api/commands", post(run_command))
        .route("/api/blobs/{*urn}", get(get_blob))
        .route("/api/tools/{id}/invoke", post(invoke_tool))
        .route("/api/tools/{id}/call", post(call_tool))
        .route("/api/executors", get(list_executors))
        .route("/api/models", post(crate::nets_api::create_model))
        .route("/api/agents", post(crate::admin_api::create_agent).get(crate::admin_api::list_agents))
        .route("/api/agents/{name}", axum::routing::delete(crate::admin_api::revoke_agent))
        .route("/api/agents/{name}/grants", post(crate::admin_api::grant_model))
        .route("/api/agents/{name}/grants/{model}", axum::routing::delete(crate::admin_api::revoke_model_grant))
        .route("/api/secrets", get(crate::admin_api::list_secrets))
        .route("/api/secrets/{name}", axum::routing::put(crate::admin_api::set_secret))
        .route("/api/secrets/{name}/grants", post(crate::admin_api::grant_secret))
        .route("/api/secret-grants", get(crate::admin_api::list_secret_grants))
        .route("/api/secret-grants/{id}", axum::routing::delete(crate::admin_api::revoke_secret_grant))
        .route("/api/events", get(crate::admin_api::list_events))
        .route("/api/models/{model}/net", get(crate::nets_api::get_net).put(crate::nets_api::apply_net))
        .route(
            "/api/models/{model}/places/{place}/tokens",
            get(crate::nets_api::list_tokens).post(crate::nets_api::put_token),
        )
        .route("/api/models/{model}/links", get(crate::nets_api::list_links))
        .route("/api/models/{model}/watch", get(crate::nets_api::watch))
        .route("/api/models/{model}/transitions/{transition}/start", post(crate::nets_api::start))
        .route("/api/models/{model}/transitions/{transition}/stop", post(crate::nets_api::stop))
        .route("/api/models/{model}/transitions/{transition}/fire", post(crate::nets_api::fire))
        .route("/api/models/{model}/parked", get(crate::nets_api::list_parked))
        .route("/api/models/{model}/parked/{token}/retry", post(crate::nets_api::retry_parked))
        .route("/api/models/{model}/parked/{token}/discard", post(crate::nets_api::discard_parked))
        .route("/api/jobs/{id}", get(get_job))
        .route("/api/executor-tokens", post(create_executor_token))
        .route("/api/executor/poll", post(executor_poll))
        .route("/api/executor/jobs/{id}/heartbeat", post(executor_heartbeat))
        .route("/api/executor/jobs/{id}/release", post(executor_release))
        .route("/api/executor/jobs/{id}/result", post(executor_result))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth::authorize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Bodies are bounded by JsonValue against max_body_bytes, which also gives the JSON 413.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
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

/// Liveness, without auth.
#[utoipa::path(get, path = "/healthz", tag = "system", security(()),
    responses((status = 200, description = "The master is up", body = Object)))]
pub async fn healthz(State(app): State<AppState>) -> Json<Value> {
    Json(json!({"ok": true, "seq": app.engine.last_seq()}))
}

/// This document.
#[utoipa::path(get, path = "/api/openapi.json", tag = "system",
    responses((status = 200, description = "The OpenAPI document", body = Object), (status = 401, body = crate::error::ErrorBody)))]
pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(openapi::document())
}

/// Models with their places.
#[utoipa::path(get, path = "/api/models", tag = "models",
    responses((status = 200, body = Vec<ModelView>), (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody)))]
pub async fn list_models(State(app): State<AppState>, Extension(p): Extension<Principal>) -> Json<Vec<ModelView>> {
    Json(app.engine.models_for(&p))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SearchParams {
    /// Binding type: script, http, docker, toolnet, host, mcp.
    #[serde(rename = "type")]
    #[param(rename = "type")]
    pub kind: Option<String>,
    /// Search this model's local catalog first, then the global one (default: the caller's home model).
    pub model: Option<String>,
    /// Free text over id, name, description and capabilities.
    pub q: Option<String>,
    /// Only entries with this capability.
    pub capability: Option<String>,
    /// Page size, 1 to 1000 (default 50).
    pub limit: Option<usize>,
    /// Entries to skip.
    pub offset: Option<usize>,
}

fn to_query(
    kind: Option<String>,
    model: Option<String>,
    q: Option<String>,
    capability: Option<String>,
    limit: Option<usize>,
    offset: Option<usize>,
) -> Result<SearchQuery, ApiError> {
    let kind = match kind.as_deref().filter(|k| !k.is_empty()) {
        None => None,
        Some(k) => Some(BindingKind::parse(k).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_type",
                format!("unknown tool type {k:?}; use one of script, http, docker, toolnet, host, mcp"),
            )
        })?),
    };
    let limit = limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::bad_request("invalid_limit", format!("limit must be between 1 and {MAX_LIMIT}")));
    }
    Ok(SearchQuery {
        model: model.filter(|m| !m.is_empty()),
        kind,
        capability: capability.filter(|c| !c.is_empty()),
        q,
        limit,
        offset: offset.unwrap_or(0),
    })
}

/// Search the catalog, local first; a global entry hidden by a local one is marked `shadowed`.
#[utoipa::path(get, path = "/api/tool-catalog", tag = "catalog", params(SearchParams),
    responses((status = 200, body = SearchPage), (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody)))]
pub async fn search_catalog(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    QueryParams(q): QueryParams<SearchParams>,
) -> Result<Json<SearchPage>, ApiError> {
    let query = to_query(q.kind, q.model, q.q, q.capability, q.limit, q.offset)?;
    Ok(Json(app.engine.search(&p, &query)?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ModelParam {
    /// Look in this model's local catalog first, then the global one (default: the caller's home model).
    pub model: Option<String>,
}

/// One entry, local first.
#[utoipa::path(get, path = "/api/tool-catalog/{id}", tag = "catalog", params(("id" = String, Path, description = "Tool id"), ModelParam),
    responses((status = 200, body = EntryView), (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody)))]
pub async fn get_entry(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    QueryParams(m): QueryParams<ModelParam>,
) -> Result<Json<EntryView>, ApiError> {
    Ok(Json(app.engine.get(&p, &id, m.model.as_deref())?))
}

/// Every definition an entry has had, oldest first.
#[utoipa::path(get, path = "/api/tool-catalog/{id}/history", tag = "catalog", params(("id" = String, Path, description = "Tool id"), ModelParam),
    responses((status = 200, body = History), (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody)))]
pub async fn entry_history(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    QueryParams(m): QueryParams<ModelParam>,
) -> Result<Json<History>, ApiError> {
    Ok(Json(app.engine.history(&p, &id, m.model.as_deref()).await?))
}

/// Run a command: `TOOL_CATALOG_REGISTER_SCRIPT`, `TOOL_CATALOG_SEARCH`, `TOOL_CATALOG_GET`, `TOOL_CATALOG_REMOVE`.
#[utoipa::path(post, path = "/api/commands", tag = "commands",
    request_body(content = Object, description = "A command: {\"type\": \"TOOL_CATALOG_REGISTER_SCRIPT\", ...}. See the RegisterScript, SearchArgs, GetArgs and RemoveArgs schemas."),
    responses((status = 200, description = "The command's answer: the stored entry, a search page, an entry, or {\"removed\": true}", body = Object),
        (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody), (status = 413, body = crate::error::ErrorBody)))]
pub async fn run_command(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    JsonValue(body): JsonValue,
) -> Result<Response, ApiError> {
    let kind = body.get("type").and_then(Value::as_str).unwrap_or_default().to_string();
    // Permission first, on the type alone: a caller who may not run a command learns nothing
    // from how its fields would have been judged. An unknown type is a 400 from the parser.
    let Some(permission) = command_permission(&kind) else {
        Command::parse(body)?;
        return Err(ApiError::forbidden(format!("{kind} declares no permission")));
    };
    if !permission.allows(p.flags) {
        return Err(ApiError::forbidden(format!(
            "{} may not run {kind}: that needs {} (it holds {})",
            p.name,
            permission.describe(),
            p.flags
        )));
    }
    let cmd = Command::parse(body)?;
    let engine = &app.engine;
    Ok(match cmd {
        Command::Register { command, body } => Json(engine.register(&p, command, body).await?).into_response(),
        Command::Search(SearchArgs { tool_type, model, q, capability, limit, offset }) => {
            let query = to_query(tool_type, model, q, capability, limit, offset)?;
            Json(engine.search(&p, &query)?).into_response()
        }
        Command::Get(GetArgs { id, model }) => Json(engine.get(&p, &id, model.as_deref())?).into_response(),
        Command::Remove(args) => {
            let (id, model) = (args.id.clone(), args.model.clone().unwrap_or_else(|| p.home_model.clone()));
            engine.remove(&p, args).await?;
            Json(json!({"removed": true, "id": id, "model": model})).into_response()
        }
    })
}

/// A blob's bytes, verified against its sha256 before they are sent.
#[utoipa::path(get, path = "/api/blobs/{urn}", tag = "blobs", params(("urn" = String, Path, description = "urn:agentos:blob:<namespace>/<sha256>[.<ext>]")),
    responses((status = 200, description = "The bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody),
        (status = 500, description = "The stored bytes are corrupt and are not served", body = crate::error::ErrorBody)))]
pub async fn get_blob(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(urn): Path<String>,
) -> Result<Response, ApiError> {
    let urn: BlobUrn = urn.parse()?;
    let bytes = app.engine.read_blob_as(&p, &urn).await?;
    let mut resp = bytes.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", urn.sha256())) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("private, max-age=31536000, immutable"));
    Ok(resp)
}

/// The executor's display name, sent by the executor on every protocol call.
fn executor_name(headers: &HeaderMap) -> Option<String> {
    headers.get("x-agentos-executor-name").and_then(|v| v.to_str().ok()).map(str::to_string)
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct InvokeParams {
    /// The model the command belongs to: its local catalog is looked up first. Defaults to the caller's home model.
    pub model: Option<String>,
}

/// Run a script tool once and wait for its result: `{exitCode, signal, stdout, stderr, durationMs, timedOut}`.
/// With `Prefer: respond-async`, a script's job is queued durably and answered at once: 202
/// `{jobId, location}`; the invoker reads the result with `GET /api/jobs/{id}`.
#[utoipa::path(post, path = "/api/tools/{id}/invoke", tag = "tools", params(("id" = String, Path, description = "Tool id"), InvokeParams),
    request_body = InvokeRequest,
    responses((status = 200, description = "A script's job result, or {toolnet, output} for a tool net", body = JobResult), (status = 202, description = "Prefer: respond-async: the job is queued; {jobId, location}", body = Object), (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody), (status = 504, description = "No executor finished the job in time", body = crate::error::ErrorBody)))]
pub async fn invoke_tool(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<InvokeParams>,
    headers: axum::http::HeaderMap,
    JsonValue(body): JsonValue,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let req: InvokeRequest = typed(body)?;
    if prefers_async(&headers) {
        // Answered once the job is stored: no invocation slot is held while it waits.
        let job_id = app.engine.invoke_async(&p, &id, q.model.as_deref(), req).await?;
        let location = format!("/api/jobs/{job_id}");
        return Ok((
            axum::http::StatusCode::ACCEPTED,
            [
                (axum::http::header::LOCATION, location.clone()),
                (axum::http::header::HeaderName::from_static("preference-applied"), "respond-async".to_string()),
            ],
            Json(json!({"jobId": job_id, "location": location})),
        )
            .into_response());
    }
    let _slot = app.engine.invocation_slot(&p)?;
    Ok(Json(app.engine.invoke(&p, &id, q.model.as_deref(), req).await?).into_response())
}

/// Whether a `Prefer` header (RFC 7240) asks for `respond-async`.
fn prefers_async(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|pref| pref.split(';').next().is_some_and(|token| token.trim().eq_ignore_ascii_case("respond-async")))
}

/// Call a tool with command-line flags, as its shim does: `{tool, args}` → `{"ok":true,"result":...}`.
/// Usage errors are 400 with code `usage`; a failed tool 422 `tool_failed`; a timeout 504 `timed_out`.
#[utoipa::path(post, path = "/api/tools/{id}/call", tag = "tools", params(("id" = String, Path, description = "Toolkit (catalog entry) id"), InvokeParams),
    request_body = agentos_engine::call::CallRequest,
    responses((status = 200, description = "{\"ok\": true, \"result\": ...}", body = Object), (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody), (status = 422, body = crate::error::ErrorBody), (status = 504, body = crate::error::ErrorBody)))]
pub async fn call_tool(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<InvokeParams>,
    JsonValue(body): JsonValue,
) -> Result<Json<Value>, ApiError> {
    let req: agentos_engine::call::CallRequest = typed(body)?;
    let _slot = app.engine.invocation_slot(&p)?;
    let result = app.engine.call_tool(&p, &id, q.model.as_deref(), req).await?;
    Ok(Json(json!({"ok": true, "result": result})))
}

/// A job: queued, running, or finished with its recorded result. Readable with `l` in its
/// model, or by the principal that invoked it.
#[utoipa::path(get, path = "/api/jobs/{id}", tag = "tools", params(("id" = String, Path, description = "Job id")),
    responses((status = 200, body = agentos_engine::dispatch::JobRecord), (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody)))]
pub async fn get_job(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<agentos_engine::dispatch::JobRecord>, ApiError> {
    Ok(Json(app.engine.job(&p, &id).await?))
}

/// Executors with their state (`polling`, `busy`, `idle`, `gone`), when each was last seen and the jobs it holds.
#[utoipa::path(get, path = "/api/executors", tag = "executors",
    responses((status = 200, body = Vec<ExecutorView>), (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody)))]
pub async fn list_executors(State(app): State<AppState>) -> Json<Vec<ExecutorView>> {
    Json(app.engine.executors())
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutorTokenRequest {
    /// a-z, 0-9 and '-'. Creating a name that exists gives it a new token; the old one stops working.
    pub name: String,
}

/// Create an executor credential (operator only). It is good for the executor protocol and nothing else.
#[utoipa::path(post, path = "/api/executor-tokens", tag = "executors", request_body = ExecutorTokenRequest,
    responses((status = 200, description = "{\"name\", \"token\"}", body = Object), (status = 400, body = crate::error::ErrorBody), (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
pub async fn create_executor_token(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    JsonValue(body): JsonValue,
) -> Result<Json<Value>, ApiError> {
    let req: ExecutorTokenRequest = typed(body)?;
    let token = app.engine.create_executor_token(&p, &req.name).await?;
    Ok(Json(json!({"name": req.name, "token": token})))
}

/// Long poll for work: answered the moment a job is queued (200), or 204 after `waitMs`.
#[utoipa::path(post, path = "/api/executor/poll", tag = "executor protocol", request_body = PollRequest,
    responses((status = 200, body = LeasedJob), (status = 204, description = "No work within waitMs"), (status = 401, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody)))]
pub async fn executor_poll(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    JsonValue(body): JsonValue,
) -> Result<Response, ApiError> {
    let req: PollRequest = typed(body)?;
    let wait = Duration::from_millis(req.wait_ms.unwrap_or(25_000).min(60_000));
    match app.engine.poll_job(&p, req.name.as_deref(), wait).await? {
        Some(job) => Ok(Json(job).into_response()),
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

/// Renew a lease. 409 when the lease was lost (the job went to another executor); 403 when
/// another executor holds it (a lease is bound to the executor that took it).
#[utoipa::path(post, path = "/api/executor/jobs/{id}/heartbeat", tag = "executor protocol", params(("id" = String, Path, description = "Job id")), request_body = LeaseRef,
    responses((status = 200, description = "{\"leaseMs\"}", body = Object), (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
pub async fn executor_heartbeat(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonValue(body): JsonValue,
) -> Result<Json<Value>, ApiError> {
    let req: LeaseRef = typed(body)?;
    let lease = app.engine.heartbeat_job(&p, executor_name(&headers).as_deref(), &id, &req.lease_id)?;
    Ok(Json(json!({"leaseMs": lease.as_millis() as u64})))
}

/// Hand a job back to the queue (an executor stopping before it could run it). Only its holder may.
#[utoipa::path(post, path = "/api/executor/jobs/{id}/release", tag = "executor protocol", params(("id" = String, Path, description = "Job id")), request_body = LeaseRef,
    responses((status = 200, body = Object), (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
pub async fn executor_release(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonValue(body): JsonValue,
) -> Result<Json<Value>, ApiError> {
    let req: LeaseRef = typed(body)?;
    app.engine.release_job(&p, executor_name(&headers).as_deref(), &id, &req.lease_id)?;
    Ok(Json(json!({"released": true})))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ResultParams {
    /// Also hand out the next job, when one is queued right now (`next`: a LeasedJob or null).
    pub next: Option<bool>,
}

/// Post a job's result. Only the current lease holder's result is taken (its lease id, from the
/// executor that took it: 403 from any other), once. With
/// `?next=true` the answer carries the next queued job, saving the executor a round trip.
#[utoipa::path(post, path = "/api/executor/jobs/{id}/result", tag = "executor protocol", params(("id" = String, Path, description = "Job id"), ResultParams), request_body = ExecutorResult,
    responses((status = 200, description = "{\"recorded\": true, \"next\": LeasedJob or null}", body = Object), (status = 400, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody), (status = 413, body = crate::error::ErrorBody)))]
pub async fn executor_result(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    headers: HeaderMap,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<ResultParams>,
    ResultBody(body): ResultBody,
) -> Result<Json<Value>, ApiError> {
    let req: ExecutorResult = typed(body)?;
    let name = executor_name(&headers);
    app.engine.complete_job(&p, name.as_deref(), &id, req).await?;
    let next = match q.next {
        Some(true) => app.engine.next_job_now(&p, name.as_deref()).await?,
        _ => None,
    };
    Ok(Json(json!({"recorded": true, "next": next})))
}
