//! The safe endpoint: one RDM endpoint with its fabric, domain, AV and CQ,
//! a progress thread, and async operations on it.
//!
//! Every libfabric call goes through one lock, so any provider threading
//! level works. Operations carry a context whose first field is the
//! provider's `fi_context2` (the `FI_CONTEXT`/`FI_CONTEXT2` modes) and
//! whose rest says how to finish it (see `progress`). Received messages are
//! handed to the `on_recv` callback given at open, on the thread that read
//! the completion, in order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::{JoinHandle, Thread};

use parking_lot::{Mutex, MutexGuard};

use crate::completion::{self, BufferGuard, Completion};
use crate::fabric::{ProviderSpec, Resources, Traits};
use crate::mr::{Access, MemoryRegion, RawMr, RemoteRegion};
use crate::progress::{Call, Done, Op, OpCtx, Post, RecvPool, SendBuf, Slot};
use crate::{sys, OfiError};

/// Default size of a message (and of each posted receive buffer).
pub const DEFAULT_MSG_SIZE: usize = 64 << 10;
/// Default number of posted receive buffers.
pub const DEFAULT_RECV_BUFFERS: usize = 64;
/// Largest piece one `fi_read`/`fi_write` moves; larger transfers are split.
const MAX_RMA: usize = 16 << 20;

/// A peer in the endpoint's address vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Peer(pub u64);

/// How to open an endpoint.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    pub spec: ProviderSpec,
    /// Largest message; every receive buffer has this size.
    pub msg_size: usize,
    pub recv_buffers: usize,
    /// Register local buffers and pass their descriptors even if the
    /// provider does not ask for it (`FI_MR_LOCAL`): exercises, on tcp or
    /// shm, the path verbs and cxi take.
    pub force_mr_local: bool,
}

impl EndpointConfig {
    pub fn new(spec: ProviderSpec) -> Self {
        EndpointConfig {
            spec,
            msg_size: DEFAULT_MSG_SIZE,
            force_mr_local: false,
            recv_buffers: DEFAULT_RECV_BUFFERS,
        }
    }
}

/// The callback that receives every message, on the progress thread.
pub type OnRecv = Box<dyn Fn(&[u8]) + Send + Sync>;

pub(crate) struct Inner {
    pub(crate) res: Resources,
    pub(crate) traits: Traits,
    pub(crate) name: Vec<u8>,
    pub(crate) msg_size: usize,
    /// Serializes every libfabric call.
    pub(crate) lock: Mutex<()>,
    /// Serializes reading the CQ and handling what it gave, so messages
    /// reach `on_recv` in order.
    pub(crate) progress_lock: Mutex<()>,
    pub(crate) recv: RecvPool,
    pub(crate) send_pool: Mutex<Vec<SendBuf>>,
    pub(crate) on_recv: OnRecv,
    pub(crate) stop: AtomicBool,
    pub(crate) thread: OnceLock<Thread>,
    pub(crate) repost: Mutex<Vec<usize>>,
    next_key: AtomicU64,
    peers: Mutex<HashMap<Vec<u8>, Peer>>,
}

struct Shared {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.lock().take() {
            t.thread().unpark();
            // The last handle may go on the progress thread itself (a
            // registration dropped in a receive callback): it then exits on
            // its own.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// An RDM endpoint shared by every connection that uses it. Cheap to
/// clone; the last clone stops the progress thread and closes everything.
#[derive(Clone)]
pub struct Endpoint(Arc<Shared>);

impl Endpoint {
    /// Opens the provider `cfg.spec` names, posts the receive buffers and
    /// starts the progress thread. `on_recv` gets every message received.
    pub fn open(cfg: &EndpointConfig, on_recv: OnRecv) -> Result<Endpoint, OfiError> {
        let (res, mut traits) = Resources::open(&cfg.spec)?;
        traits.mr_local |= cfg.force_mr_local;
        if cfg.msg_size == 0 || cfg.msg_size > traits.max_msg || cfg.recv_buffers == 0 {
            return Err(OfiError::Invalid(format!(
                "message size {} (provider max {}) or {} receive buffers",
                cfg.msg_size, traits.max_msg, cfg.recv_buffers
            )));
        }
        let name = res.name()?;
        let recv = RecvPool::new(cfg.recv_buffers, cfg.msg_size);
        let inner = Arc::new(Inner {
            res,
            traits,
            name,
            msg_size: cfg.msg_size,
            lock: Mutex::new(()),
            progress_lock: Mutex::new(()),
            recv,
            send_pool: Mutex::new(Vec::new()),
            on_recv,
            stop: AtomicBool::new(false),
            thread: OnceLock::new(),
            repost: Mutex::new(Vec::new()),
            next_key: AtomicU64::new(1),
            peers: Mutex::new(HashMap::new()),
        });
        inner.recv.register(&inner)?;
        for i in 0..cfg.recv_buffers {
            inner.post_recv(i)?;
        }
        let worker = inner.clone();
        let handle = std::thread::Builder::new()
            .name("strom-ofi-progress".into())
            .spawn(move || worker.run())
            .map_err(|e| OfiError::Invalid(format!("spawning the progress thread: {e}")))?;
        let _ = inner.thread.set(handle.thread().clone());
        at_exit::track(&inner);
        Ok(Endpoint(Arc::new(Shared {
            inner,
            thread: Mutex::new(Some(handle)),
        })))
    }

    fn inner(&self) -> &Arc<Inner> {
        &self.0.inner
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        self.inner().lock.lock()
    }

    /// This endpoint's address (`fi_getname`), what peers insert.
    pub fn name(&self) -> &[u8] {
        &self.inner().name
    }

    /// The provider's name, domain and requirements.
    pub fn traits(&self) -> &Traits {
        &self.inner().traits
    }

    /// Largest message [`Endpoint::send`] takes.
    pub fn msg_size(&self) -> usize {
        self.inner().msg_size
    }

    /// The peer whose address is `name` (inserted in the AV once).
    pub fn insert_peer(&self, name: &[u8]) -> Result<Peer, OfiError> {
        if name.is_empty() || name.len() > 1024 {
            return Err(OfiError::Invalid(format!(
                "an endpoint name of {} bytes",
                name.len()
            )));
        }
        let inner = self.inner();
        let mut peers = inner.peers.lock();
        if let Some(p) = peers.get(name) {
            return Ok(*p);
        }
        let mut addr = sys::FI_ADDR_UNSPEC;
        let ret = {
            let _g = inner.lock.lock();
            // SAFETY: name is a readable address of the provider's format
            // (libfabric validates it); addr receives one fi_addr_t.
            unsafe {
                sys::fi_av_insert(
                    inner.res.av,
                    name.as_ptr().cast(),
                    1,
                    &mut addr,
                    0,
                    std::ptr::null_mut(),
                )
            }
        };
        if ret != 1 || addr == sys::FI_ADDR_UNSPEC {
            let ret = if ret < 0 {
                ret as isize
            } else {
                -(sys::FI_EINVAL as isize)
            };
            return Err(OfiError::call("fi_av_insert", ret));
        }
        peers.insert(name.to_vec(), Peer(addr));
        Ok(Peer(addr))
    }

    /// Sends `msg` (copied) to `peer`. Returns once posted; the returned
    /// completion resolves when the send finished (awaiting it is optional).
    pub async fn send(&self, peer: Peer, msg: &[u8]) -> Result<Completion, OfiError> {
        let (done, completion) = completion::pair();
        let post = self.send_post(peer, msg, Done::Completion(done))?;
        self.inner().post(post).await?;
        Ok(completion)
    }

    /// Sends `msg` (copied) to `peer` and returns once posted; `on_done`
    /// gets the send's result on the progress thread (or the post's error).
    pub async fn send_then<F>(&self, peer: Peer, msg: &[u8], on_done: F) -> Result<(), OfiError>
    where
        F: FnOnce(Result<usize, OfiError>) + Send + 'static,
    {
        let post = self.send_post(peer, msg, Done::Callback(Box::new(on_done)))?;
        self.inner().post(post).await
    }

    /// [`Endpoint::send`] for a thread that cannot await (a `Drop`).
    pub fn send_blocking(&self, peer: Peer, msg: &[u8]) -> Result<(), OfiError> {
        let post = self.send_post(peer, msg, Done::Callback(Box::new(drop)))?;
        self.inner().post_blocking(post)
    }

    /// One attempt at [`Endpoint::send`], never waiting: `Ok(true)` if it
    /// was posted, `Ok(false)` if the provider said `FI_EAGAIN`.
    pub fn try_send(&self, peer: Peer, msg: &[u8]) -> Result<bool, OfiError> {
        let post = self.send_post(peer, msg, Done::Callback(Box::new(drop)))?;
        self.inner().post_once(post)
    }

    fn send_post(&self, peer: Peer, msg: &[u8], done: Done) -> Result<Post, OfiError> {
        let inner = self.inner();
        if msg.len() > inner.msg_size {
            return Err(OfiError::Invalid(format!(
                "a message of {} bytes (at most {})",
                msg.len(),
                inner.msg_size
            )));
        }
        let mut buf = inner.take_send_buf()?;
        buf.data[..msg.len()].copy_from_slice(msg);
        let call = Call::Send {
            buf: buf.data.as_ptr(),
            len: msg.len(),
            desc: buf.desc(),
            peer: peer.0,
        };
        let ctx = OpCtx::new(Op::Send { done, buf });
        Ok(Post { call, ctx })
    }

    /// Reads `dst.len()` bytes of the peer's `src` region into `dst`.
    pub async fn read(
        &self,
        peer: Peer,
        dst: &mut [u8],
        src: RemoteRegion,
    ) -> Result<(), OfiError> {
        check_range(dst.len(), src)?;
        for (i, piece) in dst.chunks_mut(MAX_RMA).enumerate() {
            let at = src
                .offset((i * MAX_RMA) as u64)
                .ok_or_else(|| out_of_range(src))?;
            let (post, guard) =
                self.rma_post(peer, piece.as_mut_ptr(), piece.len(), at, false, None)?;
            self.inner().post(post).await?;
            guard.wait().await?;
        }
        Ok(())
    }

    /// Writes `src` into the peer's `dst` region, with delivery complete
    /// semantics (the data is visible at the target when this returns).
    pub async fn write(&self, peer: Peer, src: &[u8], dst: RemoteRegion) -> Result<(), OfiError> {
        check_range(src.len(), dst)?;
        for (i, piece) in src.chunks(MAX_RMA).enumerate() {
            let at = dst
                .offset((i * MAX_RMA) as u64)
                .ok_or_else(|| out_of_range(dst))?;
            let ptr = piece.as_ptr() as *mut u8;
            let (post, guard) = self.rma_post(peer, ptr, piece.len(), at, true, None)?;
            self.inner().post(post).await?;
            guard.wait().await?;
        }
        Ok(())
    }

    fn rma_post(
        &self,
        peer: Peer,
        buf: *mut u8,
        len: usize,
        remote: RemoteRegion,
        write: bool,
        owned: Option<(Vec<u8>, Slot)>,
    ) -> Result<(Post, BufferGuard), OfiError> {
        let inner = self.inner();
        let mr = if inner.traits.mr_local {
            Some(inner.register_raw(buf, len, Access::RemoteReadWrite)?)
        } else {
            None
        };
        let desc = mr.as_ref().map_or(std::ptr::null_mut(), RawMr::desc);
        let call = Call::Rma {
            write,
            buf,
            len,
            desc,
            peer: peer.0,
            addr: remote.addr,
            key: remote.key,
        };
        let (done, completion) = completion::pair();
        let name = if write { "fi_writemsg" } else { "fi_read" };
        let ctx = OpCtx::new(Op::Rma {
            name,
            done,
            mr,
            owned,
        });
        Ok((Post { call, ctx }, BufferGuard(completion)))
    }

    /// Reads `buf.len()` bytes of the peer's `src` region into `buf`, which
    /// the operation owns: unlike [`Endpoint::read`], giving up is safe, so
    /// this fails after `timeout` even if the provider never completes the
    /// read (then `buf` stays with the operation until it does). At most
    /// 16 MiB at once.
    pub async fn read_owned(
        &self,
        peer: Peer,
        mut buf: Vec<u8>,
        src: RemoteRegion,
        timeout: std::time::Duration,
    ) -> Result<Vec<u8>, OfiError> {
        check_range(buf.len(), src)?;
        if buf.len() > MAX_RMA || buf.is_empty() {
            return Err(OfiError::Invalid(format!(
                "an owned read of {} bytes",
                buf.len()
            )));
        }
        let slot = Slot::default();
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        let owned = Some((buf, slot.clone()));
        let (post, guard) = self.rma_post(peer, ptr, len, src, false, owned)?;
        let mut completion = guard.into_inner();
        self.inner().post(post).await?;
        match tokio::time::timeout(timeout, &mut completion).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(OfiError::Timeout {
                    call: "fi_read",
                    secs: timeout.as_secs(),
                })
            }
        };
        let buf = slot.lock().take();
        buf.ok_or(OfiError::Closed)
    }

    /// Registers `owner`'s bytes for `access` (the registration keeps
    /// `owner` alive). Prefer [`MrCache`](crate::MrCache) for buffers sent
    /// more than once.
    pub fn register<O>(&self, owner: O, access: Access) -> Result<MemoryRegion, OfiError>
    where
        O: AsRef<[u8]> + Send + Sync + 'static,
    {
        let (ptr, len) = {
            let b = owner.as_ref();
            (b.as_ptr(), b.len())
        };
        let inner = self.inner();
        let raw = inner.register_raw(ptr as *mut u8, len, access)?;
        let remote = RemoteRegion {
            addr: if inner.traits.virt_addr {
                ptr as u64
            } else {
                0
            },
            key: raw.key(),
            len: len as u64,
        };
        Ok(MemoryRegion::new(
            raw,
            ptr,
            len,
            remote,
            self.clone(),
            Box::new(owner),
        ))
    }
}

/// Process exit: libfabric's destructor tears its providers down while
/// other threads (progress threads of endpoints nobody closed, tasks) may
/// still be inside a call. An `atexit` handler, which runs before shared
/// libraries' destructors, stops the progress threads and takes every live
/// endpoint's lock for good, so no call starts or is running after it.
mod at_exit {
    use std::sync::{Arc, Once, Weak};

    use parking_lot::Mutex;

    use super::Inner;

    static LIVE: Mutex<Vec<Weak<Inner>>> = Mutex::new(Vec::new());
    static REGISTER: Once = Once::new();

    pub(super) fn track(inner: &Arc<Inner>) {
        REGISTER.call_once(|| {
            // SAFETY: registering a plain extern "C" function.
            unsafe { libc::atexit(handler) };
        });
        let mut live = LIVE.lock();
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(inner));
    }

    extern "C" fn handler() {
        let live: Vec<Arc<Inner>> = LIVE.lock().iter().filter_map(Weak::upgrade).collect();
        for inner in &live {
            inner.stop.store(true, std::sync::atomic::Ordering::Release);
            std::mem::forget(inner.lock.lock());
            // Closing the endpoint lets the provider release what outlives
            // the process otherwise (shm unlinks its region). Nothing uses
            // it again: its lock stays taken.
            if !inner.res.ep.is_null() {
                // SAFETY: the endpoint is open, and no call can follow.
                unsafe { crate::sys::fi_close(&mut (*inner.res.ep).fid) };
            }
        }
        // Never dropped: dropping would close the endpoints (and wait for
        // the locks just taken).
        std::mem::forget(live);
    }
}

fn out_of_range(region: RemoteRegion) -> OfiError {
    OfiError::Invalid(format!("an offset past a region of {} bytes", region.len))
}

fn check_range(len: usize, region: RemoteRegion) -> Result<(), OfiError> {
    if len as u64 > region.len {
        return Err(OfiError::Invalid(format!(
            "a transfer of {len} bytes on a remote region of {} bytes",
            region.len
        )));
    }
    Ok(())
}

impl Inner {
    /// Registers `len` bytes at `ptr` (binding to the endpoint where the
    /// provider wants that).
    pub(crate) fn register_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<RawMr, OfiError> {
        if len == 0 {
            return Err(OfiError::Invalid("registering 0 bytes".into()));
        }
        let key = if self.traits.prov_key {
            0
        } else {
            self.next_key.fetch_add(1, Ordering::Relaxed)
        };
        let _g = self.lock.lock();
        let mut mr = RawMr(std::ptr::null_mut());
        // SAFETY: ptr..ptr+len is memory the caller keeps alive while the
        // registration exists; mr receives the handle.
        unsafe {
            let ret = sys::fi_mr_reg(
                self.res.domain,
                ptr.cast(),
                len,
                access.flags(),
                0,
                key,
                0,
                &mut mr.0,
                std::ptr::null_mut(),
            );
            crate::error::check("fi_mr_reg", ret as isize)?;
            if self.traits.mr_endpoint {
                let ret = sys::fi_mr_bind(mr.0, &mut (*self.res.ep).fid, 0);
                let ret = if ret == 0 {
                    sys::fi_mr_enable(mr.0)
                } else {
                    ret
                };
                if ret != 0 {
                    mr.close();
                    return Err(OfiError::call("fi_mr_bind/fi_mr_enable", ret as isize));
                }
            }
        }
        Ok(mr)
    }

    fn take_send_buf(&self) -> Result<SendBuf, OfiError> {
        if let Some(b) = self.send_pool.lock().pop() {
            return Ok(b);
        }
        SendBuf::new(self)
    }
}
