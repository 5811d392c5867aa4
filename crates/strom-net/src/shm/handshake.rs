//! The shm connection handshake, on the control socket before any frame.
//!
//! 1. The client sends [`Hello`] with one end of a fresh socket pair
//!    attached (`SCM_RIGHTS`): that pair is the connection's bulk channel.
//! 2. The server probes the client's memory (see [`cma::probe`]) and
//!    answers [`Reply`]: whether it can pull the client's data parts, and
//!    where its own probe bytes are.
//! 3. The client probes the server the same way and sends [`Confirm`].
//!
//! Each side then knows, per direction, whether its data parts may be
//! pulled by the peer (one copy) or must travel through the bulk socket.
//! Everything read here comes from another process: sizes are fixed, the
//! magic is checked, and a missing or extra file descriptor is an error.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;

use super::cma;

const MAGIC: [u8; 8] = *b"STROMSHM";
const VERSION: u32 = 1;
/// Size of [`Hello`] and [`Reply`] on the wire.
const MSG_LEN: usize = 32;
/// The sender would like its peer to pull (cross-memory attach enabled).
const FLAG_CMA: u32 = 1;
/// Set in the server's reply when it will pull the client's data parts.
const FLAG_PULLS: u32 = 2;

/// What each side learned: whether the peer pulls what this side sends,
/// whether this side pulls what the peer sends, and why not.
#[derive(Clone, Debug)]
pub(crate) struct Agreement {
    pub peer_pulls: bool,
    pub we_pull: bool,
    /// The peer's pid as seen here (from the socket's credentials).
    pub peer_pid: i32,
    /// Why this side cannot pull, when it cannot.
    pub why_not: Option<String>,
}

fn encode(flags: u32, probe: u64) -> [u8; MSG_LEN] {
    let mut m = [0u8; MSG_LEN];
    m[..8].copy_from_slice(&MAGIC);
    m[8..12].copy_from_slice(&VERSION.to_le_bytes());
    m[12..16].copy_from_slice(&flags.to_le_bytes());
    m[16..24].copy_from_slice(&probe.to_le_bytes());
    m
}

fn decode(m: &[u8; MSG_LEN]) -> io::Result<(u32, u64)> {
    let le32 = |r: std::ops::Range<usize>| u32::from_le_bytes(m[r].try_into().unwrap_or([0; 4]));
    if m[..8] != MAGIC || le32(8..12) != VERSION {
        return Err(invalid("not a Strom shm handshake (bad magic or version)"));
    }
    let probe = u64::from_le_bytes(m[16..24].try_into().unwrap_or([0; 8]));
    Ok((le32(12..16), probe))
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

fn peer_pid(s: &UnixStream) -> i32 {
    s.peer_cred().ok().and_then(|c| c.pid()).unwrap_or(0)
}

/// Whether this side may pull from the peer: only if both want it and the
/// probe read succeeds.
fn may_pull(cma: bool, peer_flags: u32, pid: i32, probe: u64) -> Result<(), String> {
    if !cma {
        return Err("cross-memory attach is disabled here".into());
    }
    if peer_flags & FLAG_CMA == 0 {
        return Err("the peer disabled cross-memory attach".into());
    }
    cma::probe(pid, probe)
}

/// The client's half: sends the hello with `bulk` attached.
pub(crate) async fn client(s: &mut UnixStream, bulk: OwnedFd, cma: bool) -> io::Result<Agreement> {
    let hello = encode(if cma { FLAG_CMA } else { 0 }, cma::probe_addr());
    let n = s
        .async_io(Interest::WRITABLE, || {
            send_with_fd(s.as_raw_fd(), &hello, bulk.as_raw_fd())
        })
        .await?;
    s.write_all(&hello[n..]).await?;
    drop(bulk);
    let mut reply = [0u8; MSG_LEN];
    s.read_exact(&mut reply).await?;
    let (flags, probe) = decode(&reply)?;
    let pid = peer_pid(s);
    let mine = may_pull(cma, flags, pid, probe);
    s.write_all(&[u8::from(mine.is_ok())]).await?;
    Ok(Agreement {
        // The server's reply flag says whether it pulls from us.
        peer_pulls: flags & FLAG_PULLS != 0,
        we_pull: mine.is_ok(),
        peer_pid: pid,
        why_not: mine.err(),
    })
}

/// The server's half: returns the bulk socket the client attached.
pub(crate) async fn server(s: &mut UnixStream, cma: bool) -> io::Result<(OwnedFd, Agreement)> {
    let mut hello = [0u8; MSG_LEN];
    let (n, fd) = s
        .async_io(Interest::READABLE, || {
            recv_with_fd(s.as_raw_fd(), &mut hello)
        })
        .await?;
    if n == 0 {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
    }
    let fd = fd.ok_or_else(|| invalid("the shm hello carried no bulk socket"))?;
    s.read_exact(&mut hello[n..]).await?;
    let (flags, probe) = decode(&hello)?;
    let pid = peer_pid(s);
    let mine = may_pull(cma, flags, pid, probe);
    let mut reply_flags = if cma { FLAG_CMA } else { 0 };
    if mine.is_ok() {
        reply_flags |= FLAG_PULLS;
    }
    s.write_all(&encode(reply_flags, cma::probe_addr())).await?;
    let mut confirm = [0u8; 1];
    s.read_exact(&mut confirm).await?;
    let agreement = Agreement {
        peer_pulls: confirm[0] == 1,
        we_pull: mine.is_ok(),
        peer_pid: pid,
        why_not: mine.err(),
    };
    Ok((fd, agreement))
}

/// Room for one file descriptor's control message, aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// `sendmsg` of `data` with `fd` attached; the bytes written (non-blocking).
fn send_with_fd(sock: RawFd, data: &[u8], fd: RawFd) -> io::Result<usize> {
    let mut cbuf = CmsgBuf([0; 64]);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: every pointer in `msg` points into locals that outlive the
    // call, and the control buffer has room for one descriptor.
    unsafe {
        let space = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.0.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut RawFd, fd);
        let n = libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

/// `recvmsg` into `buf`: the bytes read and the first descriptor attached
/// (any further ones are closed).
fn recv_with_fd(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut cbuf = CmsgBuf([0; 64]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: as in `send_with_fd`; descriptors the kernel installed are
    // taken into `OwnedFd`s exactly once.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.0.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = cbuf.0.len() as _;
        let n = libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut first = None;
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                let header = libc::CMSG_LEN(0) as usize;
                let count = ((*cmsg).cmsg_len as usize).saturating_sub(header)
                    / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    if first.is_none() {
                        first = Some(fd);
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(invalid("the shm hello carried too many descriptors"));
        }
        Ok((n as usize, first))
    }
}
