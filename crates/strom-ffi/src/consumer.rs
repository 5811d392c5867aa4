//! Consumers: named readers of a topic (or members of a consumer group)
//! with pull, seek, the `process` callbacks, and persistent acks.

use std::ffi::{c_char, c_void};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use strom_client::select::Selector;
use strom_client::{
    Consumer, ConsumerGroupMode, ConsumerOptions, Error, GroupOptions, Next, StartPos,
};

use crate::data::{
    strom_broker_fn, strom_buffer_release_fn, strom_selector_fn, CBroker, CSelector,
};
use crate::driver::{strom_topic, topic_ref};
use crate::event::{new_event, strom_event};
use crate::status::{
    guard, opt_str_arg, out_arg, put, str_arg, strom_status, Fail, FfiResult, STROM_END_OF_STREAM,
    STROM_ERR_CALLBACK, STROM_ERR_INVALID_ARGUMENT, STROM_ERR_TIMEOUT, STROM_OK,
};

/// A consumer. Thread-safe: several threads may pull from one consumer
/// (each event goes to one of them). Free with `strom_consumer_free`.
pub struct strom_consumer {
    inner: Consumer,
}

/// Start after the consumer name's last ack (the beginning if none).
pub const STROM_START_COMMITTED: u32 = 0;
pub const STROM_START_BEGINNING: u32 = 1;
pub const STROM_START_END: u32 = 2;
/// Start at offset `start_value` of every partition.
pub const STROM_START_OFFSET: u32 = 3;
/// Start at the first event at or after `start_value` µs since the epoch.
pub const STROM_START_TIMESTAMP: u32 = 4;

/// How a consumer reads. Fill with `strom_consumer_options_init`. Every
/// pointer is borrowed for the duration of `strom_consumer_open`, except
/// the `*_user` pointers, which must stay valid as long as the consumer.
#[repr(C)]
pub struct strom_consumer_options {
    /// Partitions to read (NULL: all, including ones added later).
    pub partitions: *const u32,
    pub npartitions: usize,
    /// Events per partition the server may push ahead of demand (0: default).
    pub prefetch: u32,
    /// Bytes of fetched data held for events not pulled yet (0: default).
    pub prefetch_bytes: u64,
    /// `STROM_START_*`, with `start_value` for OFFSET and TIMESTAMP.
    pub start: u32,
    pub start_value: u64,
    /// A built-in data selector in the textual form of `strom consume
    /// --select` (`"all"`, `"none"`, `"bytes[0:64]"`, `"kind == signal"`,
    /// `"step >= 10 then bytes[0:8]"`). It runs inside libstrom, never
    /// crossing the ABI. NULL: all the data.
    pub select: *const c_char,
    /// A selector callback instead of `select`.
    pub selector: strom_selector_fn,
    pub selector_user: *mut c_void,
    /// Where fetched data lands (NULL: buffers libstrom allocates).
    pub broker: strom_broker_fn,
    pub broker_release: strom_buffer_release_fn,
    pub broker_user: *mut c_void,
    /// Join this consumer group instead of reading as a named consumer
    /// (the name then labels the member). NULL: no group.
    pub group: *const c_char,
    /// `"partitioned"` (default: members split the partitions) or
    /// `"shared"` (any member may get any event; acks are per event).
    pub group_mode: *const c_char,
}

/// The `process` callbacks. `on_start` runs once, `on_event` for every
/// event until the end of the stream, then `on_end` once, all on the thread
/// that called `strom_consumer_process`. The event passed to `on_event` is
/// borrowed for the duration of the call (ack it there); a non-zero return
/// stops processing with `STROM_ERR_CALLBACK`. NULL callbacks are skipped.
#[repr(C)]
pub struct strom_process_callbacks {
    pub on_start: Option<unsafe extern "C" fn(user: *mut c_void)>,
    pub on_event:
        Option<unsafe extern "C" fn(user: *mut c_void, event: *mut strom_event) -> strom_status>,
    pub on_end: Option<unsafe extern "C" fn(user: *mut c_void)>,
}

/// Fills `opts` with the defaults.
#[no_mangle]
pub unsafe extern "C" fn strom_consumer_options_init(
    opts: *mut strom_consumer_options,
) -> strom_status {
    guard(|| {
        let opts = out_arg(opts, "opts")?;
        put(
            opts,
            strom_consumer_options {
                partitions: std::ptr::null(),
                npartitions: 0,
                prefetch: 0,
                prefetch_bytes: 0,
                start: STROM_START_COMMITTED,
                start_value: 0,
                select: std::ptr::null(),
                selector: None,
                selector_user: std::ptr::null_mut(),
                broker: None,
                broker_release: None,
                broker_user: std::ptr::null_mut(),
                group: std::ptr::null(),
                group_mode: std::ptr::null(),
            },
        );
        Ok(())
    })
}

fn to_start(kind: u32, value: u64) -> FfiResult<StartPos> {
    Ok(match kind {
        STROM_START_COMMITTED => StartPos::Committed,
        STROM_START_BEGINNING => StartPos::Beginning,
        STROM_START_END => StartPos::End,
        STROM_START_OFFSET => StartPos::Offset(value),
        STROM_START_TIMESTAMP => StartPos::Timestamp(value),
        k => {
            return Err(Fail::new(
                STROM_ERR_INVALID_ARGUMENT,
                format!("start {k} is not a STROM_START_* value"),
            ))
        }
    })
}

unsafe fn to_options(o: &strom_consumer_options) -> FfiResult<ConsumerOptions> {
    let bad = |m: String| Fail::new(STROM_ERR_INVALID_ARGUMENT, m);
    let mut opts = ConsumerOptions::default();
    if !o.partitions.is_null() {
        opts.partitions = Some(std::slice::from_raw_parts(o.partitions, o.npartitions).to_vec());
    } else if o.npartitions > 0 {
        return Err(Fail::null("partitions"));
    }
    if o.prefetch > 0 {
        opts.prefetch = o.prefetch;
    }
    if o.prefetch_bytes > 0 {
        opts.prefetch_bytes = o.prefetch_bytes;
    }
    opts.start = to_start(o.start, o.start_value)?;
    if let Some(f) = o.selector {
        opts.selector = Arc::new(CSelector {
            f,
            user: o.selector_user,
        });
    } else if let Some(text) = opt_str_arg(o.select, "select")? {
        opts.selector = Arc::new(Selector::from_str(text).map_err(|e| bad(e.to_string()))?);
    }
    if let Some(f) = o.broker {
        opts.broker = Arc::new(CBroker {
            f,
            release: o.broker_release,
            user: o.broker_user,
        });
    }
    Ok(opts)
}

unsafe fn open(
    t: &strom_topic,
    name: &str,
    o: Option<&strom_consumer_options>,
) -> FfiResult<Consumer> {
    let Some(o) = o else {
        return Ok(t.inner.consumer(name)?);
    };
    let copts = to_options(o)?;
    let Some(group) = opt_str_arg(o.group, "group")? else {
        return Ok(t.inner.consumer_with(name, copts)?);
    };
    let mode = match opt_str_arg(o.group_mode, "group_mode")? {
        Some(m) => {
            ConsumerGroupMode::from_str(m).map_err(|e| Fail::new(STROM_ERR_INVALID_ARGUMENT, e))?
        }
        None => ConsumerGroupMode::Partitioned,
    };
    let mut g = GroupOptions {
        mode,
        label: Some(name.to_string()),
        ..Default::default()
    };
    if o.start != STROM_START_COMMITTED {
        g.start = to_start(o.start, o.start_value)?;
    }
    let prefetch = if o.prefetch > 0 {
        copts.prefetch
    } else {
        g.consumer.prefetch
    };
    g.consumer = ConsumerOptions { prefetch, ..copts };
    Ok(t.inner.consumer_group(group, g)?)
}

/// Opens consumer `name` on `topic` (its acks persist under that name);
/// `opts` may be NULL for the defaults.
#[no_mangle]
pub unsafe extern "C" fn strom_consumer_open(
    topic: *const strom_topic,
    name: *const c_char,
    opts: *const strom_consumer_options,
    out: *mut *mut strom_consumer,
) -> strom_status {
    guard(|| {
        let t = topic_ref(topic)?;
        let name = str_arg(name, "name")?;
        let out = out_arg(out, "out")?;
        let c = open(t, name, opts.as_ref())?;
        put(out, Box::into_raw(Box::new(strom_consumer { inner: c })));
        Ok(())
    })
}

unsafe fn consumer_ref<'a>(c: *const strom_consumer) -> FfiResult<&'a Consumer> {
    c.as_ref()
        .map(|c| &c.inner)
        .ok_or_else(|| Fail::null("consumer"))
}

fn pull(c: &Consumer, timeout_ms: i64) -> FfiResult<Option<strom_client::Event>> {
    let next = if timeout_ms < 0 {
        c.pull().wait()
    } else {
        c.pull_timeout(Duration::from_millis(timeout_ms as u64))
    };
    match next {
        Ok(Next::Event(e)) => Ok(Some(e)),
        Ok(Next::EndOfStream) => Ok(None),
        Err(Error::Timeout(t)) => Err(Fail::new(
            STROM_ERR_TIMEOUT,
            format!("no event within {t:?}"),
        )),
        Err(e) => Err(e.into()),
    }
}

/// Waits up to `timeout_ms` (-1: no limit) for the next event. Returns
/// `STROM_OK` with `*out` a new event (free it with `strom_event_free`),
/// `STROM_END_OF_STREAM` once every producer has closed and every event
/// was returned (then `*out` is NULL), or an error: `STROM_ERR_TIMEOUT`,
/// or a gap (`STROM_ERR_DATA_EXPIRED`, `STROM_ERR_DATA_CORRUPT`) after
/// which the consumer carries on.
#[no_mangle]
pub unsafe extern "C" fn strom_consumer_pull(
    consumer: *const strom_consumer,
    timeout_ms: i64,
    out: *mut *mut strom_event,
) -> strom_status {
    let mut end = false;
    let status = guard(|| {
        let c = consumer_ref(consumer)?;
        let out = out_arg(out, "out")?;
        put(out, std::ptr::null_mut());
        match pull(c, timeout_ms)? {
            Some(e) => put(out, new_event(e)),
            None => end = true,
        }
        Ok(())
    });
    if status == STROM_OK && end {
        STROM_END_OF_STREAM
    } else {
        status
    }
}

/// Moves every partition to `start` (`STROM_START_*`, with `value` for
/// OFFSET and TIMESTAMP). Events queued and not pulled yet are dropped.
#[no_mangle]
pub unsafe extern "C" fn strom_consumer_seek(
    consumer: *const strom_consumer,
    start: u32,
    value: u64,
) -> strom_status {
    guard(|| Ok(consumer_ref(consumer)?.seek(to_start(start, value)?)?))
}

/// Runs the MPI-stream loop on this thread: `on_start`, `on_event` for
/// every event until the end of the stream, then `on_end`. Returns
/// `STROM_OK` after `on_end`, or the first error (then `on_end` does not run).
#[no_mangle]
pub unsafe extern "C" fn strom_consumer_process(
    consumer: *const strom_consumer,
    callbacks: *const strom_process_callbacks,
    user: *mut c_void,
) -> strom_status {
    guard(|| {
        let c = consumer_ref(consumer)?;
        let cb = callbacks.as_ref().ok_or_else(|| Fail::null("callbacks"))?;
        if let Some(f) = cb.on_start {
            f(user);
        }
        while let Some(e) = pull(c, -1)? {
            let Some(f) = cb.on_event else { continue };
            let ev = new_event(e);
            let status = f(user, ev);
            crate::event::strom_event_free(ev);
            if status != STROM_OK {
                return Err(Fail::new(
                    STROM_ERR_CALLBACK,
                    format!("on_event returned {status}; processing stopped"),
                ));
            }
        }
        if let Some(f) = cb.on_end {
            f(user);
        }
        Ok(())
    })
}

/// The partitions this consumer reads now (for a partitioned group's
/// member, its current assignment): writes up to `cap` of them to `out`
/// and their count to `*n` (which may exceed `cap`).
#[no_mangle]
pub unsafe extern "C" fn strom_consumer_assignment(
    consumer: *const strom_consumer,
    out: *mut u32,
    cap: usize,
    n: *mut usize,
) -> strom_status {
    guard(|| {
        let c = consumer_ref(consumer)?;
        let n = out_arg(n, "n")?;
        let parts = c.assignment();
        if cap > 0 {
            let out = out_arg(out, "out")?;
            for (i, p) in parts.iter().take(cap).enumerate() {
                out.add(i).write(*p);
            }
        }
        put(n, parts.len());
        Ok(())
    })
}

/// Frees a consumer (NULL is a no-op): its subscriptions stop, and acks
/// already made are still committed. Events pulled from it stay valid.
#[no_mangle]
pub unsafe extern "C" fn strom_consumer_free(consumer: *mut strom_consumer) {
    if !consumer.is_null() {
        guard(|| {
            drop(Box::from_raw(consumer));
            Ok(())
        });
    }
}
