//! Strom transports.
//!
//! Every transport offers framed messages plus *bulk* payloads. Over TCP (and
//! Unix sockets) a bulk payload is streamed right after the frame body, and the
//! receiver reads it straight into its destination buffer. Shared memory and
//! libfabric transports will implement the same [`Transport`] trait with
//! one-sided copies. This crate knows frames, never message semantics, and
//! must not depend on storage, server or client crates.

mod error;
mod frame_io;
mod tcp;

pub use error::NetError;
pub use frame_io::{
    spawn_writer, DirectWrite, FrameReader, FrameWriter, Hold, OutFrame, WriterHandle,
};
pub use tcp::TcpTransport;

use std::future::Future;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
pub type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
pub type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// An established connection, split into its two directions.
pub struct Conn {
    pub reader: FrameReader<BoxRead>,
    pub writer: FrameWriter<BoxWrite>,
    /// The same socket for senders that write directly while the writer
    /// task is idle (None: always go through the writer task).
    pub direct: Option<std::sync::Arc<dyn DirectWrite>>,
    /// The peer's address, for logs and errors.
    pub peer: String,
}

/// Accepts incoming connections.
pub trait Listener: Send {
    /// The address actually bound (after port 0 was resolved).
    fn local_addr(&self) -> String;
    fn accept(&mut self) -> BoxFuture<'_, Result<Conn, NetError>>;
}

/// A way to reach servers: TCP today; Unix socket + shared memory and
/// libfabric later.
pub trait Transport: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn connect<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Conn, NetError>>;
    fn listen<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Box<dyn Listener>, NetError>>;
}
