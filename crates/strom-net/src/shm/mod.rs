//! Shared-memory transport for processes on the same node: `shm://<path>`.
//!
//! Control frames travel over a Unix domain stream socket, exactly as TCP
//! frames do (same [`FrameReader`]/[`FrameWriter`]). Data parts (bulk
//! payloads) take a second socket of the connection, passed at connect
//! ([`handshake`]), and above a few KiB they do not travel through it at
//! all: the receiver copies them straight out of the sender's memory with
//! `process_vm_readv` ([`cma`], [`bulk`]), one copy in total. Where that is
//! not permitted (another user, Yama ptrace scope, PID namespaces) the
//! handshake finds out, logs why, and that direction sends its data parts
//! through the socket instead.
//!
//! Listening on `shm://auto` binds a socket inside a fresh private
//! directory (mode 0700, under `$XDG_RUNTIME_DIR` or the system temporary
//! directory), removed when the listener is dropped.
//!
//! This module owns the socket plumbing only; it knows frames, never
//! message semantics.

mod bulk;
mod cma;
mod handshake;
#[cfg(test)]
mod tests;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

use crate::frame_io::{FrameReader, FrameWriter};
use crate::socket::{self, SharedRead, SharedWrite};
use crate::{BoxFuture, Conn, Listener, NetError, Transport};
use handshake::Agreement;

/// The address part that asks for a fresh private socket path.
pub const SHM_AUTO: &str = "auto";

/// Payloads at most this large go through the bulk socket: below it a
/// socket write costs less than a cross-process pull.
pub const SHM_INLINE_MAX: usize = 16 << 10;

/// Bytes one connection may have published for its peer to pull and not
/// yet had released; past it payloads go through the socket.
const MAX_PENDING: u64 = 1 << 30;

/// A connection's handshake must be over within this long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Process-wide counts of data-part bytes sent over shm connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShmStats {
    /// Bytes the peer pulled out of this process's memory (one copy).
    pub pulled_bytes: u64,
    /// Bytes written through the bulk socket.
    pub inline_bytes: u64,
}

struct Counters {
    pulled: AtomicU64,
    inline: AtomicU64,
}

static STATS: Counters = Counters {
    pulled: AtomicU64::new(0),
    inline: AtomicU64::new(0),
};

/// What this process's shm connections have sent so far.
pub fn shm_stats() -> ShmStats {
    ShmStats {
        pulled_bytes: STATS.pulled.load(Ordering::Relaxed),
        inline_bytes: STATS.inline.load(Ordering::Relaxed),
    }
}

/// Unix socket control frames plus one-copy data parts, for clients on the
/// server's node.
#[derive(Clone, Debug)]
pub struct ShmTransport {
    pub max_frame: u32,
    /// Let peers pull data parts out of this process (and pull theirs);
    /// off, every data part goes through the socket. On unless the
    /// environment sets `STROM_SHM_CMA=0`.
    pub cma: bool,
    /// Payloads at most this large go through the socket.
    pub inline_max: usize,
}

impl ShmTransport {
    pub fn new(max_frame: u32) -> Self {
        let cma = std::env::var("STROM_SHM_CMA").map_or(true, |v| v != "0");
        ShmTransport {
            max_frame,
            cma,
            inline_max: SHM_INLINE_MAX,
        }
    }

    /// This transport with cross-memory attach turned off: every data part
    /// moves through the socket (the fallback, for tests and comparisons).
    pub fn without_cma(self) -> Self {
        ShmTransport { cma: false, ..self }
    }
}

impl Default for ShmTransport {
    fn default() -> Self {
        ShmTransport::new(strom_proto::DEFAULT_MAX_FRAME)
    }
}

/// A connection: frames on `control`, data parts on `bulk` as agreed.
fn wrap(
    control: UnixStream,
    bulk: UnixStream,
    agreed: &Agreement,
    t: &ShmTransport,
    peer: String,
) -> std::io::Result<Conn> {
    if let (false, Some(why)) = (agreed.we_pull, &agreed.why_not) {
        if t.cma {
            tracing::info!(peer = %peer, reason = %why, "shm: data parts from this peer come through the socket (one more copy)");
        }
    }
    tracing::debug!(peer = %peer, we_pull = agreed.we_pull, peer_pulls = agreed.peer_pulls, "shm connection open");
    let policy = bulk::SendPolicy {
        peer_pulls: agreed.peer_pulls,
        inline_max: t.inline_max,
        max_pending: MAX_PENDING,
    };
    let (br, bw) = bulk.into_split();
    let (sender, receiver) = bulk::bulk_path(br, bw, policy, agreed.peer_pid);
    let (r, w) = socket::split(control.into_std()?.into())?;
    Ok(Conn {
        reader: FrameReader::with_bulk(
            Box::new(SharedRead(r.clone())),
            t.max_frame,
            Box::new(receiver),
        ),
        writer: FrameWriter::with_bulk(Box::new(SharedWrite::new(w.clone())), t.max_frame, sender),
        direct: Some(w),
        direct_read: Some(r),
        peer,
        identity: Default::default(),
    })
}

/// This machine's identity for shm addresses: its kernel's boot id (the
/// same for every process and container on the node, different on every
/// other node and after a reboot).
fn node_id() -> Option<&'static str> {
    static ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let id: String = id
            .trim()
            .chars()
            .filter(|c| c.is_ascii_hexdigit())
            .collect();
        (!id.is_empty()).then_some(id)
    })
    .as_deref()
}

/// The socket path of an shm address, if it belongs to this node: an
/// address published by a server on another node (`?node=` differs) is
/// refused at once, so a client never reaches a stranger's socket that
/// happens to have the same path here.
fn on_this_node(addr: &str) -> std::io::Result<&str> {
    let Some((path, node)) = addr.rsplit_once("?node=") else {
        return Ok(addr);
    };
    match node_id() {
        Some(me) if me != node => Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            format!("the server is on another node (node {node}, this is {me})"),
        )),
        _ => Ok(path),
    }
}

fn tokio_stream(fd: OwnedFd) -> std::io::Result<UnixStream> {
    let s = std::os::unix::net::UnixStream::from(fd);
    s.set_nonblocking(true)?;
    UnixStream::from_std(s)
}

/// Removes the `auto` socket directories in `base` of processes that no
/// longer exist (a server killed with SIGKILL cannot remove its own): only
/// this user's, only a lone `strom.sock` in them, nothing else.
fn remove_stale_dirs(base: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("strom-shm-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        let owned = e.metadata().is_ok_and(|m| m.is_dir() && m.uid() == me);
        // SAFETY: kill with signal 0 only checks that the process exists.
        let gone = unsafe { libc::kill(pid, 0) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if owned && gone && pid > 0 {
            let _ = std::fs::remove_file(e.path().join("strom.sock"));
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// A fresh private directory for an `shm://auto` socket.
fn private_dir() -> Result<PathBuf, NetError> {
    use std::os::unix::fs::DirBuilderExt;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    remove_stale_dirs(&base);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let name = format!(
        "strom-shm-{}-{}-{nanos:x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let dir = base.join(name);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| NetError::io(format!("creating socket dir {}", dir.display()), e))?;
    Ok(dir)
}

struct ShmListener {
    listener: UnixListener,
    path: PathBuf,
    /// The private directory `auto` created (removed on drop).
    own_dir: Option<PathBuf>,
    transport: ShmTransport,
    /// Connections whose handshake finished (handshakes run concurrently,
    /// so a slow client never holds up the others).
    ready: mpsc::Receiver<Conn>,
    ready_tx: mpsc::Sender<Conn>,
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if let Some(dir) = &self.own_dir {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The server's side of a new connection: handshake, then the connection.
async fn accept_one(mut s: UnixStream, t: ShmTransport, path: PathBuf) -> std::io::Result<Conn> {
    let (fd, agreed) = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake::server(&mut s, t.cma))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let peer = format!("shm://{} (pid {})", path.display(), agreed.peer_pid);
    // The kernel's word for who connected (SO_PEERCRED), not the peer's.
    let cred = s.peer_cred()?;
    let mut c = wrap(s, tokio_stream(fd)?, &agreed, &t, peer)?;
    c.identity.uid = Some(cred.uid());
    c.identity.gid = Some(cred.gid());
    Ok(c)
}

impl Listener for ShmListener {
    fn local_addr(&self) -> String {
        match node_id() {
            Some(node) => format!("shm://{}?node={node}", self.path.display()),
            None => format!("shm://{}", self.path.display()),
        }
    }

    fn accept(&mut self) -> BoxFuture<'_, Result<Conn, NetError>> {
        Box::pin(async move {
            loop {
                tokio::select! {
                    Some(c) = self.ready.recv() => return Ok(c),
                    r = self.listener.accept() => {
                        let (s, _) = r.map_err(|e| NetError::io("accepting an shm connection", e))?;
                        let (tx, t, path) = (self.ready_tx.clone(), self.transport.clone(), self.path.clone());
                        tokio::spawn(async move {
                            match accept_one(s, t, path).await {
                                Ok(c) => { let _ = tx.send(c).await; }
                                Err(e) => tracing::warn!(error = %e, "shm handshake failed; connection closed"),
                            }
                        });
                    }
                }
            }
        })
    }
}

fn bind(path: &Path) -> Result<UnixListener, NetError> {
    UnixListener::bind(path)
        .map_err(|e| NetError::io(format!("binding shm://{}", path.display()), e))
}

impl ShmTransport {
    async fn connect_to(&self, addr: &str) -> std::io::Result<Conn> {
        let path = on_this_node(addr)?;
        let mut s = UnixStream::connect(path).await?;
        let (mine, theirs) = std::os::unix::net::UnixStream::pair()?;
        let agreed = tokio::time::timeout(
            HANDSHAKE_TIMEOUT,
            handshake::client(&mut s, theirs.into(), self.cma),
        )
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        let bulk = tokio_stream(mine.into())?;
        wrap(s, bulk, &agreed, self, format!("shm://{addr}"))
    }
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn connect<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Conn, NetError>> {
        Box::pin(async move {
            self.connect_to(addr)
                .await
                .map_err(|e| NetError::io(format!("connecting to shm://{addr}"), e))
        })
    }

    fn listen<'a>(&'a self, addr: &'a str) -> BoxFuture<'a, Result<Box<dyn Listener>, NetError>> {
        Box::pin(async move {
            let (path, own_dir) = if addr == SHM_AUTO || addr.is_empty() {
                let dir = private_dir()?;
                (dir.join("strom.sock"), Some(dir))
            } else {
                (PathBuf::from(addr), None)
            };
            let listener = match bind(&path) {
                Ok(l) => l,
                Err(e) => {
                    if let Some(dir) = &own_dir {
                        let _ = std::fs::remove_dir(dir);
                    }
                    return Err(e);
                }
            };
            let (ready_tx, ready) = mpsc::channel(64);
            Ok(Box::new(ShmListener {
                listener,
                path,
                own_dir,
                transport: self.clone(),
                ready,
                ready_tx,
            }) as Box<dyn Listener>)
        })
    }
}
