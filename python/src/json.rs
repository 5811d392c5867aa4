//! Conversions between Python objects and JSON without going through the
//! `json` module: metadata dicts are written straight to JSON bytes on the
//! push path, and decoded metadata becomes Python objects directly.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::Value;
use std::io::Write;

const MAX_DEPTH: usize = 128;

/// Appends `obj` as JSON text to `out`.
pub fn write(obj: &Bound<'_, PyAny>, out: &mut Vec<u8>) -> PyResult<()> {
    write_depth(obj, out, 0)
}

fn write_str(s: &str, out: &mut Vec<u8>) {
    // serde_json's escaping; writing to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn write_depth(obj: &Bound<'_, PyAny>, out: &mut Vec<u8>, depth: usize) -> PyResult<()> {
    if depth > MAX_DEPTH {
        return Err(PyValueError::new_err(
            "metadata is nested too deeply (more than 128 levels)",
        ));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        write_str(s.to_str()?, out);
    } else if let Ok(d) = obj.cast::<PyDict>() {
        out.push(b'{');
        for (i, (k, v)) in d.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match k.cast::<PyString>() {
                Ok(ks) => write_str(ks.to_str()?, out),
                Err(_) => {
                    if k.is_instance_of::<PyInt>() || k.is_instance_of::<PyFloat>() {
                        write_str(&k.str()?.to_string(), out)
                    } else {
                        return Err(PyTypeError::new_err(format!(
                            "metadata keys must be str, not {}",
                            k.get_type().name()?
                        )));
                    }
                }
            }
            out.push(b':');
            write_depth(&v, out, depth + 1)?;
        }
        out.push(b'}');
    } else if obj.is_none() {
        out.extend_from_slice(b"null");
    } else if let Ok(b) = obj.cast::<PyBool>() {
        out.extend_from_slice(if b.is_true() { b"true" } else { b"false" });
    } else if obj.is_instance_of::<PyInt>() {
        write_int(obj, out)?;
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        write_float(f.value(), out)?;
    } else if let Ok(l) = obj.cast::<PyList>() {
        out.push(b'[');
        for (i, v) in l.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_depth(&v, out, depth + 1)?;
        }
        out.push(b']');
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        out.push(b'[');
        for (i, v) in t.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_depth(&v, out, depth + 1)?;
        }
        out.push(b']');
    } else if obj.hasattr("__index__")? {
        // numpy integers and other int-likes
        write_int(&obj.call_method0("__index__")?, out)?;
    } else if obj.hasattr("tolist")? && !obj.hasattr("__len__")? {
        // numpy scalars (bool_, floating)
        write_depth(&obj.call_method0("tolist")?, out, depth + 1)?;
    } else if obj.hasattr("__float__")? {
        write_float(obj.call_method0("__float__")?.extract::<f64>()?, out)?;
    } else {
        return Err(PyTypeError::new_err(format!(
            "metadata values must be JSON-like (dict, list, tuple, str, int, float, bool, None), not {}",
            obj.get_type().name()?
        )));
    }
    Ok(())
}

fn write_int(obj: &Bound<'_, PyAny>, out: &mut Vec<u8>) -> PyResult<()> {
    if let Ok(v) = obj.extract::<i64>() {
        let _ = write!(out, "{v}");
    } else if let Ok(v) = obj.extract::<u64>() {
        let _ = write!(out, "{v}");
    } else {
        return Err(PyValueError::new_err(
            "metadata integers must fit in 64 bits",
        ));
    }
    Ok(())
}

fn write_float(v: f64, out: &mut Vec<u8>) -> PyResult<()> {
    if !v.is_finite() {
        return Err(PyValueError::new_err(format!(
            "metadata floats must be finite (JSON has no {v})"
        )));
    }
    let _ = serde_json::to_writer(&mut *out, &v);
    Ok(())
}

/// A Python object as a JSON value (for selector arguments and schemas).
pub fn to_value(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    let mut buf = Vec::new();
    write(obj, &mut buf)?;
    serde_json::from_slice(&buf).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// A JSON value as Python objects.
pub fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(a) => {
            let items = a
                .iter()
                .map(|x| to_py(py, x))
                .collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any()
        }
        Value::Object(o) => {
            let d = PyDict::new(py);
            for (k, x) in o {
                d.set_item(k, to_py(py, x)?)?;
            }
            d.into_any()
        }
    })
}
