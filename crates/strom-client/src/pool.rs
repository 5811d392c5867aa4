//! [`PoolBroker`]: a data broker that recycles its buffers, so a consumer
//! that drops (or finishes with) each event before taking many more fetches
//! into warm memory: no allocation, no zeroing and no page faults once the
//! pool is full. For large data parts that is most of the cost of a fetch
//! into fresh memory (the kernel zeroes every new page, and a zeroed
//! `Vec` is written twice).

use std::any::Any;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use strom_proto::Selection;

use crate::data::{buffer_len, DataBroker, DataBuffer, EventMeta};

/// The idle buffers and the bytes they hold.
#[derive(Default)]
struct Idle {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

type Pool = Mutex<Idle>;

/// How many idle buffers a pool keeps, and how many bytes in all.
#[derive(Clone, Copy)]
struct Limits {
    keep: usize,
    max_bytes: usize,
}

/// Hands out one buffer per event, taken from (and given back to, when the
/// event's data is dropped) a pool of at most `keep` idle buffers holding
/// at most `max_bytes`. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct PoolBroker {
    pool: Arc<Pool>,
    limits: Limits,
}

impl PoolBroker {
    /// A pool that keeps at most `keep` idle buffers (more are freed).
    pub fn new(keep: usize) -> Self {
        Self::with_limits(keep, usize::MAX)
    }

    /// A pool that keeps at most `keep` idle buffers and `max_bytes` of
    /// idle memory: room for the events a `pull_many` holds at once when
    /// they are small, without keeping gigabytes when they are large.
    pub fn with_limits(keep: usize, max_bytes: usize) -> Self {
        PoolBroker {
            pool: Arc::default(),
            limits: Limits { keep, max_bytes },
        }
    }

    /// Idle buffers in the pool now.
    pub fn idle(&self) -> usize {
        self.pool.lock().bufs.len()
    }
}

impl Default for PoolBroker {
    /// Keeps up to 64 idle buffers.
    fn default() -> Self {
        PoolBroker::new(64)
    }
}

/// A buffer of a [`PoolBroker`]; back to its pool when dropped.
pub struct PooledBuffer {
    buf: Vec<u8>,
    pool: Weak<Pool>,
    limits: Limits,
}

impl PooledBuffer {
    /// The bytes, leaving the pool without this buffer.
    pub fn into_vec(mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        if self.buf.capacity() == 0 {
            return;
        }
        if let Some(pool) = self.pool.upgrade() {
            let mut p = pool.lock();
            let size = self.buf.capacity();
            if p.bufs.len() < self.limits.keep
                && p.bytes.saturating_add(size) <= self.limits.max_bytes
            {
                p.bytes += size;
                p.bufs.push(std::mem::take(&mut self.buf));
            }
        }
    }
}

impl DataBuffer for PooledBuffer {
    fn as_slice(&self) -> &[u8] {
        &self.buf
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.buf
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

impl DataBroker for PoolBroker {
    fn buffers(
        &self,
        _: &EventMeta,
        _: &Selection,
        len: u64,
    ) -> std::result::Result<Vec<Box<dyn DataBuffer>>, String> {
        let len = buffer_len(len)?;
        let mut buf = {
            let mut p = self.pool.lock();
            // The most recently returned buffer that is large enough (it is
            // the warmest), else any (it grows).
            let taken = match p.bufs.iter().rposition(|b| b.len() >= len) {
                Some(i) => Some(p.bufs.swap_remove(i)),
                None => p.bufs.pop(),
            };
            let taken = taken.unwrap_or_default();
            p.bytes -= taken.capacity();
            taken
        };
        // Shrinking keeps the memory; only growth is zeroed.
        buf.resize(len, 0);
        Ok(vec![Box::new(PooledBuffer {
            buf,
            pool: Arc::downgrade(&self.pool),
            limits: self.limits,
        })])
    }

    /// Parts under 16 KiB share chunks: a pooled buffer each cost a lock
    /// and a reference count that the consumer's thread and the pulling
    /// thread took turns on, per event.
    fn carve_below(&self) -> u64 {
        CARVE_BELOW
    }
}

/// Selected parts smaller than this go to shared chunks, not to the pool.
pub const CARVE_BELOW: u64 = 16 << 10;

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> EventMeta {
        let policy = strom_policy::TopicPolicy::new("none", None, "round-robin", "json").unwrap();
        EventMeta::new(
            0,
            0,
            0,
            bytes::Bytes::from_static(b"{}"),
            crate::data::PolicyHandle::new(Arc::new(policy)),
        )
    }

    #[test]
    fn buffers_come_back_to_the_pool_and_are_reused_warm() {
        let b = PoolBroker::new(2);
        let first = b.buffers(&meta(), &Selection::All, 1000).unwrap();
        let addr = first[0].as_slice().as_ptr();
        drop(first);
        assert_eq!(b.idle(), 1);
        let again = b.buffers(&meta(), &Selection::All, 800).unwrap();
        assert_eq!(again[0].as_slice().as_ptr(), addr, "the same memory");
        assert_eq!(again[0].as_slice().len(), 800, "exactly the length asked");
        let bigger = b.buffers(&meta(), &Selection::All, 5000).unwrap();
        assert_eq!(bigger[0].as_slice().len(), 5000);
        drop((again, bigger));
        let extra = b.buffers(&meta(), &Selection::All, 10).unwrap();
        let more: Vec<_> = (0..3)
            .map(|_| b.buffers(&meta(), &Selection::All, 10).unwrap())
            .collect();
        drop((extra, more));
        assert_eq!(b.idle(), 2, "at most `keep` idle buffers");
    }

    #[test]
    fn idle_buffers_stay_within_the_byte_bound() {
        let b = PoolBroker::with_limits(100, 10_000);
        let held: Vec<_> = (0..5)
            .map(|_| b.buffers(&meta(), &Selection::All, 3000).unwrap())
            .collect();
        drop(held);
        assert_eq!(
            b.idle(),
            3,
            "3 x 3000 bytes fit under 10,000, a fourth does not"
        );
        let again: Vec<_> = (0..3)
            .map(|_| b.buffers(&meta(), &Selection::All, 3000).unwrap())
            .collect();
        assert_eq!(b.idle(), 0);
        drop(again);
        assert_eq!(b.idle(), 3, "taking buffers out gives their bytes back");
    }

    #[test]
    fn a_buffer_outliving_its_broker_is_simply_freed() {
        let b = PoolBroker::new(4);
        let buf = b.buffers(&meta(), &Selection::All, 64).unwrap();
        drop(b);
        drop(buf);
    }
}
