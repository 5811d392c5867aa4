//! mimalloc for the programs that make it their global allocator (the
//! `strom` binary, the Python module), and what it does with freed memory.
//!
//! By default mimalloc gives memory that stayed free for a second back to
//! the OS (`madvise(MADV_DONTNEED)`), and the next allocation there faults
//! in fresh, zeroed pages. A server or client streaming events frees and
//! allocates batches all the time, and with transparent huge pages each
//! fault clears 2 MiB: `perf` of a 1 KiB Python pipeline found 8.8% of all
//! samples in the server's `clear_page_erms`, and the pipeline took up to
//! 300,000 page faults per GB moved (more than one per 4 KiB page).
//! [`keep_freed_memory_warm`] keeps freed pages for ten seconds instead, so
//! a steady stream reuses them warm (57 to 2,860 faults per GB); an idle
//! process still gives them back. Resetting instead of decommitting
//! (`MADV_FREE`, mimalloc's `purge_decommits = 0`) cut the faults as well
//! but was slower through shared memory (docs/large-data.md, "Freed memory
//! stays warm").
//!
//! The global allocator itself is declared by the program:
//! `#[global_allocator] static GLOBAL: strom_client::alloc::MiMalloc = strom_client::alloc::MiMalloc;`

use std::ffi::{c_int, c_long};

pub use mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc 3.3's `mimalloc.h`: milliseconds
/// a freed page stays committed before it goes back to the OS (1,000 by
/// default).
const PURGE_DELAY: c_int = 15;

/// Ten seconds: a stream reuses freed memory long before; an idle process
/// still gives it back.
const KEEP_FREED_MS: c_long = 10_000;

extern "C" {
    fn mi_option_set(option: c_int, value: c_long);
}

/// Freed memory stays committed for ten seconds instead of one, unless the
/// environment sets `MIMALLOC_PURGE_DELAY` itself. Call first thing.
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
        // (Where the environment chose, the environment's choice stands.)
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            // SAFETY: as above. Only the purge delay defaults to 1,000.
            assert_eq!(unsafe { mi_option_get(PURGE_DELAY) }, 1_000);
            keep_freed_memory_warm();
            assert_eq!(unsafe { mi_option_get(PURGE_DELAY) }, KEEP_FREED_MS);
        }
    }
}
