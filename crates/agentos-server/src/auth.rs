//! Bearer authentication and the per-route permission check, driven by [`crate::routes::ROUTES`].

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::error::ApiError;
use agentos_core::event::PrincipalKind;

use crate::routes::{ModelRule, Permission, route_spec};
use crate::state::AppState;

pub async fn authorize(State(app): State<AppState>, mut req: Request, next: Next) -> Result<Response, ApiError> {
    let path = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string()).unwrap_or_default();
    // HEAD is GET without the body (the router answers it with the GET handler): it needs
    // what GET needs.
    let method = match req.method() {
        &axum::http::Method::HEAD => "GET".to_string(),
        m => m.as_str().to_string(),
    };
    // A route missing from the table is refused rather than left open.
    let spec = route_spec(&method, &path)
        .ok_or_else(|| ApiError::forbidden(format!("{method} {path} declares no permission")))?;
    let permission = spec.permission;
    if permission == Permission::Public {
        return Ok(next.run(req).await);
    }
    let header = req.headers().get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let token = match header {
        None => {
            return Err(ApiError::unauthorized(
                "missing bearer token: send 'Authorization: Bearer <token>' (the operator token is in <data>/operator.token)",
            ));
        }
        Some(h) => h
            .strip_prefix("Bearer ")
            .or_else(|| h.strip_prefix("bearer "))
            .map(str::trim)
            .ok_or_else(|| ApiError::unauthorized("the Authorization header must be 'Bearer <token>'"))?,
    };
    let principal = app.engine.authenticate(token).ok_or_else(|| {
        ApiError::unauthorized("the bearer token is not valid (revoked, mistyped, or from another data folder)")
    })?;
    let kind = principal.kind;
    let allowed = match permission {
        Permission::Operator => kind == PrincipalKind::Operator,
        Permission::Executor => kind == PrincipalKind::Executor,
        // An executor credential is good for the executor protocol and nothing else.
        _ if kind == PrincipalKind::Executor => false,
        p => p.allows(principal.flags),
    };
    if !allowed && kind == PrincipalKind::Executor {
        return Err(ApiError::forbidden(format!(
            "{} holds an executor credential, which is good for the executor protocol only, not {method} {path}",
            principal.name
        )));
    }
    if !allowed {
        return Err(ApiError::forbidden(format!(
            "{} may not {method} {path}: that needs {} (it holds {})",
            principal.name,
            permission.describe(),
            principal.flags
        )));
    }
    if spec.model == ModelRule::Path {
        // Decided here, before the handler: a request refused for its model writes nothing.
        let (mut parts, body) = req.into_parts();
        let params = axum::extract::RawPathParams::from_request_parts(&mut parts, &())
            .await
            .map_err(|e| ApiError::bad_request("invalid_path", e.to_string()))?;
        if let Some((_, model)) = params.iter().find(|(k, _)| *k == "model") {
            app.engine.check_model(&principal, model)?;
        }
        req = Request::from_parts(parts, body);
    }
    req.extensions_mut().insert(principal);
    Ok(next.run(req).await)
}
