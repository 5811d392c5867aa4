//! Strom errors as Python exceptions. The classes live in the pure-Python
//! module `strom.errors` (so they can also derive from builtins such as
//! `TimeoutError`); every one derives from `StromError` and carries the
//! stable numeric `code` shared with the Rust and C interfaces and its name
//! (`code_name`).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;
use strom_client::{Error, ErrorCode};

static MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

fn class_name(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::TIMEOUT => "TimeoutError",
        ErrorCode::TOPIC_NOT_FOUND => "TopicNotFound",
        ErrorCode::TOPIC_EXISTS => "TopicExists",
        ErrorCode::TOPIC_CLOSED => "TopicClosed",
        ErrorCode::INVALID_METADATA => "InvalidMetadata",
        ErrorCode::INVALID_ARGUMENT => "InvalidArgument",
        ErrorCode::CONNECTION_FAILED | ErrorCode::CONNECTION_CLOSED => "ConnectionError",
        ErrorCode::DATA_SELECTOR | ErrorCode::DATA_BROKER => "DataError",
        ErrorCode::PARTITION_UNAVAILABLE => "PartitionUnavailable",
        ErrorCode::DATA_DIR_LOCKED => "DataDirLocked",
        ErrorCode::GROUP_FILE_LIVE => "GroupFileLive",
        ErrorCode::DATA_CORRUPT => "DataCorrupt",
        ErrorCode::DATA_EXPIRED => "DataExpired",
        ErrorCode::PARTITION_FAILED => "PartitionFailed",
        ErrorCode::NOT_AUTHORIZED => "NotAuthorized",
        ErrorCode::UNAUTHENTICATED => "Unauthenticated",
        _ => "StromError",
    }
}

/// Builds an exception of class `name` (from `strom.errors`) with `code`.
pub fn coded_named(py: Python<'_>, name: &str, code: ErrorCode, message: &str) -> PyErr {
    let built = (|| -> PyResult<PyErr> {
        let m = MODULE.get_or_try_init(py, || {
            PyModule::import(py, "strom.errors").map(Bound::unbind)
        })?;
        let class = m.bind(py).getattr(name)?;
        let obj = class.call1((message.to_string(), code.0, code.name()))?;
        Ok(PyErr::from_value(obj))
    })();
    built.unwrap_or_else(|e| e)
}

/// Converts a client error into the matching Python exception.
pub fn to_py(py: Python<'_>, e: &Error) -> PyErr {
    let code = e.code();
    coded_named(py, class_name(code), code, &e.to_string())
}

/// `to_py` with a Python exception attached as `__cause__`.
pub fn to_py_caused(py: Python<'_>, e: &Error, cause: Option<PyErr>) -> PyErr {
    let err = to_py(py, e);
    if let Some(c) = cause {
        err.set_cause(py, Some(c));
    }
    err
}

/// `err` with `note` added (`BaseException.add_note`: shown under the
/// message in tracebacks, kept in `__notes__`).
pub fn with_note(py: Python<'_>, err: PyErr, note: &str) -> PyErr {
    // add_note only fails on a non-str note, which this is not.
    let _ = err.value(py).call_method1("add_note", (note,));
    err
}

/// An `InvalidArgument` (code 504) for misuse the client library does not see.
pub fn invalid(py: Python<'_>, message: impl AsRef<str>) -> PyErr {
    coded_named(
        py,
        "InvalidArgument",
        ErrorCode::INVALID_ARGUMENT,
        message.as_ref(),
    )
}

/// The error raised when an object made before `fork()` is used in the child.
pub fn forked(py: Python<'_>, what: &str, parent: u32) -> PyErr {
    coded_named(
        py,
        "ForkError",
        ErrorCode::SHUTTING_DOWN,
        &format!(
            "this {what} was created in process {parent}, before a fork(); Strom's background \
             threads do not survive fork(), so it cannot be used in process {}. Create the \
             Driver (and its topics, producers and consumers) in the child after forking, or use \
             the 'spawn' or 'forkserver' start method of multiprocessing",
            std::process::id()
        ),
    )
}

pub trait IntoPy<T> {
    /// Converts a client result, attaching to Python for the error only.
    fn py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPy<T> for strom_client::Result<T> {
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `strom/errors.py`, whose classes `class_name` names.
    const ERRORS_PY: &str = include_str!("../strom/errors.py");

    #[test]
    fn every_code_maps_to_a_class_defined_in_errors_py() {
        for &code in ErrorCode::ALL {
            let name = class_name(code);
            assert!(
                ERRORS_PY.contains(&format!("\nclass {name}(")),
                "{code:?} maps to {name}, which strom/errors.py does not define"
            );
        }
    }

    #[test]
    fn safety_codes_have_their_own_classes() {
        let expected = [
            (ErrorCode::PARTITION_UNAVAILABLE, "PartitionUnavailable"),
            (ErrorCode::DATA_DIR_LOCKED, "DataDirLocked"),
            (ErrorCode::GROUP_FILE_LIVE, "GroupFileLive"),
            (ErrorCode::DATA_CORRUPT, "DataCorrupt"),
            (ErrorCode::DATA_EXPIRED, "DataExpired"),
            (ErrorCode::PARTITION_FAILED, "PartitionFailed"),
        ];
        for (code, name) in expected {
            assert_eq!(class_name(code), name, "{code:?}");
        }
    }
}
