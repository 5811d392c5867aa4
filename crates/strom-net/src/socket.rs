//! The two halves of a stream socket (TCP or Unix), each shared by two
//! users: the write half by a connection's writer task (as `AsyncWrite`)
//! and by senders that write directly while that task is idle
//! ([`DirectWrite`]); the read half by the connection's reader task (as
//! `AsyncRead`) and by a thread that reads it itself while it waits
//! ([`DirectRead`], `here.rs`).
//!
//! **What the runtime watches.** Each half has its own registration with
//! the runtime: the write half for room only, the read half (on a
//! duplicate of the descriptor) for bytes only, and only while no thread
//! reads the socket itself. A registration for bytes would wake a runtime
//! worker for every frame a waiting thread reads (the kernel wakes every
//! waiter of the socket), for nothing: that thread already has them. So a
//! thread that takes the socket stops the watch ([`DirectRead::unwatch`])
//! and starts it again before it lets go ([`DirectRead::watch`]); a fresh
//! registration reports bytes that are already there, so none are missed.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::runtime::Handle;

use crate::frame_io::DirectWrite;

/// At most this many slices go to one `sendmsg` (the kernel's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// A descriptor another value owns, for a registration that must not
/// close it.
struct Borrowed(RawFd);

impl AsRawFd for Borrowed {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Splits a connected, non-blocking stream socket into its halves; the
/// read half is registered with the current runtime.
pub(crate) fn split(socket: OwnedFd) -> std::io::Result<(Arc<ReadSide>, Arc<WriteSide>)> {
    let read = ReadSide {
        watch: Mutex::new(Watch::default()),
        fd: socket.try_clone()?,
        handle: Handle::try_current().map_err(std::io::Error::other)?,
    };
    read.watch()?;
    Ok((Arc::new(read), Arc::new(WriteSide(socket))))
}

/// Result of a `send`/`recv`-style call: the byte count, or the error.
fn io_result(n: isize) -> std::io::Result<usize> {
    match usize::try_from(n) {
        Ok(n) => Ok(n),
        Err(_) => Err(std::io::Error::last_os_error()),
    }
}

/// The write half: writes never raise `SIGPIPE` (a library must not kill
/// its host), and dropping it shuts the socket down for writing, so the
/// peer sees the end although the read half lives on.
pub(crate) struct WriteSide(OwnedFd);

impl WriteSide {
    fn send(&self, buf: &[u8]) -> std::io::Result<usize> {
        // SAFETY: `buf` is valid for `len` bytes.
        io_result(unsafe {
            libc::send(
                self.0.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        })
    }

    fn send_vectored(&self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        // SAFETY: `IoSlice` is ABI-compatible with `iovec`; the header
        // names `bufs`, valid for the call, and nothing else.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len().min(IOV_MAX) as _;
        io_result(unsafe { libc::sendmsg(self.0.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) })
    }
}

impl Drop for WriteSide {
    fn drop(&mut self) {
        // SAFETY: the descriptor is open until this value is gone.
        unsafe { libc::shutdown(self.0.as_raw_fd(), libc::SHUT_WR) };
    }
}

impl DirectWrite for WriteSide {
    fn try_write_vectored(&self, bufs: &[IoSlice<'_>]) -> std::io::Result<usize> {
        self.send_vectored(bufs)
    }
}

/// The writer task's side of a shared write half. It watches the socket
/// for room only while a write waits for it: a standing watch would wake
/// the runtime each time the peer reads from a Unix socket (the kernel
/// announces the room), for nothing.
pub(crate) struct SharedWrite {
    // Declared before `side`: the registration goes before the descriptor.
    room: Option<AsyncFd<Borrowed>>,
    side: Arc<WriteSide>,
}

impl SharedWrite {
    pub(crate) fn new(side: Arc<WriteSide>) -> Self {
        SharedWrite { room: None, side }
    }

    /// Writes with `write` (which must not block); when the socket is
    /// full, waits for room and writes again.
    fn poll_with(
        &mut self,
        cx: &mut Context<'_>,
        write: impl Fn(&WriteSide) -> std::io::Result<usize>,
    ) -> Poll<std::io::Result<usize>> {
        loop {
            match write(&self.side) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                r => {
                    self.room = None;
                    return Poll::Ready(r);
                }
            }
            if self.room.is_none() {
                // SAFETY: `side` keeps the descriptor open for longer
                // than the registration (the field order).
                let r = unsafe {
                    AsyncFd::register_with_interest(
                        Borrowed(self.side.0.as_raw_fd()),
                        Interest::WRITABLE,
                    )
                };
                self.room = Some(r.map_err(|e| e.into_parts().1)?);
            }
            let room = self.room.as_ref().expect("registered above");
            match room.poll_write_ready(cx) {
                Poll::Ready(Ok(mut ready)) => ready.clear_ready(),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl AsyncWrite for SharedWrite {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_with(cx, |w| w.send(buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.poll_with(cx, |w| w.send_vectored(bufs))
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

/// The read half's watch: the runtime's registration for bytes (none while
/// a thread reads), and the reader task's waker, kept across registrations.
#[derive(Default)]
struct Watch {
    registration: Option<AsyncFd<Borrowed>>,
    task: Option<Waker>,
}

/// The read half: a duplicate of the socket's descriptor, watched by the
/// runtime while no thread reads it ([`DirectRead`]).
pub(crate) struct ReadSide {
    // Declared before `fd`: the registration goes before the descriptor.
    watch: Mutex<Watch>,
    fd: OwnedFd,
    handle: Handle,
}

impl ReadSide {
    fn recv(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        // SAFETY: `buf` is valid for writes of `len` bytes.
        io_result(unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        })
    }

    /// Runs `f` under the runtime's readiness: a `WouldBlock` from it
    /// clears that readiness. Unwatched, `f` just runs.
    fn with_readiness<R>(&self, f: impl FnOnce() -> std::io::Result<R>) -> std::io::Result<R> {
        let watch = self.watch.lock();
        match &watch.registration {
            Some(r) => r.try_io(Interest::READABLE, |_| f()),
            None => f(),
        }
    }
}

/// A socket a thread can wait on and read without the runtime (TCP, Unix),
/// for [`MuxConn::read_here`](crate::MuxConn::read_here).
pub trait DirectRead: Send + Sync {
    /// The runtime's readiness of the socket (for the reader task); never
    /// ready while unwatched.
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>>;
    /// Runs `f` if the runtime holds the socket readable; if `f` says
    /// `WouldBlock`, the runtime forgets that readiness (unless newer
    /// readiness came meanwhile).
    fn try_io_read(&self, f: &mut dyn FnMut() -> std::io::Result<()>) -> std::io::Result<()>;
    /// Stops the runtime watching for bytes: the caller reads them.
    fn unwatch(&self);
    /// Starts the runtime watching for bytes again (bytes already there
    /// count), with the reader task's waker.
    fn watch(&self) -> std::io::Result<()>;
    fn fd(&self) -> RawFd;
}

impl DirectRead for ReadSide {
    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let mut watch = self.watch.lock();
        if !watch.task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            watch.task = Some(cx.waker().clone());
        }
        match &watch.registration {
            Some(r) => r.poll_read_ready(cx).map_ok(|_| ()),
            None => Poll::Pending,
        }
    }

    fn try_io_read(&self, f: &mut dyn FnMut() -> std::io::Result<()>) -> std::io::Result<()> {
        self.with_readiness(f)
    }

    fn unwatch(&self) {
        let gone = self.watch.lock().registration.take();
        drop(gone);
    }

    fn watch(&self) -> std::io::Result<()> {
        let mut watch = self.watch.lock();
        if watch.registration.is_some() {
            return Ok(());
        }
        let _runtime = self.handle.enter();
        // SAFETY: `fd` outlives the registration (the field order, and
        // `unwatch` drops it first).
        let r = unsafe {
            AsyncFd::register_with_interest(Borrowed(self.fd.as_raw_fd()), Interest::READABLE)
        }
        .map_err(|e| e.into_parts().1)?;
        // The task waits on the registration it last polled: hand its
        // waker to this one (and wake it if readiness came already).
        let ready = watch
            .task
            .clone()
            .filter(|task| r.poll_read_ready(&mut Context::from_waker(task)).is_ready());
        watch.registration = Some(r);
        drop(watch);
        if let Some(task) = ready {
            task.wake();
        }
        Ok(())
    }

    fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The reader task's side of a shared read half.
pub(crate) struct SharedRead(pub Arc<ReadSide>);

impl AsyncRead for SharedRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            match self.0.poll_readable(cx) {
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
            match self.0.with_readiness(|| self.0.recv(dst)) {
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
