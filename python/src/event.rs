//! `Event`, its data buffer and `AckFuture`. The data a consumer receives
//! lands in a Rust buffer; `Event.data` exposes it without copying, as a
//! memoryview, or as a numpy array when the producer pushed an array (the
//! dtype, shape and order come from the event's descriptor, or from the
//! array selection that fetched a sub-array).

use std::ffi::c_int;
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyMemoryView};
use strom_client::{AckFuture, ChunkPart, DataBuffer, Error, Event, PooledBuffer};

use crate::aio;
use crate::array::ArrayType;
use crate::common::{release_pending, wait_loop};
use crate::errors;
use crate::lazy::Lazy;
use crate::select::PyDest;
use strom_client::select::ArrayLayout as Layout;

/// Received bytes, owned by Rust and exposed through the buffer protocol
/// (writable, one-dimensional, format `B`). `Event.data` wraps it in a
/// memoryview or a numpy array without copying.
#[pyclass(module = "strom._strom", name = "Buffer", frozen)]
pub struct PyDataBuffer {
    data: Store,
}

/// The memory behind a [`PyDataBuffer`]: its own, a pool's (given back
/// to the consumer's pool when Python drops the last view of it), or its
/// part of a chunk that a fetch's small events share.
enum Store {
    Owned(Vec<u8>),
    Pooled(PooledBuffer),
    Part(bytes::BytesMut),
}

impl PyDataBuffer {
    /// Where its memory is and how long: what the buffer protocol exports.
    pub(crate) fn raw_parts(&self) -> (*mut u8, usize) {
        let b = self.data.bytes();
        (b.as_ptr() as *mut u8, b.len())
    }
}

impl Store {
    /// A received buffer of one of the client's own types, or the buffer
    /// back (a Python data broker's).
    fn of(b: Box<dyn DataBuffer>) -> Result<Store, Box<dyn std::any::Any>> {
        let any = match b.into_any().downcast::<Vec<u8>>() {
            Ok(v) => return Ok(Store::Owned(*v)),
            Err(any) => any,
        };
        let any = match any.downcast::<ChunkPart>() {
            Ok(c) => return Ok(Store::Part(c.into_bytes_mut())),
            Err(any) => any,
        };
        any.downcast::<PooledBuffer>().map(|p| Store::Pooled(*p))
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Store::Owned(v) => v,
            Store::Pooled(p) => p.as_slice(),
            Store::Part(b) => b,
        }
    }
}

#[pymethods]
impl PyDataBuffer {
    /// Address of the first byte (to check zero-copy views).
    #[getter]
    fn address(&self) -> usize {
        self.data.bytes().as_ptr() as usize
    }

    fn __len__(&self) -> usize {
        self.data.bytes().len()
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("view is null"));
        }
        let (ptr, len) = {
            let b = slf.get().data.bytes();
            (b.as_ptr(), b.len())
        };
        // SAFETY: `view` is a valid Py_buffer handed to us by Python; the
        // memory stays alive and in place while `obj` (a strong reference to
        // this object) is held by the view.
        unsafe {
            (*view).obj = slf.into_any().into_ptr();
            (*view).buf = ptr as *mut std::ffi::c_void;
            (*view).len = len as isize;
            (*view).readonly = 0;
            (*view).itemsize = 1;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                c"B".as_ptr() as *mut _
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                &mut (*view).len
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                &mut (*view).itemsize
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// One consumed event: `metadata`, `data`, `offset`, `partition`,
/// `timestamp` (µs since the UNIX epoch, assigned by the server), and
/// `ack()`.
#[pyclass(module = "strom._strom", name = "Event", frozen)]
pub struct PyEvent {
    ev: Mutex<Event>,
    /// Layout of the fetched bytes when an array selection chose them.
    selected: Option<Layout>,
    meta: Lazy,
    data: Lazy,
    /// The partition the event belongs to.
    #[pyo3(get)]
    partition: u32,
    /// The event's offset in its partition.
    #[pyo3(get)]
    offset: u64,
    /// Server timestamp, microseconds since the UNIX epoch.
    #[pyo3(get)]
    timestamp: u64,
    /// Size of the event's whole data part on the server, in bytes.
    #[pyo3(get)]
    data_size: u64,
    /// Bytes fetched (the selected part of the data).
    #[pyo3(get)]
    fetched_size: u64,
    /// Deliveries of this event so far, this one included: above 1 when a
    /// shared consumer group delivers it again. Always 1 otherwise.
    #[pyo3(get)]
    deliveries: u32,
}

impl PyEvent {
    pub fn new(ev: Event, selected: Option<Layout>) -> Self {
        PyEvent {
            partition: ev.partition,
            offset: ev.offset,
            timestamp: ev.timestamp_us,
            data_size: ev.data_size(),
            fetched_size: ev.fetched_len(),
            deliveries: ev.deliveries(),
            ev: Mutex::new(ev),
            selected,
            meta: Lazy::default(),
            data: Lazy::default(),
        }
    }

    /// The array type the fetched bytes have, if they form an array (and
    /// numpy is installed).
    fn array_type(&self, py: Python<'_>) -> PyResult<Option<Arc<ArrayType>>> {
        if let Some(l) = &self.selected {
            return ArrayType::of_layout(py, l.clone());
        }
        if self.fetched_size != self.data_size {
            return Ok(None);
        }
        let ev = self.ev.lock();
        ArrayType::of_descriptor(py, ev.descriptor(), self.data_size)
    }

    fn build_data(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let bufs = self.ev.lock().take_buffers();
        let mut objs: Vec<Bound<'_, PyAny>> = Vec::with_capacity(bufs.len());
        let mut ours = true;
        for b in bufs {
            match Store::of(b) {
                Ok(data) => objs.push(Bound::new(py, PyDataBuffer { data })?.into_any()),
                Err(any) => match any.downcast::<PyDest>() {
                    Ok(mut d) => {
                        ours = false;
                        match d.object.take() {
                            Some(o) => objs.push(o.into_bound(py)),
                            None => objs.push(py.None().into_bound(py)),
                        }
                    }
                    Err(_) => objs.push(py.None().into_bound(py)),
                },
            }
        }
        if !ours {
            // The application's own buffers, as its broker returned them.
            return Ok(match objs.len() {
                1 => objs.pop().map(Bound::unbind).unwrap_or_else(|| py.None()),
                _ => PyList::new(py, objs)?.into_any().unbind(),
            });
        }
        let one = match objs.len() {
            0 => Bound::new(
                py,
                PyDataBuffer {
                    data: Store::Owned(Vec::new()),
                },
            )?
            .into_any(),
            1 => objs.pop().unwrap_or_else(|| py.None().into_bound(py)),
            _ => {
                let views = objs
                    .iter()
                    .map(PyMemoryView::from)
                    .collect::<PyResult<Vec<_>>>()?;
                return Ok(PyList::new(py, views)?.into_any().unbind());
            }
        };
        if let Some(t) = self.array_type(py)? {
            return Ok(t.view(&one)?.unbind());
        }
        Ok(PyMemoryView::from(&one)?.into_any().unbind())
    }
}

#[pymethods]
impl PyEvent {
    /// The metadata, decoded with the topic's serializer on first access
    /// (a dict for JSON objects) and cached.
    #[getter]
    fn metadata(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.meta.get_or_try_init(py, || {
            let ev = self.ev.lock();
            match ev.json() {
                Ok(v) => Ok(crate::json::to_py(py, &v)?.unbind()),
                Err(e) => Err(errors::to_py(py, &e)),
            }
        })
    }

    /// The metadata bytes as stored (JSON text with the `json` serializer).
    #[getter]
    fn raw_metadata<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.ev.lock().raw())
    }

    /// The producer's data descriptor (bytes; JSON dtype/shape/order for arrays).
    #[getter]
    fn descriptor<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.ev.lock().descriptor())
    }

    /// The fetched data, without copying: a numpy array when the producer
    /// pushed one (of the selected region, for an array selection), else a
    /// writable memoryview; the broker's own object(s) with a Python data
    /// broker; a list of memoryviews for several buffers; empty when nothing
    /// was fetched.
    #[getter]
    fn data(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.data.get_or_try_init(py, || self.build_data(py))
    }

    /// Marks this event consumed: for a named consumer, with every
    /// earlier event of its partition; in a shared consumer group, this
    /// event alone. Persisted on the server in the background; the
    /// returned `AckFuture` resolves once it is.
    fn ack(&self) -> PyAckFuture {
        PyAckFuture {
            fut: Arc::new(Mutex::new(self.ev.lock().ack())),
        }
    }

    /// Acks this event once every push future given (`PushFuture` or
    /// `PushFutures`: the event's results) is stored, and returns at once:
    /// a worker's `for ev in consumer` loop goes on to the next task while
    /// the results are in flight, and each ack frees its place in the
    /// consumer's prefetch window by itself. No futures: acks now. If a
    /// result's push fails the event is not acked (a shared group's member
    /// gives it back for another delivery).
    #[pyo3(signature = (*results))]
    fn ack_when(&self, results: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        let mut futs = Vec::with_capacity(results.len());
        for r in results.iter() {
            if let Ok(f) = r.cast::<crate::push_future::PyPushFuture>() {
                futs.push(f.get().queued());
            } else if let Ok(fs) = r.cast::<crate::push_future::PyPushFutures>() {
                futs.extend(fs.get().queued());
            } else {
                return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                    "ack_when takes PushFuture or PushFutures, not {}",
                    r.get_type().name()?
                )));
            }
        }
        let ev = self.ev.lock();
        ev.ack_when(futs.iter().flat_map(|(q, range)| q[range.clone()].iter()));
        Ok(())
    }

    /// Shared consumer groups: gives the event back, to be delivered again
    /// (to any member) now; it counts as a delivery. Other consumers get
    /// an error when the future is waited on.
    fn nack(&self) -> PyAckFuture {
        PyAckFuture {
            fut: Arc::new(Mutex::new(self.ev.lock().nack())),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "<Event partition={} offset={} timestamp={} data_size={} deliveries={}>",
            self.partition, self.offset, self.timestamp, self.data_size, self.deliveries
        )
    }
}

/// Resolves once an ack is persisted on the server: `wait(timeout=None)`,
/// `done()`, or `await` it.
#[pyclass(module = "strom._strom", name = "AckFuture", frozen)]
pub struct PyAckFuture {
    fut: Arc<Mutex<AckFuture>>,
}

#[pymethods]
impl PyAckFuture {
    /// Waits (GIL released) until the ack is persisted.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        release_pending(py);
        let fut = self.fut.clone();
        let r = wait_loop(py, timeout, move |slice| {
            match fut.lock().wait_timeout(Some(slice)) {
                Err(Error::Timeout(_)) => None,
                r => Some(r),
            }
        })?;
        match r {
            Some(r) => r.map_err(|e| errors::to_py(py, &e)),
            None => Err(errors::to_py(
                py,
                &Error::Timeout(std::time::Duration::from_secs_f64(timeout.unwrap_or(0.0))),
            )),
        }
    }

    /// True once the ack is persisted (or failed).
    fn done(&self) -> bool {
        !matches!(
            self.fut
                .lock()
                .wait_timeout(Some(std::time::Duration::ZERO)),
            Err(Error::Timeout(_))
        )
    }

    fn __await__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, PyAny>> {
        let py = slf.py();
        let fut = slf.get().fut.clone();
        let fut = aio::await_on(
            py,
            async move {
                std::future::poll_fn(|cx| {
                    let mut g = fut.lock();
                    std::future::Future::poll(std::pin::Pin::new(&mut *g), cx)
                })
                .await
            },
            |py, r: strom_client::Result<()>| match r {
                Ok(()) => Ok(py.None()),
                Err(e) => Err(errors::to_py(py, &e)),
            },
        )?;
        fut.call_method0("__await__")
    }
}
