//! The write half of a stream socket (TCP or Unix), shared by a
//! connection's writer task (as `AsyncWrite`) and by senders that write
//! directly while that task is idle ([`DirectWrite`]).

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;

use crate::frame_io::DirectWrite;

/// A socket's write half that can wait for room and write without waiting.
pub(crate) trait WriteHalf: Send + Sync + 'static {
    fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>>;
    fn try_write(&self, buf: &[u8]) -> std::io::Result<usize>;
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize>;
}

macro_rules! write_half {
    ($half:ty, $stream:ty) => {
        impl WriteHalf for $half {
            fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
                AsRef::<$stream>::as_ref(self).poll_write_ready(cx)
            }
            fn try_write(&self, buf: &[u8]) -> std::io::Result<usize> {
                AsRef::<$stream>::as_ref(self).try_write(buf)
            }
            fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
                AsRef::<$stream>::as_ref(self).try_write_vectored(bufs)
            }
        }
    };
}

write_half!(tokio::net::tcp::OwnedWriteHalf, tokio::net::TcpStream);
write_half!(tokio::net::unix::OwnedWriteHalf, tokio::net::UnixStream);

impl<W: WriteHalf> DirectWrite for W {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        WriteHalf::try_write_vectored(self, bufs)
    }
}

/// The writer task's side of a shared write half.
pub(crate) struct SharedWrite<W>(pub Arc<W>);

impl<W: WriteHalf> SharedWrite<W> {
    /// Waits for room, then writes with `write` (which must not block).
    fn poll_with(
        &self,
        cx: &mut Context<'_>,
        write: impl Fn(&W) -> std::io::Result<usize>,
    ) -> Poll<std::io::Result<usize>> {
        loop {
            match self.0.poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
            match write(&self.0) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }
}

impl<W: WriteHalf> AsyncWrite for SharedWrite<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_with(cx, |w| w.try_write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_with(cx, |w| WriteHalf::try_write_vectored(w, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
