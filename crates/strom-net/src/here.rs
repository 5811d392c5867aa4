//! Reading a connection on the calling thread: a thread that waits for
//! something a connection brings (a consumer's `pull`) reads the socket
//! itself, so the kernel wakes it when the bytes arrive, instead of waking
//! the runtime's reader task, which would then wake the thread.
//!
//! [`MuxConn::read_here`] takes the connection's frame reader when the
//! reader task is not using it (`mux.rs` hands it over at frame
//! boundaries), blocks in `ppoll` on the socket and on the thread's
//! [`Bell`], and routes what arrives exactly as the task would (responses
//! to their requests, pushes to their streams) until the socket has
//! nothing more; then it gives the reader back. A [`Bell`] is how others
//! wake the thread meanwhile: whoever queues what it waits for rings it,
//! and so does the task when it gives the reader back.
//!
//! Only the wait before a frame is cut short by the bell or the deadline:
//! once a frame has begun, the thread reads all of it (the reader task
//! would wait for the rest too).

use std::future::Future;
use std::os::fd::RawFd;
use std::pin::{pin, Pin};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use tokio::io::{AsyncRead, ReadBuf};

use crate::bell::Bell;
use crate::mux::{read_one, Complete, LentBuffer, MuxConn};
use crate::socket::DirectRead;
use crate::{BoxRead, FrameReader, NetError};

/// What [`MuxConn::read_here`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadHere {
    /// Routed the frames that arrived.
    Read,
    /// The bell rang (what the thread waits for may have come another way).
    Rang,
    /// The deadline passed.
    TimedOut,
    /// This connection cannot be read by a thread, or it is gone: wait
    /// another way.
    Unavailable,
}

/// Why [`wait`] returned.
enum Woke {
    Socket,
    Bell,
    Deadline,
}

/// Blocks until the socket `fd` (if any) is readable, the bell rings, or
/// the deadline passes.
fn wait(fd: Option<RawFd>, bell: &Bell, deadline: Option<Instant>) -> std::io::Result<Woke> {
    let mut fds = [
        libc::pollfd {
            fd: bell.fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: fd.unwrap_or(-1),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        let timeout = deadline.map(|d| {
            let left = d.saturating_duration_since(Instant::now());
            libc::timespec {
                tv_sec: left.as_secs() as libc::time_t,
                tv_nsec: left.subsec_nanos() as libc::c_long,
            }
        });
        let ts = timeout.as_ref().map_or(std::ptr::null(), |t| t as *const _);
        let n = fds.len() - usize::from(fd.is_none());
        // SAFETY: `fds` and `ts` outlive the call; n <= fds.len().
        let r = unsafe { libc::ppoll(fds.as_mut_ptr(), n as libc::nfds_t, ts, std::ptr::null()) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[1].revents != 0 && fd.is_some() {
            return Ok(Woke::Socket);
        }
        if fds[0].revents != 0 {
            return Ok(Woke::Bell);
        }
        if r == 0 {
            return Ok(Woke::Deadline);
        }
    }
}

/// Whether `fd` has bytes (or an end) to read right now.
fn readable_now(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, no timeout.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

/// The frame reader's byte source while a thread reads: blocking reads of
/// the socket (never `Pending`), bypassing the runtime.
struct Blocking(RawFd);

impl AsyncRead for Blocking {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            // SAFETY: the kernel writes at most `unfilled.len()` bytes
            // into the unfilled part, and only the `n` it reports are
            // marked initialized (as tokio's own sockets do).
            let n = unsafe {
                let unfilled = buf.unfilled_mut();
                libc::recv(
                    self.0,
                    unfilled.as_mut_ptr().cast(),
                    unfilled.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n >= 0 {
                unsafe { buf.assume_init(n as usize) };
                buf.advance(n as usize);
                return Poll::Ready(Ok(()));
            }
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::WouldBlock => {
                    let mut p = libc::pollfd {
                        fd: self.0,
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one live pollfd; waits for the rest of a
                    // frame that has begun.
                    unsafe { libc::poll(&mut p, 1, -1) };
                }
                _ => return Poll::Ready(Err(e)),
            }
        }
    }
}

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `fut` to completion on this thread. The frame stream never makes
/// it wait (its reads block instead); an out-of-band bulk path may.
fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

impl<B: LentBuffer, C: Complete<B>> MuxConn<B, C> {
    /// Waits on this thread for the next frames of this connection and
    /// routes them, until `bell` rings or `deadline` passes. `bell` must be
    /// armed before whatever the caller waits for was last checked.
    pub fn read_here(&self, bell: &Arc<Bell>, deadline: Option<Instant>) -> ReadHere {
        let Some(sock) = self.direct_read.clone() else {
            return ReadHere::Unavailable;
        };
        if self.is_dead() {
            return ReadHere::Unavailable;
        }
        let reader = match self.take_reader() {
            Some(r) => r,
            None => {
                // The reader task is routing frames: wait until it is done
                // (or the bell rings), then the caller looks again.
                self.want_reader.lock().push(bell.clone());
                match self.take_reader() {
                    Some(r) => r,
                    None => {
                        return match wait(None, bell, deadline) {
                            Ok(Woke::Deadline) => ReadHere::TimedOut,
                            Ok(_) => ReadHere::Rang,
                            Err(_) => ReadHere::Unavailable,
                        }
                    }
                }
            }
        };
        // The runtime stops watching while this thread reads: the kernel
        // would wake a worker for every frame, for nothing.
        sock.unwatch();
        let outcome = self.read_with(reader, &*sock, bell, deadline);
        match outcome {
            Ok(o) => o,
            Err(e) => {
                // Part of a frame may be consumed: the connection cannot
                // go on.
                self.end(e);
                ReadHere::Unavailable
            }
        }
    }

    /// With the frame reader taken (and the socket unwatched): waits,
    /// routes what came, watches the socket again and gives the reader
    /// back.
    fn read_with(
        &self,
        mut reader: FrameReader<BoxRead>,
        sock: &dyn DirectRead,
        bell: &Bell,
        deadline: Option<Instant>,
    ) -> Result<ReadHere, Arc<NetError>> {
        let fd = sock.fd();
        // Bytes buffered already (never at a boundary the task left):
        // route them before waiting. A failed wait sends the caller to
        // wait another way (it must not spin here).
        let woke = match reader.at_boundary() {
            true => wait(Some(fd), bell, deadline).ok(),
            false => Some(Woke::Socket),
        };
        let outcome = match woke {
            Some(Woke::Bell) => ReadHere::Rang,
            Some(Woke::Deadline) => ReadHere::TimedOut,
            None => ReadHere::Unavailable,
            Some(Woke::Socket) => {
                // Awake already: what is queued while routing need not ring.
                bell.disarm();
                ReadHere::Read
            }
        };
        let mut route = outcome == ReadHere::Read;
        loop {
            let routed = if route {
                let task_source = reader.replace_inner(Box::new(Blocking(fd)));
                let routed = self.route_arrived(&mut reader, fd);
                reader.replace_inner(task_source);
                routed
            } else {
                Ok(())
            };
            // Watched again before the reader is back: bytes that come
            // after this wake the task (a fresh watch reports them).
            let watched = sock
                .watch()
                .map_err(|e| Arc::new(NetError::io("watching the connection", e)));
            self.give_back(reader);
            routed.and(watched)?;
            // The task may have been woken meanwhile and, finding the
            // reader taken, let go of that readiness: the bytes it saw are
            // this thread's to route.
            if !self.task_missed.swap(false, Ordering::AcqRel) {
                return Ok(outcome);
            }
            match self.take_reader() {
                Some(r) => reader = r,
                // The task took it, for newer readiness: it reads them.
                None => return Ok(outcome),
            }
            sock.unwatch();
            // Looked at only now that this thread holds the reader: the
            // task may have taken it in between and routed those bytes
            // itself, and routing waits for a frame to begin (it would
            // wait for the next bytes, however long they take).
            route = readable_now(fd);
        }
    }

    /// Routes frames while bytes are there, ending at a frame boundary.
    /// Only with the reader held since bytes were seen in the socket: the
    /// first frame is waited for.
    fn route_arrived(
        &self,
        reader: &mut FrameReader<BoxRead>,
        fd: RawFd,
    ) -> Result<(), Arc<NetError>> {
        loop {
            match block_on(read_one(self, reader)) {
                Ok(true) => {}
                Ok(false) => return Err(Arc::new(NetError::Closed)),
                Err(e) => return Err(e),
            }
            if reader.at_boundary() && !readable_now(fd) {
                return Ok(());
            }
        }
    }
}
