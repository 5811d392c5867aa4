//! Posting and progress: operation contexts, the retry-on-`FI_EAGAIN` post
//! loop, the receive buffer pool and the progress thread that reads the
//! completion queue and finishes operations.
//!
//! A context is a boxed [`OpCtx`] whose first field is the provider's
//! `fi_context2`, so the pointer libfabric hands back in a completion is
//! the box. Receive contexts live as long as the endpoint and are reposted
//! after each message; every other context is freed when its completion is
//! read (or when its post fails).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::completion::Completer;
use crate::endpoint::Inner;
use crate::mr::{Access, RawMr};
use crate::{sys, OfiError};

/// How long a post may keep getting `FI_EAGAIN` before it fails.
const POST_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle rounds the progress thread only yields before it starts parking.
const SPIN_ROUNDS: u32 = 200;
/// Longest the progress thread parks when idle.
const MAX_PARK: Duration = Duration::from_millis(1);
const EAGAIN: isize = -(sys::FI_EAGAIN as isize);

/// What finishes an operation.
pub(crate) enum Op {
    /// Posted receive buffer `i` (never freed by a completion).
    Recv(usize),
    Send {
        done: Done,
        buf: SendBuf,
    },
    Rma {
        name: &'static str,
        done: Completer,
        /// A registration made for this transfer only (`FI_MR_LOCAL`).
        mr: Option<RawMr>,
        /// A destination the operation owns, and where to hand it back.
        owned: Option<(Vec<u8>, Slot)>,
    },
}

/// Who learns that a send finished.
pub(crate) enum Done {
    Completion(Completer),
    Callback(Box<dyn FnOnce(Result<usize, OfiError>) + Send>),
}

impl Done {
    fn complete(self, r: Result<usize, OfiError>) {
        match self {
            Done::Completion(c) => c.complete(r),
            Done::Callback(f) => f(r),
        }
    }
}

/// Where an owned destination goes when its read completes.
pub(crate) type Slot = std::sync::Arc<parking_lot::Mutex<Option<Vec<u8>>>>;

#[repr(C)]
pub(crate) struct OpCtx {
    fi: sys::fi_context2,
    op: Op,
}

impl OpCtx {
    pub(crate) fn new(op: Op) -> *mut OpCtx {
        Box::into_raw(Box::new(OpCtx {
            fi: sys::fi_context2::default(),
            op,
        }))
    }
}

/// The libfabric call a post makes.
pub(crate) enum Call {
    Send {
        buf: *const u8,
        len: usize,
        desc: *mut libc::c_void,
        peer: u64,
    },
    Rma {
        write: bool,
        buf: *mut u8,
        len: usize,
        desc: *mut libc::c_void,
        peer: u64,
        addr: u64,
        key: u64,
    },
}

/// A call and its context, until libfabric accepts it.
pub(crate) struct Post {
    pub(crate) call: Call,
    pub(crate) ctx: *mut OpCtx,
}

// SAFETY: the pointers are buffers and a context owned by the operation;
// they are only passed to libfabric under the endpoint's lock.
unsafe impl Send for Post {}

impl Post {
    fn name(&self) -> &'static str {
        match self.call {
            Call::Send { .. } => "fi_send",
            Call::Rma { write: false, .. } => "fi_read",
            Call::Rma { write: true, .. } => "fi_writemsg",
        }
    }

    /// Makes the call (the caller holds the endpoint's lock).
    unsafe fn call(&self, ep: *mut sys::fid_ep) -> isize {
        let ctx = self.ctx.cast();
        match self.call {
            Call::Send {
                buf,
                len,
                desc,
                peer,
            } => sys::fi_send(ep, buf.cast(), len, desc, peer, ctx),
            Call::Rma {
                write: false,
                buf,
                len,
                desc,
                peer,
                addr,
                key,
            } => sys::fi_read(ep, buf.cast(), len, desc, peer, addr, key, ctx),
            Call::Rma {
                buf,
                len,
                mut desc,
                peer,
                addr,
                key,
                ..
            } => {
                let iov = libc::iovec {
                    iov_base: buf.cast(),
                    iov_len: len,
                };
                let rma = sys::fi_rma_iov { addr, len, key };
                let msg = sys::fi_msg_rma {
                    msg_iov: (&iov as *const libc::iovec).cast(),
                    desc: &mut desc,
                    iov_count: 1,
                    addr: peer,
                    rma_iov: &rma,
                    rma_iov_count: 1,
                    context: ctx,
                    data: 0,
                };
                let flags = (sys::FI_DELIVERY_COMPLETE | sys::FI_COMPLETION) as u64;
                sys::fi_writemsg(ep, &msg, flags)
            }
        }
    }
}

/// A registered message buffer for sends (reused through a pool).
pub(crate) struct SendBuf {
    pub(crate) data: Box<[u8]>,
    mr: Option<RawMr>,
}

impl SendBuf {
    pub(crate) fn new(inner: &Inner) -> Result<SendBuf, OfiError> {
        let mut data = vec![0u8; inner.msg_size].into_boxed_slice();
        let mr = if inner.traits.mr_local {
            Some(inner.register_raw(data.as_mut_ptr(), data.len(), Access::RemoteRead)?)
        } else {
            None
        };
        Ok(SendBuf { data, mr })
    }

    pub(crate) fn desc(&self) -> *mut libc::c_void {
        self.mr.as_ref().map_or(std::ptr::null_mut(), RawMr::desc)
    }
}

/// Send buffers kept for reuse.
const SEND_POOL_MAX: usize = 64;

/// The posted receive buffers: one slab cut in `count` buffers of `size`.
pub(crate) struct RecvPool {
    slab: *mut u8,
    size: usize,
    count: usize,
    ctxs: Vec<*mut OpCtx>,
    mr: parking_lot::Mutex<Option<RawMr>>,
}

// SAFETY: the slab and contexts are owned by the pool; the provider writes
// a buffer only while it is posted, and we read it only after its
// completion.
unsafe impl Send for RecvPool {}
unsafe impl Sync for RecvPool {}

impl RecvPool {
    pub(crate) fn new(count: usize, size: usize) -> Self {
        let slab = Box::into_raw(vec![0u8; count * size].into_boxed_slice()) as *mut u8;
        let ctxs = (0..count).map(|i| OpCtx::new(Op::Recv(i))).collect();
        RecvPool {
            slab,
            size,
            count,
            ctxs,
            mr: parking_lot::Mutex::new(None),
        }
    }

    /// Registers the slab if the provider needs local registrations.
    pub(crate) fn register(&self, inner: &Inner) -> Result<(), OfiError> {
        if inner.traits.mr_local {
            let mr = inner.register_raw(self.slab, self.size * self.count, Access::RemoteRead)?;
            *self.mr.lock() = Some(mr);
        }
        Ok(())
    }

    fn desc(&self) -> *mut libc::c_void {
        self.mr
            .lock()
            .as_ref()
            .map_or(std::ptr::null_mut(), RawMr::desc)
    }
}

impl Drop for RecvPool {
    fn drop(&mut self) {
        // SAFETY: the endpoint was closed before (Inner::drop), so nothing
        // is posted; each pointer came from Box::into_raw.
        unsafe {
            for &c in &self.ctxs {
                drop(Box::from_raw(c));
            }
            let slab = std::ptr::slice_from_raw_parts_mut(self.slab, self.size * self.count);
            drop(Box::from_raw(slab));
        }
    }
}

fn completion_error(name: &'static str, err: &sys::fi_cq_err_entry) -> OfiError {
    OfiError::Completion {
        op: name,
        code: err.err,
        prov_errno: err.prov_errno,
        text: crate::error::strerror(err.err),
    }
}

impl Inner {
    /// Posts receive buffer `i` (queues it for later on `FI_EAGAIN`).
    pub(crate) fn post_recv(&self, i: usize) -> Result<(), OfiError> {
        let desc = self.recv.desc();
        let ret = {
            let _g = self.lock.lock();
            // SAFETY: buffer i lies inside the slab and is not posted; its
            // context lives as long as the pool.
            unsafe {
                let buf = self.recv.slab.add(i * self.recv.size);
                let ctx = self.recv.ctxs[i].cast();
                sys::fi_recv(
                    self.res.ep,
                    buf.cast(),
                    self.recv.size,
                    desc,
                    sys::FI_ADDR_UNSPEC,
                    ctx,
                )
            }
        };
        match ret {
            0 => Ok(()),
            EAGAIN => {
                self.repost.lock().push(i);
                Ok(())
            }
            r => Err(OfiError::call("fi_recv", r)),
        }
    }

    fn wake(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }

    /// One attempt at `post`; Some(result) when it is final.
    fn try_post(&self, post: &Post) -> Option<Result<(), OfiError>> {
        let ret = {
            let _g = self.lock.lock();
            // SAFETY: the call's buffers and context stay valid until the
            // operation completes (owned by the context or guarded).
            unsafe { post.call(self.res.ep) }
        };
        match ret {
            0 => {
                self.wake();
                Some(Ok(()))
            }
            EAGAIN => {
                self.progress(false);
                None
            }
            r => Some(Err(OfiError::call(post.name(), r))),
        }
    }

    /// Posts, retrying on `FI_EAGAIN` while progressing the CQ.
    pub(crate) async fn post(&self, post: Post) -> Result<(), OfiError> {
        let start = Instant::now();
        let mut tries = 0u32;
        loop {
            if let Some(r) = self.try_post(&post) {
                return self.settle(post, r);
            }
            if start.elapsed() > POST_TIMEOUT {
                let e = self.timeout(&post);
                return self.settle(post, Err(e));
            }
            tries += 1;
            if tries < 100 {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(Duration::from_micros(100)).await;
            }
        }
    }

    /// [`Inner::post`] for callers that cannot await.
    pub(crate) fn post_blocking(&self, post: Post) -> Result<(), OfiError> {
        let start = Instant::now();
        loop {
            if let Some(r) = self.try_post(&post) {
                return self.settle(post, r);
            }
            if start.elapsed() > POST_TIMEOUT {
                let e = self.timeout(&post);
                return self.settle(post, Err(e));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// One attempt at `post`: Ok(false) if the provider said `FI_EAGAIN`.
    pub(crate) fn post_once(&self, post: Post) -> Result<bool, OfiError> {
        match self.try_post(&post) {
            Some(r) => self.settle(post, r).map(|()| true),
            None => {
                let _ = self.settle(post, Err(OfiError::Closed));
                Ok(false)
            }
        }
    }

    fn timeout(&self, post: &Post) -> OfiError {
        OfiError::Timeout {
            call: post.name(),
            secs: POST_TIMEOUT.as_secs(),
        }
    }

    /// On failure, frees the context libfabric never took.
    fn settle(&self, post: Post, r: Result<(), OfiError>) -> Result<(), OfiError> {
        if let Err(e) = &r {
            // SAFETY: the post was refused, so the context is still ours.
            let ctx = unsafe { Box::from_raw(post.ctx) };
            self.finish(ctx.op, Err(e.clone()));
        }
        r
    }

    /// Reads the CQ once and finishes what it gave. `wait`: block for the
    /// progress lock (the progress thread) rather than skip if it is busy.
    pub(crate) fn progress(&self, wait: bool) -> usize {
        let _p = if wait {
            self.progress_lock.lock()
        } else {
            match self.progress_lock.try_lock() {
                Some(g) => g,
                None => return 0,
            }
        };
        let mut entries = [sys::fi_cq_data_entry::default(); 16];
        let n = {
            let _g = self.lock.lock();
            // SAFETY: entries holds 16 entries of the CQ's format.
            unsafe { sys::fi_cq_read(self.res.cq, entries.as_mut_ptr().cast(), entries.len()) }
        };
        let handled = if n > 0 {
            for e in &entries[..n as usize] {
                self.dispatch(e.op_context.cast(), Ok(e.len));
            }
            n as usize
        } else if n == -(sys::FI_EAVAIL as isize) {
            self.read_error()
        } else {
            0
        };
        self.repost_queued();
        handled
    }

    fn read_error(&self) -> usize {
        let mut err = sys::fi_cq_err_entry::default();
        let n = {
            let _g = self.lock.lock();
            // SAFETY: err is one error entry.
            unsafe { sys::fi_cq_readerr(self.res.cq, &mut err, 0) }
        };
        if n != 1 || err.op_context.is_null() {
            return 0;
        }
        self.dispatch(err.op_context.cast(), Err(err));
        1
    }

    /// Finishes the operation whose context is `ctx`.
    fn dispatch(&self, ctx: *mut OpCtx, r: Result<usize, sys::fi_cq_err_entry>) {
        // SAFETY: every context we post is an OpCtx; receive contexts stay
        // owned by the pool, all others were leaked for this completion.
        unsafe {
            if let Op::Recv(i) = (*ctx).op {
                if let Ok(len) = r {
                    let len = len.min(self.recv.size);
                    let buf =
                        std::slice::from_raw_parts(self.recv.slab.add(i * self.recv.size), len);
                    if !self.stop.load(Ordering::Acquire) {
                        (self.on_recv)(buf);
                    }
                }
                if !self.stop.load(Ordering::Acquire) {
                    let _ = self.post_recv(i);
                }
                return;
            }
            let ctx = Box::from_raw(ctx);
            let name = match &ctx.op {
                Op::Rma { name, .. } => *name,
                _ => "fi_send",
            };
            self.finish(ctx.op, r.map_err(|e| completion_error(name, &e)));
        }
    }

    fn finish(&self, op: Op, r: Result<usize, OfiError>) {
        match op {
            Op::Recv(_) => {}
            Op::Send { done, buf } => {
                let mut pool = self.send_pool.lock();
                if pool.len() < SEND_POOL_MAX {
                    pool.push(buf);
                } else {
                    drop(pool);
                    self.close_send_buf(buf);
                }
                done.complete(r);
            }
            Op::Rma {
                done, mr, owned, ..
            } => {
                if let Some(mut mr) = mr {
                    let _g = self.lock.lock();
                    // SAFETY: the transfer using it has ended.
                    unsafe { mr.close() };
                }
                if let Some((buf, slot)) = owned {
                    *slot.lock() = Some(buf);
                }
                done.complete(r);
            }
        }
    }

    fn close_send_buf(&self, buf: SendBuf) {
        if let Some(mut mr) = buf.mr {
            let _g = self.lock.lock();
            // SAFETY: no send uses the buffer any more.
            unsafe { mr.close() };
        }
    }

    fn repost_queued(&self) {
        let queued = std::mem::take(&mut *self.repost.lock());
        for i in queued {
            let _ = self.post_recv(i);
        }
    }

    /// The progress thread: reads the CQ, spinning briefly then parking
    /// with a growing timeout while idle; posts unpark it.
    pub(crate) fn run(&self) {
        let mut idle = 0u32;
        while !self.stop.load(Ordering::Acquire) {
            if self.progress(true) > 0 {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle < SPIN_ROUNDS {
                std::thread::yield_now();
            } else {
                let shift = (idle - SPIN_ROUNDS).min(6);
                let park = Duration::from_micros(16 << shift).min(MAX_PARK);
                std::thread::park_timeout(park);
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _g = self.lock.lock();
        // SAFETY: closing the endpoint first cancels posted receives; then
        // the registrations, then (Resources::drop) the rest.
        unsafe {
            if !self.res.ep.is_null() {
                crate::fabric::close(&mut (*self.res.ep).fid);
                self.res.ep = std::ptr::null_mut();
            }
            for buf in self.send_pool.lock().drain(..) {
                if let Some(mut mr) = buf.mr {
                    mr.close();
                }
            }
            if let Some(mut mr) = self.recv.mr.lock().take() {
                mr.close();
            }
        }
    }
}
