//! SIGINT and SIGTERM for commands that must finish cleanly (`produce`,
//! `consume`): the handler only records the signal; the command polls
//! [`received`] between short, bounded waits, finishes what it owes
//! (offsets, flushes, acks), and exits with 128 + the signal number.
//!
//! Install it once setup (connecting, subscribing) is done: until then the
//! default action applies and Ctrl-C stops a hung connect at once. The
//! handler runs with `SA_RESTART`, so the client's threads never see an
//! interrupted system call because of it.

use std::sync::atomic::{AtomicI32, Ordering};

static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// Installs the handlers.
pub fn install() -> anyhow::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction with a valid handler and empty mask;
        // the handler only stores to an atomic.
        let rc = unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut act.sa_mask);
            act.sa_flags = libc::SA_RESTART;
            libc::sigaction(sig, &act, std::ptr::null_mut())
        };
        if rc != 0 {
            anyhow::bail!(
                "installing the handler for signal {sig}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
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
