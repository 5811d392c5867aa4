//! TCP transport: frames over a socket, with bulk payloads streamed inline
//! after each body (the inline bulk path), and Nagle disabled so small
//! frames go out at once.

use tokio::net::{TcpListener, TcpStream};

use crate::frame_io::{FrameReader, FrameWriter};
use crate::socket::{self, SharedRead, SharedWrite};
use crate::{BoxFuture, Conn, Listener, NetError, Transport};

/// TCP with a maximum frame size enforced on everything it reads and writes.
pub struct TcpTransport {
    pub max_frame: u32,
}

impl Default for TcpTransport {
    fn default() -> Self {
        TcpTransport {
            max_frame: strom_proto::DEFAULT_MAX_FRAME,
        }
    }
}

fn wrap(stream: TcpStream, max_frame: u32) -> Result<Conn, NetError> {
    stream
        .set_nodelay(true)
        .map_err(|e| NetError::io("setting TCP_NODELAY", e))?;
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "unknown".into());
    let socket = stream
        .into_std()
        .map_err(|e| NetError::io("taking the socket from the runtime", e))?;
    let (r, w) =
        socket::split(socket.into()).map_err(|e| NetError::io("registering the socket", e))?;
    Ok(Conn {
        reader: FrameReader::new(Box::new(SharedRead(r.clone())), max_frame),
        writer: FrameWriter::new(Box::new(SharedWrite::new(w.clone())), max_frame),
        direct: Some(w),
        direct_read: Some(r),
        peer,
        identity: Default::default(),
    })
}

struct TcpAcceptor {
    listener: TcpListener,
    max_frame: u32,
}

impl Listener for TcpAcceptor {
    fn local_addr(&self) -> String {
        self.listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    fn accept(&mut self) -> BoxFuture<'_, Result<Conn, NetError>> {
        Box::pin(async move {
            let (s, _) = self
                .listener
                .accept()
                .await
                .map_err(|e| NetError::io("accepting a connection", e))?;
            wrap(s, self.max_frame)
        })
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn connect<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Conn, NetError>> {
        Box::pin(async move {
            let s = TcpStream::connect(addr)
                .await
                .map_err(|e| NetError::io(format!("connecting to {addr}"), e))?;
            wrap(s, self.max_frame)
        })
    }

    fn listen<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Box<dyn Listener>, NetError>> {
        Box::pin(async move {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|e| NetError::io(format!("binding {addr}"), e))?;
            Ok(Box::new(TcpAcceptor {
                listener,
                max_frame: self.max_frame,
            }) as Box<dyn Listener>)
        })
    }
}
