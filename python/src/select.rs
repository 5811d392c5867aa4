//! Data selectors and brokers. The built-in selectors (`strom.select.*`)
//! are strom-client's engine (`strom_client::select`): this module only
//! converts Python objects into it, and the engine runs on Strom's network
//! threads without the GIL. Python callables are accepted too; they run
//! with the GIL held only while they are called.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyEllipsis, PyList, PySlice, PyTuple};
use strom_client::select::{ArrayLayout, AxisIndex, Picked, Predicate, Selector};
use strom_client::{DataBroker, DataBuffer, DataDescriptor, DataSelector, EventMeta, Selection};

use crate::common::{Export, Held, Lent};
use crate::json;

/// A data selection: which bytes of each event's data a consumer fetches.
/// Build one with `strom.select.all()`, `none()`, `range(offset, length)`,
/// `strided(offset, block, stride, count)`, `ranges([(offset, length), ...])`,
/// `where(field, op, value)` or `strom.select.array[...]`.
#[pyclass(module = "strom._strom", name = "Selection", frozen)]
#[derive(Clone)]
pub struct PySelection {
    pub sel: Selector,
}

fn index_item(item: &Bound<'_, PyAny>) -> PyResult<AxisIndex> {
    if item.is_instance_of::<PyEllipsis>() {
        return Ok(AxisIndex::Ellipsis);
    }
    if let Ok(s) = item.cast::<PySlice>() {
        let get = |name: &str| -> PyResult<Option<i64>> {
            let v = s.getattr(name)?;
            if v.is_none() {
                Ok(None)
            } else {
                v.extract().map(Some)
            }
        };
        return Ok(AxisIndex::Slice {
            start: get("start")?,
            stop: get("stop")?,
            step: get("step")?.unwrap_or(1),
        });
    }
    if let Ok(i) = item.extract::<i64>() {
        return Ok(AxisIndex::At(i));
    }
    Err(PyTypeError::new_err(format!(
        "array selections take integers, slices and '...', not {}",
        item.get_type().name()?
    )))
}

#[pymethods]
impl PySelection {
    /// Fetch the whole data part (the default).
    #[staticmethod]
    fn all() -> Self {
        PySelection {
            sel: Selector::Fixed(Selection::All),
        }
    }

    /// Fetch no data (metadata only).
    #[staticmethod]
    fn none() -> Self {
        PySelection {
            sel: Selector::Fixed(Selection::None),
        }
    }

    /// Fetch `length` bytes starting at `offset`.
    #[staticmethod]
    fn range(offset: u64, length: u64) -> Self {
        PySelection {
            sel: Selector::Fixed(Selection::Range {
                offset,
                len: length,
            }),
        }
    }

    /// Fetch `count` blocks of `block` bytes, the first at `offset`, `stride` bytes apart.
    #[staticmethod]
    fn strided(offset: u64, block: u64, stride: u64, count: u64) -> Self {
        PySelection {
            sel: Selector::Fixed(Selection::Strided {
                offset,
                block,
                stride,
                count,
            }),
        }
    }

    /// Fetch a list of `(offset, length)` ranges, in the given order.
    #[staticmethod]
    fn ranges(ranges: Vec<(u64, u64)>) -> Self {
        PySelection {
            sel: Selector::Fixed(Selection::Ranges(ranges)),
        }
    }

    /// Fetch with `then` (default: all the data) when the metadata field
    /// `field` (a top-level key, or a JSON pointer such as `/a/b`) compares
    /// true with `value` under `op` (`==`, `!=`, `<`, `<=`, `>`, `>=`);
    /// fetch nothing otherwise, or when the field is missing.
    #[staticmethod]
    #[pyo3(name = "where_", signature = (field, op, value, then=None))]
    fn where_(
        field: &str,
        op: &str,
        value: &Bound<'_, PyAny>,
        then: Option<PyRef<'_, PySelection>>,
    ) -> PyResult<Self> {
        let op = op
            .parse()
            .map_err(|e| PyValueError::new_err(format!("{e}")))?;
        let predicate = Predicate::new(field, op, json::to_value(value)?);
        Ok(PySelection {
            sel: Selector::where_then(predicate, then.map_or(Selector::all(), |t| t.sel.clone())),
        })
    }

    /// An N-d sub-array of an array payload, from an index such as
    /// `(slice(None), slice(10, 20), slice(None, None, 2))`; use
    /// `strom.select.array[:, 10:20, ::2]`.
    #[staticmethod]
    fn array(index: &Bound<'_, PyAny>) -> PyResult<Self> {
        let items = match index.cast::<PyTuple>() {
            Ok(t) => t
                .iter()
                .map(|i| index_item(&i))
                .collect::<PyResult<Vec<_>>>()?,
            Err(_) => vec![index_item(index)?],
        };
        Ok(PySelection {
            sel: Selector::Array(items),
        })
    }

    fn __repr__(&self) -> String {
        format!("strom.select.{:?}", self.sel)
    }
}

/// Array layouts of selected events, by `(partition, offset)`, handed from
/// the selector (network thread) to the event (when pulled).
pub type Layouts = Arc<Mutex<HashMap<(u32, u64), ArrayLayout>>>;

/// The selector a consumer runs: a built-in one, or a Python callable.
pub struct ConsumerSelector {
    pub kind: SelectorKind,
    pub layouts: Layouts,
    /// The exception a Python selector raised, reported by the next pull.
    pub error: Arc<Mutex<Option<PyErr>>>,
}

pub enum SelectorKind {
    Builtin(Selector),
    Python(Py<PyAny>),
}

impl ConsumerSelector {
    pub fn tracks_layouts(&self) -> bool {
        match &self.kind {
            SelectorKind::Builtin(s) => s.selects_arrays(),
            SelectorKind::Python(_) => true,
        }
    }

    fn call_python(
        &self,
        f: &Py<PyAny>,
        meta: &EventMeta,
        data: &DataDescriptor,
    ) -> PyResult<Picked> {
        Python::attach(|py| {
            let m = meta_object(py, meta)?;
            let d = descriptor_dict(py, data)?;
            let r = f.bind(py).call1((m, d))?;
            let sel = selection_from(&r)?;
            sel.eval(meta, data)
                .map_err(|e| PyValueError::new_err(e.to_string()))
        })
    }
}

/// The consumer calls `try_select`: a refused event fails the pull with
/// `DATA_SELECTOR`, and the pull raises the Python exception kept here.
impl DataSelector for ConsumerSelector {
    fn select(&self, meta: &EventMeta, data: &DataDescriptor) -> Selection {
        self.try_select(meta, data).unwrap_or(Selection::None)
    }

    fn try_select(&self, meta: &EventMeta, data: &DataDescriptor) -> Result<Selection, String> {
        let picked = match &self.kind {
            // A lazily built exception: no GIL needed here.
            SelectorKind::Builtin(s) => s
                .eval(meta, data)
                .map_err(|e| PyValueError::new_err(e.to_string())),
            SelectorKind::Python(f) => self.call_python(f, meta, data),
        };
        match picked {
            Ok(p) => {
                if let Some(l) = p.layout {
                    self.layouts.lock().insert((meta.partition, meta.offset), l);
                }
                Ok(p.selection)
            }
            Err(e) => {
                let msg = e.to_string();
                self.error.lock().get_or_insert(e);
                Err(msg)
            }
        }
    }
}

/// Converts what a Python selector returned into a selector.
pub fn selection_from(r: &Bound<'_, PyAny>) -> PyResult<Selector> {
    if r.is_none() {
        return Ok(Selector::none());
    }
    if let Ok(s) = r.cast::<PySelection>() {
        return Ok(s.get().sel.clone());
    }
    if let Ok(b) = r.extract::<bool>() {
        return Ok(if b { Selector::all() } else { Selector::none() });
    }
    if let Ok((o, l)) = r.extract::<(u64, u64)>() {
        return Ok(Selector::Fixed(Selection::Range { offset: o, len: l }));
    }
    if let Ok(rs) = r.extract::<Vec<(u64, u64)>>() {
        return Ok(Selector::Fixed(Selection::Ranges(rs)));
    }
    Err(PyTypeError::new_err(format!(
        "a data selector must return a strom.select selection, None, a bool, an (offset, length) \
         tuple or a list of them, not {}",
        r.get_type().name()?
    )))
}

/// The metadata object handed to Python selectors and brokers (a dict for
/// JSON objects).
pub fn meta_object<'py>(py: Python<'py>, meta: &EventMeta) -> PyResult<Bound<'py, PyAny>> {
    match meta.json() {
        Ok(v) => json::to_py(py, &v),
        Err(_) => Ok(pyo3::types::PyBytes::new(py, meta.raw()).into_any()),
    }
}

/// `{"size": n, "descriptor": bytes}` plus `dtype`, `shape`, `order` for arrays.
pub fn descriptor_dict<'py>(
    py: Python<'py>,
    data: &DataDescriptor,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("size", data.size)?;
    d.set_item(
        "descriptor",
        pyo3::types::PyBytes::new(py, &data.descriptor),
    )?;
    if let Some(l) = ArrayLayout::parse(&data.descriptor) {
        d.set_item("dtype", &l.dtype)?;
        d.set_item("shape", PyTuple::new(py, &l.shape)?)?;
        d.set_item("order", l.order.to_string())?;
    }
    Ok(d)
}

/// Destination memory a Python broker provided: a writable, contiguous
/// buffer export of a Python object, written without the GIL.
pub struct PyDest {
    pub lent: Lent,
    pub object: Option<Py<PyAny>>,
}

impl DataBuffer for PyDest {
    fn as_slice(&self) -> &[u8] {
        self.lent.as_ref()
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.lent.as_ref().len();
        if len == 0 {
            return &mut [];
        }
        // SAFETY: the export is writable and contiguous (checked when made)
        // and kept alive by `lent`; Strom writes it from one thread at a time.
        unsafe { std::slice::from_raw_parts_mut(self.lent.as_mut_ptr(), len) }
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// A broker written in Python: `f(metadata, length)` returns one writable
/// buffer or a list of them, holding at least `length` bytes together.
pub struct PyBroker {
    pub f: Py<PyAny>,
    pub error: Arc<Mutex<Option<PyErr>>>,
}

fn dest(obj: &Bound<'_, PyAny>) -> PyResult<Box<dyn DataBuffer>> {
    let buf = Export::get(obj, true).map_err(|e| {
        PyValueError::new_err(format!(
            "a data broker must return writable, contiguous buffers: {e}"
        ))
    })?;
    let (ptr, len) = (buf.ptr() as *const u8, buf.len());
    // SAFETY: the export keeps the memory alive and in place.
    let lent = unsafe { Lent::new(Held::Buffer(buf), ptr, len) };
    Ok(Box::new(PyDest {
        lent,
        object: Some(obj.clone().unbind()),
    }))
}

impl DataBroker for PyBroker {
    fn buffers(
        &self,
        meta: &EventMeta,
        _selection: &Selection,
        len: u64,
    ) -> Result<Vec<Box<dyn DataBuffer>>, String> {
        Python::attach(|py| {
            let r = (|| -> PyResult<Vec<Box<dyn DataBuffer>>> {
                let m = meta_object(py, meta)?;
                let out = self.f.bind(py).call1((m, len))?;
                if let Ok(l) = out.cast::<PyList>() {
                    l.iter().map(|o| dest(&o)).collect()
                } else if let Ok(t) = out.cast::<PyTuple>() {
                    t.iter().map(|o| dest(&o)).collect()
                } else {
                    Ok(vec![dest(&out)?])
                }
            })();
            r.map_err(|e| {
                let msg = e.to_string();
                self.error.lock().get_or_insert(e);
                msg
            })
        })
    }
}
