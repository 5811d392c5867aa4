//! SIGINT and SIGTERM for commands that must finish cleanly (`produce`,
//! `consume`): the handler only records the signal; the command polls
//! [`received`] between short waits, finishes what it owes (offsets,
//! flushes, acks), and exits with 128 + the signal number.
//!
//! [`install`] also blocks both signals in the calling thread, so every
//! thread started afterwards (the client's runtime, the stdin reader)
//! inherits the mask; [`unblock_here`] then lets them reach only the main
//! thread, where they interrupt a blocking `poll` or `write` (no
//! `SA_RESTART`).

use std::sync::atomic::{AtomicI32, Ordering};

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    SIGNAL.store(sig, Ordering::SeqCst);
}

fn mask() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialize and fill a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Installs the handlers and blocks the signals in this thread.
pub fn install() -> anyhow::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction with a valid handler and empty mask;
        // the handler only stores to an atomic.
        let rc = unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut act.sa_mask);
            act.sa_flags = 0;
            libc::sigaction(sig, &act, std::ptr::null_mut())
        };
        if rc != 0 {
            anyhow::bail!(
                "installing the handler for signal {sig}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    let set = mask();
    // SAFETY: changes this thread's signal mask only.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    Ok(())
}

/// Lets SIGINT and SIGTERM reach this thread again (call once every
/// helper thread is started).
pub fn unblock_here() {
    let set = mask();
    // SAFETY: changes this thread's signal mask only.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
}

/// The signal received, if any.
pub fn received() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The shell's exit code for a command stopped by `sig`.
pub fn exit_code(sig: i32) -> i32 {
    128 + sig
}

/// The signal's usual name, for messages.
pub fn name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}
