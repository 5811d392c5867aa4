//! `strom.transform(fn, src, dst)`: a user-defined transform run by this
//! process, with the exactly-once guarantees of the built-in ones
//! (docs/transforms.md). The loop is the Rust client's
//! (`strom_client::transform`): one thread per source partition reads as
//! the consumer `transform.NAME`, calls `fn` on each event under the GIL,
//! appends each source batch's output as one stamped batch, then acks.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use strom_client::transform::{run_all, Out, Transformer};
use strom_client::{Error, Event};

use crate::driver::PyTopic;
use crate::errors::to_py_caused;
use crate::event::PyEvent;
use crate::producer::{event_data, metadata};

/// Calls a Python function on each event.
struct PyFn {
    f: Py<PyAny>,
    /// The first exception `f` raised (it stops the run).
    raised: Mutex<Option<PyErr>>,
}

fn failed(why: String) -> Error {
    Error::InvalidArgument(why)
}

/// One `(metadata, data)` pair, or `(metadata, data, descriptor)`.
fn one(py: Python<'_>, item: &Bound<'_, PyAny>) -> PyResult<Out> {
    let t = item.cast::<PyTuple>().map_err(|_| {
        pyo3::exceptions::PyTypeError::new_err(
            "a transform returns None, (metadata, data) or a list of them",
        )
    })?;
    if !(2..=3).contains(&t.len()) {
        return Err(pyo3::exceptions::PyTypeError::new_err(
            "an output is (metadata, data) or (metadata, data, descriptor)",
        ));
    }
    let meta = metadata(&t.get_item(0)?)?;
    let data_obj = t.get_item(1)?;
    let (data, array_desc) = event_data(py, Some(&data_obj))?;
    let descriptor = match t.len() {
        3 => Bytes::from(t.get_item(2)?.extract::<Vec<u8>>()?),
        _ => array_desc.unwrap_or_default(),
    };
    let data = match data.0.len() {
        0 => Bytes::new(),
        1 => data.0.into_iter().next().unwrap_or_default(),
        _ => Bytes::from(data.0.concat()),
    };
    Ok(Out {
        metadata: meta,
        descriptor,
        data,
    })
}

fn outputs(py: Python<'_>, r: &Bound<'_, PyAny>) -> PyResult<Vec<Out>> {
    if r.is_none() {
        return Ok(Vec::new());
    }
    if let Ok(l) = r.cast::<PyList>() {
        return l.iter().map(|i| one(py, &i)).collect();
    }
    Ok(vec![one(py, r)?])
}

impl Transformer for PyFn {
    fn apply(&self, ev: Event) -> strom_client::Result<Vec<Out>> {
        Python::attach(|py| {
            let r = Bound::new(py, PyEvent::new(ev, None))
                .and_then(|e| self.f.bind(py).call1((e,)))
                .and_then(|r| outputs(py, &r));
            r.map_err(|e| {
                let why = e.to_string();
                self.raised.lock().get_or_insert(e);
                failed(why)
            })
        })
    }
}

/// Runs `f` on every event of `src` and writes what it returns to `dst`,
/// until `src` ends; returns `(events read, events written)`. `f(event)`
/// returns None (drop the event), `(metadata, data)`, `(metadata, data,
/// descriptor)`, or a list of them. Reading resumes after a restart where
/// the last run left off (consumer `transform.NAME`), and nothing is
/// written twice, as long as `f` gives the same output for the same event.
#[pyfunction]
#[pyo3(signature = (f, src, dst, name))]
pub fn transform(
    py: Python<'_>,
    f: Py<PyAny>,
    src: &PyTopic,
    dst: &PyTopic,
    name: &str,
) -> PyResult<(u64, u64)> {
    let (src, dst) = (src.inner.get(py)?.clone(), dst.inner.get(py)?.clone());
    let t = Arc::new(PyFn {
        f,
        raised: Mutex::new(None),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let run = {
        let t = t.clone();
        py.detach(move || run_all(name, &src, &dst, t, stop))
    };
    match run {
        Ok(p) => Ok((p.read, p.written)),
        Err(e) => {
            let cause = t.raised.lock().take();
            Err(to_py_caused(py, &e, cause))
        }
    }
}
