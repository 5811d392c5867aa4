//! Strom's HTTP front end, one more front end over the service layer: it
//! reads the server's metrics tap ([`strom_server::Services::snapshot`]),
//! never its internals.
//!
//! - `GET /metrics`: Prometheus / OpenMetrics text ([`metrics`]).
//! - `GET /`: the live dashboard (one self-contained page, no internet
//!   needed: hand-drawn SVG charts, no external assets).
//! - `GET /api/snapshot`: this server now, as JSON (what `/metrics` shows).
//! - `GET /api/group`: every live member's snapshot, gathered by the master
//!   over the native protocol (elsewhere: this server's alone).
//! - `GET /api/history`: per-topic rates over the last minutes ([`history`]),
//!   sampled every second; the dashboard's charts and `strom top` read it.
//!
//! Started beside the native front end by `strom server --http-listen`,
//! within the bounds of [`listener`] (`http_max_connections`,
//! `http_header_timeout_ms`, `http_idle_timeout_ms`).

pub mod access;
pub mod history;
pub mod listener;
pub mod metrics;
mod metrics_ops;
mod metrics_work;
mod visible;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use access::Need;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Extension;
use axum::{Json, Router};
use listener::PeerAddr;
use strom_server::Services;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use history::Recorder;

/// How often the sampler records rates.
pub const SAMPLE_PERIOD: Duration = Duration::from_secs(1);

/// Points the history keeps: ten minutes at one per second.
pub const HISTORY_POINTS: usize = 600;

const DASHBOARD: &str = include_str!("../assets/dashboard.html");

/// Why the HTTP endpoint could not start. Stable codes, as elsewhere.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error(
        "http_listen = '{addr}' is not a socket address (HOST:PORT, e.g. 127.0.0.1:9464): {source}"
    )]
    BadAddress {
        addr: String,
        source: std::net::AddrParseError,
    },
    #[error("binding the HTTP endpoint to {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("http_tls: {0}")]
    Tls(String),
}

impl HttpError {
    /// The error's stable code (shared with `strom_proto::ErrorCode`'s
    /// `INVALID_ARGUMENT` and `CONNECTION_FAILED`).
    pub fn code(&self) -> u16 {
        match self {
            HttpError::BadAddress { .. } | HttpError::Tls(_) => {
                strom_proto::ErrorCode::INVALID_ARGUMENT.0
            }
            HttpError::Bind { .. } => strom_proto::ErrorCode::CONNECTION_FAILED.0,
        }
    }
}

#[derive(Clone)]
struct AppState {
    services: Arc<Services>,
    recorder: Arc<Recorder>,
}

/// A running HTTP endpoint.
pub struct HttpHandle {
    addr: SocketAddr,
    tls: bool,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl HttpHandle {
    /// The address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The endpoint's base URL: `https://ADDR` with `http_tls`, else
    /// `http://ADDR`.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Stops serving and sampling.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Binds `listen` (port 0 picks a free one) and serves the endpoint over
/// `services` until [`HttpHandle::shutdown`]. Must run inside a tokio runtime.
pub async fn serve(services: Arc<Services>, listen: &str) -> Result<HttpHandle, HttpError> {
    let addr: SocketAddr = listen.parse().map_err(|source| HttpError::BadAddress {
        addr: listen.to_string(),
        source,
    })?;
    let tcp = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind {
            addr: listen.to_string(),
            source,
        })?;
    let addr = tcp.local_addr().map_err(|source| HttpError::Bind {
        addr: listen.to_string(),
        source,
    })?;
    let tls = match services.config.http_tls {
        false => None,
        true => match services.tls_server_config() {
            Ok(Some(c)) => Some(strom_server::tls::tokio_rustls::TlsAcceptor::from(c)),
            Ok(None) => return Err(HttpError::Tls("needs tls_cert and tls_key".into())),
            Err(e) => return Err(HttpError::Tls(e.to_string())),
        },
    };
    let recorder = Arc::new(Recorder::new(SAMPLE_PERIOD, HISTORY_POINTS));
    let (stop, stopped) = watch::channel(false);
    let sampler = tokio::spawn(recorder.clone().run(services.clone(), stopped.clone()));
    let limits = listener::Limits::of(&services.config);
    let app = router(AppState { services, recorder });
    let https = tls.is_some();
    let server = tokio::spawn(listener::serve(tcp, app, limits, "http", tls, stopped));
    tracing::info!(%addr, tls = https, "HTTP endpoint serving /metrics and the dashboard");
    Ok(HttpHandle {
        addr,
        tls: https,
        stop,
        tasks: vec![sampler, server],
    })
}

fn router(state: AppState) -> Router {
    Router::new()
        .route("/", get(dashboard))
        .route("/metrics", get(metrics_text))
        .route("/api/snapshot", get(snapshot))
        .route("/api/group", get(group))
        .route("/api/history", get(history))
        .route("/login", get(login))
        .with_state(state)
}

/// Refuses a request that may not read what `need` names (`access.rs`);
/// otherwise says what it may see.
fn allowed(
    s: &AppState,
    headers: &HeaderMap,
    peer: &PeerAddr,
    need: Need,
) -> Result<access::Sees, access::Refusal> {
    access::check(&s.services, headers, peer, need)
}

/// `/login?token=…`: checks the token and keeps it in a cookie for the
/// dashboard's own requests, then opens the dashboard.
async fn login(
    State(s): State<AppState>,
    Extension(peer): Extension<PeerAddr>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let token = q.get("token").map(String::as_str).unwrap_or_default();
    let mut headers = HeaderMap::new();
    if let Ok(v) = header::HeaderValue::from_str(&format!("Bearer {token}")) {
        headers.insert(header::AUTHORIZATION, v);
    }
    if let Err(r) = allowed(&s, &headers, &peer, Need::Api) {
        return r.into_response();
    }
    let cookie = format!(
        "{}={token}; HttpOnly; SameSite=Strict; Path=/",
        access::COOKIE
    );
    match header::HeaderValue::from_str(&cookie) {
        Ok(c) => (
            StatusCode::SEE_OTHER,
            [
                (header::SET_COOKIE, c),
                (header::LOCATION, header::HeaderValue::from_static("/")),
            ],
        )
            .into_response(),
        Err(_) => (
            StatusCode::BAD_REQUEST,
            "the token holds characters a cookie cannot",
        )
            .into_response(),
    }
}

async fn dashboard() -> Html<&'static str> {
    Html(DASHBOARD)
}

/// OpenMetrics to scrapers that ask for it (Prometheus does), the classic
/// text format to everyone else.
async fn metrics_text(
    State(s): State<AppState>,
    Extension(peer): Extension<PeerAddr>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = allowed(&s, &headers, &peer, Need::Metrics) {
        return r.into_response();
    }
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    match metrics::render(s.services.snapshot().await) {
        Ok(text) if openmetrics => {
            ([(header::CONTENT_TYPE, metrics::OPENMETRICS)], text).into_response()
        }
        Ok(text) => (
            [(header::CONTENT_TYPE, metrics::PROMETHEUS_TEXT)],
            metrics::to_prometheus_text(&text),
        )
            .into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoding the metrics failed",
        )
            .into_response(),
    }
}

async fn snapshot(
    State(s): State<AppState>,
    Extension(peer): Extension<PeerAddr>,
    headers: HeaderMap,
) -> Response {
    match allowed(&s, &headers, &peer, Need::Api) {
        Ok(sees) => {
            let mut snap = s.services.snapshot().await;
            visible::server(&s.services, &sees, &mut snap);
            Json(snap).into_response()
        }
        Err(r) => r.into_response(),
    }
}

async fn group(
    State(s): State<AppState>,
    Extension(peer): Extension<PeerAddr>,
    headers: HeaderMap,
) -> Response {
    match allowed(&s, &headers, &peer, Need::Api) {
        Ok(sees) => {
            let mut group = s.services.group_snapshot().await;
            for snap in &mut group.servers {
                visible::server(&s.services, &sees, snap);
            }
            Json(group).into_response()
        }
        Err(r) => r.into_response(),
    }
}

async fn history(
    State(s): State<AppState>,
    Extension(peer): Extension<PeerAddr>,
    headers: HeaderMap,
) -> Response {
    match allowed(&s, &headers, &peer, Need::Api) {
        Ok(sees) => {
            Json(visible::history(&s.services, &sees, s.recorder.history())).into_response()
        }
        Err(r) => r.into_response(),
    }
}
