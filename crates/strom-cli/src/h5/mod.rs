//! HDF5 for `strom topic load` and `strom topic stage-out --format hdf5`
//! (docs/hdf5.md): the `FILE:/DATASET` argument ([`source`], pure and
//! always built) and, with the `hdf5` feature, the element types shared by
//! numpy and HDF5 ([`dtype`]), opening a dataset to load and reading its
//! rows as raw bytes ([`read`]), and writing arrays ([`write`]).
//!
//! Files, groups, datasets and attributes go through the `hdf5-metno`
//! crate; raw bytes in a dataset's own datatype (no conversion, so the
//! bytes are the array's bytes) and datatypes built with a byte order go
//! through its `-sys` crate under the library's global lock
//! (`hdf5_metno::sync::sync`). Every size read from a file is checked
//! before anything is allocated from it. This module knows nothing of
//! topics or events: it takes and returns bytes, shapes and dtypes.

pub mod source;

#[cfg(feature = "hdf5")]
pub mod dtype;
#[cfg(feature = "hdf5")]
pub mod read;
#[cfg(feature = "hdf5")]
pub mod write;

/// What can go wrong reading or writing HDF5.
#[cfg(feature = "hdf5")]
#[derive(Debug, thiserror::Error)]
pub enum Hdf5Error {
    /// The library refused a call; `what` says which step.
    #[error("{what}: {source}")]
    Library {
        what: String,
        #[source]
        source: hdf5_metno::Error,
    },
    #[error(
        "dtype '{0}' has no HDF5 type Strom writes \
         (b1, i1-i8, u1-u8, f2, f4, f8, c8, c16 and S<n> do)"
    )]
    UnsupportedDtype(String),
    #[error("the dataset's element type is {0}: Strom cannot describe it as a numpy dtype")]
    Undescribable(String),
    /// A file, path or dataset refused before reading it.
    #[error("{0}")]
    Refused(String),
}

#[cfg(feature = "hdf5")]
impl Hdf5Error {
    pub fn library(what: impl Into<String>, source: hdf5_metno::Error) -> Hdf5Error {
        Hdf5Error::Library {
            what: what.into(),
            source,
        }
    }
}

/// A return value of the C library that signals failure by its value.
#[cfg(feature = "hdf5")]
pub trait Checked: Copy {
    fn failed(self) -> bool;
}

#[cfg(feature = "hdf5")]
impl Checked for i32 {
    fn failed(self) -> bool {
        self < 0
    }
}

#[cfg(feature = "hdf5")]
impl Checked for i64 {
    fn failed(self) -> bool {
        self < 0
    }
}

/// `size_t` results: HDF5 returns 0 on failure where 0 is not a valid answer.
#[cfg(feature = "hdf5")]
impl Checked for usize {
    fn failed(self) -> bool {
        self == 0
    }
}

/// Runs one C call under the library's lock; a failure value becomes an
/// error carrying HDF5's own error stack, named by `what`.
#[cfg(feature = "hdf5")]
pub fn h5<T: Checked>(what: &str, call: impl FnOnce() -> T) -> Result<T, Hdf5Error> {
    hdf5_metno::sync::sync(|| {
        let v = call();
        if v.failed() {
            let e = hdf5_metno::Error::query()
                .unwrap_or_else(|_| hdf5_metno::Error::from("no error stack"));
            return Err(Hdf5Error::library(what, e));
        }
        Ok(v)
    })
}

/// Takes ownership of a datatype id: it is closed on drop.
#[cfg(feature = "hdf5")]
pub fn owned(id: hdf5_sys::h5i::hid_t) -> Result<hdf5_metno::Datatype, Hdf5Error> {
    // SAFETY: `id` was just returned by the library, valid and owned by no
    // one else; the `Datatype` closes it exactly once.
    unsafe { hdf5_metno::from_id::<hdf5_metno::Datatype>(id) }
        .map_err(|e| Hdf5Error::library("taking a datatype handle", e))
}
