//! libfabric transports: `ofi+tcp://`, `ofi+shm://`, `ofi+verbs://` and
//! `ofi+cxi://`, over one RDM endpoint per process and provider
//! ([`strom_ofi`]).
//!
//! An address is `<scheme>://<hex of the endpoint name>/<service>`: the
//! endpoint's `fi_getname` and the id of a listener on it (one endpoint
//! serves any number of listeners and connections). `listen("auto")` opens
//! a new service on the provider's default address (`auto?domain=mlx5_0`
//! picks a domain, i.e. a NIC; so does the `STROM_OFI_DOMAIN` variable).
//!
//! Connection setup: the client sends `Connect{its name, its id}` to the
//! service, the server inserts the name in its AV and answers
//! `Accept{server id}`; every later message carries the receiver's id and
//! the sender's sequence number, by which the receiver restores the order.
//! Frames travel as `Data` messages (see `stream`), bulk payloads are
//! pulled by the receiver with RMA reads (see `bulk`).

mod bulk;
mod hub;
mod stream;
mod wire;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strom_ofi::{OfiError, ProviderSpec};
use tokio::sync::mpsc;

use self::bulk::{OfiBulkReceiver, OfiBulkSender};
use self::hub::{BulkMsg, Held, Hub, Incoming};
use self::stream::{io_err, ConnShared, OfiRead, OfiWrite};
use crate::{BoxFuture, Conn, FrameReader, FrameWriter, Listener, NetError, Transport};

/// A connection's inbound channels and held registrations.
type Routes = (
    mpsc::UnboundedReceiver<Bytes>,
    mpsc::UnboundedReceiver<BulkMsg>,
    Held,
);

/// How long a connect waits for the server's `Accept`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The environment variable naming the domain (NIC) to open by default.
pub const OFI_DOMAIN_ENV: &str = "STROM_OFI_DOMAIN";

/// A Strom transport over one libfabric provider.
pub struct OfiTransport {
    scheme: &'static str,
    provider: &'static str,
    max_frame: u32,
}

impl OfiTransport {
    /// `ofi+tcp`: the `tcp;ofi_rxm` provider (any IP network).
    pub fn tcp(max_frame: u32) -> Self {
        Self::new("ofi+tcp", "tcp;ofi_rxm", max_frame)
    }

    /// `ofi+shm`: the `shm` provider (processes on one node).
    pub fn shm(max_frame: u32) -> Self {
        Self::new("ofi+shm", "shm", max_frame)
    }

    /// `ofi+verbs`: InfiniBand and RoCE (`verbs;ofi_rxm`).
    pub fn verbs(max_frame: u32) -> Self {
        Self::new("ofi+verbs", "verbs;ofi_rxm", max_frame)
    }

    /// `ofi+cxi`: HPE Slingshot.
    pub fn cxi(max_frame: u32) -> Self {
        Self::new("ofi+cxi", "cxi", max_frame)
    }

    /// `scheme` served by libfabric `provider` (as `FI_PROVIDER` names it).
    pub fn new(scheme: &'static str, provider: &'static str, max_frame: u32) -> Self {
        OfiTransport {
            scheme,
            provider,
            max_frame,
        }
    }

    fn hub(&self, domain: Option<&str>) -> Result<Arc<Hub>, NetError> {
        let env = std::env::var(OFI_DOMAIN_ENV).ok().filter(|d| !d.is_empty());
        let spec = ProviderSpec::new(self.provider).with_domain(domain.or(env.as_deref()));
        Hub::get(&spec).map_err(|e| self.err(format!("opening {}", self.scheme), e))
    }

    fn err(&self, context: String, e: OfiError) -> NetError {
        NetError::io(context, io_err(e))
    }

    fn invalid(&self, addr: &str, why: &str) -> NetError {
        NetError::io(
            format!("connecting to {}://{addr}", self.scheme),
            std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_string()),
        )
    }

    /// A connection's reader and writer, with the RMA bulk path. `cache`:
    /// whether the registrations of what it sends stay cached after the
    /// peer released them (see [`OfiBulkSender`]).
    fn conn(&self, shared: Arc<ConnShared>, routes: Routes, peer: String, cache: bool) -> Conn {
        let (data, bulk_rx, held) = routes;
        let receiver = OfiBulkReceiver::new(shared.clone(), bulk_rx);
        let sender = OfiBulkSender {
            conn: shared.clone(),
            held,
            next_id: AtomicU64::new(1),
            cache,
        };
        let read = OfiRead {
            rx: data,
            current: Bytes::new(),
            _conn: shared.clone(),
        };
        Conn {
            reader: FrameReader::with_bulk(Box::new(read), self.max_frame, Box::new(receiver)),
            writer: FrameWriter::with_bulk(
                Box::new(OfiWrite::new(shared)),
                self.max_frame,
                Arc::new(sender),
            ),
            direct: None,
            direct_read: None,
            peer,
            identity: Default::default(),
        }
    }

    async fn connect_to(&self, addr: &str) -> Result<Conn, NetError> {
        let (name, service) = parse_addr(addr).map_err(|why| self.invalid(addr, why))?;
        let hub = self.hub(None)?;
        let context = || format!("connecting to {}://{addr}", self.scheme);
        let peer = hub
            .ep
            .insert_peer(&name)
            .map_err(|e| self.err(context(), e))?;
        let id = hub.next_id();
        let accepted = hub.await_accept(id);
        // The route exists before the server can answer, so nothing it
        // sends after `Accept` is lost.
        let routes = hub.add_conn(id);
        let msg = wire::connect(service, id, hub.ep.name());
        let answer = async {
            hub.send(peer, &msg)
                .await
                .map_err(|e| self.err(context(), e))?;
            accepted.await.map_err(|_| NetError::Closed)
        };
        let answer = tokio::time::timeout(CONNECT_TIMEOUT, answer)
            .await
            .unwrap_or_else(|_| Err(NetError::io(context(), std::io::ErrorKind::TimedOut.into())));
        let server = match answer {
            Ok(s) => s,
            Err(e) => {
                hub.forget_connect(id);
                hub.remove_conn(id);
                return Err(e);
            }
        };
        let shared = ConnShared::new(hub, id, peer, server);
        // A client sends its user's buffers, which may be lent (libstrom's
        // release callbacks): never kept registered past their transfer.
        let peer = format!("{}://{addr}", self.scheme);
        Ok(self.conn(shared, routes, peer, false))
    }
}

/// `<hex name>/<service>` → (name, service).
fn parse_addr(addr: &str) -> Result<(Vec<u8>, u32), &'static str> {
    let (hex, service) = addr
        .split_once('/')
        .ok_or("expected <hex endpoint name>/<service>")?;
    let service = service.parse().map_err(|_| "the service is not a number")?;
    if hex.is_empty() || hex.len() % 2 != 0 || hex.len() > 2 * wire::MAX_NAME {
        return Err("the endpoint name is not hex of a valid length");
    }
    let name = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("x"), 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| "the endpoint name is not hex")?;
    Ok((name, service))
}

fn hex(name: &[u8]) -> String {
    name.iter().map(|b| format!("{b:02x}")).collect()
}

/// `auto`, `auto?domain=X` (or empty) → the domain asked for.
fn parse_listen(addr: &str) -> Result<Option<&str>, &'static str> {
    let (host, query) = addr.split_once('?').unwrap_or((addr, ""));
    if !matches!(host, "" | "auto" | "0") {
        return Err(
            "ofi listens on 'auto' (the provider's address), optionally auto?domain=<name>",
        );
    }
    match query {
        "" => Ok(None),
        q => q
            .strip_prefix("domain=")
            .filter(|d| !d.is_empty())
            .map(Some)
            .ok_or("the only listen option is domain=<name>"),
    }
}

struct OfiListener {
    transport: OfiTransport,
    hub: Arc<Hub>,
    service: u32,
    incoming: mpsc::UnboundedReceiver<Incoming>,
}

impl Drop for OfiListener {
    fn drop(&mut self) {
        self.hub.remove_listener(self.service);
    }
}

impl OfiListener {
    /// Accepts one request: inserts the client, answers `Accept`.
    async fn accept_one(&self, inc: Incoming) -> Result<Conn, OfiError> {
        let peer = self.hub.ep.insert_peer(&inc.name)?;
        let id = self.hub.next_id();
        let routes = self.hub.add_conn(id);
        let shared = ConnShared::new(self.hub.clone(), id, peer, inc.from);
        let peer_name = format!("{}://{} (client)", self.transport.scheme, hex(&inc.name));
        let conn = self.transport.conn(shared, routes, peer_name, true);
        self.hub.send(peer, &wire::accept(inc.from, id)).await?;
        Ok(conn)
    }
}

impl Listener for OfiListener {
    fn local_addr(&self) -> String {
        format!(
            "{}://{}/{}",
            self.transport.scheme,
            hex(self.hub.ep.name()),
            self.service
        )
    }

    fn accept(&mut self) -> BoxFuture<'_, Result<Conn, NetError>> {
        Box::pin(async move {
            loop {
                let inc = self.incoming.recv().await.ok_or(NetError::Closed)?;
                match self.accept_one(inc).await {
                    Ok(conn) => return Ok(conn),
                    // A bad request from one client must not stop the server.
                    Err(e) => tracing::warn!(error = %e, "refusing an ofi connection"),
                }
            }
        })
    }
}

impl Transport for OfiTransport {
    fn name(&self) -> &'static str {
        self.scheme
    }

    fn connect<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Conn, NetError>> {
        Box::pin(self.connect_to(addr))
    }

    fn listen<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Box<dyn Listener>, NetError>> {
        Box::pin(async move {
            let domain = parse_listen(addr).map_err(|why| {
                NetError::io(
                    format!("listening on {}://{addr}", self.scheme),
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, why),
                )
            })?;
            let hub = self.hub(domain)?;
            let service = hub.next_id();
            let incoming = hub.add_listener(service);
            Ok(Box::new(OfiListener {
                transport: OfiTransport::new(self.scheme, self.provider, self.max_frame),
                hub,
                service,
                incoming,
            }) as Box<dyn Listener>)
        })
    }
}

#[cfg(test)]
mod tests;
