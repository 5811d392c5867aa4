//! Opening a dataset to load, strictly, and reading rows of it (slices
//! along axis 0) as raw bytes in the file's own datatype.
//!
//! [`Loadable::open`] refuses, before any data is read: a file HDF5 cannot
//! open (no HDF5 signature, truncated, damaged superblock); a path with a
//! missing component, a component that is a dataset where a group is
//! needed, an external or user-defined link (Strom reads only the named
//! file), or an object that is not a dataset; a dataset whose data lives
//! elsewhere (external raw storage, a virtual dataset) or needs a filter
//! this libhdf5 does not have; a null dataspace; and an element type
//! numpy cannot describe. Sizes (rows, bytes per row) come back checked;
//! callers allocate only after comparing them with their limits.

use std::ffi::CString;

use hdf5_metno::dataset::Layout;
use hdf5_metno::{Dataset, Datatype, Extents, File, LocationType};
use hdf5_sys::h5i::hid_t;
use hdf5_sys::{h5d, h5l, h5p, h5s, h5z};

use super::dtype::Dtype;
use super::source::Source;
use super::{h5, Hdf5Error};

/// A dataset checked to be loadable.
pub struct Loadable {
    /// Kept open while the dataset is read.
    _file: File,
    ds: Dataset,
    /// The file's datatype, used as the memory type: no conversion.
    mem_type: Datatype,
    pub dtype: Dtype,
    /// Empty for a scalar dataset.
    pub shape: Vec<u64>,
    /// The dataset's chunk size along axis 0, when it is chunked.
    pub chunk_rows: Option<u64>,
}

fn refused(msg: String) -> Hdf5Error {
    Hdf5Error::Refused(msg)
}

fn cstr(s: &str) -> Result<CString, Hdf5Error> {
    CString::new(s).map_err(|_| refused(format!("'{s}' contains a NUL byte")))
}

/// Checks every link on the path: it exists, it is hard or soft (never
/// external), and every component but the last is a group.
fn walk(file: &File, src: &Source, shown: &str) -> Result<(), Hdf5Error> {
    let mut prefix = String::new();
    let parts: Vec<&str> = src.components().collect();
    for (i, part) in parts.iter().enumerate() {
        let parent = if prefix.is_empty() { "/" } else { &prefix };
        let parent = parent.to_string();
        prefix.push('/');
        prefix.push_str(part);
        let name = cstr(&prefix)?;
        let exists = h5(&format!("looking up {prefix}"), || unsafe {
            h5l::H5Lexists(file.id(), name.as_ptr(), h5p::H5P_DEFAULT)
        })?;
        if exists == 0 {
            return Err(refused(format!(
                "{shown}: no dataset {}: group {parent} has no member '{part}'",
                src.dataset
            )));
        }
        // SAFETY: a plain C struct the library fills in.
        let mut info: h5l::H5L_info1_t = unsafe { std::mem::zeroed() };
        h5(&format!("reading the link {prefix}"), || unsafe {
            h5l::H5Lget_info1(file.id(), name.as_ptr(), &mut info, h5p::H5P_DEFAULT)
        })?;
        if !matches!(
            info.type_,
            h5l::H5L_type_t::H5L_TYPE_HARD | h5l::H5L_type_t::H5L_TYPE_SOFT
        ) {
            return Err(refused(format!(
                "{shown}: {prefix} is an external or user-defined link; \
                 Strom loads only from the file it is given"
            )));
        }
        let kind = file
            .loc_type_by_name(&prefix)
            .map_err(|e| Hdf5Error::library(format!("{shown}: opening {prefix}"), e))?;
        let last = i + 1 == parts.len();
        match (kind, last) {
            (LocationType::Group, false) | (LocationType::Dataset, true) => {}
            (LocationType::Group, true) => {
                return Err(refused(format!(
                    "{shown}: {prefix} is a group, not a dataset"
                )))
            }
            (_, false) => {
                return Err(refused(format!(
                    "{shown}: {prefix} is not a group, so it has no member '{}'",
                    parts[i + 1]
                )))
            }
            (_, true) => {
                return Err(refused(format!(
                    "{shown}: {prefix} is a named datatype, not a dataset"
                )))
            }
        }
    }
    Ok(())
}

/// Refuses data stored outside the file, and filters this libhdf5 lacks.
fn check_storage(ds: &Dataset, shown: &str) -> Result<(), Hdf5Error> {
    let dcpl = ds
        .create_plist()
        .map_err(|e| Hdf5Error::library(format!("{shown}: reading its creation properties"), e))?;
    if dcpl.layout() == Layout::Virtual {
        return Err(refused(format!(
            "{shown}: a virtual dataset (its data lives in other files); Strom loads only \
             data stored in the file it is given"
        )));
    }
    let external = h5("counting external storage files", || unsafe {
        h5p::H5Pget_external_count(dcpl.id())
    })?;
    if external > 0 {
        return Err(refused(format!(
            "{shown}: its data is stored in {external} external file(s); Strom loads only \
             data stored in the file it is given"
        )));
    }
    let filters = dcpl
        .get_filters()
        .map_err(|e| Hdf5Error::library(format!("{shown}: reading its filters"), e))?;
    for f in filters {
        let avail = h5("checking a filter", || unsafe {
            h5z::H5Zfilter_avail(f.id())
        })?;
        if avail == 0 {
            return Err(refused(format!(
                "{shown}: compressed with filter {} ({f:?}), which this libhdf5 does not have",
                f.id()
            )));
        }
    }
    Ok(())
}

impl Loadable {
    /// Opens `src` and checks everything listed in the module docs.
    pub fn open(src: &Source) -> Result<Loadable, Hdf5Error> {
        let shown = format!("{}:{}", src.file.display(), src.dataset);
        let meta = std::fs::metadata(&src.file)
            .map_err(|e| refused(format!("{}: {e}", src.file.display())))?;
        if !meta.is_file() {
            return Err(refused(format!(
                "{}: not a regular file",
                src.file.display()
            )));
        }
        let file = File::open(&src.file).map_err(|e| {
            Hdf5Error::library(
                format!(
                    "{}: not an HDF5 file this libhdf5 can open (damaged, truncated or \
                     another format)",
                    src.file.display()
                ),
                e,
            )
        })?;
        walk(&file, src, &shown)?;
        let ds = file
            .dataset(&src.dataset)
            .map_err(|e| Hdf5Error::library(format!("{shown}: opening the dataset"), e))?;
        if ds.filename() != file.filename() {
            return Err(refused(format!(
                "{shown}: the dataset lives in another file ({}); Strom loads only from the \
                 file it is given",
                ds.filename()
            )));
        }
        check_storage(&ds, &shown)?;
        let mem_type = ds
            .dtype()
            .map_err(|e| Hdf5Error::library(format!("{shown}: reading its datatype"), e))?;
        let dtype = Dtype::from_hdf5(&mem_type)?;
        let space = ds
            .space()
            .map_err(|e| Hdf5Error::library(format!("{shown}: reading its dataspace"), e))?;
        let shape = match space
            .extents()
            .map_err(|e| Hdf5Error::library(format!("{shown}: reading its shape"), e))?
        {
            Extents::Null => {
                return Err(refused(format!(
                    "{shown}: a null dataspace (no elements, not even a scalar)"
                )))
            }
            Extents::Scalar => Vec::new(),
            Extents::Simple(s) => s.dims().iter().map(|d| *d as u64).collect(),
        };
        let chunk_rows = ds.chunk().and_then(|c| c.first().map(|r| *r as u64));
        Ok(Loadable {
            _file: file,
            ds,
            mem_type,
            dtype,
            shape,
            chunk_rows,
        })
    }

    /// Bytes of one row (one element for a 1-d dataset, the whole array
    /// for a scalar one); `None` if it does not fit in a `u64`.
    pub fn row_bytes(&self) -> Option<u64> {
        let trailing = self.shape.get(1..).unwrap_or(&[]);
        trailing
            .iter()
            .try_fold(self.dtype.itemsize(), |a, d| a.checked_mul(*d))
    }

    /// Rows along axis 0 (1 for a scalar dataset).
    pub fn rows(&self) -> u64 {
        self.shape.first().copied().unwrap_or(1)
    }

    /// Reads rows `start..start + count` into `buf`, whose length must be
    /// exactly `count` rows (the caller checked the size before allocating).
    pub fn read_rows(&self, start: u64, count: u64, buf: &mut [u8]) -> Result<(), Hdf5Error> {
        let want = self.row_bytes().and_then(|r| r.checked_mul(count));
        if want != Some(buf.len() as u64)
            || start.checked_add(count).is_none_or(|e| e > self.rows())
        {
            return Err(refused(format!(
                "internal: rows {start}+{count} do not match a buffer of {} bytes",
                buf.len()
            )));
        }
        if self.shape.is_empty() {
            h5("reading the scalar dataset", || unsafe {
                h5d::H5Dread(
                    self.ds.id(),
                    self.mem_type.id(),
                    h5s::H5S_ALL,
                    h5s::H5S_ALL,
                    h5p::H5P_DEFAULT,
                    buf.as_mut_ptr().cast(),
                )
            })?;
            return Ok(());
        }
        if count == 0 || buf.is_empty() {
            return Ok(());
        }
        let mut offset = vec![0u64; self.shape.len()];
        offset[0] = start;
        let mut counts = self.shape.clone();
        counts[0] = count;
        let what = format!("reading rows {start}..{}", start + count);
        let file_space = Space::of(&self.ds)?;
        file_space.select(&offset, &counts)?;
        let mem_space = Space::simple(&counts)?;
        h5(&what, || unsafe {
            h5d::H5Dread(
                self.ds.id(),
                self.mem_type.id(),
                mem_space.0,
                file_space.0,
                h5p::H5P_DEFAULT,
                buf.as_mut_ptr().cast(),
            )
        })?;
        Ok(())
    }
}

/// A dataspace id, closed on drop.
pub struct Space(pub hid_t);

impl Space {
    /// A copy of a dataset's dataspace.
    pub fn of(ds: &Dataset) -> Result<Space, Hdf5Error> {
        h5("getting a dataspace", || unsafe {
            h5d::H5Dget_space(ds.id())
        })
        .map(Space)
    }

    /// A simple dataspace of `dims`.
    pub fn simple(dims: &[u64]) -> Result<Space, Hdf5Error> {
        let rank =
            i32::try_from(dims.len()).map_err(|_| refused(format!("{} dimensions", dims.len())))?;
        h5("creating a dataspace", || unsafe {
            h5s::H5Screate_simple(rank, dims.as_ptr(), std::ptr::null())
        })
        .map(Space)
    }

    /// Selects the block at `offset` of size `counts`.
    pub fn select(&self, offset: &[u64], counts: &[u64]) -> Result<(), Hdf5Error> {
        h5("selecting a hyperslab", || unsafe {
            h5s::H5Sselect_hyperslab(
                self.0,
                h5s::H5S_seloper_t::H5S_SELECT_SET,
                offset.as_ptr(),
                std::ptr::null(),
                counts.as_ptr(),
                std::ptr::null(),
            )
        })?;
        Ok(())
    }
}

impl Drop for Space {
    fn drop(&mut self) {
        hdf5_metno::sync::sync(|| unsafe { h5s::H5Sclose(self.0) });
    }
}
