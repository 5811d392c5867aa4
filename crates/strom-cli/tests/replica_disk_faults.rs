//! A follower whose disk fails, on two real `strom server` processes: a
//! topic with replication factor 2, `min_in_sync` 2 and `durability
//! always`, under an idempotent `acks=all` producer, while the follower's
//! writes fail with ENOSPC (a full disk) or its fdatasync fails with EIO
//! (I/O errors injected through `STROM_TEST_IO_FAULTS`,
//! `strom_storage::faulty`). No push may be acknowledged while only the
//! leader holds it durably: the pushes wait, their waiting appends fail
//! with `NOT_ENOUGH_REPLICAS_AFTER_APPEND` once the follower leaves the
//! in-sync replicas, the producer resends them, and they are acknowledged
//! only once the follower holds them again, each stored once at the offset
//! its acknowledgement names (docs/replication.md, docs/safety.md).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::replicated::{member_stderr, same_copies_of, TOPIC};
use common::{live_members, member_id, read_all, strom_bin, wait_for, JoinedMember, ServerProcess};
use strom_client::{Driver, Durability, EventId, TopicSpec};

const FAULTS_VAR: &str = "STROM_TEST_IO_FAULTS";

/// Pushes per test.
const PUSHES: u64 = 5;

/// Member 0 and one joined member, each with its own fault control file.
struct Pair {
    base: PathBuf,
    zero: ServerProcess,
    joined: Option<JoinedMember>,
    joined_dir: PathBuf,
    joined_id: u32,
    d: Driver,
}

fn control(base: &Path, member: &str) -> PathBuf {
    base.join(format!("{member}.faults"))
}

/// Writes the faults member `member` suffers from now on (atomically).
fn set_faults(base: &Path, member: &str, faults: &str) {
    let tmp = base.join(format!("{member}.faults.tmp"));
    std::fs::write(&tmp, faults).expect("writing the fault control file");
    std::fs::rename(&tmp, control(base, member)).expect("renaming the fault control file");
}

impl Pair {
    fn start(base: &Path) -> Pair {
        let c0 = control(base, "m0");
        let zero = ServerProcess::start_with_env(
            &base.join("m0"),
            &[],
            &[(FAULTS_VAR, c0.to_str().expect("utf-8 path"))],
        );
        let joined_dir = base.join("m1");
        let mut p = Pair {
            base: base.to_path_buf(),
            zero,
            joined: None,
            joined_dir,
            joined_id: u32::MAX,
            d: Driver::connect(base.join("m0").join("group.json")).expect("connecting"),
        };
        p.start_joined();
        wait_for("the member's id", || member_id(&p.joined_dir).is_some());
        p.joined_id = member_id(&p.joined_dir).expect("the member's id");
        p
    }

    /// Starts (or starts again) the joined member on its data dir.
    fn start_joined(&mut self) {
        let child = Command::new(strom_bin())
            .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&self.joined_dir)
            .arg("--join")
            .arg(&self.zero.group_file)
            .env_remove("STROM_GROUP_FILE")
            .env(FAULTS_VAR, control(&self.base, "m1"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(member_stderr(&self.base, 1))
            .spawn()
            .expect("spawning the member");
        self.joined = Some(JoinedMember(child));
        wait_for("two live members", || live_members(&self.d) == 2);
    }

    /// The control file name of member `id`.
    fn name_of(&self, id: u32) -> &'static str {
        if id == 0 {
            "m0"
        } else {
            "m1"
        }
    }

    /// (leader, in-sync replicas) of partition `p`.
    fn roles(&self, p: u32) -> (u32, Vec<u32>) {
        let info = self.d.describe(TOPIC).expect("describing the topic");
        let part = &info.partitions[p as usize];
        (part.member, part.isr.clone())
    }
}

/// Creates the topic (2 partitions, one led by each member) and returns
/// the partition member 0 leads, once both copies of it are in sync and it
/// took one acknowledged push.
fn topic_led_by_member_0(pair: &Pair) -> u32 {
    let spec = TopicSpec {
        replication_factor: 2,
        min_in_sync: 2,
        durability: Durability::Always,
        ..TopicSpec::new(TOPIC, 2)
    };
    pair.d.create_topic(spec).expect("creating the topic");
    let p = (0..2)
        .find(|p| pair.roles(*p).0 == 0)
        .expect("member 0 leads a partition");
    wait_for("both copies in sync", || pair.roles(p).1.len() == 2);
    let t = pair.d.open_topic(TOPIC).unwrap();
    let producer = t.producer().unwrap();
    let f = producer
        .push_with("{\"i\":0}", vec![0u8; 64], Some(p), &[])
        .unwrap();
    producer.flush().unwrap();
    f.wait().expect("the first push");
    p
}

/// An acknowledgement and when it came.
type Acks = Arc<Mutex<Vec<(u64, strom_client::Result<EventId>, Instant)>>>;

/// Pushes events 1..=PUSHES to partition `p` (acks=all, idempotent) and
/// records each answer as it arrives, on its own thread.
fn push_and_record(d: &Driver, p: u32) -> (Acks, Vec<std::thread::JoinHandle<()>>) {
    let t = d.open_topic(TOPIC).unwrap();
    let producer = Arc::new(t.producer().unwrap());
    let acks: Acks = Arc::default();
    let mut threads = Vec::new();
    for i in 1..=PUSHES {
        let f = producer
            .push_with(format!("{{\"i\":{i}}}"), vec![i as u8; 64], Some(p), &[])
            .unwrap();
        let (acks, keep) = (acks.clone(), producer.clone());
        threads.push(std::thread::spawn(move || {
            let r = f.wait();
            acks.lock().unwrap().push((i, r, Instant::now()));
            drop(keep);
        }));
    }
    // A flush waits for every acknowledgement: on its own thread.
    threads.push(std::thread::spawn(move || {
        let _ = producer.flush();
    }));
    (acks, threads)
}

/// Waits until the follower left the in-sync replicas of `p` (or, if that
/// never happens, until a push was acknowledged anyway).
fn out_of_sync_or_acked(pair: &Pair, p: u32, acks: &Acks) {
    wait_for("the follower out of the in-sync replicas", || {
        pair.roles(p).1 == vec![0] || !acks.lock().unwrap().is_empty()
    });
}

/// Every push was acknowledged, none before `healed`, and each is stored
/// once at the offset its acknowledgement named.
fn check_acks(
    pair: &Pair,
    acks: &Acks,
    healed: Instant,
    threads: Vec<std::thread::JoinHandle<()>>,
) {
    for t in threads {
        t.join().expect("a push thread");
    }
    let acks = std::mem::take(&mut *acks.lock().unwrap());
    let mut early = Vec::new();
    for (i, r, at) in &acks {
        let id = r
            .as_ref()
            .unwrap_or_else(|e| panic!("push {i} failed: {e}"));
        if *at < healed {
            early.push((*i, id.offset, healed - *at));
        }
    }
    assert!(
        early.is_empty(),
        "acks=all pushes acknowledged while only the leader held them durably \
         (push, offset, how long before the follower could hold them): {early:?}"
    );
    let stored = read_all(&pair.d, TOPIC, "check", Duration::from_secs(30)).events;
    for (i, r, _) in &acks {
        let id = r.as_ref().expect("checked above");
        let ev = stored
            .get(&(id.partition, id.offset))
            .unwrap_or_else(|| panic!("push {i} is not at {}/{}", id.partition, id.offset));
        assert_eq!(
            ev.meta,
            format!("{{\"i\":{i}}}").as_bytes(),
            "event at {}",
            id.offset
        );
        let copies = stored
            .values()
            .filter(|e| e.meta == format!("{{\"i\":{i}}}").as_bytes())
            .count();
        assert_eq!(copies, 1, "push {i} stored {copies} times");
    }
}

/// The follower's disk fills up (every write fails with ENOSPC) while
/// `acks=all` appends wait for it; the leader shrinks the in-sync replicas
/// to itself after 3 s. Without the re-check of `min_in_sync` when an
/// append completes, the waiting appends were acknowledged then, on one
/// copy (the probe: 166 events past the follower's ENOSPC).
#[test]
fn acks_all_is_not_acknowledged_on_one_copy_when_a_followers_disk_is_full() {
    let tmp = tempfile::tempdir().unwrap();
    let pair = Pair::start(tmp.path());
    let p = topic_led_by_member_0(&pair);
    let follower = pair.joined_id;
    set_faults(tmp.path(), pair.name_of(follower), "write ENOSPC");
    let (acks, threads) = push_and_record(&pair.d, p);
    out_of_sync_or_acked(&pair, p, &acks);
    // Room for an acknowledgement the shrink would release at once.
    std::thread::sleep(Duration::from_secs(1));
    let healed = Instant::now();
    set_faults(tmp.path(), pair.name_of(follower), "");
    check_acks(&pair, &acks, healed, threads);
    wait_for("the follower back in sync", || pair.roles(p).1.len() == 2);
    std::thread::sleep(Duration::from_millis(500));
    same_copies_of(&[pair.zero.data_dir.clone(), pair.joined_dir.clone()], p);
}

/// The follower's fdatasync fails (EIO): its copy stops (the log must be
/// reopened) and what it wrote since its last sync is lost. It must not
/// tell the leader it holds that tail: without reporting its durable end,
/// the leader acknowledged the pushes at the follower's next fetch.
/// Restarting the follower (without the fault) brings it back.
#[test]
fn acks_all_waits_for_a_follower_whose_fsync_failed() {
    let tmp = tempfile::tempdir().unwrap();
    let mut pair = Pair::start(tmp.path());
    let p = topic_led_by_member_0(&pair);
    let follower = pair.joined_id;
    set_faults(tmp.path(), pair.name_of(follower), "sync EIO");
    let (acks, threads) = push_and_record(&pair.d, p);
    out_of_sync_or_acked(&pair, p, &acks);
    std::thread::sleep(Duration::from_secs(1));
    let healed = Instant::now();
    drop(pair.joined.take());
    set_faults(tmp.path(), pair.name_of(follower), "");
    pair.start_joined();
    check_acks(&pair, &acks, healed, threads);
    wait_for("the follower back in sync", || pair.roles(p).1.len() == 2);
    std::thread::sleep(Duration::from_millis(500));
    same_copies_of(&[pair.zero.data_dir.clone(), pair.joined_dir.clone()], p);
}
