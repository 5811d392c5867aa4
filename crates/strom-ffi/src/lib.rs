//! libstrom: the C ABI of the Strom client, for C, C++ (`strom.hpp`) and
//! Fortran (`strom.f90`) codes. `include/strom.h` is generated from this
//! crate by cbindgen (`make header`; a test fails when it is stale).
//!
//! The rules every function here follows (docs/c-api.md):
//! - it returns a `strom_status` (0, a shared error code, or a `9xx` code
//!   of the C API) and leaves a message for `strom_last_error` on failure;
//! - no Rust panic crosses the ABI ([`status::guard`]);
//! - every handle is an opaque pointer that may be used from several
//!   threads, freed by its `*_free` function (NULL is a no-op);
//! - every pointer argument is borrowed for the call unless its
//!   documentation says otherwise, and every returned pointer says how
//!   long it is valid.
//!
//! This crate only converts between C and [`strom_client`]; it holds no
//! logic of its own.
#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)]

pub mod consumer;
pub mod data;
pub mod driver;
pub mod event;
pub mod producer;
pub mod status;

pub use consumer::*;
pub use data::*;
pub use driver::*;
pub use event::*;
pub use producer::*;
pub use status::*;

/// The library's version (`"0.1.0"`). Static: never free it.
#[no_mangle]
pub extern "C" fn strom_version() -> *const std::ffi::c_char {
    static V: &std::ffi::CStr = c"0.1.0";
    V.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn handles_are_thread_safe() {
        assert_send_sync::<strom_driver>();
        assert_send_sync::<strom_topic>();
        assert_send_sync::<strom_producer>();
        assert_send_sync::<strom_future>();
        assert_send_sync::<strom_consumer>();
        assert_send_sync::<strom_event>();
    }

    #[test]
    fn a_panic_becomes_a_status_and_a_message() {
        let s = status::guard(|| panic!("boom in a test"));
        assert_eq!(s, STROM_ERR_PANIC);
        let msg = unsafe { std::ffi::CStr::from_ptr(strom_last_error()) };
        assert!(msg.to_str().unwrap().contains("boom in a test"), "{msg:?}");
    }

    #[test]
    fn version_matches_the_crate() {
        let v = unsafe { std::ffi::CStr::from_ptr(strom_version()) };
        assert_eq!(v.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }
}
