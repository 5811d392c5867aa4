//! `Producer` and `PushFuture`. `push` converts the metadata to JSON bytes
//! in Rust, lends the data's buffers to Strom without copying them (the
//! Python objects stay alive until their batch is acknowledged), and queues
//! the event with the GIL released; batches go out from Strom's own threads.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString, PyTuple, PyType};
use strom_client::{Data, Error, EventId, MetadataInput, Producer, PushFuture};

use crate::aio;
use crate::common::{release_pending, wait_loop, Export, ForkSafe, Held, Lent};
use crate::errors::{self, IntoPy};
use crate::json;
use strom_client::select::{itemsize, ArrayLayout as Layout, Order};

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
            _ => Err(pyo3::exceptions::PyIndexError::new_err(
                "EventId has 2 items",
            )),
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

/// The future of one pushed event: resolves to its `EventId` once the
/// event's batch is acknowledged by the server. Wait with `wait()` /
/// `result()`, poll with `done()`, or `await` it in asyncio.
#[pyclass(module = "strom._strom", name = "PushFuture", frozen)]
pub struct PyPushFuture {
    fut: Arc<Mutex<PushFuture>>,
    outcome: PyOnceLock<Result<PyEventId, Error>>,
}

impl PyPushFuture {
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
        let fut = self.fut.clone();
        let got = wait_loop(py, timeout, move |slice| {
            match fut.lock().wait_timeout(Some(slice)) {
                Err(Error::Timeout(_)) => None,
                r => Some(r),
            }
        })?;
        match got {
            Some(r) => Self::answer(py, self.settle(py, r)),
            None => Err(errors::to_py(
                py,
                &Error::Timeout(Duration::from_secs_f64(timeout.unwrap_or(0.0))),
            )),
        }
    }

    /// Same as `wait`, in the style of `concurrent.futures.Future`.
    #[pyo3(signature = (timeout=None))]
    fn result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<PyEventId> {
        self.wait(py, timeout)
    }

    /// True once the event is stored or its batch failed.
    fn done(&self, py: Python<'_>) -> bool {
        self.outcome.get(py).is_some() || self.fut.lock().is_done()
    }

    fn __await__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        if let Some(r) = this.outcome.get(py) {
            let outcome = Self::answer(py, r).and_then(|id| Ok(Py::new(py, id)?.into_any()));
            return aio::ready(py, outcome)?.call_method0("__await__");
        }
        let fut = this.fut.clone();
        let me = slf.clone().unbind();
        let fut = aio::await_on(
            py,
            async move {
                std::future::poll_fn(|cx| {
                    let mut g = fut.lock();
                    std::pin::Pin::new(&mut *g).poll(cx)
                })
                .await
            },
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

use std::future::Future;

static NDARRAY: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// numpy's ndarray type, if numpy is imported (never imports it).
fn ndarray<'py>(py: Python<'py>) -> Option<&'py Bound<'py, PyType>> {
    if let Some(t) = NDARRAY.get(py) {
        return Some(t.bind(py));
    }
    let modules = PyModule::import(py, "sys").ok()?.getattr("modules").ok()?;
    let np = modules.get_item("numpy").ok()?;
    let t = np.getattr("ndarray").ok()?.cast_into::<PyType>().ok()?;
    let _ = NDARRAY.set(py, t.unbind());
    NDARRAY.get(py).map(|t| t.bind(py))
}

/// The descriptor of a numpy array: dtype, shape and memory order.
fn array_layout(a: &Bound<'_, PyAny>) -> PyResult<Layout> {
    let dtype: String = a.getattr("dtype")?.getattr("str")?.extract()?;
    if itemsize(&dtype).is_none() {
        return Err(PyTypeError::new_err(format!(
            "cannot push a numpy array of dtype {dtype}: only fixed-size element types have a byte layout"
        )));
    }
    let shape: Vec<u64> = a.getattr("shape")?.extract()?;
    let flags = a.getattr("flags")?;
    let order = if flags.getattr("c_contiguous")?.extract::<bool>()? {
        Order::C
    } else if flags.getattr("f_contiguous")?.extract::<bool>()? {
        Order::F
    } else {
        return Err(PyValueError::new_err(
            "cannot push a non-contiguous numpy array without copying; pass numpy.ascontiguousarray(a)",
        ));
    };
    Ok(Layout {
        dtype,
        shape,
        order,
    })
}

/// Lends one Python object's bytes to Strom as `Bytes`, without copying.
fn segment(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        let s = b.as_bytes();
        if s.is_empty() {
            return Ok(Bytes::new());
        }
        let (ptr, len) = (s.as_ptr(), s.len());
        // SAFETY: a bytes object is immutable and its buffer never moves.
        let lent = unsafe { Lent::new(Held::Object(b.clone().into_any().unbind()), ptr, len) };
        return Ok(Bytes::from_owner(lent));
    }
    let buf =
        match Export::get(obj, false) {
            Ok(b) => b,
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyBufferError>(obj.py()) => {
                return Err(PyValueError::new_err(format!(
                    "event data must be contiguous in memory; copy it first (bytes(x) or \
                 numpy.ascontiguousarray(x)): {e}"
                )))
            }
            Err(_) => {
                return Err(PyTypeError::new_err(format!(
                "event data must be bytes-like (bytes, bytearray, memoryview, numpy array or any \
                 buffer-protocol object), or a list of them; got {}",
                obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
            )))
            }
        };
    let (ptr, len) = (buf.ptr() as *const u8, buf.len());
    if len == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the export pins the memory until released.
    let lent = unsafe { Lent::new(Held::Buffer(buf), ptr, len) };
    Ok(Bytes::from_owner(lent))
}

/// Event data and, for a numpy array, its descriptor.
pub(crate) fn event_data(
    py: Python<'_>,
    data: Option<&Bound<'_, PyAny>>,
) -> PyResult<(Data, Option<Vec<u8>>)> {
    let Some(obj) = data.filter(|d| !d.is_none()) else {
        return Ok((Data::none(), None));
    };
    if let Ok(l) = obj.cast::<PyList>() {
        let segs = l
            .iter()
            .map(|o| segment(&o))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok((Data(segs), None));
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        let segs = t
            .iter()
            .map(|o| segment(&o))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok((Data(segs), None));
    }
    if let Some(nd) = ndarray(py) {
        if obj.is_instance(nd)? {
            let layout = array_layout(obj)?;
            return Ok((Data(vec![segment(obj)?]), Some(layout.to_descriptor())));
        }
    }
    Ok((Data(vec![segment(obj)?]), None))
}

/// Metadata as the client library takes it: JSON text.
pub(crate) fn metadata(obj: &Bound<'_, PyAny>) -> PyResult<MetadataInput> {
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(MetadataInput::Json(Bytes::copy_from_slice(
            s.to_str()?.as_bytes(),
        )));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(MetadataInput::Json(Bytes::copy_from_slice(b.as_bytes())));
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(MetadataInput::Json(Bytes::from(b.to_vec())));
    }
    let mut out = Vec::with_capacity(128);
    json::write(obj, &mut out)?;
    Ok(MetadataInput::Json(Bytes::from(out)))
}

/// Pushes events to a topic. Made by `Topic.producer()`. A producer is a
/// context manager: leaving the `with` block closes it.
#[pyclass(module = "strom._strom", name = "Producer", frozen)]
pub struct PyProducer {
    pub inner: ForkSafe<Producer>,
}

#[pymethods]
impl PyProducer {
    /// Queues an event and returns a `PushFuture` at once (it blocks only
    /// when the partition's in-flight limit is reached: backpressure).
    ///
    /// `metadata` is a dict (or any JSON-like object), or JSON text as str
    /// or bytes. `data` is bytes, bytearray, memoryview, a numpy array or
    /// any contiguous buffer-protocol object, or a list of them (sent back
    /// to back). The data is not copied: do not modify it until the future
    /// resolves. A numpy array's dtype, shape and order are recorded in the
    /// event's descriptor (consumers get an array back). `partition` names
    /// the partition (required by the `explicit` selector); `descriptor`
    /// sets a custom descriptor (bytes).
    #[pyo3(signature = (metadata, data=None, partition=None, descriptor=None))]
    fn push(
        &self,
        py: Python<'_>,
        metadata: &Bound<'_, PyAny>,
        data: Option<&Bound<'_, PyAny>>,
        partition: Option<u32>,
        descriptor: Option<&[u8]>,
    ) -> PyResult<PyPushFuture> {
        release_pending(py);
        let producer = self.inner.get(py)?;
        let meta = self::metadata(metadata)?;
        let (data, array_desc) = event_data(py, data)?;
        let desc: &[u8] = descriptor.or(array_desc.as_deref()).unwrap_or(&[]);
        let fut = py
            .detach(|| producer.push_with(meta, data, partition, desc))
            .py(py)?;
        Ok(PyPushFuture {
            fut: Arc::new(Mutex::new(fut)),
            outcome: PyOnceLock::new(),
        })
    }

    /// Sends every pending event and waits until all are acknowledged.
    /// Raises the first error any batch met since the last flush.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let producer = self.inner.get(py)?;
        let r = py.detach(|| producer.flush());
        release_pending(py);
        r.py(py)
    }

    /// Flushes, then ends this producer's part of the stream. Once every
    /// producer of the topic has closed, consumers see the end of stream.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let producer = self.inner.get(py)?;
        let r = py.detach(|| producer.close());
        release_pending(py);
        r.py(py)
    }

    /// The topic's name.
    #[getter]
    fn topic(&self, py: Python<'_>) -> PyResult<String> {
        Ok(self.inner.get(py)?.topic().name().to_string())
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }
}
