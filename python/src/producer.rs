//! `Producer`: `push` and `push_many` convert the metadata to JSON bytes
//! in Rust, lend the data's buffers to Strom without copying them (the
//! Python objects stay alive until their batch is acknowledged), and queue
//! the events with the GIL released (once per call); batches go out from
//! Strom's own threads. What they return is `push_future.rs`.

use std::sync::Arc;

use bytes::Bytes;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString, PyTuple};
use strom_client::{Data, MetadataInput, Producer};

use crate::array;
use crate::common::{release_pending, Export, ForkSafe, Held, Lent};
use crate::errors::{self, IntoPy};
use crate::json;
use crate::push_future::{PyPushFuture, PyPushFutures, Queued};

/// Lends an export's memory to Strom as `Bytes`, without copying.
fn lend(buf: Export) -> Bytes {
    let (ptr, len) = (buf.ptr() as *const u8, buf.len());
    if len == 0 {
        return Bytes::new();
    }
    // SAFETY: the export pins the memory until released.
    let lent = unsafe { Lent::new(Held::Buffer(buf), ptr, len) };
    Bytes::from_owner(lent)
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
    Ok(lend(buf))
}

/// Event data and, for a numpy array, its descriptor.
pub(crate) fn event_data(
    py: Python<'_>,
    data: Option<&Bound<'_, PyAny>>,
) -> PyResult<(Data, Option<Bytes>)> {
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
    if let Some(nd) = array::ndarray(py) {
        if obj.is_instance(nd)? {
            let (buf, desc) = array::export(obj)?;
            return Ok((Data(vec![lend(buf)]), Some(desc)));
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

/// One event of a `push_many` call, converted: metadata, data, descriptor.
type Prepared = (MetadataInput, Data, Option<Bytes>);

fn prepare(
    py: Python<'_>,
    item: &Bound<'_, PyAny>,
    shared: Option<&MetadataInput>,
) -> PyResult<Prepared> {
    let (meta, data) = match shared {
        Some(m) => (m.clone(), item.clone()),
        None => {
            let pair = match item.cast::<PyTuple>() {
                Ok(t) if t.len() == 2 => t,
                _ => {
                    return Err(PyTypeError::new_err(format!(
                        "without metadata=, push_many takes (metadata, data) pairs; got {}",
                        item.get_type()
                            .name()
                            .map(|n| n.to_string())
                            .unwrap_or_default()
                    )))
                }
            };
            (metadata(&pair.get_item(0)?)?, pair.get_item(1)?)
        }
    };
    let (data, desc) = event_data(py, Some(&data))?;
    Ok((meta, data, desc))
}

/// The exception of a `push_many` call that failed at event `k`, with
/// the futures of the events queued before it as `queued`.
fn batch_error(py: Python<'_>, err: PyErr, k: usize, queued: Queued) -> PyErr {
    let queued = Py::new(py, PyPushFutures::new(queued));
    if let Ok(q) = queued {
        // Exceptions take attributes; a failure here leaves `err` as is.
        let _ = err.value(py).setattr("queued", q);
    }
    errors::with_note(
        py,
        err,
        &format!("raised by event {k} of this push_many call"),
    )
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
        Ok(PyPushFuture::new(Arc::new([fut]), 0))
    }

    /// Queues many events in one call and returns one `PushFutures` for
    /// all of them at once (blocking only for backpressure, like `push`).
    ///
    /// With `metadata` given, every item of `events` is one event's data
    /// (anything `push` takes as `data`) and every event gets that
    /// metadata, encoded once. Without it, every item is a
    /// `(metadata, data)` pair. `partition` applies to every event. The
    /// data is lent, not copied, as with `push`.
    ///
    /// Every item is converted before any is queued: a conversion error
    /// (`TypeError`, `ValueError`) queues nothing. An error while queuing
    /// (say, an event larger than the partition accepts, or metadata the
    /// topic's validator refuses) leaves the events before it queued, to
    /// be sent as usual. Either way the exception carries `queued`, the
    /// `PushFutures` of the events that were queued (empty when none
    /// were), and a note naming the failing event's index.
    #[pyo3(signature = (events, metadata=None, partition=None))]
    fn push_many(
        &self,
        py: Python<'_>,
        events: &Bound<'_, PyAny>,
        metadata: Option<&Bound<'_, PyAny>>,
        partition: Option<u32>,
    ) -> PyResult<PyPushFutures> {
        release_pending(py);
        let producer = self.inner.get(py)?;
        let shared = match metadata.filter(|m| !m.is_none()) {
            Some(m) => Some(self::metadata(m)?),
            None => None,
        };
        // A list or tuple is read in place; any other iterable is taken
        // whole first, so no generator code runs between conversions.
        let owned;
        let items: &Bound<'_, PyAny> =
            if events.is_instance_of::<PyList>() || events.is_instance_of::<PyTuple>() {
                events
            } else {
                owned = PyList::new(py, events.try_iter()?.collect::<PyResult<Vec<_>>>()?)?;
                owned.as_any()
            };
        let n = items.len()?;
        let mut prepared = Vec::with_capacity(n);
        for k in 0..n {
            let item = items.get_item(k)?;
            match prepare(py, &item, shared.as_ref()) {
                Ok(p) => prepared.push(p),
                Err(e) => return Err(batch_error(py, e, k, Arc::new([]))),
            }
        }
        // The GIL is released once for the whole call.
        let (futs, failed) = py.detach(move || {
            let mut futs = Vec::with_capacity(prepared.len());
            for (k, (meta, data, desc)) in prepared.into_iter().enumerate() {
                let desc = desc.as_deref().unwrap_or(&[]);
                match producer.push_with(meta, data, partition, desc) {
                    Ok(f) => futs.push(f),
                    // The events not queued are dropped here; their loans
                    // are released by the next call holding the GIL.
                    Err(e) => return (futs, Some((k, e))),
                }
            }
            (futs, None)
        });
        let futs: Queued = futs.into();
        match failed {
            None => Ok(PyPushFutures::new(futs)),
            Some((k, e)) => {
                release_pending(py);
                Err(batch_error(py, errors::to_py(py, &e), k, futs))
            }
        }
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
