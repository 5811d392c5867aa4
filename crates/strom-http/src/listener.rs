//! Serving an axum router over HTTP/1.1 with bounds a hostile client
//! cannot get around: at most [`Limits::max_connections`] connections (more
//! are closed at accept), a request's header must arrive within
//! [`Limits::header_timeout`], and a connection that reads and writes
//! nothing for [`Limits::idle_timeout`] is closed. Repeated accept failures
//! (out of descriptors) are logged once per interval with a count. With a
//! TLS acceptor (`http_tls`), each connection's handshake runs in its own
//! task within the header timeout, then the same bounds apply. Used by
//! `strom server --http-listen` and `strom gen --control-listen`.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use strom_server::tls::tokio_rustls::TlsAcceptor;
use strom_server::AcceptErrors;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

/// The bounds of one HTTP listener.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

impl Limits {
    /// The limits in a server's configuration (`http_max_connections`,
    /// `http_header_timeout_ms`, `http_idle_timeout_ms`).
    pub fn of(config: &strom_server::ServerConfig) -> Self {
        Limits {
            max_connections: config.http_max_connections as usize,
            header_timeout: Duration::from_millis(config.http_header_timeout_ms),
            idle_timeout: Duration::from_millis(config.http_idle_timeout_ms),
        }
    }
}

impl Default for Limits {
    /// As a server's defaults: 256 connections, 10 s to send a header, 60
    /// s of silence.
    fn default() -> Self {
        Limits {
            max_connections: 256,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// Who a request's connection is: its address, and over mutual TLS the
/// subject of the client certificate the listener verified.
#[derive(Clone, Debug)]
pub struct PeerAddr {
    pub addr: SocketAddr,
    pub cert_subject: Option<Arc<str>>,
}

/// Serves `app` on `listener` within `limits` (over TLS with `tls`) until
/// `stopped` turns true. `name` names the listener in logs.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    name: &'static str,
    tls: Option<TlsAcceptor>,
    mut stopped: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut failures = AcceptErrors::new(name);
    let mut refused = 0u64;
    let for_conns = stopped.clone();
    loop {
        tokio::select! {
            c = listener.accept() => match c {
                Ok((sock, peer)) => match slots.clone().try_acquire_owned() {
                    Ok(slot) => {
                        let conn = Conn { peer, app: app.clone(), limits, _slot: slot, stopped: for_conns.clone() };
                        match tls.clone() {
                            None => tokio::spawn(conn.serve(sock, None)),
                            Some(a) => tokio::spawn(conn.handshake(a, sock)),
                        };
                    }
                    Err(_) => {
                        refused += 1;
                        if refused.is_power_of_two() {
                            tracing::warn!(listener = name, peer = %peer, refused, limit = limits.max_connections, "HTTP connection limit reached; closing new connections");
                        }
                    }
                },
                Err(e) => {
                    failures.failed(&e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = stop_signal(&mut stopped) => return,
        }
    }
}

/// One accepted connection and what serving it needs.
struct Conn {
    peer: SocketAddr,
    app: Router,
    limits: Limits,
    _slot: OwnedSemaphorePermit,
    stopped: watch::Receiver<bool>,
}

impl Conn {
    /// The TLS handshake, within the header timeout, then [`Conn::serve`].
    async fn handshake(self, tls: TlsAcceptor, sock: TcpStream) {
        let peer = self.peer;
        match tokio::time::timeout(self.limits.header_timeout, tls.accept(sock)).await {
            Ok(Ok(stream)) => {
                let subject = strom_server::tls::client_subject(stream.get_ref().1);
                self.serve(stream, subject.map(Arc::from)).await
            }
            Ok(Err(e)) => {
                tracing::debug!(peer = %peer, error = %e, "HTTPS handshake failed; connection closed")
            }
            Err(_) => {
                tracing::debug!(peer = %peer, "HTTPS handshake did not finish in time; connection closed")
            }
        }
    }

    /// Serves the connection until it closes, breaks a bound, or the
    /// listener stops.
    async fn serve<S>(self, sock: S, cert_subject: Option<Arc<str>>)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Conn {
            peer,
            app,
            limits,
            _slot,
            mut stopped,
        } = self;
        let start = Instant::now();
        let last = Arc::new(AtomicU64::new(0));
        let io = TokioIo::new(Watched {
            inner: sock,
            start,
            last: last.clone(),
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout);
        // Handlers that decide by the peer's address read it from here.
        let app = app.layer(axum::Extension(PeerAddr {
            addr: peer,
            cert_subject,
        }));
        let conn = builder.serve_connection(io, TowerToHyperService::new(app));
        tokio::pin!(conn);
        let mut closing = false;
        loop {
            let quiet_since = start + Duration::from_millis(last.load(Ordering::Relaxed));
            let idle_at = quiet_since + limits.idle_timeout;
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(peer = %peer, error = %e, "HTTP connection closed");
                    }
                    return;
                }
                _ = tokio::time::sleep_until(idle_at.into()) => {
                    let quiet = start + Duration::from_millis(last.load(Ordering::Relaxed));
                    if quiet.elapsed() < limits.idle_timeout {
                        continue;
                    }
                    if closing {
                        // Asked to close, and still silent: drop it.
                        tracing::debug!(peer = %peer, "HTTP connection idle; dropped");
                        return;
                    }
                    tracing::debug!(peer = %peer, "HTTP connection idle; closing");
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                    touch(&last, start);
                }
                _ = stop_signal(&mut stopped), if !closing => {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}

/// Resolves once `stopped` turns true (or its sender is gone).
async fn stop_signal(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

fn touch(last: &AtomicU64, start: Instant) {
    last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
}

/// A socket that records when it last moved bytes (ms since `start`).
struct Watched<S> {
    inner: S,
    start: Instant,
    last: Arc<AtomicU64>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            touch(&self.last, self.start);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            touch(&self.last, self.start);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            touch(&self.last, self.start);
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
