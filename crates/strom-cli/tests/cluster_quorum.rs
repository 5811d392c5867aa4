//! `strom cluster up` with its defaults starts what survives any one
//! member: a 3-server group keeps its registry on a quorum of three voters,
//! so after `kill -9` of member 0 (the registry's first leader and a
//! partition leader) new CLI producers and consumers work and every
//! acknowledged event reads back; `strom status` says how many failures
//! the group survives before and after. Every member, member 0 included,
//! restarted in turn with `--join` under a running producer comes back as
//! the same member and loses nothing acknowledged. Real `strom` processes,
//! temp dirs, port 0.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cluster::{cluster_up, cluster_up_with, running, Cluster};
use common::procs::{positions, CLI_TIMEOUT};
use common::{ok, read_all, run_cli};
use serde_json::Value;
use strom_client::{Driver, EventId, TopicSpec};

/// `strom status --json` of the group.
fn status(group_file: &str) -> Value {
    let out = ok(
        run_cli(
            &["--group-file", group_file, "status", "--json"],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "status",
    );
    serde_json::from_str(&out.stdout).expect("status --json is JSON")
}

/// Creates topic `r`, 2 partitions with 3 copies each, with the CLI.
fn create_rf3(group_file: &str) {
    ok(
        run_cli(
            &[
                "--group-file",
                group_file,
                "topic",
                "create",
                "r",
                "--partitions",
                "2",
                "--replication-factor",
                "3",
            ],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "topic create",
    );
}

/// Produces `n` events numbered from `from` with the CLI, its producer left
/// open (the stream goes on for the next one); every one must
/// be acknowledged. Returns their positions.
fn produce(group_file: &str, from: u32, n: u32) -> Vec<(u32, u64)> {
    let input: String = (from..from + n)
        .map(|i| format!("{{\"i\":{i}}}\n"))
        .collect();
    let out = ok(
        run_cli(
            &["--group-file", group_file, "produce", "r", "--keep-open"],
            &input,
            &[],
            CLI_TIMEOUT,
        ),
        "produce",
    );
    let got = positions(&out);
    assert_eq!(
        got.len(),
        n as usize,
        "one position per event:\n{}",
        out.stdout
    );
    got
}

#[test]
fn a_default_cluster_up_of_three_survives_the_death_of_member_0() {
    let base = tempfile::tempdir().expect("tempdir");
    let c = cluster_up(base.path(), 3);
    let gf = c.group_file.clone();
    let s = status(&gf);
    assert_eq!(s["survives"]["registry"]["survives"], 1, "{s:#}");
    let roles: BTreeSet<String> = s["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| m["role"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        roles.contains("leader") && roles.contains("voter"),
        "{roles:?}"
    );

    create_rf3(&gf);
    let mut acked: BTreeSet<(u32, u64)> = produce(&gf, 0, 200).into_iter().collect();
    let s = status(&gf);
    assert_eq!(s["survives"]["member_failures"], 1, "{s:#}");
    assert_eq!(s["survives"]["topics"]["r"]["survives"], 2, "{s:#}");

    // Member 0: rank 0, the registry's first leader.
    let pid = c.pids[0];
    // SAFETY: kill(2) on a server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    while running(pid) {
        std::thread::sleep(Duration::from_millis(20));
    }

    acked.extend(produce(&gf, 200, 200));
    let out = ok(
        run_cli(
            &["--group-file", &gf, "consume", "r", "--name", "after"],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "consume after member 0 died",
    );
    let read: BTreeSet<(u32, u64)> = positions(&out).into_iter().collect();
    let lost: Vec<_> = acked.difference(&read).collect();
    assert!(
        lost.is_empty(),
        "acknowledged events not read back: {lost:?}"
    );
    assert_eq!(read.len(), 400, "every event once");

    let s = status(&gf);
    assert_eq!(s["survives"]["member_failures"], 0, "{s:#}");
    let why = s["survives"]["registry"]["why"].as_str().unwrap_or("");
    assert!(why.contains("2 of 3 voters alive"), "{why}");
}

#[test]
fn cluster_up_checks_its_voters_and_passes_server_options_through() {
    let base = tempfile::tempdir().expect("tempdir");
    let d = base.path().to_str().expect("utf-8");
    let out = run_cli(
        &[
            "cluster",
            "up",
            "--servers",
            "2",
            "--meta-voters",
            "3",
            "--data-dir",
            d,
        ],
        "",
        &[],
        CLI_TIMEOUT,
    );
    assert!(!out.status.success());
    assert!(
        out.stderr
            .contains("--meta-voters 3 needs at least 3 servers"),
        "{}",
        out.stderr
    );
    // A server refusing its options stops `up` at once, with its reason.
    let bad = base.path().join("bad");
    let out = run_cli(
        &[
            "cluster",
            "up",
            "--servers",
            "1",
            "--data-dir",
            bad.to_str().expect("utf-8"),
            "--",
            "--member-timeout-ms",
            "1",
        ],
        "",
        &[],
        CLI_TIMEOUT,
    );
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("rank 0 exited before the group formed")
            && out.stderr.contains("member_timeout_ms"),
        "{}",
        out.stderr
    );
    // A server option after `--` reaches every member: here the HTTP
    // listener each member logs.
    let c = cluster_up_with(base.path(), 1, &["--", "--http-listen", "127.0.0.1:0"]);
    let log = std::fs::read_to_string(c.dir.join("server-0.log")).expect("server log");
    assert!(
        log.contains("strom http listening on http://127.0.0.1:"),
        "the member serves HTTP:\n{log}"
    );
    let s = status(&c.group_file);
    assert_eq!(s["survives"]["registry"]["survives"], 0, "{s:#}");
}

/// Waits (bounded) until member `id` is alive again with its old id and
/// every partition of `r` has all its copies in sync.
fn wait_rejoined(c: &Cluster, id: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = run_cli(
            &["--group-file", &c.group_file, "status", "--json"],
            "",
            &[],
            CLI_TIMEOUT,
        );
        assert!(
            out.status.success(),
            "status failed: {}\n{}",
            out.stderr,
            c.logs()
        );
        let s: Value = serde_json::from_str(&out.stdout).expect("status --json is JSON");
        let back = s["members"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["id"] == id && m["alive"] == true);
        let in_sync = s["topics"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|t| t["partitions"].as_array().into_iter().flatten())
            .all(|p| p["isr"].as_array().map_or(0, |i| i.len()) == 3);
        let members = s["members"].as_array().map_or(0, |m| m.len());
        assert_eq!(members, 3, "a restarted member joined as a new one: {s:#}");
        if back && in_sync {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "member {id} did not come back in sync: {s:#}\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn every_member_restarted_in_turn_with_join_comes_back_as_itself_and_loses_nothing() {
    let base = tempfile::tempdir().expect("tempdir");
    let c = cluster_up(base.path(), 3);
    let d = Driver::connect(&c.group_file).expect("connect");
    let mut spec = TopicSpec::new("r", 3);
    spec.replication_factor = 3;
    d.create_topic(spec).expect("create");
    // A producer pushing all along, acks=all and idempotent (the default
    // for replicated topics): it rides out each member's death.
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let gf = c.group_file.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let d = Driver::connect(&gf).expect("connect");
            let p = d
                .open_topic("r")
                .expect("open")
                .producer()
                .expect("producer");
            let mut futures = Vec::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Acquire) {
                futures.push(p.push(format!("{{\"i\":{i}}}"), ()).expect("push"));
                i += 1;
                // Paced (at most about 10,000 events/s, less under
                // backpressure), so the futures kept stay few.
                if i.is_multiple_of(50) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            let _ = p.flush();
            let acked: Vec<EventId> = futures.into_iter().filter_map(|f| f.wait().ok()).collect();
            p.close().expect("close");
            (i, acked)
        })
    };
    let mut restarted = Vec::new();
    for rank in 0..3 {
        c.kill(c.pids[rank]);
        restarted.push(c.restart(rank));
        wait_rejoined(&c, rank as u64);
    }
    stop.store(true, Ordering::Release);
    let (pushed, acked) = producer.join().expect("the producer thread");
    assert!(
        acked.len() > 100,
        "{} of {pushed} acknowledged",
        acked.len()
    );
    let read = read_all(&d, "r", "check", Duration::from_secs(60));
    let lost: Vec<_> = acked
        .iter()
        .filter(|e| !read.events.contains_key(&(e.partition, e.offset)))
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged events lost: {lost:?}",
        lost.len()
    );
    for rank in 0..3 {
        let id = std::fs::read_to_string(c.dir.join(format!("rank-{rank}/member-id")))
            .expect("every data dir records its member");
        assert_eq!(id.trim(), rank.to_string());
    }
}

/// The members `strom status` lists with their role in the registry.
fn roles(group_file: &str) -> Vec<(u64, String, bool)> {
    status(group_file)["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| {
            (
                m["id"].as_u64().expect("id"),
                m["role"].as_str().unwrap_or("").to_string(),
                m["alive"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

/// Waits (bounded) until `cond` holds of the members' roles.
fn wait_roles(c: &Cluster, what: &str, cond: impl Fn(&[(u64, String, bool)]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = roles(&c.group_file);
        if cond(&r) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {r:?}\n{}", c.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_removed_voter_is_replaced_and_the_group_survives_a_second_death() {
    let base = tempfile::tempdir().expect("tempdir");
    let c = cluster_up_with(base.path(), 4, &["--", "--member-timeout-ms", "2000"]);
    let gf = c.group_file.clone();
    let voting = |r: &[(u64, String, bool)], id: u64| {
        r.iter()
            .any(|(m, role, _)| *m == id && (role == "leader" || role == "voter"))
    };
    // Which member is the spare depends on the order the members joined
    // in; a member's id is its rank (`cluster up`), its pid's index.
    let start = roles(&gf);
    let spare = (0..4u64)
        .find(|id| !voting(&start, *id))
        .expect("one of four members is a spare");
    let leader = start
        .iter()
        .find(|(_, role, _)| role == "leader")
        .map(|(m, _, _)| *m)
        .expect("a leader");
    let mut others = (0..4u64).filter(|id| *id != spare && *id != leader);
    let (first, second) = (others.next().unwrap(), others.next().unwrap());
    create_rf3(&gf);
    let mut acked: BTreeSet<(u32, u64)> = produce(&gf, 0, 100).into_iter().collect();

    // A voter dies for good and is removed: the spare votes in its place.
    c.kill(c.pids[first as usize]);
    wait_roles(&c, "the dead voter counted dead", |r| {
        r.iter().any(|(m, _, alive)| *m == first && !alive)
    });
    let id = first.to_string();
    ok(
        run_cli(
            &["--group-file", &gf, "member", "remove", &id],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "member remove",
    );
    wait_roles(&c, "the spare votes instead of the removed voter", |r| {
        voting(r, spare) && !voting(r, first)
    });

    // A second voter dies: two of three voters are left, and the group
    // keeps working.
    c.kill(c.pids[second as usize]);
    acked.extend(produce(&gf, 100, 100));
    let out = ok(
        run_cli(
            &["--group-file", &gf, "consume", "r", "--name", "after"],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "consume after the second death",
    );
    let read: BTreeSet<(u32, u64)> = positions(&out).into_iter().collect();
    let lost: Vec<_> = acked.difference(&read).collect();
    assert!(
        lost.is_empty(),
        "acknowledged events not read back: {lost:?}"
    );
}
