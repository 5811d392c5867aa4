//! The registry on a metadata quorum of three real `strom server`
//! processes (`--meta-voters 3`, docs/replication.md): killing the Raft
//! leader with SIGKILL, member 0 included, loses no metadata, topic
//! administration works again after the election through the same driver
//! and through the CLI, a restarted member 0 rejoins as a follower, and a
//! data dir whose registry was kept without a quorum refuses to start one.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{member_id, ok, read_all, run_cli, strom_bin, wait_for, JoinedMember, ServerProcess};
use strom_client::{Driver, TopicSpec};

const WAIT: Duration = Duration::from_secs(30);

/// The master the group file names, and every member's address.
fn group_file(path: &Path) -> (u32, Vec<(u32, String)>) {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("reading the group file"))
            .expect("the group file is JSON");
    let members = v["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            let id = m["id"].as_u64().expect("id") as u32;
            (id, m["addr"].as_str().expect("addr").to_string())
        })
        .collect();
    (v["master"].as_u64().expect("master") as u32, members)
}

/// Member 0 and two members that joined it, all with `--meta-voters 3`,
/// once the quorum has its three voters.
struct Cluster {
    base: PathBuf,
    zero: Option<ServerProcess>,
    /// (member id, process, data dir) of the joined members.
    joined: Vec<(u32, Option<JoinedMember>, PathBuf)>,
}

impl Cluster {
    fn start(base: &Path) -> Cluster {
        let zero = ServerProcess::start_with(&base.join("m0"), &["--meta-voters", "3"]);
        let mut joined = Vec::new();
        for i in 1..=2 {
            let dir = base.join(format!("m{i}"));
            let p = zero.join_member(&dir, &["--meta-voters", "3"], Stdio::null());
            wait_for("the member's id", || member_id(&dir).is_some());
            joined.push((member_id(&dir).unwrap(), Some(p), dir));
        }
        wait_for("three voters", || {
            zero.stderr()
                .contains("metadata quorum voters changed voters={0, 1, 2}")
        });
        Cluster {
            base: base.to_path_buf(),
            zero: Some(zero),
            joined,
        }
    }

    fn group_file(&self) -> PathBuf {
        self.base.join("m0").join("group.json")
    }

    /// SIGKILLs member `id`.
    fn kill(&mut self, id: u32) {
        if id == 0 {
            self.zero.take().expect("member 0 runs").kill9();
            return;
        }
        let (_, p, _) = self
            .joined
            .iter_mut()
            .find(|(m, _, _)| *m == id)
            .expect("a joined member");
        drop(p.take().expect("the member runs"));
    }

    /// Restarts joined member `id` on its data, on a new port.
    fn restart_joined(&mut self, id: u32) {
        let zero = self.zero.as_ref().expect("member 0 runs");
        let (_, p, dir) = self
            .joined
            .iter_mut()
            .find(|(m, _, _)| *m == id)
            .expect("a joined member");
        *p = Some(zero.join_member(dir, &["--meta-voters", "3"], Stdio::null()));
    }

    /// Restarts member 0 on the address it had.
    fn restart_zero(&mut self, addr: &str) {
        self.zero = Some(ServerProcess::restart_on(&self.base.join("m0"), addr));
    }
}

fn names(d: &Driver) -> Vec<String> {
    let mut n: Vec<String> = d
        .list_topics()
        .expect("listing topics")
        .into_iter()
        .map(|t| t.spec.name)
        .collect();
    n.sort();
    n
}

fn roles(d: &Driver) -> Vec<(u32, String)> {
    d.members()
        .expect("members")
        .into_iter()
        .map(|m| (m.id, m.role))
        .collect()
}

/// Creates `name` through `d` and says how long it took.
fn create(d: &Driver, name: &str, partitions: u32) -> Duration {
    let t = Instant::now();
    d.create_topic(TopicSpec::new(name, partitions))
        .unwrap_or_else(|e| panic!("creating {name} after a leader kill: {e}"));
    t.elapsed()
}

/// Pushes `n` events to `topic` and checks a fresh consumer reads them all.
fn produce_and_read(d: &Driver, topic: &str, n: u64) {
    let t = d.open_topic(topic).expect("opening the topic");
    let p = t.producer().expect("a producer");
    let futures: Vec<_> = (0..n)
        .map(|i| {
            p.push(format!("{{\"i\":{i}}}"), vec![i as u8; 16])
                .expect("push")
        })
        .collect();
    p.flush().expect("flush");
    for f in futures {
        f.wait().expect("an acknowledged push");
    }
    p.close().expect("close");
    let got = read_all(d, topic, "check", Duration::from_secs(20));
    assert_eq!(got.len() as u64, n, "every acknowledged event is read back");
}

#[test]
fn the_registry_survives_sigkill_of_its_leader_member_0_included() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(tmp.path());
    let d = Driver::connect(c.group_file()).expect("connecting");
    assert_eq!(group_file(&c.group_file()).0, 0, "member 0 leads first");
    let r = roles(&d);
    assert!(r.contains(&(0, "leader".into())), "{r:?}");
    assert_eq!(r.iter().filter(|(_, r)| r == "voter").count(), 2, "{r:?}");
    d.create_topic(TopicSpec::new("before", 3)).unwrap();
    let placed = d.describe("before").unwrap().partitions;
    produce_and_read(&d, "before", 30);
    let zero_addr = c.zero.as_ref().unwrap().addr.clone();

    // Kill the leader, member 0. The same driver creates a topic once a
    // new leader is elected; nothing committed before is lost.
    c.kill(0);
    let took = create(&d, "after-first-kill", 2);
    eprintln!("topic created {took:?} after the leader's SIGKILL");
    assert_eq!(names(&d), ["after-first-kill", "before"]);
    let now = d.describe("before").unwrap().partitions;
    let members =
        |ps: &[strom_proto::PartitionInfo]| ps.iter().map(|p| p.member).collect::<Vec<_>>();
    assert_eq!(members(&now), members(&placed), "placement survives");
    let (leader, _) = group_file(&c.group_file());
    assert_ne!(leader, 0, "the group file names the new leader");
    // New partitions live on live members: produce and read them back.
    produce_and_read(&d, "after-first-kill", 20);
    // The CLI finds the leader from the group file.
    let gf = c.group_file();
    let gf = gf.to_str().unwrap();
    let out = ok(
        run_cli(&["--group-file", gf, "topic", "list"], "", &[], WAIT),
        "topic list",
    );
    assert!(out.stdout.contains("after-first-kill"), "{}", out.stdout);

    // Member 0 comes back as a follower, then the new leader dies too.
    c.restart_zero(&zero_addr);
    wait_for("member 0 back as a voter", || {
        roles(&d).contains(&(0, "voter".into()))
    });
    c.kill(leader);
    create(&d, "after-second-kill", 1);
    assert_eq!(
        names(&d),
        ["after-first-kill", "after-second-kill", "before"]
    );
    let status = ok(
        run_cli(&["--group-file", gf, "status"], "", &[], WAIT),
        "status",
    );
    assert!(status.stdout.contains("REGISTRY"), "{}", status.stdout);
    assert!(status.stdout.contains("leader"), "{}", status.stdout);
}

/// A registry request that finds its leader dead waits for the election,
/// however long it takes, in a group with a metadata quorum. Here neither
/// other member can answer or elect for 4 s (both paused); a client that
/// gave up after 2 s, as one must in a group without a quorum, failed this.
#[test]
fn a_registry_request_waits_out_a_slow_election() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(tmp.path());
    let d = Driver::connect(c.group_file()).expect("connecting");
    d.create_topic(TopicSpec::new("before", 1)).unwrap();
    let pids: Vec<i32> = c
        .joined
        .iter()
        .map(|(_, p, _)| p.as_ref().expect("running").0.id() as i32)
        .collect();
    for pid in &pids {
        // SAFETY: kill(2) on our own children; no memory is involved.
        unsafe { libc::kill(*pid, libc::SIGSTOP) };
    }
    c.kill(0);
    let paused = Duration::from_secs(4);
    let resume = std::thread::spawn(move || {
        std::thread::sleep(paused);
        for pid in pids {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    });
    let took = create(&d, "after-a-slow-election", 1);
    resume.join().expect("the resuming thread");
    eprintln!("topic created {took:?} after the leader's SIGKILL");
    assert!(
        took >= paused,
        "created before any member could lead: {took:?}"
    );
    assert_eq!(names(&d), ["after-a-slow-election", "before"]);
}

#[test]
fn a_registry_kept_without_a_quorum_does_not_start_one() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let s = ServerProcess::start(base);
    let (status, _) = s.terminate(Duration::from_secs(20));
    assert!(status.success());
    let out = Command::new(strom_bin())
        .args(["server", "--listen", "127.0.0.1:0", "--meta-voters", "3"])
        .arg("--data-dir")
        .arg(base.join("data"))
        .output()
        .expect("running strom server");
    assert!(!out.status.success(), "it must refuse to start");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("moving a registry into a quorum is not supported"),
        "{err}"
    );
}

/// A voter restarted on another port is reached there: with it and the
/// leader up and the third voter dead, the quorum still commits.
#[test]
fn a_voter_restarted_on_another_port_still_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(tmp.path());
    let d = Driver::connect(c.group_file()).expect("connecting");
    let addr_of = |d: &Driver, id: u32| {
        d.members()
            .unwrap()
            .into_iter()
            .find(|m| m.id == id && m.alive)
            .map(|m| m.addr)
    };
    let before = addr_of(&d, 2).expect("member 2 alive");
    c.kill(2);
    c.restart_joined(2);
    wait_for("member 2 back on a new port", || {
        addr_of(&d, 2).is_some_and(|a| a != before)
    });
    wait_for("member 2 a voter again", || {
        roles(&d).contains(&(2, "voter".into()))
    });
    // Give the leader its one-second pass to update the quorum's address.
    std::thread::sleep(Duration::from_secs(2));
    c.kill(1);
    create(&d, "with-two-of-three", 1);
    assert_eq!(names(&d), ["with-two-of-three"]);
}
