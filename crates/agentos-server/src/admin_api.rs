//! Principals, secrets and the audit trail over HTTP (operator only, but the audit needs `l`).

use axum::extract::State;

use crate::extract::Path;
use axum::{Extension, Json};
use serde_json::{Value, json};

use agentos_engine::Principal;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{JsonValue, QueryParams, typed};
use crate::state::AppState;
use crate::wire;

/// Create an agent; its token is in the answer, once.
#[utoipa::path(post, path = "/api/agents", tag = "principals", request_body = wire::CreateAgent,
    responses((status = 200, description = "{name, token, flags, model}", body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn create_agent(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    JsonValue(body): JsonValue,
) -> Result<Json<Value>, ApiError> {
    let req: wire::CreateAgent = typed(body)?;
    let (view, token) = app.engine.principals().create_agent(&p, &req.name, &req.flags, req.model.as_deref()).await?;
    Ok(Json(json!({"name": view.name, "token": token, "flags": view.flags, "model": view.model})))
}

/// Principals: name, kind, flags, home model. Never a token.
#[utoipa::path(get, path = "/api/agents", tag = "principals", responses((status = 200, body = Vec<wire::PrincipalView>), (status = 403, body = ErrorBody)))]
pub async fn list_agents(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Vec<wire::PrincipalView>>, ApiError> {
    Ok(Json(app.engine.principals().list_principals(&p)?.into_iter().map(wire::PrincipalView::from).collect()))
}

/// Revoke an agent or executor credential.
#[utoipa::path(delete, path = "/api/agents/{name}", tag = "principals", params(("name" = String, Path)),
    responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn revoke_agent(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
    _: crate::extract::NoBody,
) -> Result<Json<Value>, ApiError> {
    app.engine.principals().revoke(&p, &name).await?;
    Ok(Json(json!({"revoked": name})))
}

/// Let an agent act in another model (its net, tokens, watch stream, jobs). An event; revocable.
#[utoipa::path(post, path = "/api/agents/{name}/grants", tag = "principals", params(("name" = String, Path)), request_body = wire::GrantModel,
    responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn grant_model(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
    JsonValue(body): JsonValue,
) -> Result<Json<Value>, ApiError> {
    let req: wire::GrantModel = typed(body)?;
    app.engine.principals().grant_model(&p, &name, &req.model, true).await?;
    Ok(Json(json!({"agent": name, "granted": req.model})))
}

/// End a model grant.
#[utoipa::path(delete, path = "/api/agents/{name}/grants/{model}", tag = "principals", params(("name" = String, Path), ("model" = String, Path)),
    responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn revoke_model_grant(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((name, model)): Path<(String, String)>,
    _: crate::extract::NoBody,
) -> Result<Json<Value>, ApiError> {
    app.engine.principals().grant_model(&p, &name, &model, false).await?;
    Ok(Json(json!({"agent": name, "revoked": model})))
}

/// Grant a secret to one use: a pinned tool (`tool`, resolved in `model` or the global catalog) or an origin
/// (`origin`, for headers of requests there), optionally only in `model`.
#[utoipa::path(post, path = "/api/secrets/{name}/grants", tag = "secrets", params(("name" = String, Path)), request_body = wire::SecretGrantRequest,
    responses((status = 200, body = wire::SecretGrant), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn grant_secret(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
    JsonValue(body): JsonValue,
) -> Result<Json<wire::SecretGrant>, ApiError> {
    let mut req: wire::SecretGrantRequest = typed(body)?;
    req.secret = name;
    Ok(Json(app.engine.principals().grant_secret(&p, req.into()).await?.into()))
}

/// Every secret grant.
#[utoipa::path(get, path = "/api/secret-grants", tag = "secrets", responses((status = 200, body = Vec<wire::SecretGrant>), (status = 403, body = ErrorBody)))]
pub async fn list_secret_grants(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Vec<wire::SecretGrant>>, ApiError> {
    Ok(Json(app.engine.principals().secret_grants(&p)?.into_iter().map(wire::SecretGrant::from).collect()))
}

/// End a secret grant.
#[utoipa::path(delete, path = "/api/secret-grants/{id}", tag = "secrets", params(("id" = String, Path)),
    responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn revoke_secret_grant(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    _: crate::extract::NoBody,
) -> Result<Json<Value>, ApiError> {
    app.engine.principals().revoke_secret_grant(&p, &id).await?;
    Ok(Json(json!({"revoked": id})))
}

/// Set a secret. The value is encrypted before it is stored and is never answered.
#[utoipa::path(put, path = "/api/secrets/{name}", tag = "secrets", params(("name" = String, Path)), request_body = wire::SetSecret,
    responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn set_secret(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
    JsonValue(body): JsonValue,
) -> Result<Json<Value>, ApiError> {
    let req: wire::SetSecret = typed(body)?;
    app.engine.principals().set_secret(&p, &name, &req.value).await?;
    Ok(Json(json!({"set": name})))
}

/// Secret names, never values.
#[utoipa::path(get, path = "/api/secrets", tag = "secrets", responses((status = 200, body = Vec<wire::SecretView>), (status = 403, body = ErrorBody)))]
pub async fn list_secrets(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Vec<wire::SecretView>>, ApiError> {
    Ok(Json(app.engine.principals().list_secrets(&p)?.into_iter().map(wire::SecretView::from).collect()))
}

/// The event log, oldest first: every change with its principal.
#[utoipa::path(get, path = "/api/events", tag = "audit", params(wire::EventParams), responses((status = 200, body = Vec<wire::EventView>), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn list_events(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    QueryParams(q): QueryParams<wire::EventParams>,
) -> Result<Json<Vec<wire::EventView>>, ApiError> {
    let events = app
        .engine
        .principals()
        .events(
            &p,
            q.after.unwrap_or(0),
            q.limit.unwrap_or(100),
            &agentos_engine::admin::EventFilter { principal: q.principal, model: q.model, kind: q.kind },
        )
        .await?;
    Ok(Json(events.into_iter().map(wire::EventView::from).collect()))
}
