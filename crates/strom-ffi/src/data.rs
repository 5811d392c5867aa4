//! The consumer's data path in C: selections, the selector and broker
//! callbacks, and the trampolines that turn them into the client's
//! [`DataSelector`] and [`DataBroker`].

use std::any::Any;
use std::ffi::{c_char, c_void};

use strom_client::{DataBroker, DataBuffer, DataDescriptor, DataSelector, EventMeta, Selection};

use crate::status::{strom_status, STROM_OK};

/// Fetch nothing of the data (metadata only).
pub const STROM_SELECT_NONE: u32 = 0;
/// Fetch the whole data part.
pub const STROM_SELECT_ALL: u32 = 1;
/// One range: `len` bytes at `offset`.
pub const STROM_SELECT_RANGE: u32 = 2;
/// `count` blocks of `len` bytes, starting at `offset`, `stride` apart.
pub const STROM_SELECT_STRIDED: u32 = 3;
/// A list of ranges (only reported to brokers; selectors cannot return it).
pub const STROM_SELECT_RANGES: u32 = 4;

/// Most buffers one broker call may provide for an event.
pub const STROM_MAX_BUFFERS: usize = 16;

/// Which bytes of an event's data to fetch.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct strom_selection {
    /// `STROM_SELECT_*`.
    pub kind: u32,
    pub offset: u64,
    /// RANGE: the range's length; STRIDED: each block's length.
    pub len: u64,
    pub stride: u64,
    pub count: u64,
}

/// What a selector or broker knows of an event. Every pointer is borrowed
/// for the duration of the callback.
#[repr(C)]
pub struct strom_event_meta {
    pub partition: u32,
    pub offset: u64,
    /// Microseconds since the UNIX epoch, assigned by the server.
    pub timestamp_us: u64,
    /// The metadata as stored (JSON text with the default serializer).
    pub metadata: *const c_char,
    pub metadata_len: usize,
    /// Size of the whole data part (`UINT64_MAX` in broker callbacks,
    /// which get the selected length instead).
    pub data_size: u64,
    /// The producer's data descriptor (empty in broker callbacks).
    pub descriptor: *const u8,
    pub descriptor_len: usize,
}

/// Chooses which bytes of an event's data to fetch by filling `*out`
/// (which starts as `STROM_SELECT_ALL`). A non-zero return refuses the
/// event: the pull fails with `STROM_ERR_DATA_SELECTOR`. Runs on one of
/// libstrom's threads, possibly several at once: it must be thread-safe
/// and must not call blocking `strom_*` functions.
pub type strom_selector_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        meta: *const strom_event_meta,
        out: *mut strom_selection,
    ) -> strom_status,
>;

/// Memory that fetched data lands in.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct strom_buffer {
    pub base: *mut c_void,
    pub len: usize,
    /// Given back to the broker's `release` when the event is freed.
    pub token: *mut c_void,
}

/// Provides destination buffers for `len` selected bytes of an event:
/// fill up to `max_bufs` entries of `bufs` (at least `len` bytes in all,
/// filled in order) and set `*nbufs`. The memory must stay valid until the
/// broker's `release` is called for it (when the event is freed). A
/// non-zero return fails the pull with `STROM_ERR_DATA_BROKER`. Runs on
/// libstrom's threads, like a selector.
pub type strom_broker_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        meta: *const strom_event_meta,
        selection: *const strom_selection,
        len: u64,
        bufs: *mut strom_buffer,
        max_bufs: usize,
        nbufs: *mut usize,
    ) -> strom_status,
>;

/// Called once for each buffer a broker provided, when libstrom is done
/// with it (its event was freed, or the fetch failed). Any thread.
pub type strom_buffer_release_fn =
    Option<unsafe extern "C" fn(user: *mut c_void, buffer: *const strom_buffer)>;

pub(crate) fn to_c_selection(s: &Selection) -> strom_selection {
    let mut c = strom_selection::default();
    match *s {
        Selection::None => c.kind = STROM_SELECT_NONE,
        Selection::All => c.kind = STROM_SELECT_ALL,
        Selection::Range { offset, len } => {
            (c.kind, c.offset, c.len) = (STROM_SELECT_RANGE, offset, len);
        }
        Selection::Strided {
            offset,
            block,
            stride,
            count,
        } => {
            (c.kind, c.offset, c.len) = (STROM_SELECT_STRIDED, offset, block);
            (c.stride, c.count) = (stride, count);
        }
        Selection::Ranges(_) => c.kind = STROM_SELECT_RANGES,
    }
    c
}

pub(crate) fn from_c_selection(c: &strom_selection) -> Result<Selection, String> {
    Ok(match c.kind {
        STROM_SELECT_NONE => Selection::None,
        STROM_SELECT_ALL => Selection::All,
        STROM_SELECT_RANGE => Selection::Range {
            offset: c.offset,
            len: c.len,
        },
        STROM_SELECT_STRIDED => Selection::Strided {
            offset: c.offset,
            block: c.len,
            stride: c.stride,
            count: c.count,
        },
        k => {
            return Err(format!(
                "selection kind {k} is not one a selector may return"
            ))
        }
    })
}

pub(crate) fn meta_view(m: &EventMeta, data_size: u64, descriptor: &[u8]) -> strom_event_meta {
    strom_event_meta {
        partition: m.partition,
        offset: m.offset,
        timestamp_us: m.timestamp_us,
        metadata: m.raw().as_ptr().cast(),
        metadata_len: m.raw().len(),
        data_size,
        descriptor: descriptor.as_ptr(),
        descriptor_len: descriptor.len(),
    }
}

/// A C selector function and its `user` pointer.
pub(crate) struct CSelector {
    pub f: unsafe extern "C" fn(*mut c_void, *const strom_event_meta, *mut strom_selection) -> i32,
    pub user: *mut c_void,
}
// SAFETY: the header requires selectors to be thread-safe.
unsafe impl Send for CSelector {}
unsafe impl Sync for CSelector {}

impl DataSelector for CSelector {
    fn select(&self, meta: &EventMeta, data: &DataDescriptor) -> Selection {
        self.try_select(meta, data).unwrap_or(Selection::None)
    }

    fn try_select(&self, meta: &EventMeta, data: &DataDescriptor) -> Result<Selection, String> {
        let view = meta_view(meta, data.size, &data.descriptor);
        let mut out = strom_selection {
            kind: STROM_SELECT_ALL,
            ..Default::default()
        };
        let status = unsafe { (self.f)(self.user, &view, &mut out) };
        if status != STROM_OK {
            return Err(format!(
                "the selector refused event {}/{} with status {status}",
                meta.partition, meta.offset
            ));
        }
        from_c_selection(&out)
    }
}

/// A C broker function, its release function and their `user` pointer.
pub(crate) struct CBroker {
    pub f: unsafe extern "C" fn(
        *mut c_void,
        *const strom_event_meta,
        *const strom_selection,
        u64,
        *mut strom_buffer,
        usize,
        *mut usize,
    ) -> i32,
    pub release: strom_buffer_release_fn,
    pub user: *mut c_void,
}
// SAFETY: the header requires brokers to be thread-safe.
unsafe impl Send for CBroker {}
unsafe impl Sync for CBroker {}

impl DataBroker for CBroker {
    fn buffers(
        &self,
        meta: &EventMeta,
        selection: &Selection,
        len: u64,
    ) -> Result<Vec<Box<dyn DataBuffer>>, String> {
        let view = meta_view(meta, u64::MAX, &[]);
        let sel = to_c_selection(selection);
        let empty = strom_buffer {
            base: std::ptr::null_mut(),
            len: 0,
            token: std::ptr::null_mut(),
        };
        let mut bufs = [empty; STROM_MAX_BUFFERS];
        let mut n = 0usize;
        let status = unsafe {
            (self.f)(
                self.user,
                &view,
                &sel,
                len,
                bufs.as_mut_ptr(),
                bufs.len(),
                &mut n,
            )
        };
        // Whatever the broker handed out is released, also on failure.
        let given = &bufs[..n.min(STROM_MAX_BUFFERS)];
        let owned: Vec<Box<dyn DataBuffer>> = given
            .iter()
            .map(|b| {
                Box::new(CBuffer {
                    buf: *b,
                    release: self.release,
                    user: self.user,
                }) as Box<dyn DataBuffer>
            })
            .collect();
        if status != STROM_OK {
            return Err(format!("the broker failed with status {status}"));
        }
        if n > STROM_MAX_BUFFERS {
            return Err(format!(
                "the broker gave {n} buffers; at most {STROM_MAX_BUFFERS} fit"
            ));
        }
        if let Some(i) = given.iter().position(|b| b.base.is_null() && b.len > 0) {
            return Err(format!("buffer {i} has a NULL base"));
        }
        Ok(owned)
    }
}

/// A buffer a C broker provided; released back to it when dropped.
pub(crate) struct CBuffer {
    buf: strom_buffer,
    release: strom_buffer_release_fn,
    user: *mut c_void,
}
// SAFETY: the header requires the memory to stay valid until released, and
// release functions to be callable from any thread.
unsafe impl Send for CBuffer {}

impl DataBuffer for CBuffer {
    fn as_slice(&self) -> &[u8] {
        if self.buf.base.is_null() {
            return &[];
        }
        unsafe { std::slice::from_raw_parts(self.buf.base.cast(), self.buf.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.buf.base.is_null() {
            return &mut [];
        }
        unsafe { std::slice::from_raw_parts_mut(self.buf.base.cast(), self.buf.len) }
    }
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

impl Drop for CBuffer {
    fn drop(&mut self) {
        if let Some(f) = self.release {
            unsafe { f(self.user, &self.buf) }
        }
    }
}
