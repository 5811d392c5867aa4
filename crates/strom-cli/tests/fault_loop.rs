//! The randomized fault loop: a group of three real `strom server`
//! processes (the master and two joined members) under load from two
//! producers, while each cycle kills and restarts a member (`kill -9`),
//! pauses one (`SIGSTOP` … `SIGCONT`), pauses the master, or kills the
//! master and starts it again on its address. A checker
//! then reads the whole topic and holds it against every producer's
//! history (`common/faults.rs`: no acknowledged event lost, none stored
//! twice, push order kept per producer and partition).
//!
//! Replication factor 1 (file partitions, `durability=always`): a killed
//! member's partitions are unavailable until it is back, and those pushes
//! fail; while the master is down, topic administration waits for it
//! (one registry; see docs/replication.md).
//!
//! `STROM_FAULT_CYCLES` (default 50) sets the length, `STROM_FAULT_SEED`
//! replays one run; a failure prints the seed and the fault history.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::faults::{
    addr_of, check, seed_and_cycles, signal, wait_for, HistoryOnPanic, Load, Log, PARTITIONS,
};
use common::{live_members, JoinedMember, Rng, ServerProcess};
use strom_client::{Driver, Durability, TopicSpec};

const TOPIC: &str = "faults";

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
    let (seed, cycles) = seed_and_cycles();
    let log = Log::new(seed);
    log.say(format!("seed {seed}, {cycles} cycles"));
    let _history = HistoryOnPanic(&log);
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut master, mut members, d) = start_group(dir.path(), &log);
    let spec = TopicSpec {
        durability: Durability::Always,
        ..TopicSpec::new(TOPIC, PARTITIONS)
    };
    d.create_topic(spec).expect("creating the topic");

    let mut load = Load::start(&d, TOPIC);
    let mut rng = Rng::new(seed);
    for _ in 0..cycles {
        std::thread::sleep(Duration::from_millis(50 + rng.below(150)));
        fault(&mut rng, &mut master, &mut members, &d, &log);
    }
    load.stop(&log);
    log.say("load stopped; checking".into());
    let checked = check(&d, TOPIC, &load.histories, &log);
    eprintln!(
        "fault loop (seed {}): {} member kills, {} member pauses, {} master pauses, {} master kills; {} stored, {} acked, all acknowledged events present once and in order",
        log.seed,
        log.count("kill -9 member"),
        log.count("SIGSTOP member"),
        log.count("SIGSTOP the master"),
        log.count("kill -9 the master"),
        checked.stored,
        checked.acked
    );
}
