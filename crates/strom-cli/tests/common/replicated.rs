//! A replicated topic on three real `strom server` processes under a
//! running producer and consumer, and the checks a run ends with: every
//! acknowledged event read back exactly once, at the offset its
//! acknowledgement named, in push order per partition; what a consumer saw
//! is what the final log holds; and every copy is byte for byte the same
//! (docs/replication.md, docs/elasticity.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use strom_client::{Driver, ErrorCode, Next, PushFuture, StartPos, TopicSpec};
use strom_proto::PartitionType;

use super::{member_id, read_all, wait_for, JoinedMember, ServerProcess};

pub const TOPIC: &str = "replicated";
pub const PARTITIONS: u32 = 3;
pub const WAIT: Duration = Duration::from_secs(30);

pub struct Group {
    pub zero: ServerProcess,
    /// member id -> (process, data dir)
    pub joined: BTreeMap<u32, (JoinedMember, PathBuf)>,
    pub d: Driver,
}

pub fn start(base: &Path) -> Group {
    start_with(base, PartitionType::File)
}

/// Where a member's stderr goes: nowhere, or with `STROM_TEST_MEMBER_LOGS`
/// set, to `base/m<i>.stderr` (to see why a run failed).
pub fn member_stderr(base: &Path, i: u32) -> Stdio {
    match std::env::var_os("STROM_TEST_MEMBER_LOGS") {
        Some(_) => std::fs::File::create(base.join(format!("m{i}.stderr")))
            .map_or_else(|_| Stdio::null(), Stdio::from),
        None => Stdio::null(),
    }
}

/// A memory topic's group keeps its registry on a metadata quorum: without
/// one the registry refuses a replicated memory topic.
pub fn start_with(base: &Path, kind: PartitionType) -> Group {
    let zero = match kind {
        PartitionType::Memory => {
            ServerProcess::start_with(&base.join("m0"), &["--meta-voters", "3"])
        }
        _ => ServerProcess::start(&base.join("m0")),
    };
    let mut joined = BTreeMap::new();
    for i in 1..=2 {
        let dir = base.join(format!("m{i}"));
        let p = zero.join_member(&dir, &[], member_stderr(base, i));
        wait_for("the member's id", || member_id(&dir).is_some());
        joined.insert(member_id(&dir).unwrap(), (p, dir));
    }
    let d = zero.connect();
    wait_for("three live members", || super::live_members(&d) == 3);
    let spec = TopicSpec {
        replication_factor: 3,
        partition_type: kind,
        ..TopicSpec::new(TOPIC, PARTITIONS)
    };
    d.create_topic(spec).expect("creating the replicated topic");
    Group { zero, joined, d }
}

/// What the producer saw: acked `(seq, partition, offset, when)`, and the
/// seqs that failed.
#[derive(Default)]
pub struct History {
    pub acked: Vec<(u64, u32, u64, Instant)>,
    pub failed: Vec<u64>,
}

/// Pushes `seq` to partition `seq % PARTITIONS` until `stop`, waiting for
/// each window of acknowledgements.
pub fn produce(d: Driver, stop: Arc<AtomicBool>, out: Arc<Mutex<History>>) {
    let t = d.open_topic(TOPIC).unwrap();
    let p = t.producer().unwrap();
    let mut seq = 0u64;
    while !stop.load(Ordering::Acquire) {
        let mut window: Vec<(u64, Option<PushFuture>)> = Vec::new();
        for _ in 0..12 {
            let meta = format!("{{\"i\":{seq}}}");
            let part = (seq % u64::from(PARTITIONS)) as u32;
            window.push((
                seq,
                p.push_with(meta, vec![seq as u8; 64], Some(part), &[]).ok(),
            ));
            seq += 1;
        }
        let _ = p.flush();
        for (s, f) in window {
            let r = f.map(|f| f.wait());
            let mut h = out.lock().unwrap();
            match r {
                Some(Ok(id)) => h.acked.push((s, id.partition, id.offset, Instant::now())),
                _ => h.failed.push(s),
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// What a consumer saw at each offset: (partition, offset) -> metadata.
pub type Seen = Arc<Mutex<BTreeMap<(u32, u64), Vec<u8>>>>;

/// Follows the topic from the beginning until `stop`, recording what it
/// saw at each offset.
pub fn watch(d: Driver, stop: Arc<AtomicBool>, seen: Seen) {
    let t = d.open_topic(TOPIC).unwrap();
    let c = t
        .consumer_with(
            "watcher",
            strom_client::ConsumerOptions {
                start: StartPos::Beginning,
                ..Default::default()
            },
        )
        .unwrap();
    while !stop.load(Ordering::Acquire) {
        match c.pull_timeout(Duration::from_millis(200)) {
            Ok(Next::Event(e)) => {
                seen.lock()
                    .unwrap()
                    .insert((e.partition, e.offset), e.raw().to_vec());
            }
            Ok(Next::EndOfStream) => return,
            Err(e) if e.code() == ErrorCode::TIMEOUT => {}
            // A partition's owner died: the consumer follows the new one.
            Err(_) => {}
        }
    }
}

pub fn seq_of(meta: &[u8]) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(meta).expect("JSON metadata");
    v["i"].as_u64().expect("a sequence number")
}

/// The checks every run ends with.
pub fn check(g: &Group, h: &History, seen: &BTreeMap<(u32, u64), Vec<u8>>) {
    let stored = read_all(&g.d, TOPIC, "check", WAIT).events;
    let mut by_seq: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
    for ((p, o), ev) in &stored {
        let s = seq_of(&ev.meta);
        assert!(
            by_seq.insert(s, (*p, *o)).is_none(),
            "event {s} is stored twice"
        );
        assert_eq!(ev.data, vec![s as u8; 64], "data of event {s}");
    }
    for (s, p, o, _) in &h.acked {
        assert_eq!(
            by_seq.get(s),
            Some(&(*p, *o)),
            "acknowledged event {s} is not at {p}/{o}"
        );
    }
    for p in 0..PARTITIONS {
        let seqs: Vec<u64> = stored
            .iter()
            .filter(|((q, _), _)| *q == p)
            .map(|(_, ev)| seq_of(&ev.meta))
            .collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "partition {p} out of push order"
        );
    }
    for (at, meta) in seen {
        let now = stored.get(at).map(|e| &e.meta);
        assert_eq!(
            now,
            Some(meta),
            "a consumer saw {at:?} as something the log no longer holds"
        );
    }
    eprintln!(
        "{} acked, {} failed, {} stored, {} seen by the watcher",
        h.acked.len(),
        h.failed.len(),
        stored.len(),
        seen.len()
    );
}

/// Every replica's copy of each partition holds the same bytes.
pub fn same_copies(dirs: &[PathBuf]) {
    for p in 0..PARTITIONS {
        same_copies_of(dirs, p);
    }
}

/// The copies of partition `p` under these members' data dirs hold the
/// same bytes (`.log` and `.data` files).
pub fn same_copies_of(dirs: &[PathBuf], p: u32) {
    let logs: Vec<Vec<u8>> = dirs
        .iter()
        .map(|d| {
            let topic = std::fs::read_dir(d.join("topics"))
                .unwrap()
                .filter_map(|e| e.ok())
                .find(|e| e.file_name().to_string_lossy().starts_with(TOPIC))
                .expect("the topic's directory")
                .path();
            let mut all = Vec::new();
            let mut files: Vec<PathBuf> = std::fs::read_dir(topic.join(p.to_string()))
                .unwrap()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "log" || x == "data"))
                .collect();
            files.sort();
            for f in files {
                all.extend(std::fs::read(f).unwrap());
            }
            all
        })
        .collect();
    assert!(
        logs.windows(2).all(|w| w[0] == w[1]),
        "partition {p}: the replicas' files differ"
    );
}

/// The member leading partition `p`, and the epoch.
pub fn leader(d: &Driver, p: u32) -> (u32, u64) {
    let info = d.describe(TOPIC).unwrap();
    let part = &info.partitions[p as usize];
    (part.member, part.epoch)
}

pub struct Run {
    pub stop: Arc<AtomicBool>,
    pub history: Arc<Mutex<History>>,
    pub seen: Seen,
    pub threads: Vec<std::thread::JoinHandle<()>>,
}

pub fn run(g: &Group) -> Run {
    let stop = Arc::new(AtomicBool::new(false));
    let history = Arc::new(Mutex::new(History::default()));
    let seen = Arc::new(Mutex::new(BTreeMap::new()));
    let pd = Driver::connect(&g.zero.group_file).unwrap();
    let wd = Driver::connect(&g.zero.group_file).unwrap();
    let (s1, s2, h, w) = (stop.clone(), stop.clone(), history.clone(), seen.clone());
    let threads = vec![
        std::thread::spawn(move || produce(pd, s1, h)),
        std::thread::spawn(move || watch(wd, s2, w)),
    ];
    Run {
        stop,
        history,
        seen,
        threads,
    }
}

impl Run {
    pub fn acked_on(&self, p: u32) -> usize {
        self.history
            .lock()
            .unwrap()
            .acked
            .iter()
            .filter(|a| a.1 == p)
            .count()
    }

    pub fn finish(self) -> (History, BTreeMap<(u32, u64), Vec<u8>>) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads {
            t.join().unwrap();
        }
        let h = std::mem::take(&mut *self.history.lock().unwrap());
        let s = std::mem::take(&mut *self.seen.lock().unwrap());
        (h, s)
    }
}

/// Every member's copy of each partition holds the same bytes (after a
/// moment for the last fetches).
pub fn group_copies_are_the_same(g: &Group) {
    std::thread::sleep(Duration::from_secs(1));
    let mut dirs = vec![g.zero.data_dir.clone()];
    dirs.extend(g.joined.values().map(|(_, d)| d.clone()));
    same_copies(&dirs);
}

/// Whether every partition has all three copies in sync.
pub fn all_in_sync(d: &Driver) -> bool {
    let info = d.describe(TOPIC).unwrap();
    info.partitions.iter().all(|q| q.isr.len() == 3)
}

/// Stops the run, checks it, and checks that no push failed.
pub fn finish_without_failures(g: &Group, r: Run) {
    let (h, seen) = r.finish();
    check(g, &h, &seen);
    assert_eq!(h.failed, Vec::<u64>::new(), "pushes that failed");
}

/// The partition member 1 leads (member 0 keeps the registry).
pub fn led_by_member_1(d: &Driver) -> u32 {
    (0..PARTITIONS)
        .find(|p| leader(d, *p).0 == 1)
        .expect("member 1 leads a partition")
}
