//! What a push returns: `EventId`, the `PushFuture` of one event, and the
//! `PushFutures` of the events one `push_many` call queued (one Python
//! object per call; a `PushFuture` of any of its events on request).

use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use strom_client::{Error, EventId, PushFuture};

use crate::aio;
use crate::common::{release_pending, wait_loop};
use crate::errors;

/// Where an acknowledged event was stored: `partition` and `offset`.
/// Unpacks like a tuple: `partition, offset = future.result()`.
#[pyclass(module = "strom._strom", name = "EventId", frozen, eq, hash)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyEventId {
    /// The partition the event went to.
    #[pyo3(get)]
    pub partition: u32,
    /// The event's offset within its partition.
    #[pyo3(get)]
    pub offset: u64,
}

#[pymethods]
impl PyEventId {
    #[new]
    fn new(partition: u32, offset: u64) -> Self {
        PyEventId { partition, offset }
    }
    fn __len__(&self) -> usize {
        2
    }
    fn __getitem__(&self, py: Python<'_>, i: isize) -> PyResult<Py<PyAny>> {
        match i {
            0 | -2 => Ok(self.partition.into_pyobject(py)?.into_any().unbind()),
            1 | -1 => Ok(self.offset.into_pyobject(py)?.into_any().unbind()),
            _ => Err(PyIndexError::new_err("EventId has 2 items")),
        }
    }
    fn __repr__(&self) -> String {
        format!(
            "EventId(partition={}, offset={})",
            self.partition, self.offset
        )
    }
}

impl From<EventId> for PyEventId {
    fn from(e: EventId) -> Self {
        PyEventId {
            partition: e.partition,
            offset: e.offset,
        }
    }
}

/// The client futures of the events one call queued, in push order.
pub type Queued = Arc<[PushFuture]>;

/// The error `Timeout` of a wait that ran out after `timeout` seconds.
fn timed_out(py: Python<'_>, timeout: Option<f64>) -> PyErr {
    errors::to_py(
        py,
        &Error::Timeout(Duration::from_secs_f64(timeout.unwrap_or(0.0))),
    )
}

/// The future of one pushed event: resolves to its `EventId` once the
/// event's batch is acknowledged by the server. Wait with `wait()` /
/// `result()`, poll with `done()`, or `await` it in asyncio.
#[pyclass(module = "strom._strom", name = "PushFuture", frozen)]
pub struct PyPushFuture {
    futs: Queued,
    i: usize,
    outcome: PyOnceLock<Result<PyEventId, Error>>,
}

impl PyPushFuture {
    /// Its futures and the index range of this one (for `Event.ack_when`).
    pub fn queued(&self) -> (Queued, std::ops::Range<usize>) {
        (self.futs.clone(), self.i..self.i + 1)
    }

    pub fn new(futs: Queued, i: usize) -> Self {
        PyPushFuture {
            futs,
            i,
            outcome: PyOnceLock::new(),
        }
    }

    fn settle(&self, py: Python<'_>, r: Result<EventId, Error>) -> &Result<PyEventId, Error> {
        self.outcome.get_or_init(py, || r.map(PyEventId::from))
    }

    fn answer(py: Python<'_>, r: &Result<PyEventId, Error>) -> PyResult<PyEventId> {
        r.as_ref().map(|id| *id).map_err(|e| errors::to_py(py, e))
    }
}

#[pymethods]
impl PyPushFuture {
    /// Waits (with the GIL released) until the event is stored and returns
    /// its `EventId`. Raises `strom.TimeoutError` after `timeout` seconds,
    /// or the error that failed the event's batch.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyEventId> {
        release_pending(py);
        if let Some(r) = self.outcome.get(py) {
            return Self::answer(py, r);
        }
        let (futs, i) = (self.futs.clone(), self.i);
        let got = wait_loop(py, timeout, move |slice| {
            match futs[i].wait_timeout(Some(slice)) {
                Err(Error::Timeout(_)) => None,
                r => Some(r),
            }
        })?;
        match got {
            Some(r) => Self::answer(py, self.settle(py, r)),
            None => Err(timed_out(py, timeout)),
        }
    }

    /// Same as `wait`, in the style of `concurrent.futures.Future`.
    #[pyo3(signature = (timeout=None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyEventId> {
        self.wait(py, timeout)
    }

    /// True once the event is stored or its batch failed.
    fn done(&self, py: Python<'_>) -> bool {
        self.outcome.get(py).is_some() || self.futs[self.i].is_done()
    }

    fn __await__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        if let Some(r) = this.outcome.get(py) {
            let outcome = Self::answer(py, r).and_then(|id| Ok(Py::new(py, id)?.into_any()));
            return aio::ready(py, outcome)?.call_method0("__await__");
        }
        let (futs, i) = (this.futs.clone(), this.i);
        let me = slf.clone().unbind();
        let fut = aio::await_on(
            py,
            std::future::poll_fn(move |cx| futs[i].poll_ref(cx)),
            move |py, r| {
                let settled = me.get().settle(py, r);
                Self::answer(py, settled).and_then(|id| Ok(Py::new(py, id)?.into_any()))
            },
        )?;
        fut.call_method0("__await__")
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        match self.outcome.get(py) {
            Some(Ok(id)) => format!("<PushFuture done {}>", id.__repr__()),
            Some(Err(e)) => format!("<PushFuture failed: {e}>"),
            None => "<PushFuture pending>".into(),
        }
    }
}

/// The first failure among a call's events: its index and error.
type Failure = (usize, Error);

/// The futures of the events one `Producer.push_many` call queued, in
/// push order: one object for the whole call. `wait()` returns every
/// event's `EventId` once all are stored; `futures[i]` is the
/// `PushFuture` of event `i`; `len(futures)` is how many were queued.
#[pyclass(module = "strom._strom", name = "PushFutures", frozen, sequence)]
pub struct PyPushFutures {
    futs: Queued,
    outcome: PyOnceLock<Result<Vec<PyEventId>, Failure>>,
}

impl PyPushFutures {
    /// Every future of the call (for `Event.ack_when`).
    pub fn queued(&self) -> Option<(Queued, std::ops::Range<usize>)> {
        Some((self.futs.clone(), 0..self.futs.len()))
    }

    pub fn new(futs: Queued) -> Self {
        PyPushFutures {
            futs,
            outcome: PyOnceLock::new(),
        }
    }

    fn answer(py: Python<'_>, r: &Result<Vec<PyEventId>, Failure>) -> PyResult<Vec<PyEventId>> {
        match r {
            Ok(ids) => Ok(ids.clone()),
            Err((i, e)) => Err(errors::with_note(
                py,
                errors::to_py(py, e),
                &format!("raised by event {i} of this push_many call"),
            )),
        }
    }
}

/// Collects the ids of `futs[*next..]` in order, waiting until `end` at
/// most: `None` when time ran out first (progress is kept in `ids`).
fn collect(
    futs: &[PushFuture],
    ids: &mut Vec<PyEventId>,
    end: Instant,
) -> Option<Result<Vec<PyEventId>, Failure>> {
    while let Some(f) = futs.get(ids.len()) {
        let left = end.saturating_duration_since(Instant::now());
        match f.wait_timeout(Some(left)) {
            Ok(id) => ids.push(id.into()),
            Err(Error::Timeout(_)) => return None,
            Err(e) => return Some(Err((ids.len(), e))),
        }
    }
    Some(Ok(std::mem::take(ids)))
}

#[pymethods]
impl PyPushFutures {
    /// Waits (GIL released) until every event is stored and returns their
    /// `EventId`s, in push order. Raises the error of the first event (in
    /// push order) whose batch failed, or `strom.TimeoutError` after
    /// `timeout` seconds.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Vec<PyEventId>> {
        release_pending(py);
        if let Some(r) = self.outcome.get(py) {
            return Self::answer(py, r);
        }
        let futs = self.futs.clone();
        let mut ids = Vec::with_capacity(futs.len());
        let got = wait_loop(py, timeout, move |slice| {
            collect(&futs, &mut ids, Instant::now() + slice)
        })?;
        match got {
            Some(r) => Self::answer(py, self.outcome.get_or_init(py, || r)),
            None => Err(timed_out(py, timeout)),
        }
    }

    /// Same as `wait`, in the style of `concurrent.futures.Future`.
    #[pyo3(signature = (timeout=None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Vec<PyEventId>> {
        self.wait(py, timeout)
    }

    /// True once every event is stored or failed.
    fn done(&self, py: Python<'_>) -> bool {
        self.outcome.get(py).is_some() || self.futs.iter().all(PushFuture::is_done)
    }

    fn __len__(&self) -> usize {
        self.futs.len()
    }

    /// The `PushFuture` of event `i` (negative counts from the end).
    fn __getitem__(&self, i: isize) -> PyResult<PyPushFuture> {
        let n = self.futs.len() as isize;
        let j = if i < 0 { i + n } else { i };
        if !(0..n).contains(&j) {
            return Err(PyIndexError::new_err(format!(
                "event {i} of {n} queued events"
            )));
        }
        Ok(PyPushFuture::new(self.futs.clone(), j as usize))
    }

    fn __await__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        if let Some(r) = this.outcome.get(py) {
            let outcome = Self::answer(py, r).and_then(|ids| Ok(ids.into_pyobject(py)?.unbind()));
            return aio::ready(py, outcome)?.call_method0("__await__");
        }
        let futs = this.futs.clone();
        let me = slf.clone().unbind();
        let mut ids: Vec<PyEventId> = Vec::with_capacity(futs.len());
        let fut = aio::await_on(
            py,
            std::future::poll_fn(move |cx| {
                while let Some(f) = futs.get(ids.len()) {
                    match std::task::ready!(f.poll_ref(cx)) {
                        Ok(id) => ids.push(id.into()),
                        Err(e) => return std::task::Poll::Ready(Err((ids.len(), e))),
                    }
                }
                std::task::Poll::Ready(Ok(std::mem::take(&mut ids)))
            }),
            move |py, r| {
                let settled = me.get().outcome.get_or_init(py, || r);
                Self::answer(py, settled).and_then(|ids| Ok(ids.into_pyobject(py)?.unbind()))
            },
        )?;
        fut.call_method0("__await__")
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let n = self.futs.len();
        match self.outcome.get(py) {
            Some(Ok(_)) => format!("<PushFutures of {n} events, done>"),
            Some(Err((i, e))) => format!("<PushFutures of {n} events, event {i} failed: {e}>"),
            None => format!("<PushFutures of {n} events, pending>"),
        }
    }
}
