//! asyncio integration. Awaiting a Strom future never blocks the event
//! loop: a helper thread (one per process, started on first use) waits for
//! the Rust future and completes an asyncio future through
//! `loop.call_soon_threadsafe`.

use std::future::Future;

use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyCFunction;
use tokio::runtime::Runtime;

static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);

fn runtime() -> std::io::Result<&'static Runtime> {
    let mut rt = RUNTIME.lock();
    let pid = crate::common::current_pid();
    match *rt {
        Some((p, r)) if p == pid => Ok(r),
        // None yet, or one inherited through fork() whose thread is gone
        // (leaked: it cannot be shut down from here).
        _ => {
            let r = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("strom-py-aio")
                .enable_time()
                .build()?;
            let r: &'static Runtime = Box::leak(Box::new(r));
            *rt = Some((pid, r));
            Ok(r)
        }
    }
}

/// The result handed to asyncio: a value, or an exception to set.
pub type Outcome = Result<Py<PyAny>, PyErr>;

#[pyfunction]
fn _complete(fut: &Bound<'_, PyAny>, ok: bool, value: &Bound<'_, PyAny>) -> PyResult<()> {
    if fut.call_method0("done")?.extract::<bool>()? {
        return Ok(()); // cancelled meanwhile
    }
    if ok {
        fut.call_method1("set_result", (value,))?;
    } else {
        fut.call_method1("set_exception", (value,))?;
    }
    Ok(())
}

static COMPLETE: PyOnceLock<Py<PyCFunction>> = PyOnceLock::new();
static ASYNCIO: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// A new asyncio future on the running loop, and the loop.
pub fn new_future(py: Python<'_>) -> PyResult<(Bound<'_, PyAny>, Bound<'_, PyAny>)> {
    let asyncio =
        ASYNCIO.get_or_try_init(py, || PyModule::import(py, "asyncio").map(Bound::unbind))?;
    let event_loop = asyncio.bind(py).call_method0("get_running_loop")?;
    let fut = event_loop.call_method0("create_future")?;
    Ok((event_loop, fut))
}

fn settle(
    py: Python<'_>,
    event_loop: &Bound<'_, PyAny>,
    fut: &Bound<'_, PyAny>,
    outcome: Outcome,
) -> PyResult<()> {
    let complete =
        COMPLETE.get_or_try_init(py, || wrap_pyfunction!(_complete, py).map(Bound::unbind))?;
    let (ok, value) = match outcome {
        Ok(v) => (true, v.into_bound(py)),
        Err(e) => (false, e.into_value(py).into_bound(py).into_any()),
    };
    event_loop.call_method1("call_soon_threadsafe", (complete.bind(py), fut, ok, value))?;
    Ok(())
}

/// An asyncio future that resolves with `make(output)` once `work`
/// finishes on the helper thread.
pub fn await_on<'py, F, M>(py: Python<'py>, work: F, make: M) -> PyResult<Bound<'py, PyAny>>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
    M: FnOnce(Python<'_>, F::Output) -> Outcome + Send + 'static,
{
    let (event_loop, fut) = new_future(py)?;
    let (l, f) = (event_loop.clone().unbind(), fut.clone().unbind());
    let rt = runtime().map_err(|e| pyo3::exceptions::PyRuntimeError::new_err(e.to_string()))?;
    let task = rt.spawn(async move {
        let out = work.await;
        Python::attach(|py| {
            let outcome = make(py, out);
            let closed = l
                .bind(py)
                .call_method0("is_closed")
                .and_then(|c| c.extract::<bool>())
                .unwrap_or(true);
            // A closed loop has nobody waiting on it any more.
            if !closed {
                if let Err(e) = settle(py, l.bind(py), f.bind(py), outcome) {
                    e.write_unraisable(py, None);
                }
            }
        });
    });
    // Cancelling the asyncio future (asyncio.wait_for, task.cancel()) stops
    // the work, so a cancelled pull takes no event from the queue.
    fut.call_method1(
        "add_done_callback",
        (Canceller {
            task: task.abort_handle(),
        },),
    )?;
    Ok(fut)
}

/// Done-callback of an asyncio future: aborts its Rust task if cancelled.
#[pyclass(module = "strom._strom", frozen)]
struct Canceller {
    task: tokio::task::AbortHandle,
}

#[pymethods]
impl Canceller {
    fn __call__(&self, fut: &Bound<'_, PyAny>) -> PyResult<()> {
        if fut.call_method0("cancelled")?.extract::<bool>()? {
            self.task.abort();
        }
        Ok(())
    }
}

/// An asyncio future that is already resolved.
pub fn ready<'py>(py: Python<'py>, outcome: Outcome) -> PyResult<Bound<'py, PyAny>> {
    let (_, fut) = new_future(py)?;
    match outcome {
        Ok(v) => fut.call_method1("set_result", (v,))?,
        Err(e) => fut.call_method1("set_exception", (e.into_value(py),))?,
    };
    Ok(fut)
}
