//! Shared-memory transport for processes on the same node: `shm://<path>`.
//!
//! Control frames travel over a Unix domain stream socket, exactly as TCP
//! frames do (same [`FrameReader`]/[`FrameWriter`]). Listening on
//! `shm://auto` binds a socket inside a fresh private directory (mode 0700,
//! under `$XDG_RUNTIME_DIR` or the system temporary directory), removed
//! when the listener is dropped. Bulk payloads follow their body inline on
//! the socket.
//!
//! This module owns the socket plumbing only; it knows frames, never
//! message semantics.

use std::io::IoSlice;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::{UnixListener, UnixStream};

use crate::frame_io::{DirectWrite, FrameReader, FrameWriter};
use crate::{BoxFuture, Conn, Listener, NetError, Transport};

/// The address part that asks for a fresh private socket path.
pub const SHM_AUTO: &str = "auto";

/// Unix socket control frames, for clients on the server's node.
pub struct ShmTransport {
    pub max_frame: u32,
}

impl ShmTransport {
    pub fn new(max_frame: u32) -> Self {
        ShmTransport { max_frame }
    }
}

impl Default for ShmTransport {
    fn default() -> Self {
        ShmTransport::new(strom_proto::DEFAULT_MAX_FRAME)
    }
}

/// The write half of a Unix socket, shared by the writer task and by
/// senders writing directly while it is idle.
struct SharedWrite(Arc<OwnedWriteHalf>);

impl DirectWrite for OwnedWriteHalf {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        let s: &UnixStream = self.as_ref();
        s.try_write_vectored(bufs)
    }
}

impl AsyncWrite for SharedWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let s: &UnixStream = (*self.0).as_ref();
        loop {
            match s.poll_write_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
            match s.try_write(buf) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A connection with inline bulk in both directions.
fn wrap(stream: UnixStream, max_frame: u32, peer: String) -> Conn {
    let (r, w) = stream.into_split();
    let w = Arc::new(w);
    Conn {
        reader: FrameReader::new(Box::new(r), max_frame),
        writer: FrameWriter::new(Box::new(SharedWrite(w.clone())), max_frame),
        direct: Some(w),
        peer,
    }
}

/// A fresh private directory for an `shm://auto` socket.
fn private_dir() -> Result<PathBuf, NetError> {
    use std::os::unix::fs::DirBuilderExt;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!(
        "strom-shm-{}-{}-{nanos:x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let dir = base.join(name);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| NetError::io(format!("creating socket dir {}", dir.display()), e))?;
    Ok(dir)
}

struct ShmListener {
    listener: UnixListener,
    path: PathBuf,
    /// The private directory `auto` created (removed on drop).
    own_dir: Option<PathBuf>,
    max_frame: u32,
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if let Some(dir) = &self.own_dir {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

impl Listener for ShmListener {
    fn local_addr(&self) -> String {
        format!("shm://{}", self.path.display())
    }

    fn accept(&mut self) -> BoxFuture<'_, Result<Conn, NetError>> {
        Box::pin(async move {
            let (s, _) = self
                .listener
                .accept()
                .await
                .map_err(|e| NetError::io("accepting an shm connection", e))?;
            let peer = match s.peer_cred().ok().and_then(|c| c.pid()) {
                Some(pid) => format!("shm://{} (pid {pid})", self.path.display()),
                None => format!("shm://{} (client)", self.path.display()),
            };
            Ok(wrap(s, self.max_frame, peer))
        })
    }
}

fn bind(path: &Path) -> Result<UnixListener, NetError> {
    UnixListener::bind(path)
        .map_err(|e| NetError::io(format!("binding shm://{}", path.display()), e))
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn connect<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Conn, NetError>> {
        Box::pin(async move {
            let s = UnixStream::connect(addr)
                .await
                .map_err(|e| NetError::io(format!("connecting to shm://{addr}"), e))?;
            Ok(wrap(s, self.max_frame, format!("shm://{addr}")))
        })
    }

    fn listen<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Box<dyn Listener>, NetError>> {
        Box::pin(async move {
            let (path, own_dir) = if addr == SHM_AUTO || addr.is_empty() {
                let dir = private_dir()?;
                (dir.join("strom.sock"), Some(dir))
            } else {
                (PathBuf::from(addr), None)
            };
            let listener = match bind(&path) {
                Ok(l) => l,
                Err(e) => {
                    if let Some(dir) = &own_dir {
                        let _ = std::fs::remove_dir(dir);
                    }
                    return Err(e);
                }
            };
            Ok(Box::new(ShmListener {
                listener,
                path,
                own_dir,
                max_frame: self.max_frame,
            }) as Box<dyn Listener>)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OutFrame, Transports};
    use bytes::Bytes;
    use strom_proto::{FrameKind, Request};

    #[tokio::test]
    async fn auto_binds_a_private_socket_that_carries_frames_and_is_removed_on_drop() {
        let t = Transports::default();
        let mut listener = t.listen("shm://auto").await.unwrap();
        let addr = listener.local_addr();
        let path = PathBuf::from(addr.strip_prefix("shm://").unwrap());
        let dir = path.parent().unwrap().to_path_buf();
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "the socket dir is private");
        }
        let client = tokio::spawn({
            let t = t.clone();
            let addr = addr.clone();
            async move {
                let mut c = t.connect(&addr).await.unwrap();
                let payload = Bytes::from(vec![7u8; 100_000]);
                let f = OutFrame::request(2, 9, &Request::Limits).with_bulk(vec![payload]);
                c.writer.write(&f).await.unwrap();
                c.writer.flush().await.unwrap();
                c
            }
        });
        let mut server = listener.accept().await.unwrap();
        let (header, _) = server.reader.next().await.unwrap().unwrap();
        assert_eq!(
            (header.kind, header.id, header.bulk_len),
            (FrameKind::Request, 9, 100_000)
        );
        let bulk = server.reader.read_bulk().await.unwrap();
        assert!(bulk.iter().flat_map(|b| b.iter()).all(|&b| b == 7));
        drop(client.await.unwrap());
        drop(listener);
        assert!(
            !path.exists() && !dir.exists(),
            "socket and dir are removed"
        );
    }

    #[tokio::test]
    async fn connecting_to_a_missing_socket_names_the_address() {
        let dir = std::env::temp_dir().join(format!("strom-shm-missing-{}", std::process::id()));
        let addr = format!("shm://{}/nope.sock", dir.display());
        let e = match Transports::default().connect(&addr).await {
            Err(e) => e.to_string(),
            Ok(_) => panic!("nothing listens there"),
        };
        assert!(e.contains("nope.sock"), "{e}");
    }
}
