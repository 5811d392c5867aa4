//! `strom gen --control-listen HOST:PORT`: a small HTTP/1.1 control
//! endpoint (axum) on its own thread and single-threaded runtime.
//!
//! - `GET /status`: `{"state":"running"|"stopped","target_rate":N,"rate":N,
//!   "sent":N,"acked":N,"errors":N}` (`rate` is the rate achieved over the
//!   last second);
//! - `POST /start`, `POST /stop`: start or pause generation; reply with
//!   the status. Starting with a target rate of 0 is refused (400);
//! - `POST /rate` with the body `{"rate": N}` or the query `?rate=N`: sets
//!   the target (events/s, all workers); it also ends a `--ramp`.
//!
//! Bad input gets a 400 with `{"error": "..."}` saying what was wrong.
//!
//! Every `POST` must say `Content-Type: application/json` (any other gets
//! 415): a hostile web page's cross-site form can send only form, multipart
//! or plain-text bodies, so it cannot drive the generator. Connections are
//! bounded as the server's HTTP endpoint's are (`strom_http::listener`:
//! 256 at once, 10 s for a header, closed after 60 s idle).

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use anyhow::Context;
use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::pacer::check_rate;
use super::Shared;

/// Binds `addr` now (so a bad address fails the command at once), prints
/// the bound address on stderr, and serves on a background thread.
pub fn spawn(addr: &str, shared: Arc<Shared>) -> anyhow::Result<SocketAddr> {
    let listener =
        TcpListener::bind(addr).with_context(|| format!("binding --control-listen {addr}"))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the control endpoint's runtime")?;
    std::thread::Builder::new()
        .name("gen-control".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(error = %e, "control endpoint");
                        return;
                    }
                };
                // Never stopped: it lives as long as the process.
                let (_keep, never) = tokio::sync::watch::channel(false);
                strom_http::listener::serve(
                    listener,
                    router(shared),
                    strom_http::listener::Limits::default(),
                    "gen-control",
                    None,
                    never,
                )
                .await;
            })
        })
        .context("starting the control endpoint's thread")?;
    eprintln!("control listening on http://{bound}");
    Ok(bound)
}

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/status", get(status))
        .route("/start", post(start))
        .route("/stop", post(stop))
        .route("/rate", post(rate))
        .with_state(shared)
}

/// The status object `/status` and every change reply with.
pub fn status_json(s: &Shared) -> Value {
    json!({
        "state": if s.running.load(Ordering::Acquire) { "running" } else { "stopped" },
        "target_rate": s.target(),
        "rate": s.achieved(),
        "sent": s.sent.load(Ordering::Relaxed),
        "acked": s.acked.load(Ordering::Relaxed),
        "errors": s.errors.load(Ordering::Relaxed),
    })
}

/// A 415 answer unless the request says its body is JSON.
fn json_only(headers: &HeaderMap) -> Option<Response> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if json {
        return None;
    }
    let body = json!({ "error": "send Content-Type: application/json (e.g. curl --json '{\"rate\": 100}', or -H 'Content-Type: application/json')" });
    Some((StatusCode::UNSUPPORTED_MEDIA_TYPE, Json(body)).into_response())
}

fn bad_request(msg: impl Into<String>) -> Response {
    let body = json!({ "error": msg.into() });
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

async fn status(State(s): State<Arc<Shared>>) -> Response {
    Json(status_json(&s)).into_response()
}

async fn start(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Some(r) = json_only(&headers) {
        return r;
    }
    if s.target() <= 0.0 {
        return bad_request("no target rate: POST /rate with {\"rate\": N} first");
    }
    s.running.store(true, Ordering::Release);
    tracing::info!(rate = s.target(), "started over HTTP");
    Json(status_json(&s)).into_response()
}

async fn stop(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Some(r) = json_only(&headers) {
        return r;
    }
    s.running.store(false, Ordering::Release);
    tracing::info!("stopped over HTTP");
    Json(status_json(&s)).into_response()
}

async fn rate(
    State(s): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(r) = json_only(&headers) {
        return r;
    }
    match parse_rate(query.as_deref(), &body) {
        Ok(r) => {
            s.manual.store(true, Ordering::Release);
            s.set_target(r);
            tracing::info!(rate = r, "target rate set over HTTP");
            Json(status_json(&s)).into_response()
        }
        Err(msg) => bad_request(msg),
    }
}

/// The rate from `?rate=N` or a JSON body `{"rate": N}` (not both).
fn parse_rate(query: Option<&str>, body: &[u8]) -> Result<f64, String> {
    let from_query = query
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("rate="));
    let body_blank = body.iter().all(u8::is_ascii_whitespace);
    let value = match (from_query, body_blank) {
        (Some(_), false) => return Err("give the rate in the query or the body, not both".into()),
        (Some(q), true) => q
            .parse::<f64>()
            .map_err(|_| format!("?rate={q} is not a number"))?,
        (None, true) => {
            return Err("give the rate as a JSON body {\"rate\": N} or as ?rate=N".into());
        }
        (None, false) => {
            let v: Value = serde_json::from_slice(body)
                .map_err(|e| format!("the body is not JSON ({e}); send {{\"rate\": N}}"))?;
            v.get("rate").and_then(Value::as_f64).ok_or_else(|| {
                "the body must be a JSON object with a number \"rate\"".to_string()
            })?
        }
    };
    check_rate(value)
}

#[cfg(test)]
mod tests {
    use super::parse_rate;

    #[test]
    fn rate_comes_from_query_or_json_body() {
        assert_eq!(parse_rate(Some("rate=250"), b""), Ok(250.0));
        assert_eq!(parse_rate(None, br#"{"rate": 1e3}"#), Ok(1000.0));
        assert_eq!(parse_rate(Some("x=1&rate=5"), b"\n"), Ok(5.0));
    }

    #[test]
    fn bad_rates_are_refused_with_a_reason() {
        for (q, b) in [
            (None, &b""[..]),
            (Some("rate=abc"), b""),
            (Some("rate=-5"), b""),
            (None, b"{\"rate\": \"fast\"}"),
            (None, b"[1,2]"),
            (None, b"{\"rate\": -1}"),
            (None, b"{\"rate\": 1e300}"),
            (None, b"not json"),
            (Some("rate=5"), b"{\"rate\": 5}"),
        ] {
            assert!(parse_rate(q, b).is_err(), "{q:?} {b:?} accepted");
        }
    }
}
