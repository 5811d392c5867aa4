//! Memory registration: [`MemoryRegion`] (a registered buffer that keeps
//! its owner alive), [`RemoteRegion`] (what a peer needs to read or write
//! it) and [`MrCache`], which registers each buffer once and hands out
//! shared, refcounted registrations.
//!
//! The cache is keyed by `(address, length)`. That is safe because each
//! cached registration owns its buffer: the memory cannot be freed and
//! reused at the same address while the entry exists. Entries no transfer
//! uses are evicted oldest first once the cache holds more than its bound.

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::endpoint::Endpoint;
use crate::{sys, OfiError};

/// A raw registration handle (closed explicitly by its owner).
pub(crate) struct RawMr(pub(crate) *mut sys::fid_mr);

// SAFETY: a registration handle is a pointer into libfabric; calls on it
// are serialized by the endpoint's lock.
unsafe impl Send for RawMr {}
unsafe impl Sync for RawMr {}

impl RawMr {
    pub(crate) fn desc(&self) -> *mut libc::c_void {
        // SAFETY: the handle is open while self exists.
        unsafe { sys::fi_mr_desc(self.0) }
    }

    pub(crate) fn key(&self) -> u64 {
        // SAFETY: as above.
        unsafe { sys::fi_mr_key(self.0) }
    }

    /// Closes the registration (the caller holds the endpoint's lock).
    pub(crate) unsafe fn close(&mut self) {
        if !self.0.is_null() {
            sys::fi_close(&mut (*self.0).fid);
            self.0 = std::ptr::null_mut();
        }
    }
}

/// Where a peer finds registered memory: the address (a virtual address or
/// an offset, as the provider's `FI_MR_VIRT_ADDR` says), key and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRegion {
    pub addr: u64,
    pub key: u64,
    pub len: u64,
}

impl RemoteRegion {
    /// The part of this region from byte `offset` on (None if out of range).
    pub fn offset(&self, offset: u64) -> Option<RemoteRegion> {
        (offset <= self.len).then(|| RemoteRegion {
            addr: self.addr.wrapping_add(offset),
            key: self.key,
            len: self.len - offset,
        })
    }
}

/// What a registration lets peers do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Peers may read it (`fi_read` from them); we may send from it.
    RemoteRead,
    /// Peers may read and write it; we may send from and receive into it.
    RemoteReadWrite,
}

impl Access {
    pub(crate) fn flags(self) -> u64 {
        let local = (sys::FI_SEND | sys::FI_RECV | sys::FI_READ | sys::FI_WRITE) as u64;
        match self {
            Access::RemoteRead => local | sys::FI_REMOTE_READ as u64,
            Access::RemoteReadWrite => local | (sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE) as u64,
        }
    }
}

/// A registered buffer. It owns the buffer, so the memory stays valid as
/// long as peers may access it; dropping it closes the registration.
pub struct MemoryRegion {
    pub(crate) raw: RawMr,
    ptr: *const u8,
    len: usize,
    remote: RemoteRegion,
    ep: Endpoint,
    _owner: Box<dyn Any + Send + Sync>,
}

// SAFETY: the owner is Send + Sync and the handle's calls are serialized.
unsafe impl Send for MemoryRegion {}
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    pub(crate) fn new(
        raw: RawMr,
        ptr: *const u8,
        len: usize,
        remote: RemoteRegion,
        ep: Endpoint,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Self {
        MemoryRegion {
            raw,
            ptr,
            len,
            remote,
            ep,
            _owner: owner,
        }
    }

    /// What a peer needs to access this memory.
    pub fn remote(&self) -> RemoteRegion {
        self.remote
    }

    /// The local descriptor for operations on this memory.
    pub fn desc(&self) -> *mut libc::c_void {
        self.raw.desc()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The registered bytes. A peer may write them concurrently (for a
    /// region registered with [`Access::RemoteReadWrite`]): read them only
    /// after the peer said it is done.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the owner keeps ptr..ptr+len alive for self's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub(crate) fn addr(&self) -> usize {
        self.ptr as usize
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let _g = self.ep.lock();
        // SAFETY: the handle is open and closed once, under the lock.
        unsafe { self.raw.close() };
    }
}

struct Entry {
    mr: Arc<MemoryRegion>,
    last_use: u64,
}

#[derive(Default)]
struct CacheState {
    map: HashMap<(usize, usize), Entry>,
    bytes: usize,
    tick: u64,
}

/// Cache statistics (for tests and metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub entries: usize,
    pub bytes: usize,
}

/// Registrations keyed by `(address, length)`, bounded in entries and
/// bytes (entries in use are never evicted, so the bound is soft).
pub struct MrCache {
    ep: Endpoint,
    access: Access,
    max_entries: usize,
    max_bytes: usize,
    state: Mutex<CacheState>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl MrCache {
    pub fn new(ep: Endpoint, access: Access, max_entries: usize, max_bytes: usize) -> Self {
        MrCache {
            ep,
            access,
            max_entries: max_entries.max(1),
            max_bytes,
            state: Mutex::default(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The registration of `owner`'s bytes: the cached one if the same
    /// memory was registered before, a new one otherwise. The returned
    /// handle keeps the registration alive while a transfer uses it.
    pub fn get<O>(&self, owner: O) -> Result<Arc<MemoryRegion>, OfiError>
    where
        O: AsRef<[u8]> + Send + Sync + 'static,
    {
        let key = {
            let b = owner.as_ref();
            (b.as_ptr() as usize, b.len())
        };
        let mut s = self.state.lock();
        s.tick += 1;
        let tick = s.tick;
        if let Some(e) = s.map.get_mut(&key) {
            e.last_use = tick;
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(e.mr.clone());
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let mr = Arc::new(self.ep.register(owner, self.access)?);
        debug_assert_eq!(mr.addr(), key.0);
        s.bytes += key.1;
        s.map.insert(
            key,
            Entry {
                mr: mr.clone(),
                last_use: tick,
            },
        );
        self.evict(&mut s);
        Ok(mr)
    }

    /// Drops idle entries, oldest first, until within bounds.
    fn evict(&self, s: &mut CacheState) {
        while s.map.len() > self.max_entries || s.bytes > self.max_bytes {
            let victim = s
                .map
                .iter()
                .filter(|(_, e)| Arc::strong_count(&e.mr) == 1)
                .min_by_key(|(_, e)| e.last_use)
                .map(|(k, _)| *k);
            let Some(k) = victim else { return };
            s.map.remove(&k);
            s.bytes -= k.1;
        }
    }

    pub fn stats(&self) -> CacheStats {
        let s = self.state.lock();
        CacheStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: s.map.len(),
            bytes: s.bytes,
        }
    }

    /// Drops every idle entry.
    pub fn clear_idle(&self) {
        let mut s = self.state.lock();
        let idle: Vec<_> = s
            .map
            .iter()
            .filter(|(_, e)| Arc::strong_count(&e.mr) == 1)
            .map(|(k, _)| *k)
            .collect();
        for k in idle {
            s.map.remove(&k);
            s.bytes -= k.1;
        }
    }
}
