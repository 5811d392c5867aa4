//! A [`Bell`]: how a thread blocked reading a connection itself
//! ([`MuxConn::read_here`](crate::MuxConn::read_here), `here.rs`) is woken
//! by whoever queues what it waits for.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Wakes a thread blocked in [`MuxConn::read_here`](crate::MuxConn::read_here): an `eventfd` written
/// only while the thread is armed to listen (a ring costs one atomic
/// otherwise).
pub struct Bell {
    fd: OwnedFd,
    armed: AtomicBool,
    /// A ring was written and not read yet.
    rung: AtomicBool,
}

impl Bell {
    pub fn new() -> std::io::Result<Bell> {
        // SAFETY: eventfd takes no pointers; its result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Bell {
            // SAFETY: a fresh descriptor this owns from here on.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            armed: AtomicBool::new(false),
            rung: AtomicBool::new(false),
        })
    }

    /// From now on a ring wakes the thread (until it is [`quiet`](Self::quiet)).
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Wakes the armed thread; nothing when no thread listens.
    pub fn ring(&self) {
        if self.armed.swap(false, Ordering::AcqRel) {
            self.rung.store(true, Ordering::Release);
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live buffer to an owned fd. A
            // full counter (EAGAIN) still leaves the bell readable.
            unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
    }

    /// Stops listening (the thread is awake anyway).
    pub(crate) fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    /// Stops listening and clears a ring that came.
    pub fn quiet(&self) {
        self.armed.store(false, Ordering::SeqCst);
        if !self.rung.swap(false, Ordering::AcqRel) {
            return;
        }
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer (nonblocking).
        unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
    }

    /// The descriptor a waiting thread polls.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
