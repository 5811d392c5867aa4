//! Consumed events in C: their metadata and fetched data, and acks.

use std::ffi::{c_char, c_void};
use std::time::Duration;

use strom_client::Event;

use crate::data::{meta_view, strom_event_meta};
use crate::status::{guard, out_arg, put, strom_status, Fail, FfiResult};

/// One consumed event. It owns its metadata and fetched data, borrows
/// nothing from its consumer (it may outlive it), and may be read from
/// several threads. Free with `strom_event_free`.
pub struct strom_event {
    inner: Event,
}

// SAFETY: an event's data buffers are libstrom's own `Vec<u8>`s or a C
// broker's memory; reading them through `&` from several threads at once
// is sound (the header says the broker's memory must stay valid and is
// written only by libstrom before the event is returned).
unsafe impl Sync for strom_event {}

pub(crate) fn new_event(e: Event) -> *mut strom_event {
    Box::into_raw(Box::new(strom_event { inner: e }))
}

unsafe fn event_ref<'a>(e: *const strom_event) -> FfiResult<&'a Event> {
    e.as_ref()
        .map(|e| &e.inner)
        .ok_or_else(|| Fail::null("event"))
}

/// Fills `*out` with the event's partition, offset, timestamp, metadata,
/// data size and descriptor. The pointers are borrowed until the event is
/// freed.
#[no_mangle]
pub unsafe extern "C" fn strom_event_info(
    event: *const strom_event,
    out: *mut strom_event_meta,
) -> strom_status {
    guard(|| {
        let e = event_ref(event)?;
        let out = out_arg(out, "out")?;
        put(out, meta_view(e.meta(), e.data_size(), e.descriptor()));
        Ok(())
    })
}

/// The event's metadata (JSON text with the default serializer, not
/// NUL-terminated); `*len` receives its length. Borrowed until the event
/// is freed. NULL if `event` is NULL.
#[no_mangle]
pub unsafe extern "C" fn strom_event_metadata(
    event: *const strom_event,
    len: *mut usize,
) -> *const c_char {
    let (p, n) = match event.as_ref() {
        Some(e) => (e.inner.raw().as_ptr().cast(), e.inner.raw().len()),
        None => (std::ptr::null(), 0),
    };
    if !len.is_null() {
        put(len, n);
    }
    p
}

/// Bytes of data fetched for this event (the selected part).
#[no_mangle]
pub unsafe extern "C" fn strom_event_fetched_len(event: *const strom_event) -> u64 {
    event.as_ref().map_or(0, |e| e.inner.fetched_len())
}

/// The fetched data when it is in one buffer (always the case without a
/// broker); `*len` receives its length. Borrowed until the event is freed.
/// NULL with `*len` 0 when nothing was fetched or a broker gave several
/// buffers (read those directly, or use `strom_event_copy_data`). The
/// bytes have no particular alignment: `memcpy` them into typed values, or
/// give a broker whose buffers are aligned as the data needs.
#[no_mangle]
pub unsafe extern "C" fn strom_event_data(event: *const strom_event, len: *mut usize) -> *const u8 {
    let data = event.as_ref().map_or(&[][..], |e| e.inner.data());
    if !len.is_null() {
        put(len, data.len());
    }
    if data.is_empty() {
        std::ptr::null()
    } else {
        data.as_ptr()
    }
}

/// Copies the fetched data (all buffers, in order) into `dst`, up to `cap`
/// bytes; `*copied` receives the bytes copied. `STROM_ERR_INVALID_ARGUMENT`
/// if `cap` is smaller than `strom_event_fetched_len` (nothing is copied).
#[no_mangle]
pub unsafe extern "C" fn strom_event_copy_data(
    event: *const strom_event,
    dst: *mut c_void,
    cap: usize,
    copied: *mut usize,
) -> strom_status {
    guard(|| {
        let e = event_ref(event)?;
        let need = e.fetched_len();
        if (cap as u64) < need {
            return Err(Fail::new(
                crate::status::STROM_ERR_INVALID_ARGUMENT,
                format!("the event has {need} bytes of data; the destination holds {cap}"),
            ));
        }
        let mut at = 0usize;
        let mut left = need as usize;
        if left > 0 {
            out_arg(dst, "dst")?;
        }
        for b in e.buffers() {
            let n = left.min(b.as_slice().len());
            std::ptr::copy_nonoverlapping(b.as_slice().as_ptr(), dst.cast::<u8>().add(at), n);
            at += n;
            left -= n;
        }
        if !copied.is_null() {
            put(copied, at);
        }
        Ok(())
    })
}

/// Acks the event: for a named consumer this covers every earlier event of
/// its partition too. Returns at once; the ack is persisted in the
/// background (use `strom_event_ack_sync` to wait for it).
#[no_mangle]
pub unsafe extern "C" fn strom_event_ack(event: *const strom_event) -> strom_status {
    guard(|| {
        drop(event_ref(event)?.ack());
        Ok(())
    })
}

/// Acks the event and waits up to `timeout_ms` (-1: no limit) until the
/// server has persisted the ack.
#[no_mangle]
pub unsafe extern "C" fn strom_event_ack_sync(
    event: *const strom_event,
    timeout_ms: i64,
) -> strom_status {
    guard(|| {
        let limit = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
        event_ref(event)?.ack().wait_timeout(limit)?;
        Ok(())
    })
}

/// Acks the event once every one of the `n` futures (the pushes of its
/// results) is stored, and returns at once; the futures may be freed
/// right after. With `n` 0 it acks now. If a push fails the event is not
/// acked (in a shared group it is given back for another delivery).
#[no_mangle]
pub unsafe extern "C" fn strom_event_ack_when(
    event: *const strom_event,
    futures: *const *const crate::producer::strom_future,
    n: usize,
) -> strom_status {
    guard(|| {
        let ev = event_ref(event)?;
        let ptrs: &[*const crate::producer::strom_future] = match (futures.is_null(), n) {
            (_, 0) => &[],
            (true, _) => return Err(Fail::null("futures")),
            (false, _) => std::slice::from_raw_parts(futures, n),
        };
        let futs = ptrs
            .iter()
            .map(|f| crate::producer::future_ref(*f))
            .collect::<FfiResult<Vec<_>>>()?;
        ev.ack_when(futs);
        Ok(())
    })
}

/// Shared consumer groups: gives the event back for another delivery now.
#[no_mangle]
pub unsafe extern "C" fn strom_event_nack(event: *const strom_event) -> strom_status {
    guard(|| {
        drop(event_ref(event)?.nack());
        Ok(())
    })
}

/// Frees an event (NULL is a no-op); a broker's buffers are released.
#[no_mangle]
pub unsafe extern "C" fn strom_event_free(event: *mut strom_event) {
    if !event.is_null() {
        guard(|| {
            drop(Box::from_raw(event));
            Ok(())
        });
    }
}
