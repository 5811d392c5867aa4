//! How a follower of a replicated partition learns that one of its closed
//! segments is in the tier, without copying it: the leader put the segment
//! under the same key (keys depend on the partition and the base offset,
//! not on the member), and the follower's files are byte-identical to the
//! leader's below the high watermark. For the `.log` then the `.data`
//! file, the follower computes the CRC32C and length of its own file, reads
//! the tier object back and compares them, then makes the object durable
//! ([`TierStore::make_durable`]), so a copy whose writer died before its
//! last fsync is never relied on. Only a segment whose two files both match
//! is returned, for the caller to record in its manifest; a missing,
//! partial, stale or different object leaves the local segment alone.

use std::sync::Arc;

use super::copy::LocalFile;
use super::{crc_by_chunks, segment_key, TierStore, TieredSegment};
use crate::file::ClosedSegment;
use crate::vfs::Vfs;
use crate::Result;

/// The manifest entry of `seg` if the tier holds a durable copy identical
/// to the local files, `None` if it does not (yet). Errors are the local
/// files' only: the tier's are reasons not to record the segment.
pub(crate) fn adopt_segment(
    store: &dyn TierStore,
    prefix: &str,
    vfs: &Arc<dyn Vfs>,
    seg: &ClosedSegment,
) -> Result<Option<TieredSegment>> {
    let Some(log) = matching_file(store, prefix, vfs, seg, "log")? else {
        return Ok(None);
    };
    let Some(data) = matching_file(store, prefix, vfs, seg, "data")? else {
        return Ok(None);
    };
    tracing::info!(tier = %store.describe(), segment = seg.base, next_offset = seg.next,
        bytes = log.0 + data.0, "the tier holds this copy's segment; recorded it");
    Ok(Some(TieredSegment::of(seg, log, data)))
}

/// Length and CRC of one local file of `seg` when the tier object under
/// its key matches it (and is now durable).
fn matching_file(
    store: &dyn TierStore,
    prefix: &str,
    vfs: &Arc<dyn Vfs>,
    seg: &ClosedSegment,
    ext: &str,
) -> Result<Option<(u64, u32)>> {
    let local = LocalFile::open(vfs, seg, ext)?;
    let len = local.len;
    let key = segment_key(prefix, seg.base, ext);
    // A missing object is the common case (the leader has not copied the
    // segment yet): its size is all it costs.
    match store.size(&key) {
        Ok(size) if size == len => {}
        Ok(size) => {
            tracing::debug!(key = %key, size, len, "the tier object differs in length from this copy's file; not recorded");
            return Ok(None);
        }
        Err(e) => {
            tracing::debug!(key = %key, error = %e, "not in the tier (yet)");
            return Ok(None);
        }
    }
    let crc = local.crc()?;
    let theirs = match crc_by_chunks(len, |p, n| store.get_range(&key, p, n)) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(key = %key, error = %e, "could not read the tier object back; not recorded");
            return Ok(None);
        }
    };
    if theirs != crc {
        tracing::warn!(key = %key, tier = %store.describe(), "the tier object differs from this copy's file; the local segment is kept");
        return Ok(None);
    }
    if let Err(e) = store.make_durable(&key) {
        tracing::warn!(key = %key, error = %e, "could not make the tier object durable; not recorded");
        return Ok(None);
    }
    Ok(Some((len, crc)))
}
