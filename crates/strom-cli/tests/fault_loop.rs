//! The randomized fault loop: a group of three real `strom server`
//! processes (the master and two joined members) under load from two
//! producers, while each cycle kills and restarts a member (`kill -9`),
//! pauses one (`SIGSTOP` … `SIGCONT`), pauses the master, or kills the
//! master and starts it again on its address. A checker
//! then reads the whole topic and holds it against every producer's
//! history:
//!
//! - every acknowledged event is stored, byte for byte, at the offset its
//!   acknowledgement named (acknowledged events are never lost, and no
//!   offset ever names two events);
//! - no event is stored twice (a failed push may be stored once or not);
//! - per producer and partition, events are stored in push order.
//!
//! Replication factor 1 (file partitions, `durability=always`): a killed
//! member's partitions are unavailable until it is back, and those pushes
//! fail; while the master is down, topic administration waits for it
//! (one registry; see docs/replication.md).
//!
//! `STROM_FAULT_CYCLES` (default 50) sets the length, `STROM_FAULT_SEED`
//! replays one run; a failure prints the seed and the fault history.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{live_members, read_all, JoinedMember, Rng, ServerProcess};
use strom_client::{Driver, Durability, PushFuture, TopicSpec};

const PARTITIONS: u32 = 6;
const PRODUCERS: u64 = 2;
const TOPIC: &str = "faults";

/// What one producer saw: acked `(seq, partition, offset)` and failed seqs.
#[derive(Default)]
struct History {
    acked: Vec<(u64, u32, u64)>,
    failed: Vec<u64>,
}

/// The run's log, printed with any failure so it can be replayed.
struct Log {
    seed: u64,
    start: Instant,
    lines: Mutex<Vec<String>>,
}

/// Prints the run's seed and fault history if the test panics anywhere
/// (a helper's assertion included), so every failure can be replayed.
struct HistoryOnPanic<'a>(&'a Log);

impl Drop for HistoryOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let lines = self
                .0
                .lines
                .lock()
                .map(|l| l.join("\n"))
                .unwrap_or_default();
            eprintln!(
                "\nfault loop failed; replay with STROM_FAULT_SEED={}; fault history:\n{lines}",
                self.0.seed
            );
        }
    }
}

impl Log {
    fn say(&self, what: String) {
        let t = self.start.elapsed().as_millis();
        self.lines
            .lock()
            .unwrap()
            .push(format!("{t:>7} ms  {what}"));
    }

    /// Fails the test; [`HistoryOnPanic`] prints the seed and history.
    fn fail(&self, what: String) -> ! {
        panic!("{what}");
    }
}

/// A joined member that can be killed and started again on its data.
struct Member {
    dir: PathBuf,
    proc: Option<JoinedMember>,
}

impl Member {
    fn start(&mut self, master: &ServerProcess) {
        self.proc = Some(master.join_member(&self.dir, &[], Stdio::null()));
    }

    /// Its Strom member id, which it keeps across restarts.
    fn member_id(&self) -> u32 {
        std::fs::read_to_string(self.dir.join("member-id"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .expect("a joined member's id file")
    }

    fn pid(&self) -> i32 {
        self.proc.as_ref().expect("running").0.id() as i32
    }
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe { libc::kill(pid, sig) };
}

/// The address the master has for member `id`, if it lists it alive.
fn addr_of(d: &Driver, id: u32) -> Option<String> {
    let members = d.members().ok()?;
    members
        .into_iter()
        .find(|m| m.id == id && m.alive)
        .map(|m| m.addr)
}

fn wait_for(what: &str, log: &Log, mut ok: impl FnMut() -> bool) {
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
fn payload(pid: u64, seq: u64) -> (Vec<u8>, Vec<u8>) {
    let meta = format!("{{\"tag\":\"p{pid}\",\"i\":{seq}}}").into_bytes();
    let size = (seq * 37 % 1024) as usize;
    (meta, Rng::new(seq ^ (pid << 56) ^ 0xABCD).bytes(size))
}

/// Pushes until `stop`, in windows of 16, recording every outcome.
fn load(d: Driver, pid: u64, stop: Arc<AtomicBool>, out: Arc<Mutex<History>>) {
    let t = d.open_topic(TOPIC).expect("open");
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

/// The master, which a fault may kill and start again on its address.
struct Master {
    base: PathBuf,
    proc: Option<ServerProcess>,
}

impl Master {
    fn get(&self) -> &ServerProcess {
        self.proc.as_ref().expect("the master runs")
    }
}

/// One fault, then everything back up.
fn fault(rng: &mut Rng, master: &mut Master, members: &mut [Member], d: &Driver, log: &Log) {
    let pause = Duration::from_millis(50 + rng.below(350));
    match rng.below(4) {
        0 => {
            let m = &mut members[rng.below(members.len() as u64) as usize];
            let id = m.member_id();
            let old = addr_of(d, id);
            log.say(format!("kill -9 member {id} at {old:?}, down {pause:?}"));
            m.proc = None;
            std::thread::sleep(pause);
            m.start(master.get());
            // Back once the master has its new address (port 0) and
            // every member is alive.
            wait_for("the member to rejoin", log, || {
                let now = addr_of(d, id);
                now.is_some() && now != old && live_members(d) == 3
            });
            log.say(format!("member {id} rejoined at {:?}", addr_of(d, id)));
        }
        1 => {
            let m = &members[rng.below(members.len() as u64) as usize];
            log.say(format!("SIGSTOP member {} for {pause:?}", m.member_id()));
            signal(m.pid(), libc::SIGSTOP);
            std::thread::sleep(pause);
            signal(m.pid(), libc::SIGCONT);
        }
        2 => {
            log.say(format!("SIGSTOP the master for {pause:?}"));
            signal(master.get().pid(), libc::SIGSTOP);
            std::thread::sleep(pause);
            signal(master.get().pid(), libc::SIGCONT);
        }
        _ => {
            let addr = master.get().addr.clone();
            log.say(format!("kill -9 the master at {addr}, down {pause:?}"));
            if let Some(m) = master.proc.take() {
                m.kill9();
            }
            std::thread::sleep(pause);
            master.proc = Some(ServerProcess::restart_on(&master.base, &addr));
            wait_for("the members to rejoin the restarted master", log, || {
                live_members(d) == members.len() + 1
            });
            log.say("master restarted; every member alive".into());
        }
    }
}

/// Checks the stored topic against every producer's history.
fn check(d: &Driver, histories: &[Arc<Mutex<History>>], log: &Log) {
    let got = read_all(d, TOPIC, "fault-checker", Duration::from_secs(120));
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
    let lines = log.lines.lock().unwrap();
    let count = |what: &str| lines.iter().filter(|l| l.contains(what)).count();
    eprintln!(
        "fault loop (seed {}): {} member kills, {} member pauses, {} master pauses, {} master kills; {} stored, {acked_total} acked, all acknowledged events present once and in order",
        log.seed,
        count("kill -9 member"),
        count("SIGSTOP member"),
        count("SIGSTOP the master"),
        count("kill -9 the master"),
        got.len()
    );
}

fn start_group(base: &Path, log: &Log) -> (Master, Vec<Member>, Driver) {
    let master = ServerProcess::start(base);
    let mut members: Vec<Member> = (1..=2)
        .map(|id| Member {
            dir: base.join(format!("member-{id}")),
            proc: None,
        })
        .collect();
    for m in &mut members {
        m.start(&master);
    }
    let d = master.connect();
    wait_for("three live members", log, || live_members(&d) == 3);
    let master = Master {
        base: base.to_path_buf(),
        proc: Some(master),
    };
    (master, members, d)
}

#[test]
fn acknowledged_events_survive_random_kills_and_pauses() {
    let seed = std::env::var("STROM_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| Rng::from_time().next_u64());
    let cycles: usize = std::env::var("STROM_FAULT_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let log = Log {
        seed,
        start: Instant::now(),
        lines: Mutex::new(Vec::new()),
    };
    log.say(format!("seed {seed}, {cycles} cycles"));
    let _history = HistoryOnPanic(&log);
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut master, mut members, d) = start_group(dir.path(), &log);
    let spec = TopicSpec {
        durability: Durability::Always,
        ..TopicSpec::new(TOPIC, PARTITIONS)
    };
    d.create_topic(spec).expect("creating the topic");

    let stop = Arc::new(AtomicBool::new(false));
    let histories: Vec<Arc<Mutex<History>>> = (0..PRODUCERS).map(|_| Default::default()).collect();
    let loaders: Vec<_> = histories
        .iter()
        .enumerate()
        .map(|(pid, h)| {
            let (d, stop, h) = (d.clone(), stop.clone(), h.clone());
            std::thread::spawn(move || load(d, pid as u64, stop, h))
        })
        .collect();
    let mut rng = Rng::new(seed);
    for _ in 0..cycles {
        std::thread::sleep(Duration::from_millis(50 + rng.below(150)));
        fault(&mut rng, &mut master, &mut members, &d, &log);
    }
    stop.store(true, Ordering::Release);
    for l in loaders {
        if l.join().is_err() {
            log.fail("a producer thread panicked".into());
        }
    }
    log.say("load stopped; checking".into());
    check(&d, &histories, &log);
}
