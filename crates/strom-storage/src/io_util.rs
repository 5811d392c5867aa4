//! Positional I/O helper: vectored positional writes (no concatenation of
//! scatter/gather segments), used by [`crate::vfs::RealFs`].

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Most iovecs handed to one `pwritev` call (Linux `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// Writes every buffer of `bufs`, in order, at `offset` with `pwritev`,
/// retrying short writes and `EINTR`. One syscall per up to 1024 buffers.
pub(crate) fn pwritev_all<B: AsRef<[u8]>>(file: &File, bufs: &[B], offset: u64) -> io::Result<()> {
    let fd = file.as_raw_fd();
    let mut pos = offset;
    let mut idx = 0usize;
    let mut skip = 0usize;
    let mut iov: Vec<libc::iovec> = Vec::with_capacity(bufs.len().min(IOV_MAX));
    while idx < bufs.len() {
        iov.clear();
        let mut first = true;
        for buf in bufs[idx..].iter() {
            if iov.len() == IOV_MAX {
                break;
            }
            let slice = buf.as_ref();
            let slice = if first { &slice[skip..] } else { slice };
            first = false;
            if slice.is_empty() {
                continue;
            }
            iov.push(libc::iovec {
                iov_base: slice.as_ptr() as *mut libc::c_void,
                iov_len: slice.len(),
            });
        }
        if iov.is_empty() {
            return Ok(());
        }
        let off = libc::off_t::try_from(pos)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file offset too large"))?;
        // SAFETY: every iovec points into a live slice borrowed from `bufs`
        // for the duration of the call, and `iov.len() <= IOV_MAX`.
        let n = unsafe { libc::pwritev(fd, iov.as_ptr(), iov.len() as libc::c_int, off) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwritev wrote 0 bytes",
            ));
        }
        let mut written = n as usize;
        pos += written as u64;
        // Advance (idx, skip) past `written` bytes.
        while written > 0 && idx < bufs.len() {
            let remaining = bufs[idx].as_ref().len() - skip;
            if written >= remaining {
                written -= remaining;
                idx += 1;
                skip = 0;
            } else {
                skip += written;
                written = 0;
            }
        }
        // Skip any buffers that are now exhausted (including empty ones).
        while idx < bufs.len() && bufs[idx].as_ref().len() == skip {
            idx += 1;
            skip = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pwritev_all_writes_many_segments_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        let bufs: Vec<Vec<u8>> = (0..3000u32)
            .map(|i| vec![(i % 251) as u8; (i % 7) as usize])
            .collect();
        pwritev_all(&file, &bufs, 10).unwrap();
        let expected: Vec<u8> = bufs.concat();
        let mut got = vec![0u8; expected.len()];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut got, 10).unwrap();
        assert_eq!(got, expected);
    }
}
