//! The randomized fault loop with partitions on the move (docs/elasticity.md):
//! five real `strom server` processes (member 0 keeps the registry; members
//! 1-4 joined it), a topic of 6 partitions with 3 copies each under the
//! load and the checker of `fault_loop.rs` (`common/faults.rs`: two
//! idempotent `acks=all` producers; every acknowledged event stored once,
//! at the offset its acknowledgement named, in push order), while each
//! cycle does one of:
//!
//! - `MovePartition` of a random partition to 3 random members, the
//!   wanted leader first (a move may replace one still going on);
//! - SIGKILL of a random member other than 0, started again on its data
//!   dir 0.3-1.5 s later;
//! - SIGSTOP of a random member other than 0 for 0.3-1.5 s.
//!
//! At most one member is down or paused at a time. At the end every move
//! must finish with every copy in sync, and the history must pass the
//! checker. `STROM_FAULT_CYCLES` (default 30 here) and `STROM_FAULT_SEED`
//! as in the other loops; a failure prints the seed and the history.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::faults::{
    check, seed_and_cycles_or, signal, wait_for, HistoryOnPanic, Load, Log, PARTITIONS,
};
use common::{live_members, member_id, JoinedMember, Rng, ServerProcess};
use strom_client::{Driver, Durability, TopicSpec};

const TOPIC: &str = "moving";
const MEMBERS: u32 = 5;

struct Cluster {
    zero: ServerProcess,
    /// id -> (process, data dir)
    joined: BTreeMap<u32, (Option<JoinedMember>, PathBuf)>,
}

impl Cluster {
    fn start(base: &std::path::Path, log: &Log) -> Cluster {
        let zero = ServerProcess::start(&base.join("m0"));
        let mut joined = BTreeMap::new();
        for i in 1..MEMBERS {
            let dir = base.join(format!("m{i}"));
            let p = zero.join_member(&dir, &[], Stdio::null());
            wait_for("the member's id", log, || member_id(&dir).is_some());
            joined.insert(member_id(&dir).expect("an id"), (Some(p), dir));
        }
        Cluster { zero, joined }
    }

    fn pid(&self, id: u32) -> i32 {
        let p = self.joined[&id].0.as_ref().expect("the member runs");
        p.0.id() as i32
    }

    fn restart(&mut self, id: u32, d: &Driver, log: &Log) {
        let dir = self.joined[&id].1.clone();
        let p = self.zero.join_member(&dir, &[], Stdio::null());
        self.joined.insert(id, (Some(p), dir));
        wait_for("every member alive", log, || {
            live_members(d) == MEMBERS as usize
        });
    }
}

fn cycle(rng: &mut Rng, c: &mut Cluster, d: &Driver, log: &Log) {
    let victim = 1 + rng.below(u64::from(MEMBERS) - 1) as u32;
    let hold = Duration::from_millis(300 + rng.below(1200));
    match rng.below(3) {
        0 => {
            let p = rng.below(u64::from(PARTITIONS)) as u32;
            let mut members: Vec<u32> = (0..MEMBERS).collect();
            let mut target = Vec::new();
            while target.len() < 3 {
                let i = rng.below(members.len() as u64) as usize;
                target.push(members.remove(i));
            }
            match d.move_partition(TOPIC, p, target.clone()) {
                Ok(()) => log.say(format!("move partition {p} to {target:?}")),
                Err(e) => log.say(format!("move partition {p} to {target:?} refused: {e}")),
            }
        }
        1 => {
            log.say(format!("kill -9 member {victim}, down {hold:?}"));
            drop(c.joined.get_mut(&victim).and_then(|m| m.0.take()));
            std::thread::sleep(hold);
            c.restart(victim, d, log);
        }
        _ => {
            log.say(format!("SIGSTOP member {victim} for {hold:?}"));
            signal(c.pid(victim), libc::SIGSTOP);
            std::thread::sleep(hold);
            signal(c.pid(victim), libc::SIGCONT);
        }
    }
}

#[test]
fn acknowledged_events_survive_moves_kills_and_pauses() {
    let (seed, cycles) = seed_and_cycles_or(30);
    let log = Log::new(seed);
    log.say(format!("seed {seed}, {cycles} cycles"));
    let _history = HistoryOnPanic(&log);
    let tmp = tempfile::tempdir().expect("temp dir");
    let begin = Instant::now();
    let mut c = Cluster::start(tmp.path(), &log);
    let d = Driver::connect(&c.zero.group_file).expect("connecting");
    wait_for("every member alive", &log, || {
        live_members(&d) == MEMBERS as usize
    });
    let spec = TopicSpec {
        durability: Durability::Always,
        replication_factor: 3,
        ..TopicSpec::new(TOPIC, PARTITIONS)
    };
    d.create_topic(spec).expect("creating the topic");
    let mut load = Load::start(&d, TOPIC);
    let mut rng = Rng::new(seed);
    for _ in 0..cycles {
        std::thread::sleep(Duration::from_millis(100 + rng.below(400)));
        cycle(&mut rng, &mut c, &d, &log);
    }
    let settled = |d: &Driver| {
        d.describe(TOPIC).is_ok_and(|t| {
            t.partitions
                .iter()
                .all(|p| p.moving_to.is_empty() && p.isr.len() == 3)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !settled(&d) {
        if Instant::now() > deadline {
            log.fail(format!(
                "moves not done within 60 s: {:?}",
                d.describe(TOPIC).map(|t| t.partitions)
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    load.stop(&log);
    log.say("load stopped; checking".into());
    let checked = check(&d, TOPIC, &load.histories, &log);
    eprintln!(
        "elastic fault loop (seed {seed}): {cycles} cycles in {:.1?}; {} moves, {} kills, {} pauses; {} stored, {} acked, all acknowledged events present once and in order",
        begin.elapsed(),
        log.count("move partition"),
        log.count("kill -9"),
        log.count("SIGSTOP"),
        checked.stored,
        checked.acked,
    );
}
