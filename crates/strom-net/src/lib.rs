//! Strom transports: framed messages plus *bulk* payloads.
//!
//! This crate owns how bytes move between Strom processes: a [`Transport`]
//! connects and listens, and gives each connection as a [`Conn`], a
//! [`FrameReader`] and a [`FrameWriter`] (plus a [`WriterHandle`] task
//! that batches writes); [`Transports`] picks a transport by URL scheme
//! (`tcp://host:port`, or a bare `host:port`; `shm://<socket path>` for
//! clients on the server's node, see [`ShmTransport`]); [`MuxConn`] multiplexes
//! many requests, their responses and push streams over one connection.
//! It knows frames (a header, a body, a bulk payload), never message
//! semantics: it does not decode requests, responses or pushes, and it must
//! not depend on storage, server or client crates.
//!
//! **Bulk is a transport operation.** A frame's header announces its bulk
//! length; where the bytes travel is up to the transport's bulk path
//! ([`bulk`]). TCP streams them inline after the body and the receiver
//! reads them straight into its destination; a shared-memory or RDMA
//! transport moves them one-sidedly through a [`BulkSender`] /
//! [`BulkReceiver`] pair (as the in-process [`MemTransport`] does). Callers
//! send a payload as `OutFrame::bulk` and receive it through
//! [`FrameReader::read_bulk_into`], [`FrameReader::read_bulk`] or
//! [`FrameReader::skip_bulk`], and never assume it is inline.

mod bell;
pub mod bulk;
mod error;
mod frame_io;
mod here;
mod mem;
pub mod mux;
#[cfg(feature = "ofi")]
mod ofi;
mod shm;
mod socket;
pub mod spin;
mod tcp;
mod tls;
mod transports;

pub use bell::Bell;
pub use bulk::{BulkReceiver, BulkSender};
pub use error::NetError;
pub use frame_io::{
    spawn_writer, DirectWrite, FrameReader, FrameWriter, Hold, OutFrame, WriterHandle,
};
pub use here::ReadHere;
pub use mem::MemTransport;
pub use mux::{Complete, FillPlan, LentBuffer, MuxConn, PushHandler, Reply, Waiter};
#[cfg(feature = "ofi")]
pub use ofi::{OfiTransport, OFI_DOMAIN_ENV};
pub use shm::{shm_stats, ShmStats, ShmTransport, SHM_AUTO, SHM_INLINE_MAX};
pub use socket::DirectRead;
pub use tcp::TcpTransport;
pub use tls::{
    client_config, client_config_from_env, client_subject, server_config, TlsTransport, TLS_CA_ENV,
    TLS_CERT_ENV, TLS_KEY_ENV,
};
/// The TLS library, for front ends that terminate TLS themselves (Kafka).
pub use tokio_rustls;
pub use transports::{scheme_of, Transports, BUSY_POLL_ENV, DEFAULT_SCHEME};

use std::future::Future;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
pub type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
pub type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// An established connection, split into its two directions. The transport
/// builds the reader and writer with its bulk path (inline for TCP).
pub struct Conn {
    pub reader: FrameReader<BoxRead>,
    pub writer: FrameWriter<BoxWrite>,
    /// The same socket for senders that write directly while the writer
    /// task is idle (None: always go through the writer task).
    pub direct: Option<std::sync::Arc<dyn DirectWrite>>,
    /// The same socket for a thread that waits on it and reads it itself
    /// (None: only the connection's reader task reads).
    pub direct_read: Option<std::sync::Arc<dyn DirectRead>>,
    /// The peer's address, for logs and errors.
    pub peer: String,
    /// Who the peer is, as far as the transport knows.
    pub identity: PeerIdentity,
}

/// What a transport proved about the peer of an accepted connection: the
/// kernel's credentials of a same-node peer (Unix sockets, `SO_PEERCRED`),
/// or the subject of a verified TLS client certificate. Empty for a
/// connection this side opened, and for TCP.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerIdentity {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// The verified client certificate's subject common name (its whole
    /// subject if it has none).
    pub tls_subject: Option<String>,
    /// Whether the connection is encrypted with TLS.
    pub tls: bool,
}

/// Accepts incoming connections.
pub trait Listener: Send {
    /// The address actually bound (after port 0 was resolved), in a form
    /// [`Transports`] resolves back to this transport.
    fn local_addr(&self) -> String;
    fn accept(&mut self) -> BoxFuture<'_, Result<Conn, NetError>>;
}

/// A way to reach servers: TCP, Unix socket + shared memory
/// ([`ShmTransport`]), libfabric (`OfiTransport`, feature `ofi`) and the in-process [`MemTransport`]. Each enforces its own
/// maximum frame size on everything it reads and writes.
pub trait Transport: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn connect<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Conn, NetError>>;
    fn listen<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Box<dyn Listener>, NetError>>;
}
