//! Status codes, the thread-local last-error message, and the guard that
//! keeps Rust panics and errors from crossing the C ABI.
//!
//! A `strom_status` is `0` on success, else one of the stable
//! [`ErrorCode`] numbers every Strom interface shares (docs/protocol.md),
//! or one of the few codes only the C API has (`9xx`). Each failing call
//! leaves a message for [`strom_last_error`] on the calling thread.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use strom_client::{Error, ErrorCode};

/// What every `strom_*` function returns: `STROM_OK` (0) or an error code.
pub type strom_status = i32;

pub const STROM_OK: strom_status = 0;
// The shared codes (crates/strom-proto/src/error.rs), unchanged.
pub const STROM_ERR_INTERNAL: strom_status = 1;
pub const STROM_ERR_MALFORMED_FRAME: strom_status = 100;
pub const STROM_ERR_FRAME_TOO_LARGE: strom_status = 101;
pub const STROM_ERR_UNSUPPORTED_VERSION: strom_status = 102;
pub const STROM_ERR_UNKNOWN_OPCODE: strom_status = 103;
pub const STROM_ERR_NOT_A_MEMBER: strom_status = 104;
pub const STROM_ERR_UNAUTHENTICATED: strom_status = 105;
pub const STROM_ERR_NOT_AUTHORIZED: strom_status = 106;
pub const STROM_ERR_TOPIC_NOT_FOUND: strom_status = 200;
pub const STROM_ERR_TOPIC_EXISTS: strom_status = 201;
pub const STROM_ERR_PARTITION_NOT_FOUND: strom_status = 202;
pub const STROM_ERR_INVALID_TOPIC_SPEC: strom_status = 203;
pub const STROM_ERR_TOPIC_CLOSED: strom_status = 204;
pub const STROM_ERR_NOT_MASTER: strom_status = 205;
pub const STROM_ERR_PRODUCER_NOT_FOUND: strom_status = 206;
pub const STROM_ERR_PARTITION_UNAVAILABLE: strom_status = 207;
pub const STROM_ERR_DATA_DIR_LOCKED: strom_status = 208;
pub const STROM_ERR_GROUP_FILE_LIVE: strom_status = 209;
pub const STROM_ERR_CONSUMER_GROUP_NOT_FOUND: strom_status = 210;
pub const STROM_ERR_CONSUMER_GROUP_MISMATCH: strom_status = 211;
pub const STROM_ERR_FENCED: strom_status = 212;
pub const STROM_ERR_UNKNOWN_CONSUMER: strom_status = 213;
pub const STROM_ERR_PRODUCER_EXPIRED: strom_status = 214;
pub const STROM_ERR_NOT_ENOUGH_REPLICAS: strom_status = 215;
pub const STROM_ERR_NOT_PARTITION_LEADER: strom_status = 216;
pub const STROM_ERR_OUT_OF_ORDER_SEQUENCE: strom_status = 217;
pub const STROM_ERR_MEMBER_REMOVED: strom_status = 218;
pub const STROM_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND: strom_status = 219;
pub const STROM_ERR_STALE_PRODUCER_EPOCH: strom_status = 220;
pub const STROM_ERR_QUOTA_EXCEEDED: strom_status = 230;
pub const STROM_ERR_STORAGE_IO: strom_status = 300;
pub const STROM_ERR_CORRUPT: strom_status = 301;
pub const STROM_ERR_OFFSET_OUT_OF_RANGE: strom_status = 302;
pub const STROM_ERR_BAD_DATA_RANGE: strom_status = 303;
pub const STROM_ERR_DISK_FULL: strom_status = 304;
pub const STROM_ERR_BATCH_TOO_LARGE: strom_status = 305;
pub const STROM_ERR_INVALID_STORAGE_CONFIG: strom_status = 307;
pub const STROM_ERR_STORAGE_INVALID_ARGUMENT: strom_status = 308;
pub const STROM_ERR_DATA_CORRUPT: strom_status = 309;
pub const STROM_ERR_DATA_EXPIRED: strom_status = 310;
pub const STROM_ERR_PARTITION_FAILED: strom_status = 311;
pub const STROM_ERR_INVALID_METADATA: strom_status = 400;
pub const STROM_ERR_BAD_POLICY_SPEC: strom_status = 401;
pub const STROM_ERR_SELECTION_FAILED: strom_status = 402;
pub const STROM_ERR_ENCODE_FAILED: strom_status = 403;
pub const STROM_ERR_DECODE_FAILED: strom_status = 404;
pub const STROM_ERR_CONNECTION_FAILED: strom_status = 500;
pub const STROM_ERR_CONNECTION_CLOSED: strom_status = 501;
pub const STROM_ERR_TIMEOUT: strom_status = 502;
pub const STROM_ERR_SHUTTING_DOWN: strom_status = 503;
pub const STROM_ERR_INVALID_ARGUMENT: strom_status = 504;
pub const STROM_ERR_GROUP_FILE: strom_status = 505;
pub const STROM_ERR_DATA_BROKER: strom_status = 600;
pub const STROM_ERR_DATA_SELECTOR: strom_status = 601;
// Codes only the C API has.
/// Not an error: the stream ended (every producer closed and every event
/// was returned).
pub const STROM_END_OF_STREAM: strom_status = 900;
/// A required pointer argument was NULL.
pub const STROM_ERR_NULL_ARGUMENT: strom_status = 901;
/// A string argument was not valid UTF-8.
pub const STROM_ERR_INVALID_UTF8: strom_status = 902;
/// A Rust panic was caught at the ABI (a bug in libstrom: please report it).
pub const STROM_ERR_PANIC: strom_status = 903;
/// An application callback returned a non-zero status, which stopped the call.
pub const STROM_ERR_CALLBACK: strom_status = 904;
/// A handle was used after the call that ends it (`strom_producer_close`).
pub const STROM_ERR_CLOSED: strom_status = 905;
/// Not an error: the outcome is not known yet (`strom_future_get`).
pub const STROM_NOT_READY: strom_status = 906;

/// The codes only the C API has, with their names and meanings.
pub(crate) const FFI_CODES: &[(strom_status, &str, &str)] = &[
    (STROM_OK, "OK", "success"),
    (
        STROM_END_OF_STREAM,
        "END_OF_STREAM",
        "the stream ended: every producer closed and every event was returned",
    ),
    (
        STROM_ERR_NULL_ARGUMENT,
        "NULL_ARGUMENT",
        "a required pointer argument was NULL",
    ),
    (
        STROM_ERR_INVALID_UTF8,
        "INVALID_UTF8",
        "a string argument is not valid UTF-8",
    ),
    (
        STROM_ERR_PANIC,
        "PANIC",
        "libstrom panicked (a bug; please report it); the call did nothing",
    ),
    (
        STROM_ERR_CALLBACK,
        "CALLBACK",
        "an application callback returned a non-zero status",
    ),
    (
        STROM_ERR_CLOSED,
        "CLOSED",
        "the handle was closed or has already ended",
    ),
    (
        STROM_NOT_READY,
        "NOT_READY",
        "the outcome is not known yet; ask again later",
    ),
];

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// A failure on its way to C: a status code and its message.
#[derive(Debug)]
pub(crate) struct Fail {
    pub code: strom_status,
    pub message: String,
}

impl Fail {
    pub fn new(code: strom_status, message: impl Into<String>) -> Fail {
        Fail {
            code,
            message: message.into(),
        }
    }
    pub fn null(what: &str) -> Fail {
        Fail::new(STROM_ERR_NULL_ARGUMENT, format!("{what} is NULL"))
    }
}

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        let code = match &e {
            Error::Closed(_) => STROM_ERR_CLOSED,
            _ => i32::from(e.code().0),
        };
        Fail::new(code, e.to_string())
    }
}

pub(crate) type FfiResult<T = ()> = Result<T, Fail>;

/// Records `message` as this thread's last error.
pub(crate) fn set_last_error(message: &str) {
    let c = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// Runs the body of an `extern "C"` function: a panic becomes
/// `STROM_ERR_PANIC`, an error its code, and both leave a message.
pub(crate) fn guard(body: impl FnOnce() -> FfiResult) -> strom_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => STROM_OK,
        Ok(Err(f)) => {
            set_last_error(&f.message);
            f.code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("libstrom panicked: {what}"));
            STROM_ERR_PANIC
        }
    }
}

/// Borrows a NUL-terminated UTF-8 string argument.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> FfiResult<&'a str> {
    if p.is_null() {
        return Err(Fail::null(what));
    }
    CStr::from_ptr(p)
        .to_str()
        .map_err(|e| Fail::new(STROM_ERR_INVALID_UTF8, format!("{what}: {e}")))
}

/// Like [`str_arg`], with NULL meaning "not given".
pub(crate) unsafe fn opt_str_arg<'a>(p: *const c_char, what: &str) -> FfiResult<Option<&'a str>> {
    if p.is_null() {
        Ok(None)
    } else {
        str_arg(p, what).map(Some)
    }
}

/// Borrows `len` bytes at `p` (NULL is fine when `len` is 0).
pub(crate) unsafe fn bytes_arg<'a>(p: *const u8, len: usize, what: &str) -> FfiResult<&'a [u8]> {
    match (p.is_null(), len) {
        (_, 0) => Ok(&[]),
        (true, _) => Err(Fail::null(what)),
        (false, n) => Ok(std::slice::from_raw_parts(p, n)),
    }
}

/// Writes `v` through an out-pointer that was checked for NULL.
pub(crate) unsafe fn put<T>(out: *mut T, v: T) {
    out.write(v)
}

/// Checks an out-pointer.
pub(crate) fn out_arg<T>(out: *mut T, what: &str) -> FfiResult<*mut T> {
    if out.is_null() {
        Err(Fail::null(what))
    } else {
        Ok(out)
    }
}

/// The short stable name of a status (`"TOPIC_NOT_FOUND"`, `"OK"`), or
/// `"UNKNOWN"`. The string is static: never free it.
#[no_mangle]
pub extern "C" fn strom_status_name(status: strom_status) -> *const c_char {
    static_text(status, true)
}

/// A one-line description of what a status means. The string is static:
/// never free it.
#[no_mangle]
pub extern "C" fn strom_status_str(status: strom_status) -> *const c_char {
    static_text(status, false)
}

fn static_text(status: strom_status, name: bool) -> *const c_char {
    use std::sync::OnceLock;
    static TEXTS: OnceLock<Vec<(strom_status, CString, CString)>> = OnceLock::new();
    let texts = TEXTS.get_or_init(|| {
        let shared = ErrorCode::ALL.iter().map(|c| {
            let (n, d) = (c.name(), c.describe());
            (i32::from(c.0), n, d)
        });
        FFI_CODES
            .iter()
            .copied()
            .chain(shared)
            .map(|(c, n, d)| (c, cstring(n), cstring(d)))
            .collect()
    });
    static UNKNOWN: &CStr = c"UNKNOWN";
    static UNKNOWN_TEXT: &CStr = c"unknown status code";
    match texts.iter().find(|(c, _, _)| *c == status) {
        Some((_, n, d)) => (if name { n } else { d }).as_ptr(),
        None => (if name { UNKNOWN } else { UNKNOWN_TEXT }).as_ptr(),
    }
}

fn cstring(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

/// The message of the most recent failed `strom_*` call on this thread
/// ("" if none). Borrowed: valid until the next failing call on this
/// thread; copy it to keep it.
#[no_mangle]
pub extern "C" fn strom_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}
