//! Cross-memory attach: copying a peer process's memory into ours with
//! `process_vm_readv(2)`, one copy and no kernel socket buffer in between.
//!
//! Reading another process needs ptrace access to it: the same user (or
//! `CAP_SYS_PTRACE`), a Yama `ptrace_scope` that allows it, and the peer
//! visible in our PID namespace. [`probe`] checks all of that once per
//! connection by reading a known constant of the peer, so a connection
//! where it is not allowed moves its data through the socket instead.

use std::io;

/// A range of the peer's address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Region {
    pub addr: u64,
    pub len: u64,
}

/// What [`probe`] reads from the peer (every Strom build has it).
#[used]
static PROBE: [u8; 16] = *b"strom-cma-probe\x01";

/// Where this process keeps the bytes a peer's [`probe`] reads.
pub(crate) fn probe_addr() -> u64 {
    PROBE.as_ptr() as u64
}

/// Whether this process may read process `pid`'s memory: reads the probe
/// constant at `addr` in it. The error says why not, for the log.
pub(crate) fn probe(pid: i32, addr: u64) -> Result<(), String> {
    if pid <= 0 {
        return Err("the peer's pid is not visible here (another PID namespace?)".into());
    }
    let mut got = [0u8; 16];
    read_into(pid, &mut got, &[Region { addr, len: 16 }]).map_err(|e| match e.raw_os_error() {
        Some(libc::EPERM) => format!(
            "process_vm_readv not permitted ({e}): it needs the same user and ptrace \
             access (kernel.yama.ptrace_scope 0, or CAP_SYS_PTRACE)"
        ),
        Some(libc::ENOSYS) => format!("process_vm_readv is not available ({e})"),
        _ => format!("process_vm_readv failed ({e})"),
    })?;
    if got != PROBE {
        return Err("the peer's probe bytes differ (not a compatible Strom build)".into());
    }
    Ok(())
}

/// Linux's limit on iovecs per call.
const MAX_IOV: usize = 1024;

/// Copies `regions` of process `pid`, in order, into `dst`; their lengths
/// must add up to `dst.len()`.
pub(crate) fn read_into(pid: i32, dst: &mut [u8], regions: &[Region]) -> io::Result<()> {
    // SAFETY: `dst` is valid for writes of `dst.len()` bytes.
    unsafe { read_raw(pid, dst.as_mut_ptr(), dst.len(), regions) }
}

/// Copies `regions` of process `pid` into a fresh buffer of `len` bytes
/// (their total), never zeroing it first.
pub(crate) fn read_vec(pid: i32, len: usize, regions: &[Region]) -> io::Result<Vec<u8>> {
    let mut v = Vec::with_capacity(len);
    // SAFETY: the spare capacity is valid for writes of `len` bytes, and
    // `read_raw` succeeds only once all `len` of them were written.
    unsafe {
        read_raw(pid, v.as_mut_ptr(), len, regions)?;
        v.set_len(len);
    }
    Ok(v)
}

/// # Safety
/// `dst` must be valid for writes of `len` bytes.
unsafe fn read_raw(pid: i32, dst: *mut u8, len: usize, regions: &[Region]) -> io::Result<()> {
    let total = regions
        .iter()
        .try_fold(0u64, |t, r| t.checked_add(r.len))
        .filter(|&t| t == len as u64);
    if total.is_none() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "regions do not add up to the destination",
        ));
    }
    let (mut ri, mut roff, mut done) = (0usize, 0u64, 0usize);
    let mut remote: Vec<libc::iovec> = Vec::with_capacity(regions.len().min(MAX_IOV));
    while done < len {
        remote.clear();
        let mut want = 0usize;
        let mut off = roff;
        for r in regions[ri..].iter().take(MAX_IOV) {
            if r.len > off {
                remote.push(libc::iovec {
                    iov_base: r.addr.wrapping_add(off) as usize as *mut libc::c_void,
                    iov_len: (r.len - off) as usize,
                });
                want += (r.len - off) as usize;
            }
            off = 0;
        }
        let local = libc::iovec {
            iov_base: dst.add(done) as *mut libc::c_void,
            iov_len: want,
        };
        let n = libc::process_vm_readv(pid, &local, 1, remote.as_ptr(), remote.len() as _, 0);
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        let mut n = n as u64;
        done += n as usize;
        while n > 0 && ri < regions.len() {
            let left = regions[ri].len - roff;
            if n >= left {
                n -= left;
                ri += 1;
                roff = 0;
            } else {
                roff += n;
                n = 0;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> i32 {
        std::process::id() as i32
    }

    #[test]
    fn reads_scattered_regions_of_a_process_in_order() {
        let a: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        let b = vec![9u8; 3000];
        let regions = [
            Region {
                addr: a.as_ptr() as u64 + 10,
                len: 4990,
            },
            Region {
                addr: b.as_ptr() as u64,
                len: 0,
            },
            Region {
                addr: b.as_ptr() as u64,
                len: 3000,
            },
        ];
        let got = read_vec(me(), 7990, &regions).unwrap();
        assert_eq!(&got[..4990], &a[10..]);
        assert!(got[4990..].iter().all(|&x| x == 9));
    }

    #[test]
    fn more_regions_than_one_call_takes_are_read_in_several_calls() {
        let src: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
        let regions: Vec<Region> = (0..3000)
            .map(|i| Region {
                addr: src.as_ptr() as u64 + i,
                len: 1,
            })
            .collect();
        let mut dst = vec![0u8; 3000];
        read_into(me(), &mut dst, &regions).unwrap();
        assert_eq!(dst, src);
    }

    #[test]
    fn bad_addresses_and_wrong_totals_are_errors_not_crashes() {
        let mut dst = [0u8; 8];
        let e = read_into(me(), &mut dst, &[Region { addr: 8, len: 8 }]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
        let e = read_into(
            me(),
            &mut dst,
            &[Region {
                addr: 8,
                len: u64::MAX,
            }],
        )
        .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let huge = [
            Region {
                addr: 8,
                len: u64::MAX,
            },
            Region { addr: 8, len: 9 },
        ];
        assert!(
            read_vec(me(), 8, &huge).is_err(),
            "overflowing totals are refused"
        );
    }

    #[test]
    fn the_probe_reads_this_process_and_explains_a_missing_pid() {
        probe(me(), probe_addr()).unwrap();
        let e = probe(0, probe_addr()).unwrap_err();
        assert!(e.contains("PID namespace"), "{e}");
        let other = [0u8; 16];
        let e = probe(me(), other.as_ptr() as u64).unwrap_err();
        assert!(e.contains("differ"), "{e}");
    }
}
