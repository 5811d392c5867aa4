//! The module's allocator for the client's own allocations (events,
//! buffers, batches, the runtime's tasks): mimalloc, as in the `strom`
//! binary; Python's objects keep Python's allocator. glibc's malloc and
//! free took about 1,300 instructions per pulled 1 KiB event
//! (bench/callgrind-per-event).
//!
//! Freed memory stays committed for ten seconds instead of one, as in the
//! `strom` binary (crates/strom-cli/src/alloc.rs says why): a consumer or
//! producer in a steady stream then reuses warm pages instead of faulting
//! in fresh ones.

use std::ffi::{c_int, c_long};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc 3.3's `mimalloc.h` (1,000 ms by
/// default).
const PURGE_DELAY: c_int = 15;

/// How long freed memory stays committed (ten seconds).
const KEEP_FREED_MS: c_long = 10_000;

extern "C" {
    fn mi_option_set(option: c_int, value: c_long);
}

/// Freed memory stays committed for [`KEEP_FREED_MS`] instead of a second,
/// unless the environment sets `MIMALLOC_PURGE_DELAY` itself. Called when the module loads.
pub fn keep_freed_memory_warm() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: mimalloc's option setter, on an option that exists in the
    // linked mimalloc (checked by the test below); no memory involved.
    unsafe { mi_option_set(PURGE_DELAY, KEEP_FREED_MS) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mimalloc release (major * 100 + minor) whose option numbering
    /// [`PURGE_DELAY`] follows.
    const MIMALLOC_MINOR: c_int = 303;

    extern "C" {
        fn mi_option_get(option: c_int) -> c_long;
        fn mi_version() -> c_int;
    }

    #[test]
    fn freed_memory_stays_committed_for_ten_seconds() {
        // SAFETY: mimalloc's own queries; no memory involved.
        let version = unsafe { mi_version() };
        assert_eq!(
            version / 100,
            MIMALLOC_MINOR,
            "mimalloc {version} is linked: check PURGE_DELAY against its mimalloc.h"
        );
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            // SAFETY: as above. Only the purge delay defaults to 1,000.
            assert_eq!(unsafe { mi_option_get(PURGE_DELAY) }, 1_000);
            keep_freed_memory_warm();
            assert_eq!(unsafe { mi_option_get(PURGE_DELAY) }, KEEP_FREED_MS);
        }
    }
}
