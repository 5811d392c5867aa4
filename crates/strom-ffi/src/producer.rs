//! Producers and push futures: events go out in background batches, and
//! each push returns a future that resolves to where the event was stored.

use std::ffi::{c_char, c_void};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strom_client::{Batching, Data, Producer, ProducerOptions, PushFuture};

use crate::driver::{strom_topic, topic_ref};
use crate::status::{
    bytes_arg, guard, out_arg, put, strom_status, Fail, FfiResult, STROM_ERR_INVALID_ARGUMENT,
    STROM_ERR_TIMEOUT, STROM_NOT_READY,
};

/// A producer of one topic. Thread-safe: several threads may push through
/// one producer. Free with `strom_producer_free`, which does not close it.
pub struct strom_producer {
    inner: Producer,
}

/// The outcome of one push. Thread-safe; free with `strom_future_free`
/// (freeing it does not cancel the push).
pub struct strom_future {
    inner: PushFuture,
}

/// Where an acknowledged event was stored.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct strom_event_id {
    pub partition: u32,
    pub offset: u64,
}

/// One piece of an event's data part (the layout of `struct iovec`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct strom_iovec {
    pub base: *const c_void,
    pub len: usize,
}

/// Called once libstrom no longer needs memory the application lent it
/// (with the `user` pointer given alongside). It may run on any thread.
pub type strom_release_fn = Option<unsafe extern "C" fn(user: *mut c_void)>;

/// How a producer batches. Fill with `strom_producer_options_init`.
#[repr(C)]
pub struct strom_producer_options {
    /// Batches per partition sent and not yet acknowledged (0: default, 2).
    pub max_batches: u32,
    /// 0: adaptive batching (default). N: send a batch every N events, or
    /// after `linger_ms`.
    pub batch_events: u32,
    /// How long a partial batch of `batch_events` waits (-1: default, 5 ms).
    pub linger_ms: i64,
    /// The producer's lease: 0 takes the server's default, -1 takes no
    /// lease (the producer stays open until closed, even after this process
    /// exits), other values are milliseconds (clamped to 1 s ..= 300 s).
    pub lease_ms: i64,
}

/// One event to push, with every option. Fill with `strom_push_init`.
/// Everything is borrowed for the duration of the call, except the data
/// when `release` is set.
#[repr(C)]
pub struct strom_push {
    /// The metadata, as text in the topic's serializer (JSON by default).
    pub metadata: *const c_char,
    pub metadata_len: usize,
    /// The data part, as pieces sent back to back (may be NULL if 0).
    pub data: *const strom_iovec,
    pub ndata: usize,
    /// The partition, or -1 to let the topic's partition selector choose.
    pub partition: i64,
    /// An optional descriptor of the data (for example its shape and type).
    pub descriptor: *const u8,
    pub descriptor_len: usize,
    /// NULL: the data is copied before the call returns. Otherwise the data
    /// is NOT copied: the memory must stay valid and unchanged until
    /// libstrom calls `release(release_user)`, once, from any thread.
    pub release: strom_release_fn,
    pub release_user: *mut c_void,
}

/// Fills `opts` with the defaults.
#[no_mangle]
pub unsafe extern "C" fn strom_producer_options_init(
    opts: *mut strom_producer_options,
) -> strom_status {
    guard(|| {
        let opts = out_arg(opts, "opts")?;
        put(
            opts,
            strom_producer_options {
                max_batches: 0,
                batch_events: 0,
                linger_ms: -1,
                lease_ms: 0,
            },
        );
        Ok(())
    })
}

/// Fills `push` for an event with this metadata and no data.
#[no_mangle]
pub unsafe extern "C" fn strom_push_init(
    push: *mut strom_push,
    metadata: *const c_char,
    metadata_len: usize,
) -> strom_status {
    guard(|| {
        let push = out_arg(push, "push")?;
        put(
            push,
            strom_push {
                metadata,
                metadata_len,
                data: std::ptr::null(),
                ndata: 0,
                partition: -1,
                descriptor: std::ptr::null(),
                descriptor_len: 0,
                release: None,
                release_user: std::ptr::null_mut(),
            },
        );
        Ok(())
    })
}

fn to_options(o: &strom_producer_options) -> FfiResult<ProducerOptions> {
    let mut opts = ProducerOptions::default();
    if o.max_batches > 0 {
        opts.max_batches = o.max_batches as usize;
    }
    if o.batch_events > 0 {
        opts.batch = Batching::count(o.batch_events);
    }
    if o.linger_ms >= 0 {
        opts.linger = Duration::from_millis(o.linger_ms as u64);
    }
    opts.lease = match o.lease_ms {
        -1 => None,
        0 => Some(Duration::ZERO),
        ms if ms > 0 => Some(Duration::from_millis(ms as u64)),
        ms => {
            return Err(Fail::new(
                STROM_ERR_INVALID_ARGUMENT,
                format!("lease_ms {ms}: use -1 (no lease), 0 (default) or a positive number"),
            ))
        }
    };
    Ok(opts)
}

/// Opens a producer on `topic`; `opts` may be NULL for the defaults.
#[no_mangle]
pub unsafe extern "C" fn strom_producer_open(
    topic: *const strom_topic,
    opts: *const strom_producer_options,
    out: *mut *mut strom_producer,
) -> strom_status {
    guard(|| {
        let t = topic_ref(topic)?;
        let out = out_arg(out, "out")?;
        let opts = match opts.as_ref() {
            Some(o) => to_options(o)?,
            None => ProducerOptions::default(),
        };
        let p = t.inner.producer_with(opts)?;
        put(out, Box::into_raw(Box::new(strom_producer { inner: p })));
        Ok(())
    })
}

unsafe fn producer_ref<'a>(p: *const strom_producer) -> FfiResult<&'a Producer> {
    p.as_ref()
        .map(|p| &p.inner)
        .ok_or_else(|| Fail::null("producer"))
}

/// Calls the application's release function when the last piece of lent
/// data is dropped.
struct Release {
    f: unsafe extern "C" fn(*mut c_void),
    user: *mut c_void,
}
// SAFETY: the header documents that `release` may run on any thread.
unsafe impl Send for Release {}
unsafe impl Sync for Release {}
impl Drop for Release {
    fn drop(&mut self) {
        unsafe { (self.f)(self.user) }
    }
}

/// One lent piece of data, kept alive (and the application's memory with
/// it) as long as the `Bytes` made from it.
struct Lent {
    ptr: *const u8,
    len: usize,
    _release: Arc<Release>,
}
// SAFETY: the application promised the memory stays valid and unchanged
// until `release` runs, which is after the last `Lent` is dropped.
unsafe impl Send for Lent {}
impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

unsafe fn to_data(p: &strom_push, release: Option<Arc<Release>>) -> FfiResult<Data> {
    let iov = match (p.data.is_null(), p.ndata) {
        (_, 0) => &[][..],
        (true, _) => return Err(Fail::null("data")),
        (false, n) => std::slice::from_raw_parts(p.data, n),
    };
    for (i, v) in iov.iter().enumerate() {
        if v.base.is_null() && v.len > 0 {
            return Err(Fail::null(&format!("data[{i}].base")));
        }
    }
    let parts = match release {
        None => iov
            .iter()
            .filter(|v| v.len > 0)
            .map(|v| Bytes::copy_from_slice(std::slice::from_raw_parts(v.base.cast(), v.len)))
            .collect(),
        // Even with no data, the release runs (when this Arc drops).
        Some(release) => iov
            .iter()
            .filter(|v| v.len > 0)
            .map(|v| {
                Bytes::from_owner(Lent {
                    ptr: v.base.cast(),
                    len: v.len,
                    _release: release.clone(),
                })
            })
            .collect(),
    };
    Ok(Data(parts))
}

/// The application's release call for `args`, armed: it runs when the
/// returned value (or the data made from it) is dropped, also on failure.
unsafe fn arm_release(args: &strom_push) -> Option<Arc<Release>> {
    args.release.map(|f| {
        Arc::new(Release {
            f,
            user: args.release_user,
        })
    })
}

unsafe fn push(
    p: &Producer,
    args: &strom_push,
    release: Option<Arc<Release>>,
    out: *mut *mut strom_future,
) -> FfiResult {
    let data = to_data(args, release)?;
    let meta = bytes_arg(args.metadata.cast(), args.metadata_len, "metadata")?;
    let desc = bytes_arg(args.descriptor, args.descriptor_len, "descriptor")?;
    let partition = match args.partition {
        -1 => None,
        n => Some(u32::try_from(n).map_err(|_| {
            Fail::new(
                STROM_ERR_INVALID_ARGUMENT,
                format!("partition {n}: use -1 or a partition number"),
            )
        })?),
    };
    let fut = p.push_with(Bytes::copy_from_slice(meta), data, partition, desc)?;
    if !out.is_null() {
        put(out, Box::into_raw(Box::new(strom_future { inner: fut })));
    }
    Ok(())
}

/// Pushes one event: `metadata` (text in the topic's serializer, JSON by
/// default) and a data part made of `ndata` pieces, both copied before the
/// call returns. Returns at once unless the partition's in-flight limit is
/// reached. `out` may be NULL when the caller does not want the future
/// (errors then surface at `strom_producer_flush`); otherwise `*out` is a
/// new future to free with `strom_future_free`.
#[no_mangle]
pub unsafe extern "C" fn strom_producer_push(
    producer: *const strom_producer,
    metadata: *const c_char,
    metadata_len: usize,
    data: *const strom_iovec,
    ndata: usize,
    out: *mut *mut strom_future,
) -> strom_status {
    guard(|| {
        let p = producer_ref(producer)?;
        let args = strom_push {
            metadata,
            metadata_len,
            data,
            ndata,
            partition: -1,
            descriptor: std::ptr::null(),
            descriptor_len: 0,
            release: None,
            release_user: std::ptr::null_mut(),
        };
        push(p, &args, None, out)
    })
}

/// Pushes one event described by `push` (explicit partition, descriptor,
/// data lent without a copy). `out` as for `strom_producer_push`. If the
/// call fails and `push->release` is set, `release` has already run
/// (unless `push` itself is NULL).
#[no_mangle]
pub unsafe extern "C" fn strom_producer_push_ex(
    producer: *const strom_producer,
    push: *const strom_push,
    out: *mut *mut strom_future,
) -> strom_status {
    guard(|| {
        let args = push.as_ref().ok_or_else(|| Fail::null("push"))?;
        let release = arm_release(args);
        let p = producer_ref(producer)?;
        self::push(p, args, release, out)
    })
}

/// Sends every pending event and waits until all are acknowledged; returns
/// the first error any batch met since the last flush.
#[no_mangle]
pub unsafe extern "C" fn strom_producer_flush(producer: *const strom_producer) -> strom_status {
    guard(|| Ok(producer_ref(producer)?.flush()?))
}

/// Flushes, then closes this producer's part of the stream: once every
/// producer of the topic has closed, consumers reach the end of the stream.
/// Later pushes fail with `STROM_ERR_CLOSED`. The handle must still be freed.
#[no_mangle]
pub unsafe extern "C" fn strom_producer_close(producer: *const strom_producer) -> strom_status {
    guard(|| Ok(producer_ref(producer)?.close()?))
}

/// The producer's id in the topic's stream.
#[no_mangle]
pub unsafe extern "C" fn strom_producer_id(producer: *const strom_producer) -> u64 {
    producer.as_ref().map_or(0, |p| p.inner.id())
}

/// Frees a producer handle (NULL is a no-op). Pending events are still
/// sent, but the producer is not closed: call `strom_producer_close` first
/// to end its part of the stream.
#[no_mangle]
pub unsafe extern "C" fn strom_producer_free(producer: *mut strom_producer) {
    if !producer.is_null() {
        guard(|| {
            drop(Box::from_raw(producer));
            Ok(())
        });
    }
}

pub(crate) unsafe fn future_ref<'a>(f: *const strom_future) -> FfiResult<&'a PushFuture> {
    f.as_ref()
        .map(|f| &f.inner)
        .ok_or_else(|| Fail::null("future"))
}

/// Waits until the event is acknowledged; `out` (may be NULL) receives
/// where it was stored. The future stays valid: waiting again returns the
/// same answer.
#[no_mangle]
pub unsafe extern "C" fn strom_future_wait(
    future: *const strom_future,
    out: *mut strom_event_id,
) -> strom_status {
    strom_future_wait_timeout(future, -1, out)
}

/// Like `strom_future_wait`, for at most `timeout_ms` (-1: no limit);
/// `STROM_ERR_TIMEOUT` if it is not acknowledged by then.
#[no_mangle]
pub unsafe extern "C" fn strom_future_wait_timeout(
    future: *const strom_future,
    timeout_ms: i64,
    out: *mut strom_event_id,
) -> strom_status {
    guard(|| {
        let f = future_ref(future)?;
        let limit = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
        let id = f.wait_timeout(limit).map_err(|e| match e {
            strom_client::Error::Timeout(t) => {
                Fail::new(STROM_ERR_TIMEOUT, format!("not acknowledged after {t:?}"))
            }
            e => e.into(),
        })?;
        if !out.is_null() {
            put(
                out,
                strom_event_id {
                    partition: id.partition,
                    offset: id.offset,
                },
            );
        }
        Ok(())
    })
}

/// Sets `*done` to 1 if the push has an outcome (`strom_future_wait` then
/// returns at once), else 0. Never blocks.
#[no_mangle]
pub unsafe extern "C" fn strom_future_test(
    future: *const strom_future,
    done: *mut i32,
) -> strom_status {
    guard(|| {
        let f = future_ref(future)?;
        let done = out_arg(done, "done")?;
        put(done, i32::from(f.is_done()));
        Ok(())
    })
}

/// The push's outcome without blocking: `STROM_NOT_READY` while it has
/// none, else what `strom_future_wait` returns (with `*out` filled).
#[no_mangle]
pub unsafe extern "C" fn strom_future_get(
    future: *const strom_future,
    out: *mut strom_event_id,
) -> strom_status {
    match future.as_ref() {
        Some(f) if !f.inner.is_done() => STROM_NOT_READY,
        _ => strom_future_wait_timeout(future, -1, out),
    }
}

/// Frees a future (NULL is a no-op); the push goes on.
#[no_mangle]
pub unsafe extern "C" fn strom_future_free(future: *mut strom_future) {
    if !future.is_null() {
        guard(|| {
            drop(Box::from_raw(future));
            Ok(())
        });
    }
}
