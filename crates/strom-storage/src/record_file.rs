//! [`RecordFile`]: a durable append-only file of [`crate::record`] frames
//! whose payloads a [`Codec`] turns into typed records. It owns the I/O
//! every small journal needs: open (creating), replay (every intact record
//! in order; a torn tail is cut with a warning, damage followed by a valid
//! record is a typed error), append + fdatasync (cut back on failure), and
//! rewrite (the file replaced atomically by one holding a snapshot's
//! records: temp file, fdatasync, rename, directory fsync). All I/O goes
//! through [`crate::vfs`], so a simulated or faulty disk can stand in.
//!
//! The on-disk format is the framing of [`crate::record`] with the magic
//! the owner passes; nothing is added, so files written by the journals
//! that used the framing directly open unchanged.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::record::{self, FILE_HEADER, MAX_RECORD};
use crate::vfs::{Vfs, VfsFile};
use crate::whole_file::{self, StepError};

/// Turns records into payloads and back. Decoding reads hostile bytes: it
/// must return an error, never panic.
pub trait Codec {
    type Record;
    fn encode(&self, record: &Self::Record) -> Result<Vec<u8>, String>;
    fn decode(&self, payload: &[u8]) -> Result<Self::Record, String>;
}

/// Which kind of file: its magic, the version in its header
/// ([`record::VERSION`] unless the kind had an earlier format of its own),
/// and its name in messages.
#[derive(Clone, Copy, Debug)]
pub struct Format {
    pub magic: [u8; 4],
    pub version: u32,
    pub what: &'static str,
}

/// Why a record file could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordFileError {
    #[error("{step} {}: {source}", path.display())]
    Io {
        step: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} at byte {at}: {reason}", path.display())]
    Corrupt {
        path: PathBuf,
        at: usize,
        reason: String,
    },
    #[error("a record of {0} bytes is over the limit of {MAX_RECORD}")]
    TooLarge(usize),
    #[error("a record does not encode: {0}")]
    Encode(String),
    /// A failed write could not be undone; appends are refused until reopen.
    #[error("the file stopped after a failed write: {0}")]
    Broken(String),
}

impl From<StepError> for RecordFileError {
    fn from(e: StepError) -> Self {
        RecordFileError::Io {
            step: e.step,
            path: e.path,
            source: e.source,
        }
    }
}

fn io<'a>(
    step: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> RecordFileError + 'a {
    move |source| RecordFileError::Io {
        step,
        path: path.to_path_buf(),
        source,
    }
}

/// One record read back: where it starts in the file, its index, the record.
#[derive(Debug)]
pub struct Replayed<R> {
    pub at: usize,
    pub index: u64,
    pub record: R,
}

/// An open record file.
pub struct RecordFile<C: Codec> {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    name: String,
    format: Format,
    codec: C,
    file: Box<dyn VfsFile>,
    /// Bytes of the file; the next record goes here.
    len: u64,
    /// Records in the file.
    records: u64,
    /// The index the next record gets.
    next_index: u64,
    broken: Option<String>,
}

impl<C: Codec> RecordFile<C> {
    /// Opens `dir/name` and replays it. A leftover `name.tmp` is removed.
    /// When the file is missing, stops inside its header, or holds no
    /// intact record, it is started again (atomically, synced, directory
    /// fsynced) with the records `init()` returns (maybe none), numbered
    /// from `first_index`; they are returned as replayed. Returns the file
    /// and its records in order.
    #[allow(clippy::type_complexity)]
    pub fn open(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        name: &str,
        format: Format,
        codec: C,
        first_index: u64,
        init: impl FnOnce() -> Vec<C::Record>,
    ) -> Result<(RecordFile<C>, Vec<Replayed<C::Record>>), RecordFileError> {
        let path = dir.join(name);
        whole_file::remove_if_exists(&*vfs, &dir.join(format!("{name}.tmp")))?;
        let header = record::versioned_header(format.magic, format.version);
        let buf = match whole_file::read_all(&*vfs, &path)? {
            Some(buf) if buf.len() >= FILE_HEADER || !header.starts_with(&buf) => buf,
            Some(buf) => {
                tracing::warn!(file = %path.display(), bytes = buf.len(),
                    "the {} stops inside its header; starting it again", format.what);
                return Self::create(vfs, dir, name, format, codec, first_index, init());
            }
            None => return Self::create(vfs, dir, name, format, codec, first_index, init()),
        };
        let scan = record::scan_versioned_log(&buf, format.magic, format.version, format.what)
            .map_err(|d| RecordFileError::Corrupt {
                path: path.clone(),
                at: d.at,
                reason: d.reason,
            })?;
        let mut out = Vec::with_capacity(scan.records.len());
        for r in &scan.records {
            let record = codec
                .decode(r.payload)
                .map_err(|reason| RecordFileError::Corrupt {
                    path: path.clone(),
                    at: r.at,
                    reason,
                })?;
            out.push(Replayed {
                at: r.at,
                index: r.index,
                record,
            });
        }
        if let Some(t) = &scan.torn {
            tracing::warn!(file = %path.display(), offset = t.at, reason = %t.reason,
                "dropping a damaged last record of the {} (a crash during an append); it was never acknowledged",
                format.what);
        }
        if out.is_empty() {
            let recs = init();
            if !recs.is_empty() {
                return Self::create(vfs, dir, name, format, codec, first_index, recs);
            }
        }
        let file = vfs.open(&path, false).map_err(io("opening", &path))?;
        if let Some(t) = &scan.torn {
            file.set_len(t.at as u64)
                .and_then(|_| file.sync_data())
                .map_err(io("truncating", &path))?;
        }
        let next_index = scan
            .records
            .last()
            .map_or(first_index, |r| r.index.wrapping_add(1));
        let f = RecordFile {
            vfs,
            dir: dir.to_path_buf(),
            name: name.to_string(),
            format,
            codec,
            file,
            len: scan.valid_len as u64,
            records: scan.records.len() as u64,
            next_index,
            broken: None,
        };
        Ok((f, out))
    }

    /// Starts the file with a header and `recs` numbered from `first`,
    /// replacing whatever `dir/name` held atomically and durably (temp
    /// file, fdatasync, rename, directory fsync): a crash at any point
    /// leaves the old file or the new one, whole. The owner of a file kind
    /// upgrades a file in an older format of its own this way, once it has
    /// read it. Returns the file and `recs` as replayed.
    #[allow(clippy::type_complexity)]
    pub fn create(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        name: &str,
        format: Format,
        codec: C,
        first: u64,
        recs: Vec<C::Record>,
    ) -> Result<(RecordFile<C>, Vec<Replayed<C::Record>>), RecordFileError> {
        let mut f = RecordFile {
            vfs,
            dir: dir.to_path_buf(),
            name: name.to_string(),
            format,
            codec,
            file: Box::new(Closed),
            len: 0,
            records: 0,
            next_index: first,
            broken: None,
        };
        let sizes = f.rewrite_from(first, &recs).map_err(|(e, _)| e)?;
        let mut at = FILE_HEADER;
        let mut out = Vec::with_capacity(recs.len());
        for (i, (record, size)) in recs.into_iter().zip(sizes).enumerate() {
            let index = first.wrapping_add(i as u64);
            out.push(Replayed { at, index, record });
            at += size;
        }
        Ok((f, out))
    }

    /// The file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    /// Records in the file.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Bytes of the file.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the file holds no record.
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }

    /// The index the next appended record gets.
    pub fn next_index(&self) -> u64 {
        self.next_index
    }

    /// Why appends are refused, if they are.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    fn frame(&self, first: u64, recs: &[C::Record]) -> Result<Vec<Vec<u8>>, RecordFileError> {
        let mut out = Vec::with_capacity(recs.len());
        for (i, r) in recs.iter().enumerate() {
            let payload = self.codec.encode(r).map_err(RecordFileError::Encode)?;
            if payload.is_empty() {
                return Err(RecordFileError::Encode("an empty record".into()));
            }
            if payload.len() > MAX_RECORD {
                return Err(RecordFileError::TooLarge(payload.len()));
            }
            out.push(record::encode(first.wrapping_add(i as u64), &payload));
        }
        Ok(out)
    }

    /// Appends `recs` in one write (then fdatasyncs if `sync`) and returns
    /// the first one's index. On a failed write or sync the file is cut
    /// back to where it was, so later appends follow valid records; if
    /// that fails too, every later append is refused.
    pub fn append(&mut self, recs: &[C::Record], sync: bool) -> Result<u64, RecordFileError> {
        if let Some(why) = &self.broken {
            return Err(RecordFileError::Broken(why.clone()));
        }
        let first = self.next_index;
        let bufs = self.frame(first, recs)?;
        let parts: Vec<&[u8]> = bufs.iter().map(|b| &b[..]).collect();
        let written = self.file.write_all_at(&parts, self.len).and_then(|_| {
            if sync {
                self.file.sync_data()
            } else {
                Ok(())
            }
        });
        if let Err(e) = written {
            let undone = self
                .file
                .set_len(self.len)
                .and_then(|_| self.file.sync_data());
            if let Err(e2) = undone {
                self.broken = Some(format!("appending: {e}; cutting it back: {e2}"));
            }
            return Err(io("appending to", &self.path())(e));
        }
        self.len += parts.iter().map(|p| p.len() as u64).sum::<u64>();
        self.records += recs.len() as u64;
        self.next_index = first.wrapping_add(recs.len() as u64);
        Ok(first)
    }

    /// Replaces the file atomically and durably with one holding `recs`
    /// alone, numbered from `first` (a snapshot of the state, or nothing
    /// after a separate snapshot file took the state). A failure before the
    /// new file takes the name changes nothing; a failure after it (the
    /// directory sync) stops appends, since the open handle may name a file
    /// a crash would not keep.
    pub fn rewrite(&mut self, first: u64, recs: &[C::Record]) -> Result<(), RecordFileError> {
        if let Some(why) = &self.broken {
            return Err(RecordFileError::Broken(why.clone()));
        }
        match self.rewrite_from(first, recs) {
            Ok(_) => Ok(()),
            Err((e, named)) => {
                if named {
                    self.broken = Some(format!("rewriting the file: {e}"));
                }
                Err(e)
            }
        }
    }

    /// Rewrites the file; returns the framed size of each record.
    fn rewrite_from(
        &mut self,
        first: u64,
        recs: &[C::Record],
    ) -> Result<Vec<usize>, (RecordFileError, bool)> {
        let bufs = self.frame(first, recs).map_err(|e| (e, false))?;
        let header = record::versioned_header(self.format.magic, self.format.version);
        let mut parts: Vec<&[u8]> = vec![&header];
        parts.extend(bufs.iter().map(|b| &b[..]));
        let len = parts.iter().map(|p| p.len() as u64).sum();
        let file = whole_file::replace(&*self.vfs, &self.dir, &self.name, &parts)
            .map_err(|(e, named)| (e.into(), named))?;
        let before = self.records;
        self.file = file;
        self.len = len;
        self.records = recs.len() as u64;
        self.next_index = first.wrapping_add(recs.len() as u64);
        tracing::debug!(file = %self.path().display(), before, after = self.records,
            "{} rewritten", self.format.what);
        Ok(bufs.iter().map(Vec::len).collect())
    }

    /// Deletes the file durably.
    pub fn remove(self) -> Result<(), RecordFileError> {
        let path = self.path();
        self.vfs.remove_file(&path).map_err(io("removing", &path))?;
        Ok(whole_file::sync_dir(&*self.vfs, &self.dir)?)
    }
}

/// Splits `path` into the directory (`.` for a bare name) and the file
/// name that [`RecordFile::open`] takes; a path without a UTF-8 file name
/// is an invalid argument (`what` names the file kind).
pub fn split_path<'a>(path: &'a Path, what: &str) -> crate::Result<(&'a Path, &'a str)> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
        crate::StorageError::InvalidArgument(format!(
            "a {what} path without a file name: {}",
            path.display()
        ))
    })?;
    Ok((dir, name))
}

/// Writes `dir/name` as a snapshot: a header (`format`'s magic and version)
/// and one record (`index`, `payload`), atomically and durably (temp,
/// fdatasync, rename, directory fsync). A payload over 4 GiB does not fit
/// the record's length field and is refused before anything is written.
pub fn write_snapshot(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    format: Format,
    index: u64,
    payload: &[u8],
) -> Result<(), RecordFileError> {
    if u32::try_from(payload.len()).is_err() {
        return Err(RecordFileError::Encode(format!(
            "a {} of {} bytes is over the 4 GiB a record can hold",
            format.what,
            payload.len()
        )));
    }
    let header = record::versioned_header(format.magic, format.version);
    let rec = record::encode(index, payload);
    whole_file::replace(vfs, dir, name, &[&header, &rec]).map_err(|(e, _)| e)?;
    Ok(())
}

/// Reads the snapshot `dir/name`: its index and payload, or `None` if it
/// does not exist.
pub fn read_snapshot(
    vfs: &dyn Vfs,
    dir: &Path,
    name: &str,
    format: Format,
) -> Result<Option<(u64, Vec<u8>)>, RecordFileError> {
    let path = dir.join(name);
    let Some(buf) = whole_file::read_all(vfs, &path)? else {
        return Ok(None);
    };
    let rec = record::decode_versioned_snapshot(&buf, format.magic, format.version, format.what)
        .map_err(|d| RecordFileError::Corrupt {
            path: path.clone(),
            at: d.at,
            reason: d.reason,
        })?;
    Ok(Some((rec.index, rec.payload.to_vec())))
}

/// The handle of a file being created (never used for I/O).
struct Closed;

impl VfsFile for Closed {
    fn len(&self) -> std::io::Result<u64> {
        Err(closed())
    }
    fn read_exact_at(&self, _: &mut [u8], _: u64) -> std::io::Result<()> {
        Err(closed())
    }
    fn write_all_at(&self, _: &[&[u8]], _: u64) -> std::io::Result<()> {
        Err(closed())
    }
    fn set_len(&self, _: u64) -> std::io::Result<()> {
        Err(closed())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        Err(closed())
    }
}

fn closed() -> std::io::Error {
    std::io::Error::other("the file is not open")
}
