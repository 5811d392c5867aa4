//! Writing arrays to a new HDF5 file: one dataset per array ([`H5Out::array`]),
//! or rows appended to a dataset that grows along its first axis
//! ([`Appendable`]), chunked (about [`CHUNK_TARGET`] bytes a chunk) and
//! optionally gzip-compressed; scalar attributes; and the index table of
//! an appended dataset ([`Table`], a compound dataset h5py reads as a
//! structured array). The bytes given are C-order array bytes in the
//! dtype's byte order; nothing is converted.

use std::path::Path;
use std::str::FromStr;

use hdf5_metno::types::VarLenUnicode;
use hdf5_metno::{Dataset, Datatype, Extent, File, Location, SimpleExtents};
use hdf5_sys::{h5d, h5p};

use super::dtype::Dtype;
use super::read::Space;
use super::{h5, Hdf5Error};

/// Chunks hold about this many bytes (at least one element).
pub const CHUNK_TARGET: u64 = 1 << 20;

/// A scalar attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    Str(String),
    I64(i64),
    U64(u64),
    F64(f64),
    Bool(bool),
}

/// One row of the index table of an appended dataset.
#[derive(hdf5_metno::H5Type, Clone, Debug)]
#[repr(C)]
pub struct IndexRow {
    pub offset: u64,
    pub timestamp_us: u64,
    /// First row of `/data` holding this event.
    pub row_start: u64,
    /// Rows of `/data` it holds.
    pub rows: u64,
    /// The metadata as JSON text, or as hex when `metadata_hex`.
    pub metadata: VarLenUnicode,
    pub metadata_hex: bool,
}

/// Chunk dimensions for `dims` (the first one `first` when it grows):
/// halved, axis by axis from the first, until a chunk is at most
/// [`CHUNK_TARGET`] bytes.
pub fn chunk_dims(dims: &[u64], itemsize: u64) -> Vec<usize> {
    let mut c: Vec<u64> = dims.iter().map(|d| (*d).max(1)).collect();
    let bytes = |c: &[u64]| {
        c.iter()
            .try_fold(itemsize.max(1), |a, d| a.checked_mul(*d))
            .unwrap_or(u64::MAX)
    };
    for i in 0..c.len() {
        while bytes(&c) > CHUNK_TARGET && c[i] > 1 {
            c[i] = c[i].div_ceil(2);
        }
    }
    c.into_iter().map(|d| d as usize).collect()
}

fn lib(what: impl Into<String>) -> impl FnOnce(hdf5_metno::Error) -> Hdf5Error {
    let what = what.into();
    move |e| Hdf5Error::library(what, e)
}

/// Writes scalar attributes on a file, group or dataset.
pub fn set_attrs(loc: &Location, attrs: &[(String, AttrValue)]) -> Result<(), Hdf5Error> {
    for (name, v) in attrs {
        let what = format!("writing attribute '{name}'");
        match v {
            AttrValue::Str(s) => {
                let s = VarLenUnicode::from_str(s).map_err(|_| {
                    Hdf5Error::Refused(format!("attribute '{name}': a string with a NUL byte"))
                })?;
                loc.new_attr::<VarLenUnicode>()
                    .create(name.as_str())
                    .and_then(|a| a.write_scalar(&s))
            }
            AttrValue::I64(n) => loc
                .new_attr::<i64>()
                .create(name.as_str())
                .and_then(|a| a.write_scalar(n)),
            AttrValue::U64(n) => loc
                .new_attr::<u64>()
                .create(name.as_str())
                .and_then(|a| a.write_scalar(n)),
            AttrValue::F64(n) => loc
                .new_attr::<f64>()
                .create(name.as_str())
                .and_then(|a| a.write_scalar(n)),
            AttrValue::Bool(b) => loc
                .new_attr::<bool>()
                .create(name.as_str())
                .and_then(|a| a.write_scalar(b)),
        }
        .map_err(lib(what))?;
    }
    Ok(())
}

/// Writes the C-order bytes `data` of `dims` rows-first at `offset`.
fn write_block(
    ds: &Dataset,
    mem_type: &Datatype,
    offset: &[u64],
    dims: &[u64],
    data: &[u8],
) -> Result<(), Hdf5Error> {
    if dims.is_empty() {
        h5("writing a scalar dataset", || unsafe {
            h5d::H5Dwrite(
                ds.id(),
                mem_type.id(),
                hdf5_sys::h5s::H5S_ALL,
                hdf5_sys::h5s::H5S_ALL,
                h5p::H5P_DEFAULT,
                data.as_ptr().cast(),
            )
        })?;
        return Ok(());
    }
    if dims.contains(&0) {
        return Ok(());
    }
    let file_space = Space::of(ds)?;
    file_space.select(offset, dims)?;
    let mem_space = Space::simple(dims)?;
    h5("writing array data", || unsafe {
        h5d::H5Dwrite(
            ds.id(),
            mem_type.id(),
            mem_space.0,
            file_space.0,
            h5p::H5P_DEFAULT,
            data.as_ptr().cast(),
        )
    })?;
    Ok(())
}

/// A new HDF5 file being written.
pub struct H5Out {
    file: File,
    /// gzip level, or no compression.
    gzip: Option<u8>,
}

impl H5Out {
    /// Creates `path` (truncating it).
    pub fn create(path: &Path, gzip: Option<u8>) -> Result<H5Out, Hdf5Error> {
        let file = File::create(path).map_err(lib(format!("creating {}", path.display())))?;
        Ok(H5Out { file, gzip })
    }

    pub fn root(&self) -> &Location {
        &self.file
    }

    /// Creates group `name` under the root.
    pub fn group(&self, name: &str) -> Result<hdf5_metno::Group, Hdf5Error> {
        self.file
            .create_group(name)
            .map_err(lib(format!("creating group {name}")))
    }

    /// A dataset `path` holding one array: chunked and compressed unless it
    /// is 0-d or empty (HDF5 chunks need every dimension at least 1).
    pub fn array(
        &self,
        path: &str,
        dtype: &Dtype,
        shape: &[u64],
        data: &[u8],
    ) -> Result<Dataset, Hdf5Error> {
        let mem_type = dtype.to_hdf5()?;
        let dims: Vec<usize> = shape.iter().map(|d| *d as usize).collect();
        let mut b = self.file.new_dataset_builder();
        if !shape.is_empty() && !shape.contains(&0) {
            b = b.chunk(chunk_dims(shape, dtype.itemsize()));
            if let Some(level) = self.gzip {
                b = b.deflate(level);
            }
        }
        let ds = b
            .empty_as(&mem_type)
            .shape(SimpleExtents::fixed(dims))
            .create(path)
            .map_err(lib(format!("creating dataset {path}")))?;
        write_block(&ds, &mem_type, &vec![0; shape.len()], shape, data)?;
        Ok(ds)
    }

    /// A dataset `path` of shape `(0, *row_shape)` that grows along its
    /// first axis. Every dimension of `row_shape` must be at least 1.
    pub fn appendable(
        &self,
        path: &str,
        dtype: &Dtype,
        row_shape: &[u64],
    ) -> Result<Appendable, Hdf5Error> {
        if row_shape.contains(&0) {
            return Err(Hdf5Error::Refused(format!(
                "rows of shape {row_shape:?} are empty; an appended dataset needs rows of at \
                 least one element"
            )));
        }
        let mem_type = dtype.to_hdf5()?;
        let row_bytes = row_shape
            .iter()
            .try_fold(dtype.itemsize(), |a, d| a.checked_mul(*d))
            .ok_or_else(|| Hdf5Error::Refused(format!("rows of shape {row_shape:?} overflow")))?;
        let mut dims = vec![(CHUNK_TARGET / row_bytes.max(1)).max(1)];
        dims.extend_from_slice(row_shape);
        let mut extents = vec![Extent::resizable(0)];
        extents.extend(row_shape.iter().map(|d| Extent::fixed(*d as usize)));
        let mut b = self
            .file
            .new_dataset_builder()
            .chunk(chunk_dims(&dims, dtype.itemsize()));
        if let Some(level) = self.gzip {
            b = b.deflate(level);
        }
        let ds = b
            .empty_as(&mem_type)
            .shape(SimpleExtents::from_vec(extents))
            .create(path)
            .map_err(lib(format!("creating dataset {path}")))?;
        Ok(Appendable {
            ds,
            mem_type,
            row_shape: row_shape.to_vec(),
            row_bytes,
            rows: 0,
        })
    }

    /// The index table `path`, a growing compound dataset.
    pub fn table(&self, path: &str) -> Result<Table, Hdf5Error> {
        let mut b = self.file.new_dataset::<IndexRow>().chunk(TABLE_BATCH);
        if let Some(level) = self.gzip {
            b = b.deflate(level);
        }
        let ds = b
            .shape(SimpleExtents::from_vec(vec![Extent::resizable(0)]))
            .create(path)
            .map_err(lib(format!("creating table {path}")))?;
        Ok(Table {
            ds,
            written: 0,
            pending: Vec::new(),
        })
    }

    /// Flushes and closes the file; errors the library reports on close
    /// (a full disk) come back here.
    pub fn close(self) -> Result<(), Hdf5Error> {
        self.file.flush().map_err(lib("flushing the HDF5 file"))?;
        self.file.close().map_err(lib("closing the HDF5 file"))
    }
}

/// A dataset growing along its first axis.
pub struct Appendable {
    pub ds: Dataset,
    mem_type: Datatype,
    pub row_shape: Vec<u64>,
    pub row_bytes: u64,
    pub rows: u64,
}

impl Appendable {
    /// Appends `rows` rows: `data` is exactly their C-order bytes.
    pub fn append(&mut self, rows: u64, data: &[u8]) -> Result<(), Hdf5Error> {
        if rows.checked_mul(self.row_bytes) != Some(data.len() as u64) {
            return Err(Hdf5Error::Refused(format!(
                "internal: {rows} rows of {} bytes are not {} bytes",
                self.row_bytes,
                data.len()
            )));
        }
        let end = self.rows + rows;
        let mut dims = vec![end as usize];
        dims.extend(self.row_shape.iter().map(|d| *d as usize));
        self.ds
            .resize(dims)
            .map_err(lib(format!("growing {} to {end} rows", self.ds.name())))?;
        let mut offset = vec![0; self.row_shape.len() + 1];
        offset[0] = self.rows;
        let mut block = vec![rows];
        block.extend_from_slice(&self.row_shape);
        write_block(&self.ds, &self.mem_type, &offset, &block, data)?;
        self.rows = end;
        Ok(())
    }
}

/// Rows of the index table written at a time.
const TABLE_BATCH: usize = 1024;

/// The index table, written in batches of [`TABLE_BATCH`] rows.
pub struct Table {
    ds: Dataset,
    written: usize,
    pending: Vec<IndexRow>,
}

impl Table {
    pub fn push(&mut self, row: IndexRow) -> Result<(), Hdf5Error> {
        self.pending.push(row);
        if self.pending.len() >= TABLE_BATCH {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the pending rows.
    pub fn flush(&mut self) -> Result<(), Hdf5Error> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let end = self.written + self.pending.len();
        self.ds
            .resize(end)
            .map_err(lib("growing the index table"))?;
        self.ds
            .write_slice(self.pending.as_slice(), self.written..end)
            .map_err(lib("writing the index table"))?;
        self.written = end;
        self.pending.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_stay_under_the_target_and_keep_every_dimension_positive() {
        assert_eq!(chunk_dims(&[100, 3, 4], 8), vec![100, 3, 4]);
        let c = chunk_dims(&[4096, 4096], 4);
        let bytes: u64 = c.iter().map(|d| *d as u64).product::<u64>() * 4;
        assert!(bytes <= CHUNK_TARGET, "{c:?}");
        assert_eq!(c[1], 4096, "the trailing axis is cut last");
        let c = chunk_dims(&[1, 1 << 40], 8);
        assert!(c.iter().all(|d| *d >= 1));
        assert!(c.iter().map(|d| *d as u64).product::<u64>() * 8 <= CHUNK_TARGET);
        assert_eq!(chunk_dims(&[0, 5], 1), vec![1, 5]);
    }
}
