//! The randomized fault loop on a metadata quorum: three real `strom
//! server` processes, all with `--meta-voters 3` (member 0 and two members
//! that joined it), under the load and the checker of `fault_loop.rs`
//! (`common/faults.rs`), while each cycle does one of:
//!
//! - SIGKILL of the registry's leader (the member the group file names as
//!   `master`), which stays down 0.5-4 s and is started again on its data
//!   dir only once another member leads;
//! - SIGSTOP of the leader for 0.5-4 s (it is deposed meanwhile and must
//!   step back), then SIGCONT;
//! - SIGKILL and restart, or a short pause, of a member that does not lead;
//! - a full disk or failing fdatasync on a joined member's copies of the
//!   partitions it follows (`fault_loop_quorum/disk.rs`).
//!
//! While the leader is down or paused, a thread administers topics through
//! the same driver (creates `adm-<n>`, lists topics), which must succeed
//! within the client's 15 s search for the new leader. At most one voter is
//! down or paused at a time, and each cycle starts once every member is
//! alive and the group file names the leader. At the end, every created
//! topic must still be listed (no metadata lost), and the event history
//! must pass the checker. Throughout, a forging client (`common/forger.rs`)
//! sends member requests without the cluster secret; each must be refused.
//!
//! A second test pauses the leader and checks that topic creation follows
//! the leader elected meanwhile rather than waiting for the old one.
//!
//! `STROM_FAULT_CYCLES` (default 50) sets the length, `STROM_FAULT_SEED`
//! replays one run; a failure prints the seed and the fault history, and
//! keeps the run's directory (member 0's stderr is in the history, the
//! joined members' in `m1.stderr` and `m2.stderr`).

mod common;
#[path = "fault_loop_quorum/disk.rs"]
mod disk;

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use common::faults::{
    check, seed_and_cycles, signal, wait_for, HistoryOnPanic, Load, Log, PARTITIONS,
};
use common::{live_members, member_id, strom_bin, JoinedMember, Rng, ServerProcess};
use strom_client::{Driver, Durability, TopicSpec};

const TOPIC: &str = "faults";

/// How long topic administration may take while the leader is down or
/// paused: the client searches for the new leader for up to 15 s.
const ADMIN_LIMIT: Duration = Duration::from_secs(16);

/// A member that joined member 0's group file, with its stderr appended to
/// `<dir>.stderr`.
struct Joined {
    id: u32,
    dir: PathBuf,
    proc: Option<JoinedMember>,
}

impl Joined {
    fn stderr_file(&self) -> PathBuf {
        self.dir.with_extension("stderr")
    }

    /// Starts the member listening on `listen` (`host:port`).
    fn start(&mut self, group_file: &Path, listen: &str) {
        let err = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.stderr_file())
            .expect("opening the member's stderr file");
        let child = Command::new(strom_bin())
            .args(["server", "--listen", listen, "--meta-voters", "3"])
            .arg("--data-dir")
            .arg(&self.dir)
            .arg("--join")
            .arg(group_file)
            .env_remove("STROM_GROUP_FILE")
            .env_remove("STROM_LOG")
            .env(disk::FAULTS_VAR, disk::control(&self.dir))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawning the member");
        self.proc = Some(JoinedMember(child));
    }

    /// How often it has joined the group so far (every start joins once).
    fn joins(&self) -> usize {
        std::fs::read_to_string(self.stderr_file())
            .unwrap_or_default()
            .matches("joined the group")
            .count()
    }

    /// The address its last start listened on.
    fn addr(&self) -> String {
        let err = std::fs::read_to_string(self.stderr_file()).unwrap_or_default();
        err.lines()
            .rev()
            .find_map(|l| l.strip_prefix("strom server listening on "))
            .and_then(|a| a.split_whitespace().next())
            .expect("the member says where it listens (its primary address first)")
            .to_string()
    }

    fn pid(&self) -> i32 {
        self.proc.as_ref().expect("running").0.id() as i32
    }

    /// Whether its process runs, and where it waits (for a failure).
    fn process_state(&mut self) -> String {
        let Some(p) = self.proc.as_mut() else {
            return "not started".into();
        };
        if let Ok(Some(status)) = p.0.try_wait() {
            return format!("pid {} exited with {status}", p.0.id());
        }
        let proc_file = |f: &str| {
            std::fs::read_to_string(format!("/proc/{}/{f}", p.0.id())).unwrap_or_default()
        };
        let state = proc_file("status")
            .lines()
            .find(|l| l.starts_with("State:"))
            .unwrap_or_default()
            .to_string();
        format!(
            "pid {} runs ({state}, wchan {}, {} threads)",
            p.0.id(),
            proc_file("wchan"),
            std::fs::read_dir(format!("/proc/{}/task", p.0.id()))
                .map(|d| d.count())
                .unwrap_or(0)
        )
    }
}

/// Member 0 and the two joined members.
struct Cluster {
    base: PathBuf,
    zero: Option<ServerProcess>,
    zero_addr: String,
    joined: Vec<Joined>,
}

impl Cluster {
    fn start(base: &Path, log: &Log) -> Cluster {
        let zero = ServerProcess::start_with(&base.join("m0"), &["--meta-voters", "3"]);
        let mut c = Cluster {
            base: base.to_path_buf(),
            zero_addr: zero.addr.clone(),
            zero: Some(zero),
            joined: Vec::new(),
        };
        for i in 1..=2 {
            let mut m = Joined {
                id: u32::MAX,
                dir: base.join(format!("m{i}")),
                proc: None,
            };
            m.start(&c.group_file(), "127.0.0.1:0");
            wait_for("the member's id", log, || member_id(&m.dir).is_some());
            m.id = member_id(&m.dir).expect("the member's id");
            c.joined.push(m);
        }
        wait_for("three voters", log, || {
            c.zero()
                .stderr()
                .contains("metadata quorum voters changed voters={0, 1, 2}")
        });
        c
    }

    fn zero(&self) -> &ServerProcess {
        self.zero.as_ref().expect("member 0 runs")
    }

    fn group_file(&self) -> PathBuf {
        self.base.join("m0").join("group.json")
    }

    /// The master the group file names (None while it is being rewritten,
    /// or removed by member 0's restart).
    fn named_master(&self) -> Option<u32> {
        let text = std::fs::read(self.group_file()).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
        v["master"].as_u64().map(|m| m as u32)
    }

    fn pid(&self, id: u32) -> i32 {
        if id == 0 {
            return self.zero().pid();
        }
        self.joined
            .iter()
            .find(|m| m.id == id)
            .expect("a joined member")
            .pid()
    }

    fn member(&mut self, id: u32) -> &mut Joined {
        self.joined
            .iter_mut()
            .find(|m| m.id == id)
            .expect("a joined member")
    }

    fn ids(&self) -> Vec<u32> {
        std::iter::once(0)
            .chain(self.joined.iter().map(|m| m.id))
            .collect()
    }

    fn kill(&mut self, id: u32) {
        if id == 0 {
            self.zero.take().expect("member 0 runs").kill9();
        } else {
            drop(self.member(id).proc.take().expect("the member runs"));
        }
    }

    /// Starts member `id` again on its data dir, on the address it had, and
    /// waits until the leader lists every member alive again (member 0
    /// after the group file reappears; a joined member once it has joined
    /// again). The same address, because the quorum keeps reaching a voter
    /// at the address it had when it was added (docs/replication.md).
    fn restart(&mut self, id: u32, d: &Driver, log: &Log) {
        if id == 0 {
            let base = self.base.join("m0");
            self.zero = Some(ServerProcess::restart_on(&base, &self.zero_addr));
        } else {
            let gf = self.group_file();
            let m = self.member(id);
            let (before, addr) = (m.joins(), m.addr());
            m.start(&gf, &addr);
            let m = self.member(id);
            let deadline = Instant::now() + Duration::from_secs(30);
            while m.joins() <= before {
                if Instant::now() > deadline {
                    log.fail(format!(
                        "member {id} did not join again within 30 s: {}",
                        m.process_state()
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        wait_for("every member alive", log, || live_members(d) == 3);
    }

    /// Waits until every member is alive and the group file names the
    /// leader the registry reports.
    fn steady(&self, d: &Driver, log: &Log) -> u32 {
        let mut leader = u32::MAX;
        wait_for(
            "a steady group (3 alive, the group file naming the leader)",
            log,
            || {
                let Ok(members) = d.members() else {
                    return false;
                };
                let Some(l) = members.iter().find(|m| m.role == "leader") else {
                    return false;
                };
                leader = l.id;
                members.iter().filter(|m| m.alive).count() == 3 && self.named_master() == Some(l.id)
            },
        );
        leader
    }
}

/// Creates `name` (one partition), then lists it, through `d`; sends how
/// long each step took from the start (or why it failed) on `done`.
fn administer(d: &Driver, name: &str, done: &Sender<Result<Duration, String>>) {
    let t = Instant::now();
    let created = d
        .create_topic(TopicSpec::new(name, 1))
        .map(|_| t.elapsed())
        .map_err(|e| format!("creating {name}: {e}"));
    let ok = created.is_ok();
    if done.send(created).is_err() || !ok {
        return;
    }
    let listed = match d.list_topics() {
        Ok(l) if l.iter().any(|t| t.spec.name == name) => Ok(t.elapsed()),
        Ok(_) => Err(format!("{name} was created but is not listed")),
        Err(e) => Err(format!("listing topics: {e}")),
    };
    let _ = done.send(listed);
}

/// The run's counts, for the summary line.
#[derive(Default)]
struct Counts {
    admin: usize,
    admin_max: Duration,
    elections: usize,
}

/// One fault, then everything back up.
fn fault(
    rng: &mut Rng,
    c: &mut Cluster,
    d: &Driver,
    created: &mut Vec<String>,
    counts: &mut Counts,
    log: &Log,
) {
    let leader = c.steady(d, log);
    // Leader faults take seconds each: 4 in 28, so 50 cycles take about a
    // minute; 3 in 28 are disk faults on a joined member.
    let kind = rng.below(28);
    if kind >= 25 {
        // A joined member that does not lead the registry (restarted as
        // such after an fsync fault).
        let ids: Vec<u32> = c
            .joined
            .iter()
            .map(|m| m.id)
            .filter(|id| *id != leader)
            .collect();
        let id = ids[rng.below(ids.len() as u64) as usize];
        let dir = c.member(id).dir.clone();
        let mut restart = || {
            c.kill(id);
            c.restart(id, d, log);
        };
        disk::cycle(rng, d, TOPIC, (id, &dir), &mut restart, log);
        return;
    }
    if kind >= 4 {
        // A member that does not lead: killed and restarted, or paused.
        let others: Vec<u32> = c.ids().into_iter().filter(|id| *id != leader).collect();
        let id = others[rng.below(others.len() as u64) as usize];
        let pause = Duration::from_millis(50 + rng.below(350));
        if kind < 14 {
            log.say(format!("kill -9 member {id} (not leading), down {pause:?}"));
            c.kill(id);
            std::thread::sleep(pause);
            c.restart(id, d, log);
            log.say(format!("member {id} back"));
        } else {
            log.say(format!("SIGSTOP member {id} (not leading) for {pause:?}"));
            let pid = c.pid(id);
            signal(pid, libc::SIGSTOP);
            std::thread::sleep(pause);
            signal(pid, libc::SIGCONT);
        }
        return;
    }
    let down = Duration::from_millis(500 + rng.below(3500));
    let kill = kind < 2;
    let name = format!("adm-{}", created.len());
    let start = Instant::now();
    let pid = c.pid(leader);
    if kill {
        log.say(format!(
            "kill -9 the leader, member {leader}, down {down:?}"
        ));
        c.kill(leader);
    } else {
        log.say(format!("SIGSTOP the leader, member {leader}, for {down:?}"));
        signal(pid, libc::SIGSTOP);
    }
    let (done, admin) = std::sync::mpsc::channel();
    {
        let (d, name) = (d.clone(), name.clone());
        std::thread::spawn(move || administer(&d, &name, &done));
    }
    // Created while the leader is still down or paused, or later.
    // Meanwhile: when the group file names another leader.
    let (mut early, mut named_at) = (None, None);
    while start.elapsed() < down {
        if early.is_none() {
            early = admin.try_recv().ok();
        }
        if named_at.is_none() && matches!(c.named_master(), Some(m) if m != leader) {
            named_at = Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if kill {
        // Started again only once another member leads.
        wait_for(
            "a new leader in the group file",
            log,
            || matches!(c.named_master(), Some(m) if m != leader),
        );
    }
    let named = c.named_master();
    if named.is_some_and(|m| m != leader) {
        counts.elections += 1;
    }
    log.say(format!(
        "{:?} after the fault, the group file names member {named:?} (another member first after {named_at:?})",
        start.elapsed()
    ));
    if kill {
        c.restart(leader, d, log);
        log.say(format!("member {leader} restarted"));
    } else {
        signal(pid, libc::SIGCONT);
        log.say(format!("SIGCONT member {leader}"));
    }
    let step = |r: Option<Result<Duration, String>>| {
        r.unwrap_or_else(|| log.fail("the administration thread panicked".into()))
            .unwrap_or_else(|e| log.fail(format!("topic administration failed: {e}")))
    };
    let early_done = early.is_some();
    let create = step(early.or_else(|| admin.recv().ok()));
    let took = step(admin.recv().ok());
    log.say(format!(
        "created {name} in {create:?} ({}), listed it after {took:?}",
        if early_done {
            "before the leader was back"
        } else {
            "after the leader was back"
        }
    ));
    if took > ADMIN_LIMIT {
        log.fail(format!("creating and listing {name} took {took:?}"));
    }
    created.push(name);
    counts.admin += 1;
    counts.admin_max = counts.admin_max.max(took);
}

/// Keeps the run's directory when the test fails, and says where it is.
struct KeepOnPanic(Option<tempfile::TempDir>);

impl Drop for KeepOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(dir) = self.0.take() {
                eprintln!("the run's directory is kept: {}", dir.keep().display());
            }
        }
    }
}

#[test]
fn acknowledged_events_and_metadata_survive_leader_kills_and_pauses() {
    let (seed, cycles) = seed_and_cycles();
    let log = Log::new(seed);
    log.say(format!("seed {seed}, {cycles} cycles"));
    let dir = KeepOnPanic(Some(tempfile::tempdir().expect("temp dir")));
    let _history = HistoryOnPanic(&log);
    let begin = Instant::now();
    let mut c = Cluster::start(dir.0.as_ref().expect("the dir").path(), &log);
    let d = Driver::connect(c.group_file()).expect("connecting");
    // Replicated partitions: a killed or paused member's partitions fail
    // over to an in-sync copy (STROM_FAULT_REPLICAS=1 runs without).
    let replicas = std::env::var("STROM_FAULT_REPLICAS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    log.say(format!("replication factor {replicas}"));
    let spec = TopicSpec {
        durability: Durability::Always,
        replication_factor: replicas,
        ..TopicSpec::new(TOPIC, PARTITIONS)
    };
    d.create_topic(spec).expect("creating the topic");

    let mut load = Load::start(&d, TOPIC);
    let forger = common::forger::Forger::start(c.group_file(), TOPIC, PARTITIONS, seed);
    let mut rng = Rng::new(seed);
    let mut created = Vec::new();
    let mut counts = Counts::default();
    for _ in 0..cycles {
        std::thread::sleep(Duration::from_millis(20 + rng.below(60)));
        fault(&mut rng, &mut c, &d, &mut created, &mut counts, &log);
    }
    c.steady(&d, &log);
    load.stop(&log);
    let forged = forger.stop();
    log.say(format!(
        "load stopped; {} forged member requests refused; checking",
        forged.refused
    ));
    if !forged.accepted.is_empty() {
        log.fail(format!(
            "forged member requests were served: {:?}",
            forged.accepted
        ));
    }
    let listed: Vec<String> = d
        .list_topics()
        .unwrap_or_else(|e| log.fail(format!("listing topics at the end: {e}")))
        .into_iter()
        .map(|t| t.spec.name)
        .collect();
    for name in created.iter().chain([&TOPIC.to_string()]) {
        if !listed.contains(name) {
            log.fail(format!("topic {name} was created but is no longer listed"));
        }
    }
    let checked = check(&d, TOPIC, &load.histories, &log);
    eprintln!(
        "quorum fault loop (seed {seed}): {cycles} cycles in {:.1?}; {} leader kills, {} leader pauses, {} other kills, {} other pauses, {} follower disk faults; {} new leaders; {} topics created while the leader was down or paused (slowest {:.2?}), all still listed; {} stored, {} acked, all acknowledged events present once and in order",
        begin.elapsed(),
        log.count("kill -9 the leader"),
        log.count("SIGSTOP the leader"),
        log.count("(not leading), down"),
        log.count("(not leading) for"),
        log.count("on its copies of partitions"),
        counts.elections,
        counts.admin,
        counts.admin_max,
        checked.stored,
        checked.acked,
    );
    eprintln!("fault history:\n{}", log.history());
}

/// A paused leader answers nothing and never says it was deposed: topic
/// creation through the driver must follow the leader elected meanwhile,
/// not wait for the old one to resume.
#[test]
fn topic_creation_follows_a_new_leader_while_the_old_one_is_paused() {
    let log = Log::new(0);
    let _history = HistoryOnPanic(&log);
    let dir = tempfile::tempdir().expect("temp dir");
    let c = Cluster::start(dir.path(), &log);
    let d = Driver::connect(c.group_file()).expect("connecting");
    d.create_topic(TopicSpec::new("before", 1))
        .expect("creating a topic");
    let leader = c.steady(&d, &log);
    let pid = c.pid(leader);
    signal(pid, libc::SIGSTOP);
    // Resumed once the topic is created, or after 10 s.
    let (resume, resumed) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let _ = resumed.recv_timeout(Duration::from_secs(10));
        signal(pid, libc::SIGCONT);
    });
    let t = Instant::now();
    let created = d.create_topic(TopicSpec::new("during", 1));
    let took = t.elapsed();
    let _ = resume.send(());
    watchdog.join().expect("the watchdog");
    created.expect("creating a topic while the leader is paused");
    assert!(
        took < Duration::from_secs(6),
        "creating a topic took {took:?} while member {leader}, the leader, was paused"
    );
    eprintln!("created a topic {took:?} after pausing the leader, member {leader}");
}
