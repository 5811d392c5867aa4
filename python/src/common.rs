//! Pieces shared by every class: fork detection, releasing Python buffers
//! without ever taking the GIL on Strom's network threads, and waiting with
//! the GIL released while still reacting to Ctrl-C.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pyo3::ffi;
use pyo3::prelude::*;

use crate::errors;

/// This process's id, kept so that checking it costs no system call: every
/// push, pull and ack checks it (`getpid` once per call was measurable on
/// the per-event path). Read once, and again in the child of every
/// `fork()` (a `pthread_atfork` handler, which `os.fork` runs).
static PID: AtomicU32 = AtomicU32::new(0);

extern "C" fn pid_after_fork() {
    PID.store(std::process::id(), Ordering::Relaxed);
}

pub fn current_pid() -> u32 {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        PID.store(std::process::id(), Ordering::Relaxed);
        // SAFETY: registers a handler that only stores an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(pid_after_fork)) };
    });
    PID.load(Ordering::Relaxed)
}

/// A value tied to the process that made it. Strom's runtime threads do not
/// survive `fork()`: in a child, `get` raises `ForkError`, and the value is
/// leaked instead of dropped (dropping would wait on threads that are gone).
pub struct ForkSafe<T: Send> {
    value: ManuallyDrop<T>,
    pid: u32,
    what: &'static str,
}

impl<T: Send> ForkSafe<T> {
    pub fn new(value: T, what: &'static str) -> Self {
        ForkSafe {
            value: ManuallyDrop::new(value),
            pid: current_pid(),
            what,
        }
    }

    pub fn get(&self, py: Python<'_>) -> PyResult<&T> {
        if current_pid() != self.pid {
            return Err(errors::forked(py, self.what, self.pid));
        }
        Ok(&self.value)
    }

    pub fn same_process(&self) -> bool {
        current_pid() == self.pid
    }
}

impl<T: Send> Drop for ForkSafe<T> {
    fn drop(&mut self) {
        if current_pid() != self.pid {
            return;
        }
        // SAFETY: dropped exactly once, here.
        let value = unsafe { ManuallyDrop::take(&mut self.value) };
        // Dropping a producer flushes, dropping a driver stops its runtime:
        // never hold the GIL while Strom waits.
        // If Python is finalizing, the closure (and the value) is dropped as is.
        let _ = Python::try_attach(|py| py.detach(move || drop(value)));
    }
}

/// A contiguous buffer export (`PyObject_GetBuffer`) of a Python object:
/// keeps the object alive and its memory in place until released.
pub struct Export(Box<ffi::Py_buffer>);

// SAFETY: the export is only released with the GIL held (see `Drop`); the
// memory it describes may be read or written from any thread meanwhile.
unsafe impl Send for Export {}
unsafe impl Sync for Export {}

impl Export {
    /// Exports `obj`'s memory, which must be contiguous (C or Fortran
    /// order) and, if `writable`, writable.
    pub fn get(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Export> {
        let mut view: Box<std::mem::MaybeUninit<ffi::Py_buffer>> = Box::new_uninit();
        let flags = ffi::PyBUF_ANY_CONTIGUOUS | if writable { ffi::PyBUF_WRITABLE } else { 0 };
        // SAFETY: `view` is valid writable memory for one Py_buffer.
        let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), flags) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // SAFETY: initialized by a successful PyObject_GetBuffer.
        Ok(Export(unsafe { view.assume_init() }))
    }

    /// Exports `obj`'s memory with its struct format, shape and strides,
    /// contiguous or not (read-only is fine): what describing a numpy
    /// array needs, in one call.
    pub fn get_records(obj: &Bound<'_, PyAny>) -> PyResult<Export> {
        let mut view: Box<std::mem::MaybeUninit<ffi::Py_buffer>> = Box::new_uninit();
        // SAFETY: `view` is valid writable memory for one Py_buffer.
        let rc = unsafe {
            ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), ffi::PyBUF_RECORDS_RO)
        };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // SAFETY: initialized by a successful PyObject_GetBuffer.
        Ok(Export(unsafe { view.assume_init() }))
    }

    /// The struct format (`"<f4"`-like codes such as `"f"`, `">d"`), or
    /// `"B"` when the exporter gave none.
    pub fn format(&self) -> &[u8] {
        if self.0.format.is_null() {
            return b"B";
        }
        // SAFETY: a non-null format is a NUL-terminated string owned by
        // the export, valid until it is released (it outlives `&self`).
        unsafe { std::ffi::CStr::from_ptr(self.0.format) }.to_bytes()
    }

    pub fn itemsize(&self) -> isize {
        self.0.itemsize
    }

    /// The extent of each axis; `None` if the exporter gave no shape.
    pub fn shape(&self) -> Option<&[isize]> {
        let nd = self.0.ndim.max(0) as usize;
        if nd == 0 {
            return Some(&[]);
        }
        if self.0.shape.is_null() {
            return None;
        }
        // SAFETY: `ndim` extents owned by the export (see `format`).
        Some(unsafe { std::slice::from_raw_parts(self.0.shape, nd) })
    }

    /// Bytes between neighbours along each axis; `None` if the exporter
    /// gave none (the buffer protocol's way of saying C-contiguous).
    pub fn strides(&self) -> Option<&[isize]> {
        let nd = self.0.ndim.max(0) as usize;
        if nd == 0 {
            return Some(&[]);
        }
        if self.0.strides.is_null() {
            return None;
        }
        // SAFETY: `ndim` strides owned by the export (see `format`).
        Some(unsafe { std::slice::from_raw_parts(self.0.strides, nd) })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.0.buf as *mut u8
    }

    pub fn len(&self) -> usize {
        self.0.len.max(0) as usize
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        // Attached already (release_pending or an error path): no wait.
        let view = &mut *self.0;
        let _ = Python::try_attach(|_| unsafe { ffi::PyBuffer_Release(view) });
    }
}

/// Python objects whose buffers were lent to Strom and are no longer
/// needed. They are released by the next call that holds the GIL, so
/// Strom's network threads never wait for the GIL.
static PENDING: Mutex<Vec<Held>> = Mutex::new(Vec::new());
static ANY_PENDING: AtomicBool = AtomicBool::new(false);

/// Held only so that dropping it releases the export or the reference.
#[allow(dead_code)]
pub enum Held {
    Buffer(Export),
    Object(Py<PyAny>),
}

/// Owns a Python object (or a buffer export of it) on Strom's behalf;
/// dropping it from any thread defers the release to a GIL holder.
pub struct Lent {
    held: Option<Held>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the pointer is into memory the held export keeps alive and
// unchanged (the owner exports it to us); the export itself is Send.
unsafe impl Send for Lent {}
unsafe impl Sync for Lent {}

impl Lent {
    /// # Safety
    /// `ptr..ptr+len` must stay valid while `held` is alive.
    pub unsafe fn new(held: Held, ptr: *const u8, len: usize) -> Self {
        Lent {
            held: Some(held),
            ptr,
            len,
        }
    }

    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: see `new`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(h) = self.held.take() {
            PENDING.lock().push(h);
            ANY_PENDING.store(true, Ordering::Release);
        }
    }
}

/// Releases lent buffers whose Strom use ended. Cheap when there are none.
pub fn release_pending(_py: Python<'_>) {
    if !ANY_PENDING.load(Ordering::Acquire) {
        return;
    }
    let done = {
        let mut p = PENDING.lock();
        ANY_PENDING.store(false, Ordering::Release);
        std::mem::take(&mut *p)
    };
    // Dropped while attached: PyBuffer_Release / decref run right here.
    drop(done);
}

/// How long one GIL-free wait lasts before checking for signals (Ctrl-C).
pub const SLICE: Duration = Duration::from_millis(100);

/// When a wait of `timeout` seconds from now ends: `None` for ever (no
/// timeout, or an infinite one); an `InvalidArgument` if negative or NaN.
pub fn deadline(py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Instant>> {
    match timeout {
        Some(t) if t.is_finite() && t >= 0.0 => {
            // A timeout too large for an Instant waits for ever.
            Ok(Duration::try_from_secs_f64(t)
                .ok()
                .and_then(|d| Instant::now().checked_add(d)))
        }
        Some(t) if t < 0.0 || t.is_nan() => Err(errors::invalid(
            py,
            format!("timeout must be >= 0, not {t}"),
        )),
        _ => Ok(None),
    }
}

/// `s` seconds as a `Duration`; an `InvalidArgument` naming `what` if
/// negative, NaN or too large.
pub fn seconds(py: Python<'_>, s: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| errors::invalid(py, format!("{what} must be a number of seconds, not {s}")))
}

/// As [`seconds`], for a limit that must be above zero (a request timeout).
pub fn positive_seconds(py: Python<'_>, s: f64, what: &str) -> PyResult<Duration> {
    match seconds(py, s, what)? {
        d if d.is_zero() => Err(errors::invalid(
            py,
            format!("{what} must be a number of seconds above 0, not {s}"),
        )),
        d => Ok(d),
    }
}

/// Repeats `step(slice)` with the GIL released until it returns `Some`,
/// the timeout passes (`None`), or a signal handler raises.
pub fn wait_loop<T: Send>(
    py: Python<'_>,
    timeout: Option<f64>,
    mut step: impl FnMut(Duration) -> Option<T> + Send,
) -> PyResult<Option<T>> {
    let deadline = deadline(py, timeout)?;
    loop {
        let slice = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).min(SLICE),
            None => SLICE,
        };
        if let Some(v) = py.detach(|| step(slice)) {
            return Ok(Some(v));
        }
        py.check_signals()?;
        if let Some(d) = deadline {
            if Instant::now() >= d {
                return Ok(None);
            }
        }
    }
}
