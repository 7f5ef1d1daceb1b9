//! HTTP: the pages and their assets, the JSON API over [`App`], and each sandbox's terminal
//! websocket. Callers are told apart by a cookie the pages set (`chalk_client`); with a
//! token, every request must carry it (the `?token=` a page is opened with becomes a cookie).
//! Cookies are SameSite=Strict and a request from another origin is refused, so another site
//! open in the same browser cannot drive the shells.

use std::sync::Arc;

use axum::{
    body::Bytes,
    extract::{
        ws::{Message, WebSocket, WebSocketUpgrade},
        Path, Query, State,
    },
    http::{header, HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
    routing::{get, post},
    Json, Router,
};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{
    app::{random_hex, ApiError, App, Entry, Out},
    assets, limits,
    protocol::{self, Control},
};

const CLIENT_COOKIE: &str = "chalk_client";
const TOKEN_COOKIE: &str = "chalk_token";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(json!({"error": self.message}))).into_response()
    }
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/split", get(split_page))
        .route("/suspend", get(suspend_page))
        .route("/assets/{*path}", get(asset))
        .route("/api/info", get(info))
        .route("/api/sandboxes", get(list).post(launch))
        .route("/api/sandboxes/{id}", get(one).delete(close))
        .route("/api/sandboxes/{id}/split", post(split))
        .route("/api/sandboxes/{id}/suspend", post(suspend))
        .route("/api/sandboxes/{id}/resume", post(resume))
        .route("/api/sandboxes/{id}/tty", get(tty))
        .with_state(app)
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// Refuses a request sent by a page of another origin (a browser says where it came from).
fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let (Some(origin), Some(host)) = (headers.get(header::ORIGIN), headers.get(header::HOST))
    else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or_default();
    let host = host.to_str().unwrap_or_default();
    let bare = origin.split_once("://").map_or(origin, |(_, h)| h);
    if bare == host {
        Ok(())
    } else {
        Err(ApiError::new(
            403,
            format!("requests from {origin} are not accepted here"),
        ))
    }
}

/// The caller of an API request: its client cookie, once its token (if any) and origin pass.
fn caller(app: &App, headers: &HeaderMap) -> Result<String, ApiError> {
    same_origin(headers)?;
    if let Some(expected) = &app.cfg.token {
        let given = cookie(headers, TOKEN_COOKIE).or_else(|| {
            headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        });
        if !given.is_some_and(|g| limits::token_matches(expected, g)) {
            return Err(ApiError::new(
                401,
                "this server needs its token: open the page as /?token=... (the token the server was started with)",
            ));
        }
    }
    match cookie(headers, CLIENT_COOKIE) {
        Some(c) if c.len() == 32 && c.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(c.to_string()),
        _ => Err(ApiError::new(
            400,
            "no client cookie: reload the page (it sets one)",
        )),
    }
}

#[derive(Deserialize)]
struct PageQuery {
    token: Option<String>,
}

/// A page: served with the cookies it needs (a client id; the token it was opened with).
fn page(app: &App, headers: &HeaderMap, q: &PageQuery, html: &'static str) -> Response {
    let mut cookies = Vec::new();
    if let Some(expected) = &app.cfg.token {
        let held =
            cookie(headers, TOKEN_COOKIE).is_some_and(|t| limits::token_matches(expected, t));
        match &q.token {
            Some(t) if limits::token_matches(expected, t) => cookies.push(format!(
                "{TOKEN_COOKIE}={t}; Path=/; HttpOnly; SameSite=Strict"
            )),
            _ if held => {}
            _ => {
                return (
                    StatusCode::UNAUTHORIZED,
                    "this server needs its token: open the page as /?token=...\n",
                )
                    .into_response()
            }
        }
    }
    if cookie(headers, CLIENT_COOKIE).is_none() {
        cookies.push(format!(
            "{CLIENT_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age=31536000",
            random_hex(16)
        ));
    }
    let mut resp = ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response();
    for c in cookies {
        if let Ok(v) = HeaderValue::from_str(&c) {
            resp.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    resp
}

async fn index(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> Response {
    page(&app, &headers, &q, assets::INDEX)
}

async fn split_page(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> Response {
    page(&app, &headers, &q, assets::SPLIT)
}

async fn suspend_page(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> Response {
    page(&app, &headers, &q, assets::SUSPEND)
}

async fn asset(Path(path): Path<String>) -> Response {
    match assets::get(&path) {
        Some((mime, body)) => ([(header::CONTENT_TYPE, mime)], body).into_response(),
        None => (StatusCode::NOT_FOUND, "no such asset\n").into_response(),
    }
}

async fn info(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    caller(&app, &headers)?;
    let l = &app.cfg.limits;
    Ok(Json(json!({
        "image": app.cfg.image,
        "limits": {"total": l.total, "per_client": l.per_client, "memory": l.memory,
                   "lifetime_s": l.lifetime.as_secs()},
    })))
}

/// The terminal size a request asks for (its JSON body's `cols` and `rows`), 80x24 if none.
fn size_of(body: &Bytes) -> Result<(u32, u32), ApiError> {
    if body.is_empty() {
        return Ok((80, 24));
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(400, format!("the request's body is not JSON: {e}")))?;
    let n = |k: &str| {
        v[k].as_u64()
            .map_or(Ok(None), |n| u32::try_from(n).map(Some))
    };
    match (n("cols"), n("rows")) {
        (Ok(Some(c)), Ok(Some(r))) => {
            protocol::check_size(c, r).map_err(|m| ApiError::new(400, m))?;
            Ok((c, r))
        }
        (Ok(None), Ok(None)) => Ok((80, 24)),
        _ => Err(ApiError::new(
            400,
            "cols and rows must both be given, as whole numbers",
        )),
    }
}

async fn list(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    let me = caller(&app, &headers)?;
    Ok(Json(json!({"sandboxes": app.list(&me)})))
}

async fn launch(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let me = caller(&app, &headers)?;
    let size = size_of(&body)?;
    let made = app.launch(&me, size).await?;
    Ok((StatusCode::CREATED, Json(made)).into_response())
}

async fn one(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let me = caller(&app, &headers)?;
    Ok(Json(app.get(&me, &id)?.view()))
}

async fn close(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let me = caller(&app, &headers)?;
    app.close(&me, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn split(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let me = caller(&app, &headers)?;
    let size = size_of(&body)?;
    let fork = app.split(&me, &id, size).await?;
    Ok((StatusCode::CREATED, Json(fork)).into_response())
}

async fn suspend(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let me = caller(&app, &headers)?;
    Ok(Json(app.suspend(&me, &id).await?))
}

async fn resume(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let me = caller(&app, &headers)?;
    let size = size_of(&body)?;
    Ok(Json(app.resume(&me, &id, size).await?))
}

async fn tty(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let me = caller(&app, &headers)?;
    let entry = app.get(&me, &id)?;
    Ok(ws.on_upgrade(move |socket| attach(app, entry, socket)))
}

/// One page's view of a sandbox's terminal: the screen so far (after a hello that clears the
/// page's), then everything it prints and every state change; keystrokes and window sizes
/// back. A page that falls too far behind is repainted from the replay.
async fn attach(app: Arc<App>, entry: Arc<Entry>, socket: WebSocket) {
    let (mut sink, mut stream) = socket.split();
    let writer_entry = entry.clone();
    let writer = tokio::spawn(async move {
        let (screen, mut rx) = writer_entry.subscribe();
        let state = json!({"type": "state", "sandbox": writer_entry.view()}).to_string();
        let hello = [
            Message::Text(protocol::hello().into()),
            Message::Binary(screen.into()),
            Message::Text(state.into()),
        ];
        for m in hello {
            if sink.send(m).await.is_err() {
                return;
            }
        }
        loop {
            let msg = match rx.recv().await {
                Ok(Out::Bytes(b)) => Message::Binary(b.to_vec().into()),
                Ok(Out::Event(e)) => Message::Text(e.into()),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    let (screen, again) = writer_entry.subscribe();
                    rx = again;
                    if sink
                        .send(Message::Text(protocol::hello().into()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                    Message::Binary(screen.into())
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            if sink.send(msg).await.is_err() {
                return;
            }
        }
    });
    while let Some(Ok(msg)) = stream.next().await {
        match msg {
            Message::Binary(data) => {
                if let Some(input) = entry.input() {
                    if let Err(e) = crate::terminal::write_all(&input, &data).await {
                        eprintln!("chalk-web: input to {}: {e}", entry.id);
                    }
                }
            }
            Message::Text(text) => match protocol::parse_control(&text) {
                Ok(Control::Resize { cols, rows }) => app.resize(&entry, cols, rows),
                Err(e) => eprintln!("chalk-web: {}: {e}", entry.id),
            },
            Message::Close(_) => break,
            _ => {}
        }
    }
    writer.abort();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn cookies_are_found_by_name() {
        let h = headers(&[("cookie", "a=1; chalk_client=abc"), ("cookie", "b=2")]);
        assert_eq!(cookie(&h, "chalk_client"), Some("abc"));
        assert_eq!(cookie(&h, "b"), Some("2"));
        assert_eq!(cookie(&h, "c"), None);
    }

    #[test]
    fn other_origins_are_refused() {
        let ok = headers(&[
            ("origin", "http://127.0.0.1:8080"),
            ("host", "127.0.0.1:8080"),
        ]);
        assert!(same_origin(&ok).is_ok());
        let bad = headers(&[
            ("origin", "http://evil.example"),
            ("host", "127.0.0.1:8080"),
        ]);
        assert_eq!(same_origin(&bad).unwrap_err().status, 403);
        assert!(same_origin(&headers(&[("host", "127.0.0.1:8080")])).is_ok());
    }

    #[test]
    fn sizes_come_from_the_body() {
        assert_eq!(size_of(&Bytes::new()).unwrap(), (80, 24));
        assert_eq!(
            size_of(&Bytes::from_static(br#"{"cols":100,"rows":30}"#)).unwrap(),
            (100, 30)
        );
        assert_eq!(
            size_of(&Bytes::from_static(br#"{"cols":100}"#))
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            size_of(&Bytes::from_static(br#"{"cols":1,"rows":1}"#))
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            size_of(&Bytes::from_static(b"nope")).unwrap_err().status,
            400
        );
    }
}
