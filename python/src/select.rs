//! Data selectors and brokers. The built-in selectors (`strom.select.*`)
//! run in Rust on Strom's network threads and never touch the GIL. Python
//! callables are accepted too; they run with the GIL held only while they
//! are called.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyEllipsis, PyList, PySlice, PyTuple};
use serde_json::Value;
use strom_client::{DataBroker, DataBuffer, DataDescriptor, DataSelector, EventMeta, Selection};

use crate::common::{Export, Held, Lent};
use crate::json;
use crate::layout::{self, Index, Layout};

/// Comparison of a `where` selector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// A built-in selector, evaluated without the GIL.
#[derive(Clone, Debug)]
pub enum Sel {
    Fixed(Selection),
    Where {
        pointer: String,
        op: Op,
        value: Value,
        then: Box<Sel>,
    },
    Array(Vec<Index>),
}

fn compare(a: &Value, op: Op, b: &Value) -> bool {
    use std::cmp::Ordering as O;
    let ord = match (a, b) {
        (Value::Number(x), Value::Number(y)) => x
            .as_f64()
            .zip(y.as_f64())
            .and_then(|(x, y)| x.partial_cmp(&y)),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        (Value::Bool(x), Value::Bool(y)) => Some(x.cmp(y)),
        _ => None,
    };
    match (op, ord) {
        (Op::Eq, Some(o)) => o == O::Equal,
        (Op::Ne, Some(o)) => o != O::Equal,
        (Op::Eq, None) => a == b,
        (Op::Ne, None) => a != b,
        (Op::Lt, Some(o)) => o == O::Less,
        (Op::Le, Some(o)) => o != O::Greater,
        (Op::Gt, Some(o)) => o == O::Greater,
        (Op::Ge, Some(o)) => o != O::Less,
        (_, None) => false,
    }
}

/// Something that fails `Selection::resolve`, to report an error through
/// the selector interface (which has no error channel of its own).
fn failing() -> Selection {
    Selection::Range {
        offset: u64::MAX,
        len: 1,
    }
}

/// The outcome of evaluating a selector on one event.
pub struct Picked {
    pub selection: Selection,
    /// For an array sub-selection: the layout of the bytes fetched.
    pub layout: Option<Layout>,
}

impl Sel {
    pub fn eval(&self, meta: &EventMeta, data: &DataDescriptor) -> Result<Picked, String> {
        match self {
            Sel::Fixed(s) => Ok(Picked {
                selection: s.clone(),
                layout: None,
            }),
            Sel::Where {
                pointer,
                op,
                value,
                then,
            } => {
                let v = meta.json().map_err(|e| e.to_string())?;
                match v.pointer(pointer) {
                    Some(x) if compare(x, *op, value) => then.eval(meta, data),
                    _ => Ok(Picked {
                        selection: Selection::None,
                        layout: None,
                    }),
                }
            }
            Sel::Array(index) => {
                let Some(l) = Layout::parse(&data.descriptor) else {
                    return Err(format!(
                        "event {}/{} has no array descriptor; an array selection needs data pushed as a numpy array",
                        meta.partition, meta.offset
                    ));
                };
                if l.nbytes() != Some(data.size) {
                    return Err(format!(
                        "event {}/{}: the array descriptor describes {:?} bytes but the data has {}",
                        meta.partition,
                        meta.offset,
                        l.nbytes(),
                        data.size
                    ));
                }
                let (ranges, out) = layout::select(&l, index)?;
                Ok(Picked {
                    selection: Selection::Ranges(ranges),
                    layout: Some(out),
                })
            }
        }
    }

    fn needs_layouts(&self) -> bool {
        match self {
            Sel::Fixed(_) => false,
            Sel::Where { then, .. } => then.needs_layouts(),
            Sel::Array(_) => true,
        }
    }
}

/// A data selection: which bytes of each event's data a consumer fetches.
/// Build one with `strom.select.all()`, `none()`, `range(offset, length)`,
/// `strided(offset, block, stride, count)`, `ranges([(offset, length), ...])`,
/// `where(field, op, value)` or `strom.select.array[...]`.
#[pyclass(module = "strom._strom", name = "Selection", frozen)]
#[derive(Clone)]
pub struct PySelection {
    pub sel: Sel,
}

fn parse_op(op: &str) -> PyResult<Op> {
    Ok(match op {
        "==" | "eq" => Op::Eq,
        "!=" | "ne" => Op::Ne,
        "<" | "lt" => Op::Lt,
        "<=" | "le" => Op::Le,
        ">" | "gt" => Op::Gt,
        ">=" | "ge" => Op::Ge,
        _ => {
            return Err(PyValueError::new_err(format!(
                "unknown comparison '{op}'; use one of == != < <= > >="
            )))
        }
    })
}

fn index_item(item: &Bound<'_, PyAny>) -> PyResult<Index> {
    if item.is_instance_of::<PyEllipsis>() {
        return Ok(Index::Ellipsis);
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
        return Ok(Index::Slice {
            start: get("start")?,
            stop: get("stop")?,
            step: get("step")?.unwrap_or(1),
        });
    }
    if let Ok(i) = item.extract::<i64>() {
        return Ok(Index::At(i));
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
            sel: Sel::Fixed(Selection::All),
        }
    }

    /// Fetch no data (metadata only).
    #[staticmethod]
    fn none() -> Self {
        PySelection {
            sel: Sel::Fixed(Selection::None),
        }
    }

    /// Fetch `length` bytes starting at `offset`.
    #[staticmethod]
    fn range(offset: u64, length: u64) -> Self {
        PySelection {
            sel: Sel::Fixed(Selection::Range {
                offset,
                len: length,
            }),
        }
    }

    /// Fetch `count` blocks of `block` bytes, the first at `offset`, `stride` bytes apart.
    #[staticmethod]
    fn strided(offset: u64, block: u64, stride: u64, count: u64) -> Self {
        PySelection {
            sel: Sel::Fixed(Selection::Strided {
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
            sel: Sel::Fixed(Selection::Ranges(ranges)),
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
        let pointer = if field.starts_with('/') {
            field.to_string()
        } else {
            format!("/{}", field.replace('~', "~0").replace('/', "~1"))
        };
        Ok(PySelection {
            sel: Sel::Where {
                pointer,
                op: parse_op(op)?,
                value: json::to_value(value)?,
                then: Box::new(then.map_or(Sel::Fixed(Selection::All), |t| t.sel.clone())),
            },
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
            sel: Sel::Array(items),
        })
    }

    fn __repr__(&self) -> String {
        format!("strom.select.{:?}", self.sel)
    }
}

/// Array layouts of selected events, by `(partition, offset)`, handed from
/// the selector (network thread) to the event (when pulled).
pub type Layouts = Arc<Mutex<HashMap<(u32, u64), Layout>>>;

/// The selector a consumer runs: a built-in one, or a Python callable.
pub struct ConsumerSelector {
    pub kind: SelectorKind,
    pub layouts: Layouts,
    /// The exception a Python selector raised, reported by the next pull.
    pub error: Arc<Mutex<Option<PyErr>>>,
}

pub enum SelectorKind {
    Builtin(Sel),
    Python(Py<PyAny>),
}

impl ConsumerSelector {
    pub fn tracks_layouts(&self) -> bool {
        match &self.kind {
            SelectorKind::Builtin(s) => s.needs_layouts(),
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
            sel.eval(meta, data).map_err(PyValueError::new_err)
        })
    }
}

impl DataSelector for ConsumerSelector {
    fn select(&self, meta: &EventMeta, data: &DataDescriptor) -> Selection {
        let picked = match &self.kind {
            // A lazily built exception: no GIL needed here.
            SelectorKind::Builtin(s) => s.eval(meta, data).map_err(PyValueError::new_err),
            SelectorKind::Python(f) => self.call_python(f, meta, data),
        };
        match picked {
            Ok(p) => {
                if let Some(l) = p.layout {
                    self.layouts.lock().insert((meta.partition, meta.offset), l);
                }
                p.selection
            }
            Err(e) => {
                self.error.lock().get_or_insert(e);
                failing()
            }
        }
    }
}

/// Converts what a Python selector returned into a selector.
pub fn selection_from(r: &Bound<'_, PyAny>) -> PyResult<Sel> {
    if r.is_none() {
        return Ok(Sel::Fixed(Selection::None));
    }
    if let Ok(s) = r.cast::<PySelection>() {
        return Ok(s.get().sel.clone());
    }
    if let Ok(b) = r.extract::<bool>() {
        return Ok(Sel::Fixed(if b { Selection::All } else { Selection::None }));
    }
    if let Ok((o, l)) = r.extract::<(u64, u64)>() {
        return Ok(Sel::Fixed(Selection::Range { offset: o, len: l }));
    }
    if let Ok(rs) = r.extract::<Vec<(u64, u64)>>() {
        return Ok(Sel::Fixed(Selection::Ranges(rs)));
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
    if let Some(l) = Layout::parse(&data.descriptor) {
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
