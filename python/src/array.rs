//! numpy arrays on both sides of an event, without per-event attribute
//! lookups or JSON work in the common case.
//!
//! Push: one buffer export (`PyObject_GetBuffer` with format, shape and
//! strides) gives the memory to lend and everything the descriptor needs.
//! The element type comes from the buffer's struct format for numpy's
//! fixed-size numeric and bool types; any other format falls back to
//! `dtype.str`. Encoded descriptors are cached by (format, item size,
//! order, shape), so a stream of same-shaped arrays encodes JSON once.
//!
//! Pull: the layout a descriptor parses to, with the numpy dtype object and
//! shape tuple built from it, is cached by the descriptor's bytes; the
//! array over a received buffer of this module's is made through numpy's C
//! API (`ndarray_api.rs`), else with one `numpy.ndarray(shape, dtype,
//! buffer, 0, None, order)` call.

use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyModule, PyString, PyTuple, PyType};
use strom_client::select::{itemsize, ArrayLayout as Layout, Order};

use crate::common::Export;
use crate::event::PyDataBuffer;

/// Entries kept by each cache; a stream rarely has more distinct layouts.
const CACHE_ENTRIES: usize = 32;

static NDARRAY: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// numpy's ndarray type, if numpy is imported (never imports it).
pub fn ndarray<'py>(py: Python<'py>) -> Option<&'py Bound<'py, PyType>> {
    if let Some(t) = NDARRAY.get(py) {
        return Some(t.bind(py));
    }
    let modules = PyModule::import(py, "sys").ok()?.getattr("modules").ok()?;
    let np = modules.get_item("numpy").ok()?;
    let t = np.getattr("ndarray").ok()?.cast_into::<PyType>().ok()?;
    let _ = NDARRAY.set(py, t.unbind());
    NDARRAY.get(py).map(|t| t.bind(py))
}

/// numpy's `dtype.str` for a buffer struct format numpy writes for its
/// fixed-size numeric and bool types (`"<d"`, `"L"`, `">Zf"`, `"?"`), from
/// the format and the item size; `None` for any other format.
fn dtype_of_format(format: &[u8], itemsize: usize) -> Option<String> {
    let (order, code) = match format {
        [b'<', rest @ ..] => (Some('<'), rest),
        [b'>' | b'!', rest @ ..] => (Some('>'), rest),
        [b'@' | b'=', rest @ ..] => (None, rest),
        rest => (None, rest),
    };
    let kind = match code {
        [b'?'] => 'b',
        [b'b' | b'h' | b'i' | b'l' | b'q' | b'n'] => 'i',
        [b'B' | b'H' | b'I' | b'L' | b'Q' | b'N'] => 'u',
        [b'e' | b'f' | b'd' | b'g'] => 'f',
        [b'Z', b'f' | b'd' | b'g'] => 'c',
        _ => return None,
    };
    if itemsize == 0 {
        return None;
    }
    let order = match (itemsize, order) {
        (1, _) => '|',
        (_, Some(o)) => o,
        (_, None) if cfg!(target_endian = "big") => '>',
        (_, None) => '<',
    };
    Some(format!("{order}{kind}{itemsize}"))
}

/// C order if the strides say row-major, else F if column-major, else
/// `None`. Like numpy's flags, axes of length 1 do not count, and an array
/// without elements is contiguous.
fn order_of(shape: &[isize], strides: &[isize], itemsize: isize) -> Option<Order> {
    if strides.len() != shape.len() {
        return None;
    }
    if shape.contains(&0) {
        return Some(Order::C);
    }
    let walk = |axes: &mut dyn Iterator<Item = usize>| {
        let mut want = itemsize;
        for i in axes {
            if shape[i] != 1 && strides[i] != want {
                return false;
            }
            want = want.saturating_mul(shape[i]);
        }
        true
    };
    if walk(&mut (0..shape.len()).rev()) {
        Some(Order::C)
    } else if walk(&mut (0..shape.len())) {
        Some(Order::F)
    } else {
        None
    }
}

/// What a descriptor is cached by: everything it is computed from.
struct DescKey {
    format: Box<[u8]>,
    itemsize: isize,
    order: Order,
    shape: Box<[isize]>,
}

/// Encoded descriptors of recent array layouts (most recent last).
static DESCRIPTORS: Mutex<Vec<(DescKey, Bytes)>> = Mutex::new(Vec::new());

fn not_contiguous() -> PyErr {
    PyValueError::new_err(
        "cannot push a non-contiguous numpy array without copying; pass numpy.ascontiguousarray(a)",
    )
}

fn unsized_dtype(dtype: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "cannot push a numpy array of dtype {dtype}: only fixed-size element types have a byte layout"
    ))
}

/// A numpy array's memory, exported once, and its descriptor.
pub fn export(a: &Bound<'_, PyAny>) -> PyResult<(Export, Bytes)> {
    let buf = match Export::get_records(a) {
        Ok(b) => b,
        // numpy refuses to export some dtypes (datetime64): the attribute
        // path gives the same answers as before this fast path existed.
        Err(_) => return export_slow(a),
    };
    let Some(shape) = buf.shape() else {
        return export_slow(a);
    };
    let order = match buf.strides() {
        Some(strides) => order_of(shape, strides, buf.itemsize()).ok_or_else(not_contiguous)?,
        None => Order::C,
    };
    let format = buf.format();
    {
        let cache = DESCRIPTORS.lock();
        if let Some((_, d)) = cache.iter().rev().find(|(k, _)| {
            k.order == order
                && k.itemsize == buf.itemsize()
                && *k.shape == *shape
                && *k.format == *format
        }) {
            let d = d.clone();
            drop(cache);
            return Ok((buf, d));
        }
    }
    let known = dtype_of_format(format, buf.itemsize().max(0) as usize);
    let dtype = match &known {
        Some(d) => d.clone(),
        None => a.getattr("dtype")?.getattr("str")?.extract()?,
    };
    if itemsize(&dtype).is_none() {
        return Err(unsized_dtype(&dtype));
    }
    let layout = Layout {
        dtype,
        shape: shape.iter().map(|&n| n.max(0) as u64).collect(),
        order,
    };
    let desc = Bytes::from(layout.to_descriptor());
    // Only formats that alone determine the dtype are cached: another
    // format (a user dtype, a record) is asked `dtype.str` every time.
    if known.is_some() {
        let mut cache = DESCRIPTORS.lock();
        if cache.len() >= CACHE_ENTRIES {
            cache.remove(0);
        }
        let key = DescKey {
            format: format.into(),
            itemsize: buf.itemsize(),
            order,
            shape: shape.into(),
        };
        cache.push((key, desc.clone()));
    }
    Ok((buf, desc))
}

/// The attribute path, for arrays numpy will not describe in a buffer
/// export: dtype, shape and flags, then a plain contiguous export.
fn export_slow(a: &Bound<'_, PyAny>) -> PyResult<(Export, Bytes)> {
    let dtype: String = a.getattr("dtype")?.getattr("str")?.extract()?;
    if itemsize(&dtype).is_none() {
        return Err(unsized_dtype(&dtype));
    }
    let shape: Vec<u64> = a.getattr("shape")?.extract()?;
    let flags = a.getattr("flags")?;
    let order = if flags.getattr("c_contiguous")?.extract::<bool>()? {
        Order::C
    } else if flags.getattr("f_contiguous")?.extract::<bool>()? {
        Order::F
    } else {
        return Err(not_contiguous());
    };
    let buf = Export::get(a, false).map_err(|e| {
        PyTypeError::new_err(format!(
            "cannot push a numpy array of dtype {dtype}: numpy does not export its memory ({e})"
        ))
    })?;
    let layout = Layout {
        dtype,
        shape,
        order,
    };
    Ok((buf, Bytes::from(layout.to_descriptor())))
}

/// A parsed descriptor with the Python objects an array of it needs.
pub struct ArrayType {
    pub layout: Layout,
    dtype: Py<PyAny>,
    shape: Py<PyTuple>,
    order: Py<PyString>,
    /// The bytes an array of this type spans (`None`: too many).
    nbytes: Option<u64>,
    /// The shape as numpy's C API takes it (`None` if it does not fit:
    /// the Python call then decides).
    dims: Option<Vec<isize>>,
}

/// A descriptor's bytes and what they parse to.
type Parsed = (Box<[u8]>, Arc<ArrayType>);

/// Parsed descriptors of recent events (most recent last).
static ARRAY_TYPES: Mutex<Vec<Parsed>> = Mutex::new(Vec::new());

static NUMPY: PyOnceLock<Option<Py<PyModule>>> = PyOnceLock::new();

/// The numpy module, imported on first use; `None` without numpy.
pub fn numpy(py: Python<'_>) -> Option<&Bound<'_, PyModule>> {
    NUMPY
        .get_or_init(py, || PyModule::import(py, "numpy").ok().map(Bound::unbind))
        .as_ref()
        .map(|m| m.bind(py))
}

impl ArrayType {
    fn new(py: Python<'_>, layout: Layout) -> PyResult<Option<ArrayType>> {
        let Some(np) = numpy(py) else { return Ok(None) };
        let dims = layout
            .shape
            .iter()
            .map(|&d| isize::try_from(d).ok())
            .collect::<Option<Vec<isize>>>();
        Ok(Some(ArrayType {
            dtype: np
                .getattr("dtype")?
                .call1((layout.dtype.as_str(),))?
                .unbind(),
            shape: PyTuple::new(py, &layout.shape)?.unbind(),
            order: PyString::new(py, &layout.order.to_string()).unbind(),
            nbytes: layout.nbytes(),
            dims,
            layout,
        }))
    }

    /// The array type of an event's descriptor, if it describes an array
    /// of `size` bytes (and numpy is installed).
    pub fn of_descriptor(
        py: Python<'_>,
        descriptor: &[u8],
        size: u64,
    ) -> PyResult<Option<Arc<ArrayType>>> {
        if descriptor.first() != Some(&b'{') {
            return Ok(None);
        }
        let hit = ARRAY_TYPES
            .lock()
            .iter()
            .rev()
            .find(|(d, _)| **d == *descriptor)
            .map(|(_, t)| t.clone());
        let t = match hit {
            Some(t) => t,
            None => {
                let Some(layout) = Layout::parse(descriptor) else {
                    return Ok(None);
                };
                let Some(t) = ArrayType::new(py, layout)? else {
                    return Ok(None);
                };
                let t = Arc::new(t);
                let mut cache = ARRAY_TYPES.lock();
                if cache.len() >= CACHE_ENTRIES {
                    // Dropped with the GIL held: the Python objects go now.
                    cache.remove(0);
                }
                cache.push((descriptor.into(), t.clone()));
                t
            }
        };
        Ok((t.nbytes == Some(size)).then_some(t))
    }

    /// The array type of a layout computed for one event (an array
    /// selection's result), not cached.
    pub fn of_layout(py: Python<'_>, layout: Layout) -> PyResult<Option<Arc<ArrayType>>> {
        Ok(ArrayType::new(py, layout)?.map(Arc::new))
    }

    /// A numpy array of this type over `buffer`, without copying.
    pub fn view<'py>(&self, buffer: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = buffer.py();
        // An ArrayType exists only once numpy is imported.
        let Some(nd) = ndarray(py) else {
            return Err(PyTypeError::new_err("numpy is not installed"));
        };
        if let (Ok(b), Some(dims), Some(nbytes)) =
            (buffer.cast::<PyDataBuffer>(), &self.dims, self.nbytes)
        {
            let (data, len) = b.get().raw_parts();
            if nbytes <= len as u64 {
                let fortran = self.layout.order == Order::F;
                // SAFETY: the buffer object owns `len` bytes that stay in
                // place while it lives, and the array needs `nbytes` of them.
                let made = unsafe {
                    crate::ndarray_api::view_of(buffer, self.dtype.bind(py), dims, fortran, data)
                };
                if let Some(made) = made {
                    return made;
                }
            }
        }
        nd.call1((
            self.shape.bind(py),
            self.dtype.bind(py),
            buffer,
            0,
            py.None(),
            self.order.bind(py),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_numpy_writes_map_to_its_dtype_strings() {
        let cases: &[(&[u8], usize, &str)] = &[
            (b"?", 1, "|b1"),
            (b"b", 1, "|i1"),
            (b"B", 1, "|u1"),
            (b"h", 2, "<i2"),
            (b"L", 8, "<u8"),
            (b"q", 8, "<i8"),
            (b"e", 2, "<f2"),
            (b"d", 8, "<f8"),
            (b"g", 16, "<f16"),
            (b"Zf", 8, "<c8"),
            (b">Zd", 16, ">c16"),
            (b">i", 4, ">i4"),
            (b"!H", 2, ">u2"),
            (b"<f", 4, "<f4"),
            (b"=I", 4, "<u4"),
        ];
        for (format, size, want) in cases {
            assert_eq!(
                dtype_of_format(format, *size).as_deref(),
                Some(*want),
                "{}",
                String::from_utf8_lossy(format)
            );
        }
        for other in [
            &b"5s"[..],
            b"3w",
            b"8x",
            b"O",
            b"T{h:f0:}",
            b"",
            b"Z",
            b"^d",
        ] {
            assert_eq!(dtype_of_format(other, 8), None);
        }
    }

    #[test]
    fn order_follows_numpy_contiguity_flags() {
        assert_eq!(order_of(&[3, 4], &[32, 8], 8), Some(Order::C));
        assert_eq!(order_of(&[3, 4], &[8, 24], 8), Some(Order::F));
        assert_eq!(order_of(&[3, 4], &[64, 8], 8), None);
        assert_eq!(order_of(&[10], &[16], 8), None);
        // Length-1 axes and empty arrays, as numpy's relaxed strides.
        assert_eq!(order_of(&[1, 4], &[999, 8], 8), Some(Order::C));
        assert_eq!(order_of(&[0, 4], &[3, 5], 8), Some(Order::C));
        assert_eq!(order_of(&[], &[], 8), Some(Order::C));
    }
}
