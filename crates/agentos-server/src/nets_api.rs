//! The net routes: models, net documents, tokens, links, transitions, and the event stream.

use std::convert::Infallible;

use axum::extract::State;

use crate::extract::Path;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::{Extension, Json};
use futures_util::Stream;
use serde_json::{Value, json};

use agentos_core::event::EventBody;
use agentos_core::net::NetDoc;
use agentos_engine::Principal;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{JsonValue, NoBody, typed};
use crate::state::AppState;
use crate::wire;

/// Create an empty model.
#[utoipa::path(post, path = "/api/models", tag = "nets", request_body = wire::CreateModel,
    responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn create_model(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    JsonValue(body): JsonValue,
) -> Result<Json<Value>, ApiError> {
    let req: wire::CreateModel = typed(body)?;
    app.engine.nets().create_model(&p, &req.name).await?;
    Ok(Json(json!({"created": req.name})))
}

/// Apply a net document (places and transitions) to a model: everything is validated first,
/// and errors name the path inside the document.
#[utoipa::path(put, path = "/api/models/{model}/net", tag = "nets", params(("model" = String, Path)), request_body = wire::NetDoc,
    responses((status = 200, body = wire::NetView), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn apply_net(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(model): Path<String>,
    JsonValue(body): JsonValue,
) -> Result<Json<wire::NetView>, ApiError> {
    let doc = NetDoc::from_value(body)?;
    Ok(Json(app.engine.nets().apply_net(&p, &model, doc).await?.into()))
}

/// A model's net: its document, places with token counts, transitions with their run state.
#[utoipa::path(get, path = "/api/models/{model}/net", tag = "nets", params(("model" = String, Path)),
    responses((status = 200, body = wire::NetView), (status = 404, body = ErrorBody)))]
pub async fn get_net(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(model): Path<String>,
) -> Result<Json<wire::NetView>, ApiError> {
    Ok(Json(app.engine.nets().net_view(&p, &model)?.into()))
}

/// The tokens in a place, oldest first: all of them, or a page (`limit`, `offset`); the
/// `X-Total-Count` header says how many the place holds.
#[utoipa::path(get, path = "/api/models/{model}/places/{place}/tokens", tag = "nets", params(("model" = String, Path), ("place" = String, Path), wire::TokensQuery),
    responses((status = 200, body = Vec<wire::Token>), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn list_tokens(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((model, place)): Path<(String, String)>,
    crate::extract::QueryParams(q): crate::extract::QueryParams<wire::TokensQuery>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    if q.limit.is_some_and(|l| l == 0 || l > MAX_TOKENS_PAGE) {
        return Err(ApiError::bad_request(
            "invalid_limit",
            format!("limit must be between 1 and {MAX_TOKENS_PAGE}; leave it out for every token"),
        ));
    }
    let (tokens, total) =
        app.engine.nets().tokens_page(&p, &model, &place, q.offset.unwrap_or(0), q.limit.unwrap_or(usize::MAX))?;
    let page: Vec<wire::Token> = tokens.into_iter().map(wire::Token::from).collect();
    Ok(([("x-total-count", total.to_string())], Json(page)).into_response())
}

/// The largest page of tokens one request takes.
const MAX_TOKENS_PAGE: usize = 10_000;

/// Put a token into a place.
#[utoipa::path(post, path = "/api/models/{model}/places/{place}/tokens", tag = "nets", params(("model" = String, Path), ("place" = String, Path)), request_body = wire::PutToken,
    responses((status = 200, body = wire::Token), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn put_token(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((model, place)): Path<(String, String)>,
    JsonValue(body): JsonValue,
) -> Result<Json<wire::Token>, ApiError> {
    let req: wire::PutToken = typed(body)?;
    Ok(Json(app.engine.nets().put_token(&p, &model, &place, req.data, req.name).await?.into()))
}

/// Links with either end in the model (they may be declared by another model).
#[utoipa::path(get, path = "/api/models/{model}/links", tag = "nets", params(("model" = String, Path)),
    responses((status = 200, body = Vec<wire::LinkView>), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn list_links(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(model): Path<String>,
) -> Result<Json<Vec<wire::LinkView>>, ApiError> {
    Ok(Json(app.engine.nets().links(&p, &model)?.into_iter().map(wire::LinkView::from).collect()))
}

/// Start a transition: it fires whenever enabled (and on its schedule).
#[utoipa::path(post, path = "/api/models/{model}/transitions/{transition}/start", tag = "nets", params(("model" = String, Path), ("transition" = String, Path)),
    responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn start(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((model, transition)): Path<(String, String)>,
    _: NoBody,
) -> Result<Json<Value>, ApiError> {
    app.engine.nets().set_started(&p, &model, &transition, true).await?;
    Ok(Json(json!({"transition": transition, "started": true})))
}

/// Stop a transition. Fires in flight finish.
#[utoipa::path(post, path = "/api/models/{model}/transitions/{transition}/stop", tag = "nets", params(("model" = String, Path), ("transition" = String, Path)),
    responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn stop(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((model, transition)): Path<(String, String)>,
    _: NoBody,
) -> Result<Json<Value>, ApiError> {
    app.engine.nets().set_started(&p, &model, &transition, false).await?;
    Ok(Json(json!({"transition": transition, "started": false})))
}

/// Fire a transition once, started or not.
#[utoipa::path(post, path = "/api/models/{model}/transitions/{transition}/fire", tag = "nets", params(("model" = String, Path), ("transition" = String, Path)),
    responses((status = 200, body = wire::FireOutcome), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn fire(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((model, transition)): Path<(String, String)>,
    _: NoBody,
) -> Result<Json<wire::FireOutcome>, ApiError> {
    Ok(Json(app.engine.nets().fire_once(&p, &model, &transition).await?.into()))
}

/// Server-sent events: every change to the model's net and tokens, as it is committed. The
/// stream ends, with an `ended` event saying why, once its principal may no longer watch the
/// model (revoked, or its grant of the model taken back).
#[utoipa::path(get, path = "/api/models/{model}/watch", tag = "nets", params(("model" = String, Path)),
    responses((status = 200, description = "text/event-stream of {seq, time, event}"), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn watch(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(model): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    app.engine.nets().check_watch(&p, &model)?;
    let rx = app.engine.nets().subscribe();
    let engine = app.engine.clone();
    // Whether the watcher may still see the model, asked again on every event that could
    // change the answer and before each event it is sent: access checked once at the start
    // let a revoked agent's open stream go on receiving the model's tokens.
    let refused = move |p: &Principal, model: &str| -> Option<String> {
        if !engine.is_current(p) {
            return Some(format!("{} was revoked", p.name));
        }
        engine.nets().check_watch(p, model).err().map(|e| ApiError::from(e).message)
    };
    let ended = |why: String| SseEvent::default().event("ended").data(json!({"reason": why}).to_string());
    let stream = futures_util::stream::unfold(Some((rx, model, p)), move |open| {
        let refused = refused.clone();
        async move {
            let (mut rx, model, p) = open?;
            loop {
                match rx.recv().await {
                    Ok(ev) => {
                        let access_changed =
                            matches!(ev.body, EventBody::PrincipalRevoked { .. } | EventBody::ModelGrantRevoked(_));
                        let EventBody::Net(ne) = &ev.body else {
                            if access_changed && let Some(why) = refused(&p, &model) {
                                return Some((Ok(ended(why)), None));
                            }
                            continue;
                        };
                        if ev.model != model {
                            continue;
                        }
                        if let Some(why) = refused(&p, &model) {
                            return Some((Ok(ended(why)), None));
                        }
                        let data =
                            json!({"seq": ev.seq, "time": agentos_core::time::format_time(ev.time), "event": ne});
                        let sse = SseEvent::default().event("net").data(data.to_string());
                        return Some((Ok(sse), Some((rx, model, p))));
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        // Missed events may have taken the watcher's access away.
                        if let Some(why) = refused(&p, &model) {
                            return Some((Ok(ended(why)), None));
                        }
                        let sse = SseEvent::default().event("lagged").data(json!({"missed": n}).to_string());
                        return Some((Ok(sse), Some((rx, model, p))));
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// The tokens transitions parked (their fire failed or matched no rule), with the reason.
#[utoipa::path(get, path = "/api/models/{model}/parked", tag = "nets", params(("model" = String, Path), wire::ParkedQuery),
    responses((status = 200, body = Vec<wire::ParkedToken>), (status = 404, body = ErrorBody)))]
pub async fn list_parked(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path(model): Path<String>,
    crate::extract::QueryParams(q): crate::extract::QueryParams<wire::ParkedQuery>,
) -> Result<Json<Vec<wire::ParkedToken>>, ApiError> {
    let parked = app.engine.nets().parked(&p, &model, q.transition.as_deref())?;
    Ok(Json(parked.into_iter().map(wire::ParkedToken::from).collect()))
}

/// Release a parked token: transitions bind it again, its attempts forgotten (an event).
#[utoipa::path(post, path = "/api/models/{model}/parked/{token}/retry", tag = "nets", params(("model" = String, Path), ("token" = String, Path)),
    responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn retry_parked(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((model, token)): Path<(String, String)>,
    _: NoBody,
) -> Result<Json<Value>, ApiError> {
    app.engine.nets().retry_parked(&p, &model, &token).await?;
    Ok(Json(json!({"retried": token})))
}

/// Remove a parked token from its place (an event).
#[utoipa::path(post, path = "/api/models/{model}/parked/{token}/discard", tag = "nets", params(("model" = String, Path), ("token" = String, Path)),
    responses((status = 200, body = Object), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn discard_parked(
    State(app): State<AppState>,
    Extension(p): Extension<Principal>,
    Path((model, token)): Path<(String, String)>,
    _: NoBody,
) -> Result<Json<Value>, ApiError> {
    app.engine.nets().discard_parked(&p, &model, &token).await?;
    Ok(Json(json!({"discarded": token})))
}
