//! Sequential reader of `.log` records between two positions: reads the log
//! in 64 KiB chunks with `pread`, validates each header and record CRC, and
//! hands out the meta as zero-copy slices of the chunk. Every length read
//! from disk is checked against the end of the scanned range before anything
//! is allocated, so a hostile record length cannot cause a huge allocation.

use bytes::Bytes;

use super::record::{RecordHeader, HEADER_LEN};
use crate::vfs::VfsFile;
use crate::StorageError;

const CHUNK: u64 = 64 * 1024;

/// One record read from the log.
pub(crate) struct Rec {
    /// Position of the record in the `.log` file.
    pub pos: u64,
    pub header: RecordHeader,
    pub meta: Bytes,
}

/// Why a scan stopped before the end.
pub(crate) enum ScanError {
    /// The storage itself failed; nothing is known about the record.
    Io(StorageError),
    /// The record at `pos` is torn or corrupt.
    Bad { pos: u64, reason: &'static str },
}

impl ScanError {
    /// Converts to a storage error for the read path, where a bad record is
    /// reported (never served).
    pub(crate) fn into_storage(self, file: &std::path::Path) -> StorageError {
        match self {
            ScanError::Io(e) => e,
            ScanError::Bad { pos, reason } => StorageError::corrupt(format!(
                "log record at position {pos} of {}: {reason}",
                file.display()
            )),
        }
    }
}

pub(crate) struct Cursor<'a> {
    file: &'a dyn VfsFile,
    path: &'a std::path::Path,
    pos: u64,
    end: u64,
    buf: Bytes,
    buf_pos: u64,
}

impl<'a> Cursor<'a> {
    /// Scans records of `file` starting at `pos`, stopping at `end`.
    pub(crate) fn new(
        file: &'a dyn VfsFile,
        path: &'a std::path::Path,
        pos: u64,
        end: u64,
    ) -> Self {
        Cursor {
            file,
            path,
            pos,
            end,
            buf: Bytes::new(),
            buf_pos: 0,
        }
    }

    /// Next valid record, `None` at `end`, or why the record at `pos` is bad.
    pub(crate) fn next_record(&mut self) -> Result<Option<Rec>, ScanError> {
        let pos = self.pos;
        if pos >= self.end {
            return Ok(None);
        }
        let remaining = self.end - pos;
        if remaining < HEADER_LEN as u64 {
            return Err(ScanError::Bad {
                pos,
                reason: "torn record header",
            });
        }
        let head = self.bytes(pos, HEADER_LEN as u64)?;
        let header =
            RecordHeader::decode(&head).map_err(|reason| ScanError::Bad { pos, reason })?;
        let rec_len = header.record_len();
        if rec_len > remaining {
            return Err(ScanError::Bad {
                pos,
                reason: "record extends past the end of the log",
            });
        }
        let rec = self.bytes(pos, rec_len)?;
        if !RecordHeader::crc_matches(&rec[..HEADER_LEN], &rec[HEADER_LEN..]) {
            return Err(ScanError::Bad {
                pos,
                reason: "record checksum mismatch",
            });
        }
        self.pos = pos + rec_len;
        Ok(Some(Rec {
            pos,
            header,
            meta: rec.slice(HEADER_LEN..),
        }))
    }

    /// Continues the scan at `pos` (a record boundary found by a resync).
    pub(crate) fn seek(&mut self, pos: u64) {
        self.pos = pos;
    }

    /// `len` bytes at `pos` (`pos + len <= end`, checked by the caller).
    fn bytes(&mut self, pos: u64, len: u64) -> Result<Bytes, ScanError> {
        let buf_end = self.buf_pos + self.buf.len() as u64;
        if pos >= self.buf_pos && pos + len <= buf_end {
            let start = (pos - self.buf_pos) as usize;
            return Ok(self.buf.slice(start..start + len as usize));
        }
        let read_len = len.max(CHUNK).min(self.end - pos) as usize;
        let mut buf = vec![0u8; read_len];
        self.file.read_exact_at(&mut buf, pos).map_err(|e| {
            ScanError::Io(StorageError::io(
                format!("reading {} at position {pos}", self.path.display()),
                e,
            ))
        })?;
        self.buf = Bytes::from(buf);
        self.buf_pos = pos;
        Ok(self.buf.slice(0..len as usize))
    }
}
