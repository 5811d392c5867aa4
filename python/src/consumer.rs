//! `Consumer`: pull (blocking with the GIL released, or awaitable),
//! `pull_batch` / `pull_many` (many events per call), iteration,
//! `async for`, `process` callbacks and `seek`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pyo3::exceptions::{PyStopAsyncIteration, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};
use strom_client::{Consumer, Error, ErrorCode, Event, Next, StartPos};

use crate::aio;
use crate::common::{deadline, release_pending, wait_loop, ForkSafe, SLICE};
use crate::errors;
use crate::event::PyEvent;
use crate::select::Layouts;

/// What turns client events and errors into Python objects; shared with
/// the asyncio helper thread.
#[derive(Clone)]
pub struct Ctx {
    pub layouts: Option<Layouts>,
    /// The exception a Python selector or broker raised, if any.
    pub failure: Arc<Mutex<Option<PyErr>>>,
    /// The exception an `on_assigned` / `on_revoked` callback raised,
    /// raised by the next pull (the events of the pull during which it ran
    /// are still returned, so none is skipped).
    pub rebalance: Arc<Mutex<Option<PyErr>>>,
}

impl Ctx {
    fn event(&self, ev: Event) -> PyEvent {
        let selected = self
            .layouts
            .as_ref()
            .and_then(|m| m.lock().remove(&(ev.partition, ev.offset)));
        PyEvent::new(ev, selected)
    }

    fn error(&self, py: Python<'_>, e: &Error) -> PyErr {
        let cause = match e.code() {
            ErrorCode::DATA_SELECTOR | ErrorCode::DATA_BROKER => self.failure.lock().take(),
            _ => None,
        };
        errors::to_py_caused(py, e, cause)
    }
}

/// Parses a start or seek position: `"committed"`, `"beginning"`,
/// `"end"`, an offset (int), `("offset", n)` or `("timestamp", µs)`.
pub fn start_pos(py: Python<'_>, pos: &Bound<'_, PyAny>) -> PyResult<StartPos> {
    if let Ok(s) = pos.cast::<PyString>() {
        return match s.to_str()? {
            "committed" => Ok(StartPos::Committed),
            "beginning" => Ok(StartPos::Beginning),
            "end" => Ok(StartPos::End),
            other => Err(errors::invalid(
                py,
                format!("unknown position '{other}'; use 'committed', 'beginning', 'end', an offset or ('timestamp', microseconds)"),
            )),
        };
    }
    if let Ok(o) = pos.extract::<u64>() {
        return Ok(StartPos::Offset(o));
    }
    if let Ok(t) = pos.cast::<PyTuple>() {
        if let Ok((kind, v)) = t.extract::<(String, u64)>() {
            match kind.as_str() {
                "timestamp" => return Ok(StartPos::Timestamp(v)),
                "offset" => return Ok(StartPos::Offset(v)),
                _ => {}
            }
        }
    }
    Err(PyTypeError::new_err(
        "a position is 'committed', 'beginning', 'end', an offset (int), ('offset', n) or ('timestamp', microseconds)",
    ))
}

/// A named consumer of a topic. Made by `Topic.consumer(...)`. Iterate it
/// (`for event in consumer`, `async for event in consumer`) until the end
/// of the stream, call `pull()`, or drive it with `process(...)`.
#[pyclass(module = "strom._strom", name = "Consumer", frozen)]
pub struct PyConsumer {
    inner: Mutex<Option<ForkSafe<Arc<Consumer>>>>,
    ctx: Ctx,
    carry: Mutex<Carry>,
}

/// What `pull_many` took from the client's queue but could not return:
/// the events it held when a signal handler raised (Ctrl-C), or the error
/// that followed the events it returned. Every pull returns these first.
#[derive(Default)]
struct Carry {
    events: VecDeque<Event>,
    error: Option<Error>,
}

/// Why `fill` stopped.
enum Stop {
    /// `n` events taken.
    Full,
    /// The slice ran out first.
    Slice,
    /// The end of the stream.
    End,
    /// An error followed the events taken.
    Failed(Error),
}

/// Takes events into `got` until it holds `n`, `until` passes, the stream
/// ends or an error comes. Called with the GIL released.
fn fill(c: &Consumer, got: &mut Vec<Event>, n: usize, until: Instant) -> Stop {
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match c.pull_many(n - got.len(), left) {
            Ok(Some(v)) if v.is_empty() => return Stop::Slice,
            Ok(Some(v)) => {
                got.extend(v);
                if got.len() >= n {
                    return Stop::Full;
                }
            }
            Ok(None) => return Stop::End,
            Err(e) => return Stop::Failed(e),
        }
    }
}

impl PyConsumer {
    pub fn new(consumer: Consumer, ctx: Ctx) -> Self {
        PyConsumer {
            inner: Mutex::new(Some(ForkSafe::new(Arc::new(consumer), "Consumer"))),
            ctx,
            carry: Mutex::new(Carry::default()),
        }
    }

    /// Up to `max` carried events, else the carried error, else `None`.
    fn take_carried(&self, max: usize) -> Option<Result<Vec<Event>, Error>> {
        let mut c = self.carry.lock();
        if !c.events.is_empty() {
            let k = max.min(c.events.len());
            return Some(Ok(c.events.drain(..k).collect()));
        }
        c.error.take().map(Err)
    }

    fn events(&self, v: Vec<Event>) -> Vec<PyEvent> {
        v.into_iter().map(|e| self.ctx.event(e)).collect()
    }
    fn consumer(&self, py: Python<'_>) -> PyResult<Arc<Consumer>> {
        match &*self.inner.lock() {
            Some(c) => Ok(c.get(py)?.clone()),
            None => Err(errors::coded_named(
                py,
                "StromError",
                ErrorCode::SHUTTING_DOWN,
                "the consumer is closed",
            )),
        }
    }

    /// The next item, or `None` when `timeout` passed.
    fn next(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Next>> {
        release_pending(py);
        match self.take_carried(1) {
            Some(Ok(mut v)) => return Ok(v.pop().map(Next::Event)),
            Some(Err(e)) => return Err(self.ctx.error(py, &e)),
            None => {}
        }
        let c = self.consumer(py)?;
        // Fast path: an event already queued is taken without releasing the GIL.
        match c.pull_timeout(Duration::ZERO) {
            Err(Error::Timeout(_)) => {}
            Ok(n) => return Ok(Some(n)),
            Err(e) => return Err(self.ctx.error(py, &e)),
        }
        let r = wait_loop(py, timeout, move |slice| match c.pull_timeout(slice) {
            Err(Error::Timeout(_)) => None,
            r => Some(r),
        })?;
        match r {
            None => Ok(None),
            Some(Ok(n)) => Ok(Some(n)),
            Some(Err(e)) => Err(self.ctx.error(py, &e)),
        }
    }

    fn pull_event(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<PyEvent>> {
        self.raise_rebalance()?;
        match self.next(py, timeout)? {
            Some(Next::Event(e)) => Ok(Some(self.ctx.event(e))),
            Some(Next::EndOfStream) => Ok(None),
            None => Err(errors::to_py(
                py,
                &Error::Timeout(Duration::from_secs_f64(timeout.unwrap_or(0.0))),
            )),
        }
    }

    fn raise_rebalance(&self) -> PyResult<()> {
        match self.ctx.rebalance.lock().take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// An awaitable of the next item; `end` says what the end of stream becomes.
    fn next_async<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        end_raises: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let limit = match timeout {
            Some(t) if t.is_nan() || t < 0.0 => {
                return Err(errors::invalid(
                    py,
                    format!("timeout must be >= 0, not {t}"),
                ))
            }
            // Too large for a Duration (or infinite): no limit.
            Some(t) => Duration::try_from_secs_f64(t).ok(),
            None => None,
        };
        match self.take_carried(1) {
            Some(Ok(v)) => {
                let out = match v.into_iter().next() {
                    Some(e) => Py::new(py, self.ctx.event(e))?.into_any(),
                    None => py.None(),
                };
                return aio::ready(py, Ok(out));
            }
            Some(Err(e)) => return Err(self.ctx.error(py, &e)),
            None => {}
        }
        let c = self.consumer(py)?;
        let ctx = self.ctx.clone();
        let end = move |py: Python<'_>| -> aio::Outcome {
            if end_raises {
                Err(PyStopAsyncIteration::new_err(()))
            } else {
                Ok(py.None())
            }
        };
        match c.pull_timeout(Duration::ZERO) {
            Err(Error::Timeout(_)) => {}
            Ok(Next::Event(e)) => {
                return aio::ready(py, Ok(Py::new(py, ctx.event(e))?.into_any()));
            }
            Ok(Next::EndOfStream) => {
                if end_raises {
                    return Err(PyStopAsyncIteration::new_err(()));
                }
                return aio::ready(py, Ok(py.None()));
            }
            Err(e) => return Err(ctx.error(py, &e)),
        }
        aio::await_on(
            py,
            async move {
                match limit {
                    None => Some(c.pull().await),
                    Some(t) => tokio::time::timeout(t, c.pull()).await.ok(),
                }
            },
            move |py, r| match r {
                Some(Ok(Next::Event(e))) => Ok(Py::new(py, ctx.event(e))?.into_any()),
                Some(Ok(Next::EndOfStream)) => end(py),
                Some(Err(e)) => Err(ctx.error(py, &e)),
                None => Err(errors::to_py(
                    py,
                    &Error::Timeout(limit.unwrap_or_default()),
                )),
            },
        )
    }
}

#[pymethods]
impl PyConsumer {
    /// Waits (GIL released) for the next event and returns it, or `None`
    /// at the end of the stream. Raises `strom.TimeoutError` after
    /// `timeout` seconds.
    #[pyo3(signature = (timeout=None))]
    fn pull(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<PyEvent>> {
        self.pull_event(py, timeout)
    }

    /// Every event that has arrived, up to `max`, as a list, in one call:
    /// waits (GIL released) up to `timeout` seconds (default: for ever) for
    /// the first, never for more. An empty list when `timeout` passed with
    /// nothing to take (`timeout=0` drains without waiting); `None` at the
    /// end of the stream.
    #[pyo3(signature = (max, timeout=None))]
    fn pull_batch(
        &self,
        py: Python<'_>,
        max: usize,
        timeout: Option<f64>,
    ) -> PyResult<Option<Vec<PyEvent>>> {
        release_pending(py);
        if max == 0 {
            return Err(errors::invalid(py, "pull_batch needs max >= 1"));
        }
        self.raise_rebalance()?;
        match self.take_carried(max) {
            Some(Ok(v)) => return Ok(Some(self.events(v))),
            Some(Err(e)) => return Err(self.ctx.error(py, &e)),
            None => {}
        }
        let c = self.consumer(py)?;
        // Fast path: events already queued are taken without releasing the GIL.
        let r = match c.pull_many(max, Duration::ZERO) {
            Ok(Some(v)) if v.is_empty() && timeout != Some(0.0) => {
                wait_loop(py, timeout, move |slice| match c.pull_many(max, slice) {
                    Ok(Some(v)) if v.is_empty() => None,
                    r => Some(r),
                })?
                .unwrap_or(Ok(Some(Vec::new())))
            }
            r => r,
        };
        match r {
            Ok(Some(v)) => Ok(Some(self.events(v))),
            Ok(None) => Ok(None),
            Err(e) => Err(self.ctx.error(py, &e)),
        }
    }

    /// `n` events as a list, in one call: waits (GIL released) until `n`
    /// have arrived, the stream ends, or `timeout` seconds (default: for
    /// ever) pass. The list is shorter than `n` only at the end of the
    /// stream, when `timeout` passed (it may then be empty; `timeout=0`
    /// takes what has arrived without waiting), when an error followed
    /// the events in it (the next call raises it), or after a call a
    /// signal handler interrupted (its events come first). `None` at the
    /// end of the stream. Fewer, fuller lists than `pull_batch` when the
    /// consumer outpaces the producer, at the price of waiting for them.
    #[pyo3(signature = (n, timeout=None))]
    fn pull_many(
        &self,
        py: Python<'_>,
        n: usize,
        timeout: Option<f64>,
    ) -> PyResult<Option<Vec<PyEvent>>> {
        release_pending(py);
        if n == 0 {
            return Err(errors::invalid(py, "pull_many needs n >= 1"));
        }
        let deadline = deadline(py, timeout)?;
        self.raise_rebalance()?;
        match self.take_carried(n) {
            Some(Ok(v)) => return Ok(Some(self.events(v))),
            Some(Err(e)) => return Err(self.ctx.error(py, &e)),
            None => {}
        }
        let c = self.consumer(py)?;
        // Fast path: events already queued are taken without releasing the GIL.
        let mut got = match c.pull_many(n, Duration::ZERO) {
            Ok(Some(v)) => v,
            Ok(None) => return Ok(None),
            Err(e) => return Err(self.ctx.error(py, &e)),
        };
        let mut stop = if got.len() >= n {
            Stop::Full
        } else {
            Stop::Slice
        };
        while matches!(stop, Stop::Slice) {
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                break;
            }
            let until = deadline.map_or(now + SLICE, |d| d.min(now + SLICE));
            let c = &c;
            (got, stop) = py.detach(move || {
                let stop = fill(c, &mut got, n, until);
                (got, stop)
            });
            if matches!(stop, Stop::Slice) {
                if let Err(interrupted) = py.check_signals() {
                    self.carry.lock().events.extend(got);
                    return Err(interrupted);
                }
            }
        }
        match stop {
            Stop::End if got.is_empty() => Ok(None),
            Stop::Failed(e) if got.is_empty() => Err(self.ctx.error(py, &e)),
            Stop::Failed(e) => {
                self.carry.lock().error = Some(e);
                Ok(Some(self.events(got)))
            }
            _ => Ok(Some(self.events(got))),
        }
    }

    /// Awaitable `pull`: resolves to the next event, or `None` at the end of
    /// the stream, without blocking the event loop.
    #[pyo3(signature = (timeout=None))]
    fn pull_async<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.next_async(py, timeout, false)
    }

    fn __iter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<PyEvent>> {
        self.pull_event(py, None)
    }

    fn __aiter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __anext__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.next_async(py, None, true)
    }

    /// Runs the MPI-stream style loop: `on_start()` once, `on_event(event)`
    /// for every event in order until the end of the stream, then
    /// `on_end()` once. An exception from a callback stops the loop and
    /// propagates.
    #[pyo3(signature = (on_event, on_start=None, on_end=None))]
    fn process(
        &self,
        py: Python<'_>,
        on_event: &Bound<'_, PyAny>,
        on_start: Option<&Bound<'_, PyAny>>,
        on_end: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if let Some(f) = on_start {
            f.call0()?;
        }
        while let Some(ev) = self.pull_event(py, None)? {
            on_event.call1((ev,))?;
        }
        if let Some(f) = on_end {
            f.call0()?;
        }
        Ok(())
    }

    /// Moves every partition to `position`: `"beginning"`, `"end"`,
    /// `"committed"` (after the name's last ack), an offset (int), or
    /// `("timestamp", µs)`. Queued events are dropped.
    fn seek(&self, py: Python<'_>, position: &Bound<'_, PyAny>) -> PyResult<()> {
        let pos = start_pos(py, position)?;
        let c = self.consumer(py)?;
        let r = py.detach(|| c.seek(pos));
        *self.carry.lock() = Carry::default();
        if let Some(l) = &self.ctx.layouts {
            l.lock().clear();
        }
        r.map_err(|e| self.ctx.error(py, &e))
    }

    /// The consumer's name (acks are kept per name).
    #[getter]
    fn name(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.consumer(py)?.name().to_string())
    }

    /// The consumer group this consumer is a member of, or None.
    #[getter]
    fn group(&self, py: Python<'_>) -> PyResult<Option<String>> {
        Ok(self.consumer(py)?.group().map(str::to_string))
    }

    /// This member's id in its consumer group, or None.
    #[getter]
    fn member_id(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        Ok(self.consumer(py)?.member_id())
    }

    /// The topic's name.
    #[getter]
    fn topic(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.consumer(py)?.topic().name().to_string())
    }

    /// Ends the subscriptions. Acks already made are kept.
    fn close(&self, py: Python<'_>) {
        let c = self.inner.lock().take();
        py.detach(|| drop(c));
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }
}
