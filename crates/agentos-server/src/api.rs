//! The handlers of the catalog, commands, blobs, tools, jobs and the executor protocol.

use std::time::Duration;

use axum::extract::State;

use crate::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};

use agentos_core::command::{GetArgs, SearchArgs};
use agentos_core::entry::BindingKind;
use agentos_core::name::shown;
use agentos_core::search::{DEFAULT_LIMIT, MAX_LIMIT, SearchQuery};
use agentos_core::urn::BlobUrn;
use agentos_engine::Principal;
use agentos_engine::commands::Command;
use agentos_engine::dispatch::Worker;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{JsonValue, QueryParams, ResultBody, typed};
use crate::routes::command_permission;
use crate::state::AppState;
use crate::wire;

/// Liveness, without auth.
#[utoipa::path(get, path = "/healthz", tag = "system", security(()),
    responses((status = 200, description = "The master is up", body = Object)))]
pub async fn healthz(State(app): State<AppState>) -> Json<Value> {
    Json(json!({"ok": true, "seq": app.engine.last_seq()}))
}

/// Models with their places.
#[utoipa::path(get, path = "/api/models", tag = "models",
    responses((status = 200, body = Vec<wire::ModelView>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn list_models(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
) -> Json<Vec<wire::ModelView>> {
    Json(app.engine.catalog().models_for(&p).into_iter().map(wire::ModelView::from).collect())
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
#[utoipa::path(get, path = "/api/tool-catalog", tag = "catalog", params(wire::SearchParams),
    responses((status = 200, body = wire::SearchPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn search_catalog(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    QueryParams(q): QueryParams<wire::SearchParams>,
) -> Result<Json<wire::SearchAnswer>, ApiError> {
    let query = to_query(q.kind, q.model, q.q, q.capability, q.limit, q.offset)?;
    Ok(Json(app.engine.catalog().search(&p, &query)?.into()))
}

/// One entry, local first.
#[utoipa::path(get, path = "/api/tool-catalog/{id}", tag = "catalog", params(("id" = String, Path, description = "Tool id"), wire::ModelParam),
    responses((status = 200, body = wire::EntryView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_entry(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    QueryParams(m): QueryParams<wire::ModelParam>,
) -> Result<Json<wire::EntryAnswer>, ApiError> {
    Ok(Json(app.engine.catalog().get(&p, &id, m.model.as_deref())?.into()))
}

/// How an entry is called from a shell: each operation's `--help`, as `agentos-{id} {op} --help`
/// prints it.
#[utoipa::path(get, path = "/api/tool-catalog/{id}/help", tag = "catalog", params(("id" = String, Path, description = "Tool id"), wire::ModelParam),
    responses((status = 200, body = wire::EntryHelp), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn entry_help(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    QueryParams(m): QueryParams<wire::ModelParam>,
) -> Result<Json<wire::EntryHelp>, ApiError> {
    let view = app.engine.catalog().get(&p, &id, m.model.as_deref())?;
    let contract = view.entry().contract();
    let operations = contract
        .operations
        .iter()
        .map(|(name, op)| (name.clone(), agentos_core::toolhelp::tool_help(&id, name, op)))
        .collect();
    Ok(Json(wire::EntryHelp { command: format!("agentos-{id}"), operations }))
}

/// Every definition an entry has had, oldest first.
#[utoipa::path(get, path = "/api/tool-catalog/{id}/history", tag = "catalog", params(("id" = String, Path, description = "Tool id"), wire::ModelParam),
    responses((status = 200, body = wire::History), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn entry_history(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    QueryParams(m): QueryParams<wire::ModelParam>,
) -> Result<Json<wire::History>, ApiError> {
    Ok(Json(app.engine.catalog().history(&p, &id, m.model.as_deref()).await?.into()))
}

/// Run a command of the catalog: a registration of some binding kind, a search, a get or a removal.
/// A registration asked with `Accept: application/x-ndjson` is answered as it goes: one line
/// `{"progress": "..."}` per step the binding reports (pulling an image, starting a container,
/// listing an MCP server's tools), then `{"entry": ...}` or `{"error": {code, message, status}}`.
#[utoipa::path(post, path = "/api/commands", tag = "commands",
    request_body(content = Object, description = "Written from the command table (openapi.rs)."),
    responses((status = 200, description = "The command's answer: the stored entry, a search page, an entry, or {\"removed\": true}; for a registration asked with Accept: application/x-ndjson, progress lines and then the entry or the error", body = Object),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn run_command(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    headers: HeaderMap,
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
    let follow = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim().starts_with("application/x-ndjson")));
    Ok(match cmd {
        Command::Register { command, body } if follow => registration_as_it_goes(engine.clone(), p, command, body),
        Command::Register { command, body } => {
            Json(wire::EntryAnswer::from(engine.catalog().register(&p, command, body).await?)).into_response()
        }
        Command::Search(SearchArgs { tool_type, model, q, capability, limit, offset }) => {
            let query = to_query(tool_type, model, q, capability, limit, offset)?;
            Json(wire::SearchAnswer::from(engine.catalog().search(&p, &query)?)).into_response()
        }
        Command::Get(GetArgs { id, model }) => {
            Json(wire::EntryAnswer::from(engine.catalog().get(&p, &id, model.as_deref())?)).into_response()
        }
        Command::Remove(args) => {
            let (id, model) = (args.id.clone(), args.model.clone().unwrap_or_else(|| p.home_model.clone()));
            engine.catalog().remove(&p, args).await?;
            Json(json!({"removed": true, "id": id, "model": model})).into_response()
        }
    })
}

/// A registration answered line by line: the steps its binding reports, then the entry or the
/// error. It runs in a task of its own, so a caller who goes away does not cut it short: it
/// commits or fails as it would have.
fn registration_as_it_goes(
    engine: agentos_engine::Engine,
    p: Principal,
    command: &'static str,
    body: Value,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let lines = tx.clone();
    tokio::spawn(async move {
        let answer = agentos_engine::progress::reporting_to(tx, engine.catalog().register(&p, command, body)).await;
        let last = match answer {
            Ok(entry) => json!({"entry": wire::EntryAnswer::from(entry)}),
            Err(e) => {
                let e = ApiError::from(e);
                json!({"error": {"code": e.code, "message": e.message, "status": e.status.as_u16()}})
            }
        };
        let _ = lines.send(format!("\u{0}{last}"));
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let item = rx.recv().await?;
        // The last line is marked so that it is not taken for a step.
        let line = match item.strip_prefix('\u{0}') {
            Some(last) => format!("{last}\n"),
            None => format!("{}\n", json!({"progress": item})),
        };
        Some((Ok::<_, std::convert::Infallible>(axum::body::Bytes::from(line)), rx))
    });
    let mut resp = axum::body::Body::from_stream(stream).into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    resp
}

/// A blob's bytes, verified against its sha256 before they are sent.
#[utoipa::path(get, path = "/api/blobs/{urn}", tag = "blobs", params(("urn" = String, Path, description = "urn:agentos:blob:<namespace>/<sha256>[.<ext>]")),
    responses((status = 200, description = "The bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 500, description = "The stored bytes are corrupt and are not served", body = ErrorBody)))]
pub async fn get_blob(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(urn): Path<String>,
) -> Result<Response, ApiError> {
    let urn: BlobUrn = urn.parse()?;
    let bytes = app.engine.catalog().read_blob_as(&p, &urn).await?;
    let mut resp = bytes.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    if let Ok(v) = HeaderValue::from_str(&format!("\"{}\"", urn.sha256())) {
        h.insert(header::ETAG, v);
    }
    // Content addressed, so never stale; but who may read it is the token's question, so a
    // browser keys its copy on the token, and keeps no copy of a job's output (a script's
    // output may hold what a later user of the same browser must not read).
    h.insert(header::VARY, HeaderValue::from_static("authorization"));
    let cache = if urn.namespace().split('/').next() == Some(agentos_engine::jobs::OUTPUT_NAMESPACE) {
        "private, no-store"
    } else {
        "private, max-age=31536000, immutable"
    };
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    Ok(resp)
}

/// The executor's display name, sent by the executor on every protocol call.
fn executor_name(headers: &HeaderMap) -> Option<String> {
    headers.get("x-agentos-executor-name").and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// Run a script tool once and wait for its result: `{exitCode, signal, stdout, stderr, durationMs, timedOut}`.
/// With `Prefer: respond-async`, a script's job is queued durably and answered at once: 202
/// `{jobId, location}`; the invoker reads the result with `GET /api/jobs/{id}`.
#[utoipa::path(post, path = "/api/tools/{id}/invoke", tag = "tools", params(("id" = String, Path, description = "Tool id"), wire::InvokeParams,
        ("prefer" = Option<String>, Header, description = "respond-async: a script's job is queued durably and answered at once, 202")),
    request_body = wire::InvokeRequest,
    responses((status = 200, description = "A script's job result, or {toolnet, output} for a tool net", body = wire::JobResult), (status = 202, description = "Prefer: respond-async: the job is queued; {jobId, location}", body = Object), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 408, description = "The body did not arrive in time", body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 429, description = "Too many asynchronous invocations of this caller are open", body = ErrorBody), (status = 504, description = "No executor serves the queue, or none finished the job in time", body = ErrorBody)))]
pub async fn invoke_tool(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<wire::InvokeParams>,
    headers: axum::http::HeaderMap,
    JsonValue(body): JsonValue,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let req = typed::<wire::InvokeRequest>(body)?.into();
    if prefers_async(&headers) {
        // Answered once the job is stored: no invocation slot is held while it waits.
        let job_id = app.engine.dispatch().invoke_async(&p, &id, q.model.as_deref(), req).await?;
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
    let _slot = app.engine.principals().invocation_slot(&p)?;
    Ok(Json(app.engine.dispatch().invoke(&p, &id, q.model.as_deref(), req).await?).into_response())
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
#[utoipa::path(post, path = "/api/tools/{id}/call", tag = "tools", params(("id" = String, Path, description = "Toolkit (catalog entry) id"), wire::InvokeParams),
    request_body = wire::CallRequest,
    responses((status = 200, description = "{\"ok\": true, \"result\": ...}", body = Object), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub async fn call_tool(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<wire::InvokeParams>,
    JsonValue(body): JsonValue,
) -> Result<Json<Value>, ApiError> {
    let req = typed::<wire::CallRequest>(body)?.into();
    let _slot = app.engine.principals().invocation_slot(&p)?;
    let result = app.engine.dispatch().call_tool(&p, &id, q.model.as_deref(), req).await?;
    Ok(Json(json!({"ok": true, "result": result})))
}

/// Who the token belongs to: name, kind, capability flags and home model.
#[utoipa::path(get, path = "/api/me", tag = "principals",
    responses((status = 200, body = wire::Me), (status = 401, body = ErrorBody)))]
pub async fn me(Extension(p): Extension<Principal>) -> Json<wire::Me> {
    let kind = match p.kind {
        agentos_core::event::PrincipalKind::Operator => "operator",
        agentos_core::event::PrincipalKind::Agent => "agent",
        agentos_core::event::PrincipalKind::Executor => "executor",
    };
    Json(wire::Me { name: p.name.clone(), kind: kind.into(), flags: p.flags.to_string(), model: p.home_model.clone() })
}

/// The jobs that finished lately, newest first: those the caller invoked, and those of the
/// models it may use when it holds `l`; every one for the operator.
#[utoipa::path(get, path = "/api/jobs", tag = "tools", params(wire::RecentJobsParams),
    responses((status = 200, body = Vec<wire::RecentJob>), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn recent_jobs(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    QueryParams(q): QueryParams<wire::RecentJobsParams>,
) -> Result<Json<Vec<wire::RecentJob>>, ApiError> {
    let jobs = app.engine.dispatch().recent_jobs(&p, q.limit.unwrap_or(50))?;
    Ok(Json(jobs.into_iter().map(wire::RecentJob::from).collect()))
}

/// A job: queued, running, or finished with its recorded result. Readable with `l` in its
/// model, or by the principal that invoked it.
#[utoipa::path(get, path = "/api/jobs/{id}", tag = "tools", params(("id" = String, Path, description = "Job id")),
    responses((status = 200, body = wire::JobRecord), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_job(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<wire::JobRecord>, ApiError> {
    Ok(Json(app.engine.dispatch().job(&p, &id).await?.into()))
}

/// The whole stdout of a finished job, as its bytes: read back from its blob when it was
/// offloaded, checked against its sha256. Readable by whoever may read the job (its invoker
/// needs no `r`, which `GET /api/blobs` takes).
#[utoipa::path(get, path = "/api/jobs/{id}/stdout", tag = "tools", params(("id" = String, Path, description = "Job id")),
    responses((status = 200, description = "The bytes", content_type = "application/octet-stream", body = Vec<u8>), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The job has not finished (`job_not_finished`)", body = ErrorBody), (status = 500, description = "The stored output is corrupt and is not served", body = ErrorBody)))]
pub async fn job_stdout(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    job_output(app, p, id, false).await
}

/// The whole stderr of a finished job, as [`job_stdout`] answers its stdout.
#[utoipa::path(get, path = "/api/jobs/{id}/stderr", tag = "tools", params(("id" = String, Path, description = "Job id")),
    responses((status = 200, description = "The bytes", content_type = "application/octet-stream", body = Vec<u8>), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The job has not finished (`job_not_finished`)", body = ErrorBody), (status = 500, description = "The stored output is corrupt and is not served", body = ErrorBody)))]
pub async fn job_stderr(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    job_output(app, p, id, true).await
}

async fn job_output(app: AppState, p: Principal, id: String, stderr: bool) -> Result<Response, ApiError> {
    let bytes = app.engine.dispatch().job_output(&p, &id, stderr).await?;
    let mut resp = bytes.into_response();
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    Ok(resp)
}

/// Cancel a job invoked directly that has not finished: a queued one never runs, one running
/// is stopped at its executor's next heartbeat. Answered once its one result, saying who
/// cancelled it, is recorded; a caller waiting on the job gets that result. Only the job's
/// invoker or the operator may cancel it.
#[utoipa::path(post, path = "/api/jobs/{id}/cancel", tag = "tools", params(("id" = String, Path, description = "Job id")),
    responses((status = 200, description = "The job, finished, with its result's `cancelledBy`", body = wire::JobRecord), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, description = "Another principal's job", body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The job has finished (`job_finished`), is finishing (`job_finishing`), or is a net's step (`net_job`)", body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn cancel_job(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    _: crate::extract::NoBody,
) -> Result<Json<wire::JobRecord>, ApiError> {
    Ok(Json(app.engine.dispatch().cancel_job(&p, &id).await?.into()))
}

/// Executors with their state (`polling`, `busy`, `idle`, `stopped`, `silent`, `gone`), when each was last seen and the jobs it holds: for an agent, the ids of those in models it may use, the others counted.
#[utoipa::path(get, path = "/api/executors", tag = "executors",
    responses((status = 200, body = Vec<wire::ExecutorView>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn list_executors(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Vec<wire::ExecutorView>>, ApiError> {
    Ok(Json(app.engine.dispatch().executors(&p).await?.into_iter().map(wire::ExecutorView::from).collect()))
}

/// Create an executor credential (operator only). It is good for the executor protocol and nothing else.
#[utoipa::path(post, path = "/api/executor-tokens", tag = "executors", request_body = wire::ExecutorTokenRequest,
    responses((status = 200, description = "{\"name\", \"token\"}", body = Object), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn create_executor_token(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    JsonValue(body): JsonValue,
) -> Result<Json<Value>, ApiError> {
    let req: wire::ExecutorTokenRequest = typed(body)?;
    let token = app.engine.dispatch().create_executor_token(&p, &req.name).await?;
    Ok(Json(json!({"name": req.name, "token": token})))
}

/// The worker that asks, from `x-agentos-executor-slot` (which of the process's workers: the
/// lease ids it is handed start with `{instance}-{slot}-`) and `x-agentos-executor-reclaim`.
/// Headers, not fields, so that masters from before them take the requests of executors that
/// send them.
fn worker<'a>(headers: &HeaderMap, instance: Option<&'a str>) -> Result<Worker<'a>, ApiError> {
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}").trim());
    let slot = match header("x-agentos-executor-slot") {
        None => None,
        Some(v) => Some(v.parse::<u16>().ok().filter(|_| v.bytes().all(|b| b.is_ascii_digit())).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_slot",
                format!("x-agentos-executor-slot {}: a worker's slot is a number from 0 to 65535", shown(v)),
            )
        })?),
    };
    let reclaim = match header("x-agentos-executor-reclaim") {
        None | Some("false") => false,
        Some("true") => true,
        Some(v) => {
            return Err(ApiError::bad_request(
                "invalid_slot",
                format!("x-agentos-executor-reclaim {}: send true or false", shown(v)),
            ));
        }
    };
    Ok(Worker { instance, slot, reclaim })
}

/// Long poll for work: answered the moment a job is queued (200), or 204 after `waitMs`.
#[utoipa::path(post, path = "/api/executor/poll", tag = "executor protocol", request_body = wire::PollRequest,
    params(
        ("x-agentos-executor-slot" = Option<u16>, Header, description = "Which of the executor process's workers polls: the lease ids it is handed start with `{instance}-{slot}-`"),
        ("x-agentos-executor-reclaim" = Option<bool>, Header, description = "true: the worker holds no job, and an earlier request of its that could have brought one got no answer; the leases it still has end now and their jobs go back to the queue, or fail after their last attempt (needs instance and slot)"),
    ),
    responses((status = 200, body = wire::LeasedJob), (status = 204, description = "No work within waitMs"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 408, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn executor_poll(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    headers: HeaderMap,
    JsonValue(body): JsonValue,
) -> Result<Response, ApiError> {
    let req: wire::PollRequest = typed(body)?;
    let wait = Duration::from_millis(req.wait_ms.unwrap_or(25_000).min(60_000));
    let worker = worker(&headers, req.instance.as_deref())?;
    // The name as every other executor call sends it, in its header, when the body has none:
    // a client that sends the header alone holds its jobs under that name on every call.
    let header_name = executor_name(&headers);
    let name = match (req.name.as_deref(), header_name.as_deref()) {
        (Some(body), Some(header)) if body != header => {
            return Err(ApiError::bad_request(
                "invalid_name",
                format!(
                    "the body names this executor {} and x-agentos-executor-name {}: send one name",
                    shown(body),
                    shown(header)
                ),
            ));
        }
        (body, header) => body.or(header),
    };
    match app.engine.dispatch().poll_job(&p, name, worker, &req.replaces, wait).await? {
        Some(job) => Ok(Json(wire::LeasedJob::from(job).with_limit(app.max_result_bytes)).into_response()),
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

/// Say the executor stopped in good order (its jobs finished or handed back): it is listed
/// `stopped`, and counted as serving the queue no more, until it is heard from again.
#[utoipa::path(post, path = "/api/executor/stopped", tag = "executor protocol", request_body = wire::StoppedRequest,
    responses((status = 200, description = "{\"stopped\": true}", body = Object), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 408, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn executor_stopped(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    headers: HeaderMap,
    JsonValue(body): JsonValue,
) -> Result<Json<Value>, ApiError> {
    let req: wire::StoppedRequest = typed(body)?;
    app.engine.dispatch().executor_stopped(&p, executor_name(&headers).as_deref(), req.instance.as_deref()).await?;
    Ok(Json(json!({"stopped": true})))
}

/// Renew a lease. 409 when the lease was lost (the job went to another executor); 403 when
/// another executor holds it (a lease is bound to the executor that took it).
#[utoipa::path(post, path = "/api/executor/jobs/{id}/heartbeat", tag = "executor protocol", params(("id" = String, Path, description = "Job id")), request_body = wire::LeaseRef,
    responses((status = 200, description = "{\"leaseMs\"}", body = Object), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 408, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn executor_heartbeat(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonValue(body): JsonValue,
) -> Result<Json<Value>, ApiError> {
    let req: wire::LeaseRef = typed(body)?;
    let lease = app.engine.dispatch().heartbeat_job(&p, executor_name(&headers).as_deref(), &id, &req.lease_id).await?;
    Ok(Json(json!({"leaseMs": lease.as_millis() as u64})))
}

/// Hand a job back to the queue (an executor stopping before it could run it). Only its holder may.
#[utoipa::path(post, path = "/api/executor/jobs/{id}/release", tag = "executor protocol", params(("id" = String, Path, description = "Job id")), request_body = wire::LeaseRef,
    responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 408, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn executor_release(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    headers: HeaderMap,
    Path(id): Path<String>,
    JsonValue(body): JsonValue,
) -> Result<Json<Value>, ApiError> {
    let req: wire::LeaseRef = typed(body)?;
    app.engine.dispatch().release_job(&p, executor_name(&headers).as_deref(), &id, &req.lease_id).await?;
    Ok(Json(json!({"released": true})))
}

/// Post a job's result. Only the current lease holder's result is taken (its lease id, from the
/// executor that took it: 403 from any other), once. With
/// `?next=true` the answer carries the next queued job, saving the executor a round trip.
#[utoipa::path(post, path = "/api/executor/jobs/{id}/result", tag = "executor protocol", params(("id" = String, Path, description = "Job id"), wire::ResultParams,
        ("x-agentos-executor-slot" = Option<u16>, Header, description = "Which of the executor process's workers posts: the next job's lease id starts with `{instance}-{slot}-`")),
    request_body = wire::ExecutorResult,
    responses((status = 200, description = "{\"recorded\": true, \"next\": LeasedJob or null}", body = Object), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 408, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn executor_result(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    headers: HeaderMap,
    Path(id): Path<String>,
    QueryParams(q): QueryParams<wire::ResultParams>,
    ResultBody(body): ResultBody,
) -> Result<Json<Value>, ApiError> {
    let req = typed::<wire::ExecutorResult>(body)?.into();
    let name = executor_name(&headers);
    // Checked before the result is taken: a refusal after it would leave the executor posting
    // again a result that is already recorded.
    agentos_engine::dispatch::checked_instance("instance", q.instance.as_deref())?;
    let worker = worker(&headers, q.instance.as_deref())?;
    if worker.reclaim {
        return Err(ApiError::bad_request(
            "invalid_slot",
            "x-agentos-executor-reclaim goes with a poll: a worker posting a result holds that job",
        ));
    }
    app.engine.dispatch().complete_job(&p, name.as_deref(), &id, req).await?;
    let next = match q.next {
        Some(true) => app
            .engine
            .dispatch()
            .next_job_now(&p, name.as_deref(), worker)
            .await?
            .map(|job| wire::LeasedJob::from(job).with_limit(app.max_result_bytes)),
        _ => None,
    };
    Ok(Json(json!({"recorded": true, "next": next})))
}
