//! What the randomized fault loops (`fault_loop.rs`, without a quorum, and
//! `fault_loop_quorum.rs`, on a 3-voter metadata quorum) share: the run's
//! seed and log, printed with any failure; the producers' load and the
//! history each keeps; and the checker that holds the stored topic against
//! every history:
//!
//! - every acknowledged event is stored, byte for byte, at the offset its
//!   acknowledgement named (acknowledged events are never lost, and no
//!   offset ever names two events);
//! - no event is stored twice (a failed push may be stored once or not);
//! - per producer and partition, events are stored in push order.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use strom_client::{Driver, PushFuture};

use super::{read_all, Rng};

/// Partitions of the loaded topic.
pub const PARTITIONS: u32 = 6;
/// Producers loading it, each on its own thread.
pub const PRODUCERS: u64 = 2;

/// What one producer saw: acked `(seq, partition, offset)` and failed seqs.
#[derive(Default)]
pub struct History {
    pub acked: Vec<(u64, u32, u64)>,
    pub failed: Vec<u64>,
}

/// The run's log, printed with any failure so it can be replayed.
pub struct Log {
    pub seed: u64,
    start: Instant,
    lines: Mutex<Vec<String>>,
}

/// The seed (`STROM_FAULT_SEED`, else from the clock) and the number of
/// cycles (`STROM_FAULT_CYCLES`, default 50) of a run.
pub fn seed_and_cycles() -> (u64, usize) {
    seed_and_cycles_or(50)
}

/// [`seed_and_cycles`] with `default` cycles.
pub fn seed_and_cycles_or(default: usize) -> (u64, usize) {
    let seed = std::env::var("STROM_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| Rng::from_time().next_u64());
    let cycles: usize = std::env::var("STROM_FAULT_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    (seed, cycles)
}

/// Prints the run's seed and fault history if the test panics anywhere
/// (a helper's assertion included), so every failure can be replayed.
pub struct HistoryOnPanic<'a>(pub &'a Log);

impl Drop for HistoryOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let lines = self.0.history();
            eprintln!(
                "\nfault loop failed; replay with STROM_FAULT_SEED={}; fault history:\n{lines}",
                self.0.seed
            );
        }
    }
}

impl Log {
    pub fn new(seed: u64) -> Log {
        Log {
            seed,
            start: Instant::now(),
            lines: Mutex::new(Vec::new()),
        }
    }

    pub fn say(&self, what: String) {
        let t = self.start.elapsed().as_millis();
        self.lines
            .lock()
            .unwrap()
            .push(format!("{t:>7} ms  {what}"));
    }

    /// Fails the test; [`HistoryOnPanic`] prints the seed and history.
    pub fn fail(&self, what: String) -> ! {
        panic!("{what}");
    }

    /// Every line so far.
    pub fn history(&self) -> String {
        self.lines.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// How many lines of the log so far contain `what`.
    pub fn count(&self, what: &str) -> usize {
        let lines = self.lines.lock().unwrap();
        lines.iter().filter(|l| l.contains(what)).count()
    }
}

pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe { libc::kill(pid, sig) };
}

/// The address the master has for member `id`, if it lists it alive.
pub fn addr_of(d: &Driver, id: u32) -> Option<String> {
    let members = d.members().ok()?;
    members
        .into_iter()
        .find(|m| m.id == id && m.alive)
        .map(|m| m.addr)
}

/// Waits (up to 30 s) until `ok`, else fails the run.
pub fn wait_for(what: &str, log: &Log, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ok() {
        if Instant::now() > deadline {
            log.fail(format!("timed out waiting for {what}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Event `seq` of producer `pid`: metadata naming it, and up to 1 KiB of
/// data derived from it (small, so a run writes little).
pub fn payload(pid: u64, seq: u64) -> (Vec<u8>, Vec<u8>) {
    let meta = format!("{{\"tag\":\"p{pid}\",\"i\":{seq}}}").into_bytes();
    let size = (seq * 37 % 1024) as usize;
    (meta, Rng::new(seq ^ (pid << 56) ^ 0xABCD).bytes(size))
}

/// Pushes to `topic` until `stop`, in windows of 16, recording every
/// outcome.
pub fn load(d: Driver, topic: &str, pid: u64, stop: Arc<AtomicBool>, out: Arc<Mutex<History>>) {
    let t = d.open_topic(topic).expect("open");
    let p = t.producer().expect("producer");
    let mut seq = 0u64;
    while !stop.load(Ordering::Acquire) {
        let mut window: Vec<(u64, Option<PushFuture>)> = Vec::new();
        for _ in 0..16 {
            let (meta, data) = payload(pid, seq);
            let part = (seq % u64::from(PARTITIONS)) as u32;
            window.push((seq, p.push_with(meta, data, Some(part), &[]).ok()));
            seq += 1;
        }
        let _ = p.flush();
        let mut h = out.lock().unwrap();
        for (s, f) in window {
            match f.map(|f| f.wait()) {
                Some(Ok(id)) => h.acked.push((s, id.partition, id.offset)),
                _ => h.failed.push(s),
            }
        }
        drop(h);
        // A steady load, not a flood: the check reads everything back.
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = p.close();
}

/// The producers' load on `topic`, one thread each, until stopped.
pub struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    pub histories: Vec<Arc<Mutex<History>>>,
}

impl Load {
    pub fn start(d: &Driver, topic: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let histories: Vec<Arc<Mutex<History>>> =
            (0..PRODUCERS).map(|_| Default::default()).collect();
        let threads = histories
            .iter()
            .enumerate()
            .map(|(pid, h)| {
                let (d, stop, h, topic) = (d.clone(), stop.clone(), h.clone(), topic.to_string());
                std::thread::spawn(move || load(d, &topic, pid as u64, stop, h))
            })
            .collect();
        Load {
            stop,
            threads,
            histories,
        }
    }

    /// Stops every producer and waits for it.
    pub fn stop(&mut self, log: &Log) {
        self.stop.store(true, Ordering::Release);
        for l in self.threads.drain(..) {
            if l.join().is_err() {
                log.fail("a producer thread panicked".into());
            }
        }
    }
}

/// What the checker found: events stored, and acknowledged.
pub struct Checked {
    pub stored: usize,
    pub acked: usize,
}

/// Checks the stored `topic` against every producer's history.
pub fn check(d: &Driver, topic: &str, histories: &[Arc<Mutex<History>>], log: &Log) -> Checked {
    let got = read_all(d, topic, "fault-checker", Duration::from_secs(120));
    // Where each (producer, seq) is stored; twice is a duplicate.
    let mut stored: HashMap<(u64, u64), (u32, u64)> = HashMap::new();
    for ((part, off), ev) in &got.events {
        let v: serde_json::Value = serde_json::from_slice(&ev.meta)
            .unwrap_or_else(|e| log.fail(format!("{part}/{off}: metadata {e}")));
        let pid: u64 = v["tag"].as_str().unwrap_or("")[1..]
            .parse()
            .unwrap_or(u64::MAX);
        let seq = v["i"].as_u64().unwrap_or(u64::MAX);
        if let Some(prev) = stored.insert((pid, seq), (*part, *off)) {
            log.fail(format!(
                "producer {pid}'s event {seq} is stored twice: at {}/{} and {part}/{off}",
                prev.0, prev.1
            ));
        }
    }
    let mut acked_total = 0;
    for (pid, h) in histories.iter().enumerate() {
        let h = h.lock().unwrap();
        let pid = pid as u64;
        let mut last: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for &(seq, part, off) in &h.acked {
            acked_total += 1;
            let Some(ev) = got.events.get(&(part, off)) else {
                log.fail(format!("acked event p{pid}/{seq} at {part}/{off} is lost"));
            };
            let (meta, data) = payload(pid, seq);
            if ev.meta != meta || ev.data != data {
                log.fail(format!(
                    "offset {part}/{off} was acked for p{pid}/{seq} but holds {}",
                    String::from_utf8_lossy(&ev.meta)
                ));
            }
            if let Some((s, o)) = last.insert(part, (seq, off)) {
                if o >= off {
                    log.fail(format!(
                        "p{pid}: event {seq} acked at {part}/{off}, after event {s} at {o}"
                    ));
                }
            }
        }
        // Per producer and partition, stored order is push order (failed
        // pushes that were stored included).
        let mut by_part: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
        for (&(p, s), &(part, off)) in &stored {
            if p == pid {
                by_part.entry(part).or_default().push((off, s));
            }
        }
        for (part, mut v) in by_part {
            v.sort_unstable();
            if let Some(w) = v.windows(2).find(|w| w[0].1 >= w[1].1) {
                log.fail(format!(
                    "p{pid} on partition {part}: event {} at offset {} before event {} at {}",
                    w[0].1, w[0].0, w[1].1, w[1].0
                ));
            }
        }
        log.say(format!(
            "producer {pid}: {} acked, {} failed",
            h.acked.len(),
            h.failed.len()
        ));
    }
    if acked_total == 0 {
        log.fail("no event was acknowledged: the load never ran".into());
    }
    Checked {
        stored: got.len(),
        acked: acked_total,
    }
}
