//! Errors: every failure names the libfabric call that failed and carries
//! `fi_strerror`'s text for its return code.

use std::ffi::CStr;

/// A libfabric failure, or a misuse caught before calling libfabric.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OfiError {
    /// A libfabric call returned an error code (positive, `FI_E*`).
    #[error("{call} failed: {text} (error {code})")]
    Call {
        call: &'static str,
        code: i32,
        text: String,
    },
    /// `fi_getinfo` found no provider offering what an endpoint needs.
    #[error("no libfabric provider '{provider}'{} offers an RDM endpoint with messages and RMA: {text}", domain.as_deref().map(|d| format!(" on domain '{d}'")).unwrap_or_default())]
    NoProvider {
        provider: String,
        domain: Option<String>,
        text: String,
    },
    /// An operation finished with an error completion.
    #[error("{op} completed with an error: {text} (error {code}, provider error {prov_errno})")]
    Completion {
        op: &'static str,
        code: i32,
        prov_errno: i32,
        text: String,
    },
    /// A post kept returning `-FI_EAGAIN` for too long (an unreachable peer).
    #[error("{call} kept returning FI_EAGAIN for {secs} s (is the peer reachable?)")]
    Timeout { call: &'static str, secs: u64 },
    /// An argument libfabric would reject or that would be unsafe to pass.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// The endpoint is shutting down.
    #[error("the endpoint is closed")]
    Closed,
    /// libfabric could not be loaded (it is opened on first use).
    #[error("libfabric is not available: {0}")]
    Unavailable(String),
}

/// `fi_strerror`'s text for a (positive or negative) error code.
pub fn strerror(code: i32) -> String {
    // SAFETY: fi_strerror returns a pointer to a static NUL-terminated string.
    unsafe {
        let p = crate::dynload::fi_strerror(code.abs());
        if p.is_null() {
            return format!("error {code}");
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

impl OfiError {
    /// The error for `call` having returned `ret` (negative).
    pub fn call(call: &'static str, ret: isize) -> Self {
        let code = ret.unsigned_abs() as i32;
        OfiError::Call {
            call,
            code,
            text: strerror(code),
        }
    }

    /// The positive `FI_E*` code, when libfabric gave one.
    pub fn code(&self) -> Option<i32> {
        match self {
            OfiError::Call { code, .. } | OfiError::Completion { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// `Ok(ret)` for a non-negative return, the error of `call` otherwise.
pub(crate) fn check(call: &'static str, ret: isize) -> Result<usize, OfiError> {
    if ret < 0 {
        Err(OfiError::call(call, ret))
    } else {
        Ok(ret as usize)
    }
}
