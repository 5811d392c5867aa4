//! The Kafka listener over TLS (`kafka_tls`; Kafka clients'
//! `security.protocol=SSL` or `SASL_SSL`), with the server's certificate
//! (docs/security.md). Each handshake runs in the connection's own task,
//! bounded in time; with a client CA, the verified client certificate's
//! common name is the connection's principal until SASL says otherwise.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use strom_auth::{Mechanism, Principal};
use strom_server::tls::tokio_rustls::TlsAcceptor;
use tokio::net::TcpStream;

use crate::request::Ctx;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the TLS handshake on `sock`, then serves the connection.
pub async fn serve(acceptor: TlsAcceptor, sock: TcpStream, peer: SocketAddr, ctx: Arc<Ctx>) {
    let _ = sock.set_nodelay(true);
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(sock)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::warn!(peer = %peer, error = %e, "Kafka TLS handshake failed; connection closed");
            return;
        }
        Err(_) => {
            tracing::warn!(peer = %peer, "Kafka TLS handshake did not finish in time; connection closed");
            return;
        }
    };
    let ctx = match strom_server::tls::client_subject(stream.get_ref().1) {
        Some(cn) => ctx.for_principal(Principal::user(cn, Mechanism::Certificate)),
        None => ctx,
    };
    crate::conn::serve_stream(stream, peer, ctx).await
}
