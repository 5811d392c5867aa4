//! `consume`'s stdout: lines are gathered in a buffer and written to fd 1
//! in batches, and an event is acked only once its whole line was
//! delivered. On a pipe, "delivered" means taken out of the pipe by the
//! reader (`FIONREAD` tells what is still in it), so a reader that dies
//! does not take acked-but-unread lines with it. Writes wait with `poll`,
//! so a signal or a closed pipe is noticed even when the reader is stuck.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use strom_client::{AckFuture, Event};

use crate::interrupt;

/// Why the loop stopped early.
pub enum Stop {
    Signal(i32),
    BrokenPipe,
    Failed(anyhow::Error),
}

/// Write at least this much at once...
const FLUSH_BYTES: usize = 64 << 10;
/// ...or every this often while events keep coming.
const FLUSH_EVERY: Duration = Duration::from_millis(10);
/// Longest single `poll` before signals are looked at again.
const POLL_MS: i32 = 100;
/// A pipe write this small never blocks once `poll` says writable.
const PIPE_CHUNK: usize = 4096;
/// Single acks (shared groups) kept unawaited, at most.
const SINGLES: usize = 4096;
/// Acks older than this are awaited at the end at most this long.
const ACK_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Output {
    ack: bool,
    /// Ack every event on its own (a shared group), not the latest per
    /// partition.
    each: bool,
    /// Acks of single events not yet known to be durable (`each`).
    singles: VecDeque<(u32, AckFuture)>,
    /// The first single ack that failed while the list was trimmed.
    single_error: Option<anyhow::Error>,
    buf: Vec<u8>,
    /// Bytes written to fd 1 so far.
    written: u64,
    /// Events not yet acked, with the stream position where their line ends.
    pending: VecDeque<(u64, Event)>,
    /// The latest ack per partition.
    acks: HashMap<u32, AckFuture>,
    delivered_events: u64,
    last_flush: Instant,
    fifo: bool,
}

impl Output {
    pub fn new(ack: bool, each: bool) -> Output {
        // SAFETY: fstat on fd 1 into a local struct.
        let fifo = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            libc::fstat(1, &mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFIFO
        };
        Output {
            ack,
            each,
            singles: VecDeque::new(),
            single_error: None,
            buf: Vec::with_capacity(FLUSH_BYTES * 2),
            written: 0,
            pending: VecDeque::new(),
            acks: HashMap::new(),
            delivered_events: 0,
            last_flush: Instant::now(),
            fifo,
        }
    }

    /// Buffers one line; writes and acks when a batch is due.
    pub fn line(&mut self, line: &serde_json::Value, ev: Event) -> Result<(), Stop> {
        use std::io::Write;
        writeln!(self.buf, "{line}").map_err(|e| Stop::Failed(e.into()))?;
        let end = self.written + self.buf.len() as u64;
        self.pending.push_back((end, ev));
        if self.buf.len() >= FLUSH_BYTES || self.last_flush.elapsed() >= FLUSH_EVERY {
            self.flush_and_ack()?;
        }
        Ok(())
    }

    /// Writes the buffer out, then acks what was delivered.
    pub fn flush_and_ack(&mut self) -> Result<(), Stop> {
        let r = self.write_pending(false);
        self.last_flush = Instant::now();
        self.ack_delivered();
        r
    }

    /// Writes the buffer to fd 1. Stops on a signal unless `ignore_signal`
    /// (then it still gives up when the reader does not take the bytes
    /// within a poll period).
    pub fn write_pending(&mut self, ignore_signal: bool) -> Result<(), Stop> {
        let mut done = 0;
        let r = loop {
            if done == self.buf.len() {
                break Ok(());
            }
            if !ignore_signal {
                if let Some(sig) = interrupt::received() {
                    break Err(Stop::Signal(sig));
                }
            }
            match wait_fd(libc::POLLOUT) {
                Ok(true) => {}
                Ok(false) if ignore_signal => break Ok(()),
                Ok(false) => continue,
                Err(s) => break Err(s),
            }
            let chunk = &self.buf[done..];
            let chunk = if self.fifo {
                &chunk[..chunk.len().min(PIPE_CHUNK)]
            } else {
                chunk
            };
            // SAFETY: writes from a live slice of the buffer.
            let n = unsafe { libc::write(1, chunk.as_ptr().cast(), chunk.len()) };
            if n >= 0 {
                done += n as usize;
                continue;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) | Some(libc::EAGAIN) => continue,
                Some(libc::EPIPE) => break Err(Stop::BrokenPipe),
                _ => {
                    break Err(Stop::Failed(
                        anyhow::Error::new(e).context("writing to stdout"),
                    ))
                }
            }
        };
        self.written += done as u64;
        self.buf.drain(..done);
        r
    }

    /// Bytes still in the pipe, not yet read by the reader.
    fn unread(&self) -> u64 {
        if !self.fifo {
            return 0;
        }
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD stores an int into `n`.
        if unsafe { libc::ioctl(1, libc::FIONREAD, &mut n) } == 0 {
            n.max(0) as u64
        } else {
            0
        }
    }

    /// Acks every event whose line the reader has.
    pub fn ack_delivered(&mut self) {
        let delivered = self.written.saturating_sub(self.unread());
        let mut last: HashMap<u32, Event> = HashMap::new();
        while self
            .pending
            .front()
            .is_some_and(|(end, _)| *end <= delivered)
        {
            let (_, ev) = self.pending.pop_front().expect("checked");
            self.delivered_events += 1;
            if self.each && self.ack {
                self.singles.push_back((ev.partition, ev.ack()));
            } else {
                last.insert(ev.partition, ev);
            }
        }
        // Keep the list of single acks short: the oldest are long done.
        while self.singles.len() > SINGLES {
            if let Some((p, a)) = self.singles.pop_front() {
                if let Err(e) = a.wait_timeout(Some(ACK_TIMEOUT)) {
                    let e = anyhow::anyhow!("acking an event of partition {p}: {e}");
                    self.single_error.get_or_insert(e);
                }
            }
        }
        if self.ack {
            for (p, ev) in last {
                self.acks.insert(p, ev.ack());
            }
        }
    }

    /// Waits until the reader took everything written, the reader went
    /// away (`BrokenPipe`), a signal came, or `deadline` passed.
    pub fn drain(&mut self, deadline: Option<Instant>) -> Result<(), Stop> {
        loop {
            self.ack_delivered();
            if self.unread() == 0 {
                return Ok(());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(());
            }
            if deadline.is_none() {
                if let Some(sig) = interrupt::received() {
                    return Err(Stop::Signal(sig));
                }
            }
            wait_fd(0)?;
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for the acks sent; the first error, if any.
    pub fn wait_acks(&mut self) -> anyhow::Result<()> {
        let mut first = self.single_error.take();
        let singles: Vec<_> = self.singles.drain(..).collect();
        for (p, ack) in self.acks.drain().chain(singles) {
            if let Err(e) = ack.wait_timeout(Some(ACK_TIMEOUT)) {
                first.get_or_insert(anyhow::anyhow!("acking partition {p}: {e}"));
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Events whose lines were delivered.
    pub fn delivered_events(&self) -> u64 {
        self.delivered_events
    }
}

/// Polls fd 1 for `events` (0: errors only) for up to one poll period.
/// True when ready; `BrokenPipe` when the reader is gone.
fn wait_fd(events: libc::c_short) -> Result<bool, Stop> {
    let mut fds = libc::pollfd {
        fd: 1,
        events,
        revents: 0,
    };
    // SAFETY: polls one pollfd on the stack.
    let n = unsafe { libc::poll(&mut fds, 1, POLL_MS) };
    if n < 0 {
        return Ok(false); // EINTR: the caller looks at signals
    }
    if fds.revents & libc::POLLERR != 0 {
        return Err(Stop::BrokenPipe);
    }
    Ok(n > 0 && fds.revents & events != 0)
}
