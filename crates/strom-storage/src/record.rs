//! The framing of small append-only logs and their snapshots, as pure
//! functions over bytes (no I/O). Both the server's topic registry
//! (`registry.log`, `registry.snapshot`) and the shared-group ack ledger
//! ([`crate::ledger`]) use it; each file kind passes its own magic.
//!
//! Layout: an 8-byte file header (4-byte magic, u32 version), then records of
//! `[u32 len][u32 crc32c][u64 index][len bytes of payload]`, little endian.
//! The CRC covers the length, the index and the payload. Every length is
//! checked against a cap and against the bytes that remain before anything
//! is sliced or allocated. The payload is opaque here.
//!
//! [`scan_log`] tells a torn tail (damage with nothing valid after it: a
//! crash during an append) from damage in the middle (a valid record
//! follows), which must not be silently dropped.

/// Bytes of a record header.
pub const HEADER: usize = 16;
/// Bytes of a file header.
pub const FILE_HEADER: usize = 8;
/// The largest record the log accepts (a snapshot is bounded by `u32` only).
pub const MAX_RECORD: usize = 16 << 20;
/// The format version written in a file header unless the file kind says
/// otherwise (the consumer offset store is at version 2: its version 1 was
/// not this framing).
pub const VERSION: u32 = 1;

/// Damage found at byte `at` of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    pub at: usize,
    pub reason: String,
}

/// One well-formed record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Where the record starts in the file.
    pub at: usize,
    pub index: u64,
    pub payload: &'a [u8],
}

fn crc(head: &[u8], payload: &[u8]) -> u32 {
    let c = crc32c::crc32c(&head[0..4]);
    crc32c::crc32c_append(crc32c::crc32c_append(c, &head[8..16]), payload)
}

pub fn file_header(magic: [u8; 4]) -> [u8; FILE_HEADER] {
    versioned_header(magic, VERSION)
}

/// A file header with `magic` and `version`.
pub fn versioned_header(magic: [u8; 4], version: u32) -> [u8; FILE_HEADER] {
    let mut h = [0u8; FILE_HEADER];
    h[..4].copy_from_slice(&magic);
    h[4..].copy_from_slice(&version.to_le_bytes());
    h
}

/// Checks the file header; `what` names the file kind in the reason.
pub fn check_file_header(buf: &[u8], magic: [u8; 4], what: &str) -> Result<(), Damage> {
    check_versioned_header(buf, magic, VERSION, what)
}

/// Checks the file header against `magic` and `expected` version.
pub fn check_versioned_header(
    buf: &[u8],
    magic: [u8; 4],
    expected: u32,
    what: &str,
) -> Result<(), Damage> {
    let bad = |reason: String| Err(Damage { at: 0, reason });
    if buf.len() < FILE_HEADER {
        return bad(format!(
            "the file is {} bytes, shorter than a {what} header",
            buf.len()
        ));
    }
    if buf[..4] != magic {
        return bad(format!("this is not a {what} (bad magic)"));
    }
    let version = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
    if version != expected {
        return bad(format!(
            "{what} version {version}; this server reads version {expected} (was it written by a newer one?)"
        ));
    }
    Ok(())
}

/// Encodes one record. The caller keeps `payload` under the cap it reads with.
pub fn encode(index: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&index.to_le_bytes());
    let c = crc(&out, payload);
    out[4..8].copy_from_slice(&c.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Decodes the record at `at`, whose payload may be at most `max` bytes.
/// Returns it and where the next one starts.
pub fn decode_at(buf: &[u8], at: usize, max: usize) -> Result<(Record<'_>, usize), String> {
    let left = buf.len().saturating_sub(at);
    if left < HEADER {
        return Err(format!(
            "a record header cut short ({left} of {HEADER} bytes)"
        ));
    }
    let head = &buf[at..at + HEADER];
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let stored = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let mut index = [0u8; 8];
    index.copy_from_slice(&head[8..16]);
    let index = u64::from_le_bytes(index);
    if len == 0 {
        return Err("a record of length 0".into());
    }
    if len > max {
        return Err(format!(
            "a record length of {len} bytes, over the limit of {max}"
        ));
    }
    if len > left - HEADER {
        return Err(format!(
            "a record of {len} bytes runs past the end of the file ({} bytes left)",
            left - HEADER
        ));
    }
    let payload = &buf[at + HEADER..at + HEADER + len];
    if crc(head, payload) != stored {
        return Err(format!("record {index} fails its CRC check"));
    }
    Ok((Record { at, index, payload }, at + HEADER + len))
}

/// The result of reading a log: its records and, if the last one was torn,
/// where and why (the file should be truncated to `valid_len`).
#[derive(Debug)]
pub struct LogScan<'a> {
    pub records: Vec<Record<'a>>,
    pub valid_len: usize,
    pub torn: Option<Damage>,
}

/// Reads a log file (header included) whose header carries `magic`; `what`
/// names the file kind in damage reasons. Records must have consecutive
/// indexes. Damage with no valid record after it is a torn tail; damage
/// followed by a valid record, or a valid record out of sequence, is
/// corruption and is returned as the error.
pub fn scan_log<'a>(buf: &'a [u8], magic: [u8; 4], what: &str) -> Result<LogScan<'a>, Damage> {
    scan_versioned_log(buf, magic, VERSION, what)
}

/// [`scan_log`] of a file kind whose header carries `version`.
pub fn scan_versioned_log<'a>(
    buf: &'a [u8],
    magic: [u8; 4],
    version: u32,
    what: &str,
) -> Result<LogScan<'a>, Damage> {
    check_versioned_header(buf, magic, version, what)?;
    let mut records: Vec<Record<'_>> = Vec::new();
    let mut at = FILE_HEADER;
    while at < buf.len() {
        let prev = records.last().map(|r| r.index);
        match decode_at(buf, at, MAX_RECORD) {
            Ok((rec, next)) => {
                if let Some(p) = prev.filter(|p| rec.index != p.wrapping_add(1)) {
                    return Err(Damage {
                        at,
                        reason: format!("record {} follows record {p}", rec.index),
                    });
                }
                records.push(rec);
                at = next;
            }
            Err(reason) => {
                let first = prev.map_or(1, |p| p.saturating_add(1));
                if let Some(later) = later_record(buf, at, first) {
                    return Err(Damage {
                        at,
                        reason: format!("{reason}, and {later}"),
                    });
                }
                return Ok(LogScan {
                    records,
                    valid_len: at,
                    torn: Some(Damage { at, reason }),
                });
            }
        }
    }
    Ok(LogScan {
        records,
        valid_len: at,
        torn: None,
    })
}

/// Looks for a valid record anywhere after the damaged one at `from`, with
/// an index from `first` on (a record appended later). The CRC work is
/// bounded; when the budget runs out the damage is not taken for a torn
/// tail (refusing to start is the safe side).
fn later_record(buf: &[u8], from: usize, first: u64) -> Option<String> {
    let mut budget = (64usize << 20).saturating_add(buf.len().saturating_mul(8));
    // A later record's index is at most one per HEADER+1 bytes further on.
    let last = first.saturating_add(((buf.len() - from) / (HEADER + 1)) as u64);
    for p in from + 1..buf.len().saturating_sub(HEADER - 1) {
        let mut index = [0u8; 8];
        index.copy_from_slice(&buf[p + 8..p + 16]);
        let index = u64::from_le_bytes(index);
        if index < first || index > last {
            continue;
        }
        let len = u32::from_le_bytes([buf[p], buf[p + 1], buf[p + 2], buf[p + 3]]) as usize;
        if len == 0 || len > MAX_RECORD || len > buf.len() - p - HEADER {
            continue;
        }
        if budget < len {
            return Some(
                "the rest of the file is too damaged to tell whether valid records follow".into(),
            );
        }
        budget -= len;
        if decode_at(buf, p, MAX_RECORD).is_ok() {
            return Some(format!("a valid record ({index}) follows at byte {p}"));
        }
    }
    None
}

/// Reads a snapshot file: the header (with `magic`) and exactly one record
/// (any size).
pub fn decode_snapshot<'a>(
    buf: &'a [u8],
    magic: [u8; 4],
    what: &str,
) -> Result<Record<'a>, Damage> {
    decode_versioned_snapshot(buf, magic, VERSION, what)
}

/// [`decode_snapshot`] of a file kind whose header carries `version`.
pub fn decode_versioned_snapshot<'a>(
    buf: &'a [u8],
    magic: [u8; 4],
    version: u32,
    what: &str,
) -> Result<Record<'a>, Damage> {
    check_versioned_header(buf, magic, version, what)?;
    let (rec, end) = decode_at(buf, FILE_HEADER, u32::MAX as usize).map_err(|reason| Damage {
        at: FILE_HEADER,
        reason,
    })?;
    if end != buf.len() {
        return Err(Damage {
            at: end,
            reason: format!("{} unexpected bytes after the snapshot", buf.len() - end),
        });
    }
    Ok(rec)
}
