//! TLS over TCP: `tls://host:port` (docs/transports.md, "TLS";
//! docs/security.md). rustls with the ring provider; frames and their bulk
//! payloads travel inline inside the TLS stream, as over TCP.
//!
//! A [`TlsTransport`] holds a server side (certificate, key and, for
//! mutual TLS, the CA client certificates must chain to) and a client side
//! (the CA it trusts servers by and, optionally, its own certificate). A
//! listener does each handshake off its accept loop, bounded in time, so a
//! slow or plaintext client holds up no one; the connection's
//! [`PeerIdentity`] carries the verified client certificate's subject.
//! Clients get a client side from `STROM_TLS_CA` (and `STROM_TLS_CERT`,
//! `STROM_TLS_KEY`) through [`crate::Transports::new`].

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::frame_io::{FrameReader, FrameWriter};
use crate::{BoxFuture, Conn, Listener, NetError, PeerIdentity, Transport};

/// The CA file clients trust servers by (turns on `tls://` for clients).
pub const TLS_CA_ENV: &str = "STROM_TLS_CA";
/// A client's own certificate (PEM) for mutual TLS, with [`TLS_KEY_ENV`].
pub const TLS_CERT_ENV: &str = "STROM_TLS_CERT";
/// The key of [`TLS_CERT_ENV`].
pub const TLS_KEY_ENV: &str = "STROM_TLS_KEY";
/// A handshake that takes longer is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once per listener; more connections wait in
/// the kernel's backlog.
const MAX_HANDSHAKES: usize = 256;

/// TLS over TCP, with a maximum frame size on everything read and written.
pub struct TlsTransport {
    max_frame: u32,
    server: Option<Arc<ServerConfig>>,
    client: Option<Arc<ClientConfig>>,
    /// Why the client side from the environment could not be built, told
    /// to whoever connects.
    broken: Option<String>,
}

fn bad(what: String) -> NetError {
    NetError::TlsConfig(what)
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, NetError> {
    let shown = path.display();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(format!("reading certificates from {shown}: {e}")))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("a certificate in {shown}: {e}")))?;
    if certs.is_empty() {
        return Err(bad(format!("{shown} holds no PEM certificate")));
    }
    Ok(certs)
}

fn key(path: &Path) -> Result<PrivateKeyDer<'static>, NetError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| {
        bad(format!(
            "reading a private key from {}: {e}",
            path.display()
        ))
    })
}

fn roots(path: &Path) -> Result<RootCertStore, NetError> {
    let mut roots = RootCertStore::empty();
    for c in certs(path)? {
        roots
            .add(c)
            .map_err(|e| bad(format!("a CA certificate in {}: {e}", path.display())))?;
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsTransport {
    /// Neither side yet: add [`with_server`](Self::with_server) and/or
    /// [`with_client`](Self::with_client).
    pub fn new(max_frame: u32) -> Self {
        TlsTransport {
            max_frame,
            server: None,
            client: None,
            broken: None,
        }
    }

    /// The transport `Transports::new` registers for `tls`: a client side
    /// from the environment if it names one (a bad setting is reported on
    /// connect), else none.
    pub fn for_clients(max_frame: u32) -> Self {
        match Self::from_env(max_frame) {
            Some(Ok(t)) => t,
            Some(Err(e)) => TlsTransport {
                broken: Some(e.to_string()),
                ..Self::new(max_frame)
            },
            None => Self::new(max_frame),
        }
    }

    /// Serves with `cert` (PEM chain) and `key`; with `client_ca`, every
    /// client must present a certificate that chains to it (mutual TLS).
    pub fn with_server(
        mut self,
        cert: &Path,
        key_file: &Path,
        client_ca: Option<&Path>,
    ) -> Result<Self, NetError> {
        self.server = Some(server_config(cert, key_file, client_ca)?);
        Ok(self)
    }

    /// Connects trusting servers whose certificate chains to `ca`; with
    /// `identity` (certificate, key), presents it for mutual TLS.
    pub fn with_client(
        mut self,
        ca: &Path,
        identity: Option<(&Path, &Path)>,
    ) -> Result<Self, NetError> {
        self.client = Some(client_config(ca, identity)?);
        Ok(self)
    }

    /// A client side from `STROM_TLS_CA` (and `STROM_TLS_CERT` with
    /// `STROM_TLS_KEY`); `None` if `STROM_TLS_CA` is unset.
    pub fn from_env(max_frame: u32) -> Option<Result<Self, NetError>> {
        let client = client_config_from_env()?;
        Some(client.map(|c| {
            let mut t = Self::new(max_frame);
            t.client = Some(c);
            t
        }))
    }
}

/// A rustls client configuration from `STROM_TLS_CA` (and `STROM_TLS_CERT`
/// with `STROM_TLS_KEY`, presented for mutual TLS); `None` if
/// `STROM_TLS_CA` is unset. Every TLS client of Strom's (the native
/// transport, `strom top` over HTTPS) reads its settings here.
pub fn client_config_from_env() -> Option<Result<Arc<ClientConfig>, NetError>> {
    let ca = std::env::var_os(TLS_CA_ENV).filter(|v| !v.is_empty())?;
    let cert = std::env::var_os(TLS_CERT_ENV).filter(|v| !v.is_empty());
    let key = std::env::var_os(TLS_KEY_ENV).filter(|v| !v.is_empty());
    let identity = match (&cert, &key) {
        (Some(c), Some(k)) => Some((Path::new(c), Path::new(k))),
        (None, None) => None,
        _ => {
            return Some(Err(bad(format!(
                "set both {TLS_CERT_ENV} and {TLS_KEY_ENV}, or neither"
            ))))
        }
    };
    Some(client_config(Path::new(&ca), identity))
}

/// A rustls client configuration trusting servers whose certificate
/// chains to `ca` (PEM); with `identity` (certificate, key), presenting it
/// for mutual TLS. Shared with `strom top` over `https://`.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<Arc<ClientConfig>, NetError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots(ca)?);
    let config = match identity {
        Some((c, k)) => builder
            .with_client_auth_cert(certs(c)?, key(k)?)
            .map_err(|e| bad(format!("client certificate {}: {e}", c.display())))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// A rustls server configuration from PEM files: `cert` (chain) and
/// `key`; with `client_ca`, clients must present a certificate chaining to
/// it. Shared with the Kafka listener (through strom-server).
pub fn server_config(
    cert: &Path,
    key_file: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, NetError> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                    .build()
                    .map_err(|e| bad(format!("client CA {}: {e}", ca.display())))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(certs(cert)?, key(key_file)?)
        .map_err(|e| {
            bad(format!(
                "{} with {}: {e}",
                cert.display(),
                key_file.display()
            ))
        })?;
    Ok(Arc::new(config))
}

/// The subject of the verified client certificate of a server-side TLS
/// connection, if it presented one.
pub fn client_subject(conn: &rustls::ServerConnection) -> Option<String> {
    conn.peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| subject(c.as_ref()))
}

fn conn<S>(stream: S, max_frame: u32, peer: String, identity: PeerIdentity) -> Conn
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (r, w) = tokio::io::split(stream);
    Conn {
        reader: FrameReader::new(Box::new(r), max_frame),
        writer: FrameWriter::new(Box::new(w), max_frame),
        direct: None,
        direct_read: None,
        peer,
        identity,
    }
}

/// The subject a verified client certificate names: its common name, or
/// the whole subject if it has none.
fn subject(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let cn = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok().map(str::to_string));
    Some(cn.unwrap_or_else(|| subject.to_string()))
}

async fn handshake(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    max_frame: u32,
) -> Result<Conn, NetError> {
    let peer = tcp
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "unknown".into());
    let _ = tcp.set_nodelay(true);
    let failed = |reason: String| NetError::Tls {
        peer: peer.clone(),
        reason,
    };
    let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
        .await
        .map_err(|_| failed(format!("no handshake within {HANDSHAKE_TIMEOUT:?}")))?
        .map_err(|e| failed(e.to_string()))?;
    let tls_subject = client_subject(stream.get_ref().1);
    let identity = PeerIdentity {
        tls_subject,
        tls: true,
        ..Default::default()
    };
    Ok(conn(stream, max_frame, peer.clone(), identity))
}

struct TlsListener {
    local: String,
    ready: mpsc::Receiver<Conn>,
    task: JoinHandle<()>,
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener for TlsListener {
    fn local_addr(&self) -> String {
        self.local.clone()
    }

    fn accept(&mut self) -> BoxFuture<'_, Result<Conn, NetError>> {
        Box::pin(async move { self.ready.recv().await.ok_or(NetError::Closed) })
    }
}

/// Accepts TCP connections and runs each handshake in a task of its own.
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    max_frame: u32,
    ready: mpsc::Sender<Conn>,
) {
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                tracing::warn!(error = %e, "tls: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (acceptor, ready) = (acceptor.clone(), ready.clone());
        tokio::spawn(async move {
            match handshake(acceptor, tcp, max_frame).await {
                Ok(c) => {
                    let _ = ready.send(c).await;
                }
                Err(e) => tracing::warn!(error = %e, "tls: handshake failed; connection closed"),
            }
            drop(slot);
        });
    }
}

impl Transport for TlsTransport {
    fn name(&self) -> &'static str {
        "tls"
    }

    fn connect<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Conn, NetError>> {
        Box::pin(async move {
            if let Some(why) = &self.broken {
                return Err(bad(why.clone()));
            }
            let Some(client) = &self.client else {
                return Err(bad(format!(
                    "connecting to tls://{addr} needs a CA to trust the server by (--tls-ca, or {TLS_CA_ENV})"
                )));
            };
            let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let name = ServerName::try_from(host.to_string())
                .map_err(|e| bad(format!("tls://{addr}: '{host}' is not a host name: {e}")))?;
            let tcp = TcpStream::connect(addr)
                .await
                .map_err(|e| NetError::io(format!("connecting to tls://{addr}"), e))?;
            let _ = tcp.set_nodelay(true);
            let stream = TlsConnector::from(client.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| NetError::Tls {
                    peer: format!("tls://{addr}"),
                    reason: e.to_string(),
                })?;
            let identity = PeerIdentity {
                tls: true,
                ..Default::default()
            };
            Ok(conn(
                stream,
                self.max_frame,
                format!("tls://{addr}"),
                identity,
            ))
        })
    }

    fn listen<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Box<dyn Listener>, NetError>> {
        Box::pin(async move {
            let Some(server) = &self.server else {
                return Err(bad(format!(
                    "listening on tls://{addr} needs a certificate and key (--tls-cert, --tls-key)"
                )));
            };
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|e| NetError::io(format!("binding tls://{addr}"), e))?;
            let local = listener
                .local_addr()
                .map(|a| format!("tls://{a}"))
                .map_err(|e| NetError::io(format!("binding tls://{addr}"), e))?;
            let (tx, ready) = mpsc::channel(64);
            let acceptor = TlsAcceptor::from(server.clone());
            let task = tokio::spawn(accept_loop(listener, acceptor, self.max_frame, tx));
            Ok(Box::new(TlsListener { local, ready, task }) as Box<dyn Listener>)
        })
    }
}
