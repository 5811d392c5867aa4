//! The two halves of a stream socket (TCP or Unix), each shared by two
//! users: the write half by a connection's writer task (as `AsyncWrite`)
//! and by senders that write directly while that task is idle
//! ([`DirectWrite`]); the read half by the connection's reader task (as
//! `AsyncRead`) and by a thread that reads it itself while it waits
//! ([`DirectRead`], `here.rs`).

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use std::os::fd::{AsRawFd, RawFd};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

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

/// A socket a thread can wait on and read without the runtime (TCP, Unix),
/// for [`MuxConn::read_here`](crate::MuxConn::read_here).
pub trait DirectRead: Send + Sync {
    /// The runtime's readiness of the socket (for the reader task).
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>>;
    /// Runs `f` if the runtime holds the socket readable; if `f` says
    /// `WouldBlock`, the runtime forgets that readiness (unless newer
    /// readiness came meanwhile).
    fn try_io_read(&self, f: &mut dyn FnMut() -> std::io::Result<()>) -> std::io::Result<()>;
    fn fd(&self) -> RawFd;
}

/// A socket's read half that can wait for bytes and read without waiting.
pub(crate) trait ReadHalf: Send + Sync + 'static {
    fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>>;
    fn try_read(&self, buf: &mut [u8]) -> std::io::Result<usize>;
    fn try_io(&self, f: &mut dyn FnMut() -> std::io::Result<()>) -> std::io::Result<()>;
    fn fd(&self) -> RawFd;
}

macro_rules! read_half {
    ($half:ty, $stream:ty) => {
        impl ReadHalf for $half {
            fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
                AsRef::<$stream>::as_ref(self).poll_read_ready(cx)
            }
            fn try_read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
                AsRef::<$stream>::as_ref(self).try_read(buf)
            }
            fn try_io(&self, f: &mut dyn FnMut() -> std::io::Result<()>) -> std::io::Result<()> {
                AsRef::<$stream>::as_ref(self).try_io(tokio::io::Interest::READABLE, f)
            }
            fn fd(&self) -> RawFd {
                AsRef::<$stream>::as_ref(self).as_raw_fd()
            }
        }
    };
}

read_half!(tokio::net::tcp::OwnedReadHalf, tokio::net::TcpStream);
read_half!(tokio::net::unix::OwnedReadHalf, tokio::net::UnixStream);

/// The reader task's side of a shared read half.
pub(crate) struct SharedRead<R>(pub Arc<R>);

impl<R: ReadHalf> AsyncRead for SharedRead<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            match self.0.poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
            // SAFETY: as tokio's own sockets do: the kernel only writes
            // into the unfilled part, and only the `n` bytes it reports
            // are marked initialized.
            let dst = unsafe {
                &mut *(buf.unfilled_mut() as *mut [std::mem::MaybeUninit<u8>] as *mut [u8])
            };
            match self.0.try_read(dst) {
                Ok(n) => {
                    unsafe { buf.assume_init(n) };
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // Another reader took the bytes (or the readiness was
                // stale): wait for the next ones.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl<R: ReadHalf> DirectRead for R {
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.poll_ready(cx)
    }
    fn try_io_read(&self, f: &mut dyn FnMut() -> std::io::Result<()>) -> std::io::Result<()> {
        ReadHalf::try_io(self, f)
    }
    fn fd(&self) -> RawFd {
        ReadHalf::fd(self)
    }
}
