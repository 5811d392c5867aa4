//! Process-level helpers: finding the local server process behind a port
//! (to report its memory), sampling its RSS, and the progress bar.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The pid of the local process listening on TCP `port`, found through
/// /proc/net/tcp{,6} and the processes' fd tables. `None` when not local
/// or not visible (other user, other container).
pub fn pid_listening_on(port: u16) -> Option<u32> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let local_port = f[1]
                .rsplit(':')
                .next()
                .and_then(|h| u16::from_str_radix(h, 16).ok());
            if local_port == Some(port) {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for proc_entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = proc_entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(proc_entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| link.as_os_str() == i.as_str()) {
                    return Some(pid);
                }
            }
        }
    }
    None
}

/// A `/proc/PID/status` field in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Samples a process's RSS every 50 ms until stopped; keeps the maximum.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    max_kib: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
    pub pid: u32,
}

impl RssSampler {
    pub fn start(pid: u32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let max_kib = Arc::new(AtomicU64::new(0));
        let (s, m) = (stop.clone(), max_kib.clone());
        let thread = std::thread::spawn(move || loop {
            if let Some(k) = status_kib(pid, "VmRSS") {
                m.fetch_max(k, Ordering::Relaxed);
            }
            if s.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        });
        RssSampler {
            stop,
            max_kib,
            thread: Some(thread),
            pid,
        }
    }

    /// Stops sampling; returns (max RSS seen during the run, VmHWM) in KiB.
    pub fn finish(mut self) -> (u64, Option<u64>) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        (
            self.max_kib.load(Ordering::Relaxed),
            status_kib(self.pid, "VmHWM"),
        )
    }
}

/// A progress bar on stderr, fed from a shared counter by its own thread so
/// the hot loops only bump an atomic. Invisible unless stderr is a TTY.
pub struct Progress {
    pub done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    pub fn new(total: u64, label: &str, enabled: bool) -> Progress {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = (enabled && std::io::stderr().is_terminal()).then(|| {
            let bar = indicatif::ProgressBar::new(total);
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{msg:>9} [{bar:40}] {pos}/{len} events  {per_sec}  eta {eta}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(label.to_string());
            let (d, s) = (done.clone(), stop.clone());
            std::thread::spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    bar.set_position(d.load(Ordering::Relaxed).min(total));
                    std::thread::sleep(Duration::from_millis(100));
                }
                bar.finish_and_clear();
            })
        });
        Progress { done, stop, thread }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
