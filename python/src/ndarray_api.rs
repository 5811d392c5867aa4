//! numpy's C API, reached through its `_ARRAY_API` capsule as numpy's own
//! `import_array` does, for the one call a consumer makes per event: an
//! array over memory this module owns (`PyArray_NewFromDescr` with the data
//! pointer, then `PyArray_SetBaseObject` so the array keeps the owner
//! alive). A Python-level `numpy.ndarray(shape, dtype, buffer, ...)` call
//! costs about four times the instructions, most of them argument parsing.
//!
//! The table's slots used here (0, 2, 94, 282) are the same in numpy 1.x
//! (ABI 0x01000009) and 2.x (ABI 0x02000000); any other ABI, or no numpy,
//! leaves the caller on the Python call.

use std::ffi::{c_int, c_void};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;

type GetVersion = unsafe extern "C" fn() -> u32;
type NewFromDescr = unsafe extern "C" fn(
    *mut ffi::PyTypeObject,
    *mut ffi::PyObject,
    c_int,
    *const isize,
    *const isize,
    *mut c_void,
    c_int,
    *mut ffi::PyObject,
) -> *mut ffi::PyObject;
type SetBaseObject = unsafe extern "C" fn(*mut ffi::PyObject, *mut ffi::PyObject) -> c_int;

const NPY_ARRAY_C_CONTIGUOUS: c_int = 0x0001;
const NPY_ARRAY_F_CONTIGUOUS: c_int = 0x0002;
const NPY_ARRAY_WRITEABLE: c_int = 0x0400;
const ABIS: [u32; 2] = [0x0100_0009, 0x0200_0000];

struct Api {
    ndarray: *mut ffi::PyTypeObject,
    new_from_descr: NewFromDescr,
    set_base: SetBaseObject,
}

// SAFETY: pointers into numpy's static API table and type object, which
// live as long as the interpreter (extension modules are never unloaded);
// they are only used with the GIL held.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

static API: PyOnceLock<Option<Api>> = PyOnceLock::new();

fn api(py: Python<'_>) -> Option<&Api> {
    API.get_or_init(py, || load(py)).as_ref()
}

fn load(py: Python<'_>) -> Option<Api> {
    let m = PyModule::import(py, "numpy._core._multiarray_umath")
        .or_else(|_| PyModule::import(py, "numpy.core._multiarray_umath"))
        .ok()?;
    let capsule = m.getattr("_ARRAY_API").ok()?;
    // SAFETY: numpy's capsule has no name; a wrong object gives NULL (and
    // an exception, cleared here).
    let table = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), std::ptr::null()) }
        as *const *const c_void;
    if table.is_null() {
        let _ = PyErr::take(py);
        return None;
    }
    // SAFETY: numpy's table has several hundred slots; these four exist
    // in every ABI accepted below (checked first, through slot 0).
    unsafe {
        let slot = |i: usize| *table.add(i);
        if slot(0).is_null() || slot(2).is_null() || slot(94).is_null() || slot(282).is_null() {
            return None;
        }
        let version: GetVersion = std::mem::transmute(slot(0));
        if !ABIS.contains(&version()) {
            return None;
        }
        Some(Api {
            ndarray: slot(2) as *mut ffi::PyTypeObject,
            new_from_descr: std::mem::transmute::<*const c_void, NewFromDescr>(slot(94)),
            set_base: std::mem::transmute::<*const c_void, SetBaseObject>(slot(282)),
        })
    }
}

/// A writable array of `dtype` (a numpy dtype object) and shape `dims`
/// over `len` bytes at `data`, which `owner` keeps alive; `None` if numpy's
/// C API is not reachable (the caller takes the Python path).
///
/// # Safety
/// `data` must point to at least `len` bytes that stay valid and in place
/// while `owner` lives, and `dims` with `dtype`'s item size must need no
/// more than `len` bytes (the caller checks).
pub unsafe fn view_of<'py>(
    owner: &Bound<'py, PyAny>,
    dtype: &Bound<'py, PyAny>,
    dims: &[isize],
    fortran: bool,
    data: *mut u8,
) -> Option<PyResult<Bound<'py, PyAny>>> {
    let py = owner.py();
    let api = api(py)?;
    let order = match fortran {
        true => NPY_ARRAY_F_CONTIGUOUS,
        false => NPY_ARRAY_C_CONTIGUOUS,
    };
    // SAFETY: the API was checked at load; the descr reference is stolen
    // (hence the INCREF), strides NULL means contiguous in `order`, and
    // the caller vouches for the memory.
    unsafe {
        ffi::Py_INCREF(dtype.as_ptr());
        let arr = (api.new_from_descr)(
            api.ndarray,
            dtype.as_ptr(),
            dims.len() as c_int,
            dims.as_ptr(),
            std::ptr::null(),
            data.cast(),
            NPY_ARRAY_WRITEABLE | order,
            std::ptr::null_mut(),
        );
        if arr.is_null() {
            return Some(Err(PyErr::fetch(py)));
        }
        let arr = Bound::from_owned_ptr(py, arr);
        // The base reference is stolen, also on failure.
        ffi::Py_INCREF(owner.as_ptr());
        if (api.set_base)(arr.as_ptr(), owner.as_ptr()) < 0 {
            return Some(Err(PyErr::fetch(py)));
        }
        Some(Ok(arr))
    }
}
