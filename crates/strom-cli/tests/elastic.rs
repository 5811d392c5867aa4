//! Elastic groups on real `strom server` processes (docs/elasticity.md):
//! a member joins a running group and `strom rebalance` moves copies to
//! it; `strom member drain` moves everything off a live member, which
//! then leaves and stops; `strom member remove` re-creates a dead member's
//! copies; `strom partition move` moves one copy. All of it under a
//! running idempotent `acks=all` producer and a consumer: every
//! acknowledged event is read back exactly once, in push order, no push
//! fails, and what the consumer saw is what the log holds.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::replicated::*;
use common::{member_id, ok, wait_bounded, wait_for};
use strom_client::Driver;

const CLI: Duration = Duration::from_secs(120);

/// Member id -> data dir, for every member of the group now.
fn dirs(g: &Group) -> Vec<(u32, PathBuf)> {
    let mut out = vec![(0, g.zero.data_dir.clone())];
    out.extend(g.joined.iter().map(|(id, (_, d))| (*id, d.clone())));
    out
}

/// Adds a member on `dir`; returns its id.
fn add_member(g: &mut Group, dir: PathBuf) -> u32 {
    let before = common::live_members(&g.d);
    let p = g.zero.join_member(&dir, &[], Stdio::null());
    wait_for("the new member's id", || member_id(&dir).is_some());
    let id = member_id(&dir).unwrap();
    g.joined.insert(id, (p, dir));
    wait_for("the new member alive", || {
        common::live_members(&g.d) == before + 1
    });
    id
}

/// Member -> how many copies it holds; and whether any partition moves.
fn copies(d: &Driver) -> (std::collections::BTreeMap<u32, usize>, bool) {
    let info = d.describe(TOPIC).unwrap();
    let mut n = std::collections::BTreeMap::new();
    for p in &info.partitions {
        for m in &p.replicas {
            *n.entry(*m).or_default() += 1;
        }
    }
    (n, info.partitions.iter().any(|p| !p.moving_to.is_empty()))
}

/// Each partition's copies hold the same bytes on the members that hold
/// them now, and a member that holds no copy kept no files of it.
fn copies_match_their_holders(g: &Group) {
    std::thread::sleep(Duration::from_secs(1));
    let info = g.d.describe(TOPIC).unwrap();
    let all = dirs(g);
    for p in &info.partitions {
        let holders: Vec<PathBuf> = all
            .iter()
            .filter(|(m, _)| p.replicas.contains(m))
            .map(|(_, d)| d.clone())
            .collect();
        assert_eq!(holders.len(), 3, "partition {}: {:?}", p.id, p.replicas);
        same_copies_of(&holders, p.id);
        for (m, d) in all.iter().filter(|(m, _)| !p.replicas.contains(m)) {
            assert!(
                partition_dir(d, p.id).is_none(),
                "member {m} holds no copy of partition {} but kept its files",
                p.id
            );
        }
    }
}

/// The directory of partition `p` of the topic under a member's data dir.
fn partition_dir(data: &std::path::Path, p: u32) -> Option<PathBuf> {
    let topic = std::fs::read_dir(data.join("topics"))
        .ok()?
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().starts_with(TOPIC))?
        .path()
        .join(p.to_string());
    topic.exists().then_some(topic)
}

#[test]
fn a_member_joins_takes_copies_by_rebalance_and_a_drained_member_leaves() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = start(tmp.path());
    let r = run(&g);
    wait_for("acks before the join", || r.acked_on(0) >= 30);
    let m3 = add_member(&mut g, tmp.path().join("m3"));

    let plan = ok(
        g.zero.cli(&["rebalance", "--dry-run"], "", CLI),
        "rebalance --dry-run",
    );
    assert!(plan.stdout.contains("move "), "a plan:\n{}", plan.stdout);
    assert_eq!(copies(&g.d).0.get(&m3), None, "a dry run moves nothing");
    let out = ok(g.zero.cli(&["rebalance"], "", CLI), "rebalance");
    eprintln!("{}{}", out.stdout, out.stderr);
    let (held, moving) = copies(&g.d);
    assert!(!moving, "rebalance waits for its moves");
    assert!(
        held.get(&m3).copied().unwrap_or(0) >= 2,
        "the new member holds copies: {held:?}"
    );
    assert!(all_in_sync(&g.d), "every copy in sync after the moves");
    let before = r.acked_on(1);
    wait_for("acks after the rebalance", || r.acked_on(1) > before + 30);

    // Drain member 1: everything moves off it, and it stops by itself.
    let out = ok(
        g.zero.cli(&["member", "drain", "1"], "", CLI),
        "member drain 1",
    );
    assert!(out.stderr.contains("left the group"), "{}", out.stderr);
    let (mut proc1, dir1) = g.joined.remove(&1).unwrap();
    let status = wait_bounded(&mut proc1.0, Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "a drained member stops cleanly: {status:?}"
    );
    let (held, _) = copies(&g.d);
    assert_eq!(held.get(&1), None, "member 1 holds nothing: {held:?}");
    assert!(
        !g.d.members().unwrap().iter().any(|m| m.id == 1),
        "member 1 left the group"
    );
    for p in 0..PARTITIONS {
        assert!(
            partition_dir(&dir1, p).is_none(),
            "member 1 dropped its copy of {p}"
        );
    }
    wait_for("every copy in sync", || all_in_sync(&g.d));
    let before = r.acked_on(2);
    wait_for("acks after the drain", || r.acked_on(2) > before + 30);
    finish_without_failures(&g, r);
    copies_match_their_holders(&g);
}

#[test]
fn a_dead_members_copies_are_re_created_by_remove() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = start(tmp.path());
    let r = run(&g);
    wait_for("acks", || r.acked_on(0) >= 30);
    let m3 = add_member(&mut g, tmp.path().join("m3"));
    let (proc2, _) = g.joined.remove(&2).unwrap();
    drop(proc2);
    wait_for("member 2 reported dead", || {
        g.d.members().unwrap().iter().any(|m| m.id == 2 && !m.alive)
    });
    let early = g.zero.cli(&["member", "drain", "2"], "", CLI);
    assert!(!early.status.success(), "a dead member cannot be drained");
    assert!(early.stderr.contains("member remove 2"), "{}", early.stderr);
    ok(
        g.zero.cli(&["member", "remove", "2"], "", CLI),
        "member remove 2",
    );
    let (held, moving) = copies(&g.d);
    assert!(!moving);
    assert_eq!(held.get(&2), None, "{held:?}");
    assert_eq!(
        held.get(&m3),
        Some(&3),
        "member 3 took every copy: {held:?}"
    );
    assert!(all_in_sync(&g.d));
    let before = r.acked_on(1);
    wait_for("acks after the remove", || r.acked_on(1) > before + 30);
    finish_without_failures(&g, r);
    copies_match_their_holders(&g);
}

#[test]
fn one_partition_moves_to_another_member_and_its_consumer_offsets_follow() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = start(tmp.path());
    let r = run(&g);
    wait_for("acks", || r.acked_on(0) >= 30);
    let m3 = add_member(&mut g, tmp.path().join("m3"));
    // A named consumer's committed offset lives with the partition.
    let c =
        g.d.open_topic(TOPIC)
            .unwrap()
            .consumer_with("reader", Default::default())
            .unwrap();
    let first = c.pull_timeout(Duration::from_secs(10)).unwrap();
    let strom_client::Next::Event(ev) = first else {
        panic!("an event")
    };
    ev.ack().wait().unwrap();
    let p = ev.partition;
    drop(c);
    let info = g.d.describe(TOPIC).unwrap();
    let leader = info.partitions[p as usize].member;
    let m3s = m3.to_string();
    let spec = format!("{TOPIC}/{p}");
    let out = ok(
        g.zero
            .cli(&["partition", "move", &spec, "--to", &m3s], "", CLI),
        "partition move",
    );
    assert!(out.stderr.contains("moved in"), "{}", out.stderr);
    let after = g.d.describe(TOPIC).unwrap();
    let moved = &after.partitions[p as usize];
    assert_eq!(
        moved.member, m3,
        "the moved copy leads, as the leader's did"
    );
    assert!(!moved.replicas.contains(&leader), "{:?}", moved.replicas);
    assert!(
        moved.epoch > info.partitions[p as usize].epoch,
        "a new leader epoch"
    );
    let offsets = g.d.consumer_offsets_at(&moved.addr, TOPIC, p).unwrap();
    assert!(
        offsets
            .iter()
            .any(|(n, o)| n == "reader" && *o == ev.offset + 1),
        "the committed offset moved with the partition: {offsets:?}"
    );
    let before = r.acked_on(0);
    wait_for("acks after the move", || r.acked_on(0) > before + 30);
    finish_without_failures(&g, r);
    copies_match_their_holders(&g);
}

#[test]
fn bad_moves_are_refused_with_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let g = start(tmp.path());
    let d = &g.d;
    d.create_topic(strom_client::TopicSpec::new("plain", 1))
        .unwrap();
    let cases: [(&[&str], &str); 6] = [
        (&["member", "drain", "0"], "keeps the registry"),
        (&["member", "drain", "9"], "no member 9"),
        (&["member", "remove", "1"], "is alive"),
        (
            &["partition", "move", "replicated/0", "--to", "9"],
            "no member 9",
        ),
        (
            &["partition", "move", "replicated/7", "--to", "1"],
            "no partition 7",
        ),
        (
            &["partition", "move", "replicated", "--to", "1"],
            "TOPIC/PARTITION",
        ),
    ];
    for (args, why) in cases {
        let out = g.zero.cli(args, "", CLI);
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(out.stderr.contains(why), "{args:?}: {}", out.stderr);
    }
    let owner = d.describe("plain").unwrap().partitions[0].member;
    let (owner, other) = (owner.to_string(), ((owner + 1) % 3).to_string());
    let to_owner = g
        .zero
        .cli(&["partition", "move", "plain/0", "--to", &owner], "", CLI);
    assert!(
        to_owner.stderr.contains("holds a copy"),
        "{}",
        to_owner.stderr
    );
    let args = [
        "partition",
        "move",
        "plain/0",
        "--to",
        "7",
        "--from",
        &other,
    ];
    let from_other = g.zero.cli(&args, "", CLI);
    assert!(
        from_other.stderr.contains("holds no copy"),
        "{}",
        from_other.stderr
    );
    // Member 1 holds copies of every partition of the replicated topic
    // already; with three members, a drain has nowhere to move them.
    let out = g.zero.cli(&["member", "drain", "1"], "", CLI);
    assert!(!out.status.success());
    assert!(out.stderr.contains("no member can take"), "{}", out.stderr);
    let held = copies(d).0;
    assert_eq!(held.get(&1), Some(&3), "nothing moved: {held:?}");
}

/// Pushes `n` events to topic `plain` with an idempotent producer, in
/// windows of 16; returns (seq, partition, offset) of each ack and the
/// number of failed pushes.
fn push_plain(d: &Driver, n: u64, pause: Duration) -> (Vec<(u64, u32, u64)>, usize) {
    let t = d.open_topic("plain").unwrap();
    let p = t
        .producer_with(strom_client::ProducerOptions {
            idempotent: Some(true),
            ..Default::default()
        })
        .unwrap();
    let (mut acked, mut failed) = (Vec::new(), 0);
    for w in 0..n / 16 {
        let futures: Vec<_> = (w * 16..w * 16 + 16)
            .map(|s| {
                (
                    s,
                    p.push_with(
                        format!("{{\"i\":{s}}}"),
                        vec![s as u8; 100],
                        Some((s % 3) as u32),
                        &[],
                    ),
                )
            })
            .collect();
        p.flush().unwrap();
        for (s, f) in futures {
            match f.map(|f| f.wait()) {
                Ok(Ok(id)) => acked.push((s, id.partition, id.offset)),
                _ => failed += 1,
            }
        }
        std::thread::sleep(pause);
    }
    p.close().unwrap();
    (acked, failed)
}

#[test]
fn a_topic_without_replication_moves_off_a_drained_member_too() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = start(tmp.path());
    let m3 = add_member(&mut g, tmp.path().join("m3"));
    g.d.create_topic(strom_client::TopicSpec::new("plain", 3))
        .unwrap();
    let on_1: Vec<u32> =
        g.d.describe("plain")
            .unwrap()
            .partitions
            .iter()
            .filter(|p| p.member == 1)
            .map(|p| p.id)
            .collect();
    assert!(
        !on_1.is_empty(),
        "member 1 owns a partition of the plain topic"
    );
    let gf = g.zero.group_file.clone();
    let pusher = std::thread::spawn(move || {
        let d = Driver::connect(&gf).unwrap();
        push_plain(&d, 4800, Duration::from_millis(2))
    });
    std::thread::sleep(Duration::from_millis(500));
    ok(
        g.zero.cli(&["member", "drain", "1"], "", CLI),
        "member drain 1",
    );
    let (acked, failed) = pusher.join().unwrap();
    assert_eq!(failed, 0, "no push failed");
    assert_eq!(acked.len(), 4800);
    let info = g.d.describe("plain").unwrap();
    for p in &on_1 {
        let part = &info.partitions[*p as usize];
        assert_ne!(part.member, 1, "partition {p} moved off member 1");
        assert_eq!(part.replicas.len(), 1, "one copy still");
    }
    assert!(info.partitions.iter().any(|p| p.member == m3) || on_1.len() == 1);
    let stored = common::read_all(&g.d, "plain", "check", Duration::from_secs(30)).events;
    assert_eq!(stored.len(), 4800, "every event once");
    for (s, p, o) in &acked {
        let ev = stored
            .get(&(*p, *o))
            .expect("an acknowledged event is stored where its ack said");
        assert_eq!(ev.meta, format!("{{\"i\":{s}}}").into_bytes());
        assert_eq!(ev.data, vec![*s as u8; 100]);
    }
    let (mut proc1, dir1) = g.joined.remove(&1).unwrap();
    assert!(wait_bounded(&mut proc1.0, Duration::from_secs(30)).is_some_and(|s| s.success()));
    assert!(
        !std::fs::read_dir(dir1.join("topics")).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("plain")),
        "member 1 dropped the plain topic's files"
    );
}

/// Reads topic `plain` as consumer `name` until its end; every event's
/// (partition, offset), or the first error.
fn consume_plain(d: &Driver, name: &str) -> Result<Vec<(u32, u64)>, String> {
    let c = d
        .open_topic("plain")
        .map_err(|e| e.to_string())?
        .consumer(name)
        .map_err(|e| e.to_string())?;
    let mut seen = Vec::new();
    loop {
        match c.pull_timeout(Duration::from_secs(60)) {
            Ok(strom_client::Next::Event(e)) => seen.push((e.partition, e.offset)),
            Ok(strom_client::Next::EndOfStream) => return Ok(seen),
            Err(e) => return Err(format!("after {} events: {e}", seen.len())),
        }
    }
}

#[test]
fn a_consumer_keeps_reading_while_its_partitions_move_off_a_drained_member() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = start(tmp.path());
    add_member(&mut g, tmp.path().join("m3"));
    g.d.create_topic(strom_client::TopicSpec::new("plain", 3))
        .unwrap();
    let on_1 = |g: &Group| {
        let info = g.d.describe("plain").unwrap();
        info.partitions.iter().filter(|p| p.member == 1).count()
    };
    assert!(on_1(&g) > 0, "member 1 owns a partition of the plain topic");
    let gf = g.zero.group_file.clone();
    let reader = std::thread::spawn(move || consume_plain(&Driver::connect(&gf).unwrap(), "live"));
    let gf = g.zero.group_file.clone();
    let pusher = std::thread::spawn(move || {
        let d = Driver::connect(&gf).unwrap();
        push_plain(&d, 3200, Duration::from_millis(2))
    });
    std::thread::sleep(Duration::from_millis(500));
    ok(
        g.zero.cli(&["member", "drain", "1"], "", CLI),
        "member drain 1",
    );
    assert_eq!(on_1(&g), 0, "the partitions moved off member 1");
    let (acked, failed) = pusher.join().unwrap();
    assert_eq!((acked.len(), failed), (3200, 0), "every push acknowledged");
    let mut seen = reader
        .join()
        .unwrap()
        .expect("the consumer read to the end");
    seen.sort_unstable();
    let mut want: Vec<(u32, u64)> = acked.iter().map(|(_, p, o)| (*p, *o)).collect();
    want.sort_unstable();
    assert_eq!(
        seen, want,
        "the consumer read every acknowledged event once"
    );
}

/// A consumer parked at the end of a partition (caught up, nothing new)
/// while the partition moves, and the member it left releases it: it is
/// told to follow the partition, not that the topic was deleted, and reads
/// what comes after the move from the new owner.
#[test]
fn a_caught_up_consumer_follows_its_partition_when_it_moves() {
    let tmp = tempfile::tempdir().unwrap();
    let g = start(tmp.path());
    g.d.create_topic(strom_client::TopicSpec::new("plain", 1))
        .unwrap();
    let from = g.d.describe("plain").unwrap().partitions[0].member;
    let to = (0..=2).find(|m| *m != from && *m != 0).unwrap();
    let t = g.d.open_topic("plain").unwrap();
    let p = t
        .producer_with(strom_client::ProducerOptions {
            idempotent: Some(true),
            ..Default::default()
        })
        .unwrap();
    let c = t.consumer("parked").unwrap();
    let pull = || match c.pull_timeout(Duration::from_secs(60)) {
        Ok(strom_client::Next::Event(e)) => e.offset,
        other => panic!("the consumer stopped: {:?}", other.map(|_| "end of stream")),
    };
    for i in 0..10 {
        p.push(format!("{{\"i\":{i}}}"), ())
            .unwrap()
            .wait()
            .unwrap();
    }
    let first: Vec<u64> = (0..10).map(|_| pull()).collect();
    assert_eq!(first, (0..10).collect::<Vec<_>>());
    // Parked now; the partition moves and its old owner releases it.
    let spec = "plain/0".to_string();
    ok(
        g.zero.cli(
            &["partition", "move", &spec, "--to", &to.to_string()],
            "",
            CLI,
        ),
        "partition move",
    );
    assert_eq!(g.d.describe("plain").unwrap().partitions[0].member, to);
    for i in 10..20 {
        p.push(format!("{{\"i\":{i}}}"), ())
            .unwrap()
            .wait()
            .unwrap();
    }
    let after: Vec<u64> = (0..10).map(|_| pull()).collect();
    assert_eq!(
        after,
        (10..20).collect::<Vec<_>>(),
        "read on from the new owner"
    );
    p.close().unwrap();
    assert!(matches!(
        c.pull_timeout(Duration::from_secs(60)),
        Ok(strom_client::Next::EndOfStream)
    ));
}

#[test]
fn partitions_added_to_a_replicated_topic_get_their_copies_too() {
    let tmp = tempfile::tempdir().unwrap();
    let g = start(tmp.path());
    let args = ["topic", "add-partitions", TOPIC, "--count", "2"];
    ok(g.zero.cli(&args, "", CLI), "add-partitions");
    wait_for("five partitions, each with three copies in sync", || {
        let info = g.d.describe(TOPIC).unwrap();
        info.partitions.len() == 5 && info.partitions.iter().all(|p| p.isr.len() == 3)
    });
    let t = g.d.open_topic(TOPIC).unwrap();
    let p = t.producer().unwrap();
    let id = p
        .push_with("{\"i\":1}", vec![7u8; 10], Some(4), &[])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!((id.partition, id.offset), (4, 0));
    let stored = common::read_all(&g.d, TOPIC, "check", Duration::from_secs(30)).events;
    assert_eq!(stored[&(4, 0)].data, vec![7u8; 10]);
}

/// Sends `sig` to a process of this test.
fn signal_pid(pid: i32, sig: i32) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// Sends `sig` to a child process.
fn signal(child: &std::process::Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

#[test]
fn a_move_goes_on_after_the_registry_leader_dies() {
    let tmp = tempfile::tempdir().unwrap();
    let voters = ["--meta-voters", "3"];
    let zero = common::ServerProcess::start_with(&tmp.path().join("m0"), &voters);
    let mut procs = std::collections::BTreeMap::new();
    for i in 1..=3 {
        let dir = tmp.path().join(format!("m{i}"));
        let p = zero.join_member(&dir, &voters, Stdio::null());
        wait_for("the member's id", || member_id(&dir).is_some());
        procs.insert(member_id(&dir).unwrap(), (p, dir));
    }
    let d = zero.connect();
    let role = |id: u32| {
        d.members()
            .ok()
            .and_then(|m| m.into_iter().find(|x| x.id == id))
            .map(|m| m.role)
            .unwrap_or_default()
    };
    wait_for("three voters and a fourth member", || {
        common::live_members(&d) == 4 && (0..3).all(|m| !role(m).is_empty())
    });
    let leader = (0..3)
        .find(|m| role(*m) == "leader")
        .expect("a Raft leader");
    // The partition lives on a voter that does not lead the quorum, and
    // moves to member 3 (not a voter).
    let owner = (0..3).find(|m| *m != leader).unwrap();
    d.create_topic_on(strom_client::TopicSpec::new("t", 1), Some(owner))
        .unwrap();
    let p = d.open_topic("t").unwrap().producer().unwrap();
    for i in 0..200u32 {
        p.push_with(format!("{{\"i\":{i}}}"), vec![i as u8; 1000], Some(0), &[])
            .unwrap();
    }
    p.flush().unwrap();
    drop(p);
    // Member 3 cannot copy while it is stopped: the move waits.
    signal(&procs[&3].0 .0, libc::SIGSTOP);
    d.move_partition("t", 0, vec![3]).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(d.describe("t").unwrap().partitions[0].moving_to, vec![3]);
    let shown = ok(zero.cli(&["topic", "describe", "t"], "", CLI), "describe");
    assert!(shown.stdout.contains("MOVING TO [3]"), "{}", shown.stdout);
    match leader {
        0 => zero.kill9(),
        id => drop(procs.remove(&id)),
    }
    signal(&procs[&3].0 .0, libc::SIGCONT);
    let d = Driver::connect(tmp.path().join("m0").join("group.json")).unwrap();
    wait_for("the move done under the new registry leader", || {
        d.describe("t")
            .is_ok_and(|t| t.partitions[0].moving_to.is_empty() && t.partitions[0].member == 3)
    });
    let stored = common::read_all(&d, "t", "check", Duration::from_secs(30)).events;
    assert_eq!(stored.len(), 200);
    for ((_, o), ev) in &stored {
        assert_eq!(ev.meta, format!("{{\"i\":{o}}}").into_bytes());
        assert_eq!(ev.data, vec![*o as u8; 1000]);
    }
}

/// docs/elasticity.md, "Batch jobs": servers started by a second `mpirun`
/// step join the running group under new ids, take copies by rebalance,
/// and, drained, stop by themselves, so the step ends with status 0.
#[test]
fn servers_of_a_second_mpirun_step_join_take_copies_and_leave_when_drained() {
    if std::process::Command::new("mpirun")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("SKIPPED: no mpirun on PATH (make setup-test installs Open MPI)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let g = start(tmp.path());
    let r = run(&g);
    wait_for("acks", || r.acked_on(0) >= 30);
    let script = format!(
        "exec {} server --listen 127.0.0.1:0 --join {} --data-dir {}/mpi-$OMPI_COMM_WORLD_RANK",
        common::strom_bin(),
        g.zero.group_file.display(),
        tmp.path().display()
    );
    let mut step = std::process::Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-n",
            "2",
            "sh",
            "-c",
            &script,
        ])
        .env_remove("STROM_GROUP_FILE")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mpirun");
    wait_for("two more members", || common::live_members(&g.d) == 5);
    ok(g.zero.cli(&["rebalance"], "", CLI), "rebalance");
    let ids: Vec<u32> = (0..2)
        .map(|rank| member_id(&tmp.path().join(format!("mpi-{rank}"))).expect("an id"))
        .collect();
    let (held, _) = copies(&g.d);
    assert!(ids.iter().all(|m| held.contains_key(m)), "{held:?} {ids:?}");
    for m in &ids {
        ok(
            g.zero.cli(&["member", "drain", &m.to_string()], "", CLI),
            "drain",
        );
    }
    let status = wait_bounded(&mut step, Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "the mpirun step ends once its servers are drained: {status:?}"
    );
    finish_without_failures(&g, r);
}

/// `ReleasePartitions` from a connection that has not proven membership
/// (docs/safety.md, "What members trust"): refused at once, even with a
/// huge list, and it drops nothing.
#[test]
fn a_stray_release_drops_nothing() {
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let g = start(tmp.path());
    let info = g.d.describe(TOPIC).unwrap();
    let addr = info.partitions[0].addr.clone();
    let mut s = common::raw::connect(&addr);
    let stray = strom_proto::Request::ReleasePartitions {
        topic: TOPIC.into(),
        topic_id: 999_999,
        partitions: (0..1_000_000).collect(),
    };
    let started = std::time::Instant::now();
    s.write_all(&common::raw::request_frame(7, &stray, &[]))
        .unwrap();
    let got = common::raw::read_until_reply(&mut s, 7, "a stray release");
    let answers = common::raw::responses(&got);
    assert!(
        matches!(
            answers.first(),
            Some((7, strom_proto::Response::Error { code, .. }))
                if *code == strom_proto::ErrorCode::NOT_A_MEMBER
        ),
        "{answers:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    let t = g.d.open_topic(TOPIC).unwrap();
    let id = t
        .producer()
        .unwrap()
        .push_with("{\"i\":0}", vec![1u8; 8], Some(0), &[])
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(id.partition, 0, "partition 0 still takes appends");
    let stored = common::read_all(&g.d, TOPIC, "check", Duration::from_secs(30)).events;
    assert_eq!(stored.len(), 1);
}

/// A partition of a topic without replication that moved is a replica
/// from then on: after a SIGKILL and restart of its new owner it takes no
/// append before its role comes back, then serves every event it had and
/// takes new ones.
#[test]
fn a_moved_partition_without_replication_survives_a_restart_of_its_owner() {
    let tmp = tempfile::tempdir().unwrap();
    let mut g = start(tmp.path());
    g.d.create_topic_on(strom_client::TopicSpec::new("solo", 1), Some(1))
        .unwrap();
    let push = |d: &Driver, i: u32| {
        let t = d.open_topic("solo").unwrap();
        let p = t.producer().unwrap();
        p.push_with(format!("{{\"i\":{i}}}"), vec![i as u8; 64], Some(0), &[])
            .unwrap()
            .wait()
    };
    for i in 0..20 {
        push(&g.d, i).unwrap();
    }
    ok(
        g.zero
            .cli(&["partition", "move", "solo/0", "--to", "2"], "", CLI),
        "partition move",
    );
    assert_eq!(g.d.describe("solo").unwrap().partitions[0].member, 2);
    let (p2, dir2) = g.joined.remove(&2).unwrap();
    drop(p2);
    // Started again while the registry is paused, it gets no role: it
    // must refuse appends (it may not lead any more), not take them.
    signal_pid(g.zero.pid(), libc::SIGSTOP);
    let log = tmp.path().join("m2.stderr");
    let err = std::fs::File::create(&log).unwrap();
    let p2 = g.zero.join_member(&dir2, &[], Stdio::from(err));
    let listening = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("strom server listening on "))
            .and_then(|a| a.split_whitespace().next().map(String::from))
    };
    wait_for("member 2 listening", || listening().is_some());
    let answer = common::raw::produce_with_stamp(
        &listening().unwrap(),
        "solo",
        0,
        strom_proto::ProducerStamp {
            producer: 77,
            sequence: 0,
            restart: false,
        },
        "{\"i\":-1}",
    );
    signal_pid(g.zero.pid(), libc::SIGCONT);
    match answer {
        strom_proto::Response::Error { code, .. } => {
            assert_eq!(code, strom_client::ErrorCode::NOT_PARTITION_LEADER)
        }
        other => panic!("an append before the role came: {other:?}"),
    }
    g.joined.insert(2, (p2, dir2));
    wait_for("member 2 back", || common::live_members(&g.d) == 3);
    let mut next = 20;
    wait_for("the moved partition takes appends again", || {
        let ok = push(&g.d, next).is_ok();
        next += u32::from(ok);
        ok
    });
    let stored = common::read_all(&g.d, "solo", "check", Duration::from_secs(30)).events;
    assert_eq!(stored.len(), next as usize);
    for ((_, o), ev) in &stored {
        assert_eq!(ev.meta, format!("{{\"i\":{o}}}").into_bytes(), "offset {o}");
    }
}
