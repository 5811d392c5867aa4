//! The `strom` command when members fail, and newcomer traps, against the
//! real binary and real server processes: a group member killed with -9
//! during `consume` and `produce`, `cluster down`, `--address`, `strom
//! bench`'s target, and the port-in-use message.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::cluster::{cluster_up, running, Cluster};
use common::procs::*;
use common::{ok, run_cli, ServerProcess};
use serde_json::Value;
use strom_client::{Driver, TopicSpec};

/// A 3-member group with a 3-partition topic holding 30 events (10 per
/// partition), and the member owning partition 1 killed with -9. Returns
/// the cluster, the dead member's id, and partition 1's address.
fn cluster_with_dead_member(dir: &Path) -> (Cluster, u32) {
    let c = cluster_up(dir, 3);
    let d = Driver::connect(&c.group_file).expect("connect");
    let t = d.create_topic(TopicSpec::new("t", 3)).expect("create");
    let info = t.describe().expect("describe");
    let p = t.producer().expect("producer");
    for i in 0..30u32 {
        p.push_with(format!("{{\"i\":{i}}}"), (), Some(i % 3), &[])
            .expect("push");
    }
    p.flush().expect("flush");
    drop(p);
    let victim = &info.partitions[1];
    let master_addr = d.master_addr().to_string();
    assert_ne!(
        victim.addr, master_addr,
        "partition 1 should not be on the master"
    );
    for other in [&info.partitions[0], &info.partitions[2]] {
        assert_ne!(other.addr, victim.addr, "partitions spread over members");
    }
    let pid = c.pid_of(&victim.addr);
    // SAFETY: kill(2) on a server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    while running(pid) {
        std::thread::sleep(Duration::from_millis(20));
    }
    (c, victim.member)
}

#[test]
fn consume_reads_live_partitions_when_a_member_is_dead() {
    let base = tempfile::tempdir().expect("tempdir");
    let (c, dead) = cluster_with_dead_member(base.path());
    let out = run_cli(
        &["--group-file", &c.group_file, "consume", "t", "--name", "c"],
        "",
        &[],
        CLI_TIMEOUT,
    );
    let got = positions(&out);
    let mut per: BTreeMap<u32, usize> = BTreeMap::new();
    for (p, _) in &got {
        *per.entry(*p).or_default() += 1;
    }
    assert_eq!(
        per.get(&0),
        Some(&10),
        "partition 0 read; stderr:\n{}",
        out.stderr
    );
    assert_eq!(
        per.get(&2),
        Some(&10),
        "partition 2 read; stderr:\n{}",
        out.stderr
    );
    assert_eq!(per.get(&1), None);
    let lines: Vec<_> = out
        .stderr
        .lines()
        .filter(|l| l.contains("unreachable") || l.contains("unavailable"))
        .filter(|l| !l.contains("partition(s) were unavailable"))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "one notice for the dead partition:\n{}",
        out.stderr
    );
    assert!(
        lines[0].contains("partition 1") && lines[0].contains(&format!("member {dead}")),
        "the notice names the partition and member: {}",
        lines[0]
    );
    assert!(!out.status.success(), "an incomplete read exits non-zero");
}

#[test]
fn produce_prints_stored_offsets_and_reports_failures_when_a_member_is_dead() {
    let base = tempfile::tempdir().expect("tempdir");
    let (c, dead) = cluster_with_dead_member(base.path());
    let d = Driver::connect(&c.group_file).expect("connect");
    let before = d.describe("t").expect("describe").state;
    let input: String = (0..30).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    let out = run_cli(
        &["--group-file", &c.group_file, "produce", "t"],
        &input,
        &[],
        CLI_TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(1), "stderr:\n{}", out.stderr);
    // One record per input line, in order: a position or an error.
    let records: Vec<serde_json::Value> = out
        .lines()
        .iter()
        .map(|l| serde_json::from_str(l).expect("a JSON record"))
        .collect();
    let lines: Vec<u64> = records.iter().filter_map(|r| r["line"].as_u64()).collect();
    assert_eq!(
        lines,
        (1..=30).collect::<Vec<u64>>(),
        "stdout:\n{}",
        out.stdout
    );
    let (failed, stored): (Vec<_>, Vec<_>) = records.iter().partition(|r| r.get("error").is_some());
    assert_eq!(
        stored.len(),
        20,
        "the events on live partitions are printed; stderr:\n{}",
        out.stderr
    );
    assert!(stored.iter().all(|r| r["partition"].as_u64() != Some(1)));
    assert_eq!(failed.len(), 10, "each failed line has its error record");
    let summary: Vec<_> = out
        .stderr
        .lines()
        .filter(|l| l.contains("partition 1"))
        .collect();
    assert!(
        summary
            .iter()
            .any(|l| l.contains("10 events failed") && l.contains(&format!("member {dead}"))),
        "stderr summarizes the failures by partition:\n{}",
        out.stderr
    );
    // The stream is held open for the failed lines (README's promise): a
    // producer without a lease took over and the leased one closed, so
    // nothing ends when a lease runs out.
    let held: u64 = out
        .stderr
        .lines()
        .find_map(|l| {
            l.split("strom: producer ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| {
            panic!(
                "stderr names the producer holding the stream:\n{}",
                out.stderr
            )
        });
    let state = d.describe("t").expect("describe").state;
    assert!(!state.ended, "the stream is held open");
    assert_eq!(
        (state.open_producers, state.closed_producers),
        (before.open_producers + 1, before.closed_producers + 1),
        "the holder opened and the leased producer closed: {before:?} -> {state:?}"
    );
    // The member comes back; the failed lines are sent again, as stderr
    // said, and the hold ends.
    let _back = c.restart(dead as usize);
    // Back once the registry has its new address (until its member
    // timeout passes, the dead one still counts as alive).
    let old_addr = d.describe("t").expect("describe").partitions[1]
        .addr
        .clone();
    let deadline = std::time::Instant::now() + CLI_TIMEOUT;
    while d.describe("t").expect("describe").partitions[1].addr == old_addr {
        assert!(
            std::time::Instant::now() < deadline,
            "member {dead} did not come back:\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let again: String = failed
        .iter()
        .map(|r| {
            let line = r["line"].as_u64().expect("line") as usize;
            input
                .lines()
                .nth(line - 1)
                .expect("the input line")
                .to_string()
                + "\n"
        })
        .collect();
    let resent = ok(
        run_cli(
            &["--group-file", &c.group_file, "produce", "t"],
            &again,
            &[],
            CLI_TIMEOUT,
        ),
        "sending the failed lines again",
    );
    assert_eq!(positions(&resent).len(), 10);
    assert!(!d.describe("t").expect("describe").state.ended);
    let closed = ok(
        run_cli(
            &[
                "--group-file",
                &c.group_file,
                "topic",
                "close-producer",
                "t",
                &held.to_string(),
            ],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "close-producer",
    );
    // What stays open is the setup's own producer (still leased), not
    // one of the CLI's; ending the stream is left to its owner.
    assert!(
        closed
            .stderr
            .contains(&format!("{} producers still open", before.open_producers)),
        "{}",
        closed.stderr
    );
    ok(
        run_cli(
            &["--group-file", &c.group_file, "topic", "complete", "t"],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "topic complete",
    );
    let all = ok(
        run_cli(
            &[
                "--group-file",
                &c.group_file,
                "consume",
                "t",
                "--name",
                "all",
            ],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "reading the whole stream",
    );
    assert_eq!(
        positions(&all).len(),
        30 + 30,
        "every event once, to the end"
    );
}

#[test]
fn cluster_down_stops_every_member_and_says_which() {
    let base = tempfile::tempdir().expect("tempdir");
    let c = cluster_up(base.path(), 3);
    // A member that does not react to SIGTERM (stopped) must still go.
    // SAFETY: kill(2) on a server this test started.
    assert_eq!(unsafe { libc::kill(c.pids[2], libc::SIGSTOP) }, 0);
    // No `kill` on PATH: down must not depend on one.
    let out = run_cli(
        &[
            "cluster",
            "down",
            "--data-dir",
            c.dir.to_str().expect("utf-8"),
            "--timeout",
            "1",
        ],
        "",
        &[("PATH", "")],
        CLI_TIMEOUT,
    );
    let out = ok(out, "cluster down");
    for (rank, pid) in c.pids.iter().enumerate() {
        assert!(
            !running(*pid),
            "rank {rank} (pid {pid}) still runs:\n{}",
            out.stderr
        );
        assert!(
            out.stderr.contains(&format!("pid {pid}")),
            "down names pid {pid}:\n{}",
            out.stderr
        );
    }
    assert!(
        out.stderr.contains("killed"),
        "says which it had to kill:\n{}",
        out.stderr
    );
    assert!(!c.dir.join("cluster.json").exists());
}

#[test]
fn cluster_down_never_signals_a_process_that_is_not_its_server() {
    let base = tempfile::tempdir().expect("tempdir");
    let c = cluster_up(base.path(), 1);
    // Pretend the member died and its pid went to an unrelated process.
    let mut other = Command::new("sleep").arg("60").spawn().expect("sleep");
    let rec_path = c.dir.join("cluster.json");
    let mut rec: Value =
        serde_json::from_slice(&std::fs::read(&rec_path).expect("read")).expect("json");
    rec["pids"] = serde_json::json!([other.id()]);
    std::fs::write(&rec_path, serde_json::to_vec(&rec).expect("json")).expect("write");
    let out = c.down();
    assert!(
        other.try_wait().expect("polling sleep").is_none(),
        "down signalled an unrelated process:\n{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!("pid {}", other.id())) && out.stderr.contains("not"),
        "down says pid {} is not its server:\n{}",
        other.id(),
        out.stderr
    );
    let _ = other.kill();
    let _ = other.wait();
}

#[test]
fn commands_reach_a_server_through_address() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let addr = server.addr.clone();
    ok(
        run_cli(
            &["--address", &addr, "topic", "create", "t"],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "topic create --address",
    );
    let out = ok(
        run_cli(
            &["--address", &addr, "produce", "t"],
            "{\"a\":1}\n",
            &[],
            CLI_TIMEOUT,
        ),
        "produce --address",
    );
    assert_eq!(positions(&out), vec![(0, 0)]);
    let out = ok(
        run_cli(
            &["consume", "t", "--name", "c"],
            "",
            &[("STROM_ADDRESS", &addr)],
            CLI_TIMEOUT,
        ),
        "consume with STROM_ADDRESS",
    );
    assert_eq!(positions(&out), vec![(0, 0)]);
}

#[test]
fn bench_says_when_it_uses_an_embedded_server_and_uses_the_group_file_otherwise() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let gf = server.group_file.to_str().expect("utf-8").to_string();
    let args = [
        "bench",
        "produce",
        "--events",
        "200",
        "--topic",
        "benchsafety",
    ];
    let out = ok(run_cli(&args, "", &[], CLI_TIMEOUT), "bench embedded");
    assert!(
        out.stderr.contains("embedded"),
        "says it is embedded:\n{}",
        out.stderr
    );
    let out = ok(
        run_cli(&args, "", &[("STROM_GROUP_FILE", &gf)], CLI_TIMEOUT),
        "bench with STROM_GROUP_FILE",
    );
    assert!(!out.stderr.contains("embedded"), "{}", out.stderr);
    let d = server.connect();
    let info = d
        .describe("benchsafety")
        .expect("bench used the server's topic");
    let stored: u64 = info.partitions.iter().map(|p| p.next_offset).sum();
    assert_eq!(stored, 200);
}

#[test]
fn port_in_use_is_reported_once() {
    let base = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let listen = format!("127.0.0.1:{port}");
    let first_dir = base.path().join("a");
    let mut first = Command::new(common::strom_bin())
        .args(["server", "--listen", &listen, "--data-dir"])
        .arg(&first_dir)
        .env_remove("STROM_GROUP_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("first server");
    let mut err = BufReader::new(first.stderr.take().expect("stderr"));
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        assert!(
            err.read_line(&mut line).expect("first server stderr") > 0,
            "first server exited"
        );
    }
    let second_dir = base.path().join("b");
    let out = run_cli(
        &[
            "server",
            "--listen",
            &listen,
            "--data-dir",
            second_dir.to_str().expect("utf-8"),
        ],
        "",
        &[],
        CLI_TIMEOUT,
    );
    let _ = first.kill();
    let _ = first.wait();
    assert!(!out.status.success());
    let msg = out.stderr.to_lowercase();
    assert_eq!(
        msg.matches("in use").count(),
        1,
        "the OS message once, got:\n{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&listen),
        "names the address:\n{}",
        out.stderr
    );
}
