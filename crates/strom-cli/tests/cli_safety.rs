//! The `strom` command under interruption and failure, against the real
//! binary and real server processes: Ctrl-C (a real SIGINT) and SIGTERM
//! during `consume` and `produce`, a reader that closes the pipe early, a
//! group member killed with -9, `cluster down`, `--address`, and the
//! port-in-use message.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{ok, run_cli, CliOutput, ServerProcess};
use serde_json::Value;
use strom_client::{Driver, TopicSpec};

const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// `(partition, offset)` of a JSON line printed by `produce` or `consume`.
fn pos(line: &str) -> (u32, u64) {
    let v: Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("line {line:?} is not JSON: {e}"));
    (
        v["partition"].as_u64().expect("partition") as u32,
        v["offset"].as_u64().expect("offset"),
    )
}

fn positions(out: &CliOutput) -> Vec<(u32, u64)> {
    out.lines().iter().map(|l| pos(l)).collect()
}

/// Creates `topic` and stores `n` events through the client; returns
/// every stored position.
fn fill(
    server: &ServerProcess,
    topic: &str,
    partitions: u32,
    n: u64,
    meta_pad: usize,
) -> Vec<(u32, u64)> {
    let d = server.connect();
    let t = d
        .create_topic(TopicSpec::new(topic, partitions))
        .expect("creating the topic");
    let p = t.producer().expect("a producer");
    let pad = "x".repeat(meta_pad);
    let futures: Vec<_> = (0..n)
        .map(|i| {
            p.push(format!("{{\"i\":{i},\"pad\":\"{pad}\"}}"), ())
                .expect("push")
        })
        .collect();
    p.flush().expect("flush");
    futures
        .into_iter()
        .map(|f| {
            let id = f.wait().expect("stored");
            (id.partition, id.offset)
        })
        .collect()
}

/// A `strom` child with stdout piped (or given) and stderr collected.
fn spawn(args: &[&str], stdin: Stdio, stdout: Stdio) -> Child {
    Command::new(common::strom_bin())
        .args(args)
        .env_remove("STROM_LOG")
        .env_remove("STROM_GROUP_FILE")
        .env_remove("STROM_ADDRESS")
        .stdin(stdin)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning strom")
}

/// `strom consume t --name c --follow` with its stdout piped to us.
fn follow_consumer(gf: &str) -> (Child, BufReader<std::process::ChildStdout>) {
    let args = [
        "--group-file",
        gf,
        "consume",
        "t",
        "--name",
        "c",
        "--follow",
    ];
    let mut child = spawn(&args, Stdio::null(), Stdio::piped());
    let out = BufReader::new(child.stdout.take().expect("stdout"));
    (child, out)
}

fn send(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let rc = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(rc, 0, "kill({sig}) failed");
}

/// Waits (bounded) for the child; returns its exit code and stderr.
fn finish(mut child: Child, what: &str) -> (Option<i32>, String) {
    let mut err = child.stderr.take().expect("stderr is piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + CLI_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("polling strom") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not exit; stderr:\n{}",
                reader.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stderr = reader.join().expect("stderr reader");
    use std::os::unix::process::ExitStatusExt;
    assert!(
        status.signal().is_none(),
        "{what} was killed by signal {:?} instead of exiting; stderr:\n{stderr}",
        status.signal()
    );
    (status.code(), stderr)
}

fn consume_rest(gf: &str, topic: &str, name: &str) -> Vec<(u32, u64)> {
    let out = ok(
        run_cli(
            &["--group-file", gf, "consume", topic, "--name", name],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "resuming consume",
    );
    positions(&out)
}

/// Received by the interrupted run plus printed by the resumed run must
/// be every event exactly once.
fn assert_exact_resume(all: &[(u32, u64)], first: &[(u32, u64)], second: &[(u32, u64)]) {
    let first_set: BTreeSet<_> = first.iter().copied().collect();
    assert_eq!(
        first_set.len(),
        first.len(),
        "the first run printed duplicates"
    );
    for p in second {
        assert!(
            !first_set.contains(p),
            "{p:?} was printed by the first run and again after resuming"
        );
    }
    let mut both: Vec<_> = first.iter().chain(second).copied().collect();
    both.sort();
    let mut want = all.to_vec();
    want.sort();
    assert_eq!(
        both.len(),
        want.len(),
        "events lost or duplicated across the resume"
    );
    assert_eq!(both, want);
}

#[test]
fn consume_sigint_acks_exactly_what_reached_the_reader() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let gf = server.group_file.to_str().expect("utf-8").to_string();
    let all = fill(&server, "t", 2, 3000, 0);
    let (child, mut out) = follow_consumer(&gf);
    let mut first = Vec::new();
    let mut line = String::new();
    while first.len() < 100 {
        line.clear();
        assert!(
            out.read_line(&mut line).expect("reading consume") > 0,
            "early EOF"
        );
        first.push(pos(&line));
    }
    send(&child, libc::SIGINT);
    // Whatever it still writes reached us, so it may be acked.
    for l in out.lines() {
        first.push(pos(&l.expect("reading consume")));
    }
    let (code, stderr) = finish(child, "consume after SIGINT");
    assert_eq!(code, Some(130), "exit code after SIGINT; stderr:\n{stderr}");
    let second = consume_rest(&gf, "t", "c");
    assert_exact_resume(&all, &first, &second);
}

#[test]
fn consume_sigterm_exits_143_and_resumes_without_loss() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let gf = server.group_file.to_str().expect("utf-8").to_string();
    let all = fill(&server, "t", 1, 500, 0);
    let (child, mut out) = follow_consumer(&gf);
    let mut first = Vec::new();
    let mut line = String::new();
    line.clear();
    assert!(out.read_line(&mut line).expect("reading consume") > 0);
    first.push(pos(&line));
    send(&child, libc::SIGTERM);
    for l in out.lines() {
        first.push(pos(&l.expect("reading consume")));
    }
    let (code, stderr) = finish(child, "consume after SIGTERM");
    assert_eq!(
        code,
        Some(143),
        "exit code after SIGTERM; stderr:\n{stderr}"
    );
    let second = consume_rest(&gf, "t", "c");
    assert_exact_resume(&all, &first, &second);
}

#[test]
fn consume_into_a_closed_pipe_exits_141_quietly_and_acks_only_what_was_read() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let gf = server.group_file.to_str().expect("utf-8").to_string();
    let all = fill(&server, "t", 2, 2000, 0);
    let mut child = spawn(
        &["--group-file", &gf, "consume", "t", "--name", "c"],
        Stdio::null(),
        Stdio::piped(),
    );
    // Read one byte at a time, so what we read is exactly what we "print".
    let mut out = child.stdout.take().expect("stdout");
    let mut first = Vec::new();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while first.len() < 5 {
        assert_eq!(
            out.read(&mut byte).expect("reading consume"),
            1,
            "early EOF"
        );
        if byte[0] == b'\n' {
            first.push(pos(std::str::from_utf8(&line).expect("utf-8")));
            line.clear();
        } else {
            line.push(byte[0]);
        }
    }
    drop(out);
    quiet_broken_pipe_then_exact_resume(child, "consume into a closed pipe", &gf, &all, &first);
}

#[test]
fn consume_piped_into_head_loses_nothing_head_did_not_print() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let gf = server.group_file.to_str().expect("utf-8").to_string();
    // Lines longer than head's read buffer, so head holds no unprinted line.
    let all = fill(&server, "t", 1, 100, 20_000);
    let mut head = Command::new("head")
        .args(["-n", "5"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawning head");
    let head_in = head.stdin.take().expect("head stdin");
    let child = spawn(
        &["--group-file", &gf, "consume", "t", "--name", "c"],
        Stdio::null(),
        Stdio::from(head_in),
    );
    let mut printed = String::new();
    head.stdout
        .take()
        .expect("head stdout")
        .read_to_string(&mut printed)
        .expect("reading head");
    head.wait().expect("head");
    let first: Vec<_> = printed.lines().map(pos).collect();
    assert_eq!(first.len(), 5);
    quiet_broken_pipe_then_exact_resume(child, "consume | head -n 5", &gf, &all, &first);
}

/// The consumer exits 141 with nothing on stderr, and a second consumer of
/// the same name gets exactly what the first did not deliver.
fn quiet_broken_pipe_then_exact_resume(
    child: Child,
    what: &str,
    gf: &str,
    all: &[(u32, u64)],
    first: &[(u32, u64)],
) {
    let (code, stderr) = finish(child, what);
    assert_eq!(
        code,
        Some(141),
        "exit code on a broken pipe; stderr:\n{stderr}"
    );
    assert!(stderr.is_empty(), "a broken pipe is quiet, got:\n{stderr}");
    let second = consume_rest(gf, "t", "c");
    assert_exact_resume(all, first, &second);
}

#[test]
fn consume_from_past_the_end_says_so() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let gf = server.group_file.to_str().expect("utf-8").to_string();
    fill(&server, "t", 1, 10, 0);
    let out = run_cli(
        &[
            "--group-file",
            &gf,
            "consume",
            "t",
            "--name",
            "c",
            "--from",
            "50",
        ],
        "",
        &[],
        CLI_TIMEOUT,
    );
    assert!(!out.status.success(), "--from past the end must fail");
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    assert!(
        out.stderr.contains("past the end") && out.stderr.contains("next offset 10"),
        "stderr should say --from is past the end: {}",
        out.stderr
    );
}

#[test]
fn produce_sigint_prints_every_stored_offset_closes_and_exits_130() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let gf = server.group_file.to_str().expect("utf-8").to_string();
    ok(
        run_cli(
            &[
                "--group-file",
                &gf,
                "topic",
                "create",
                "t",
                "--partitions",
                "2",
            ],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "topic create",
    );
    let mut child = spawn(
        &["--group-file", &gf, "produce", "t"],
        Stdio::piped(),
        Stdio::piped(),
    );
    let mut input = child.stdin.take().expect("stdin");
    let lines: String = (0..5000).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    input.write_all(lines.as_bytes()).expect("writing input");
    input.flush().expect("flush");
    // Keep stdin open: produce must stop on the signal, not on EOF. Send
    // it once the server holds some of the events.
    let out = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        BufReader::new(out)
            .lines()
            .map(|l| pos(&l.expect("reading produce")))
            .collect::<Vec<_>>()
    });
    let d = server.connect();
    let deadline = Instant::now() + CLI_TIMEOUT;
    loop {
        let info = d.describe("t").expect("describe");
        if info.partitions.iter().map(|p| p.next_offset).sum::<u64>() > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "produce stored nothing");
        std::thread::sleep(Duration::from_millis(10));
    }
    send(&child, libc::SIGINT);
    let printed = reader.join().expect("stdout reader");
    let (code, stderr) = finish(child, "produce after SIGINT");
    drop(input);
    assert_eq!(code, Some(130), "exit code after SIGINT; stderr:\n{stderr}");
    let r = common::read_all(&d, "t", "check", CLI_TIMEOUT);
    let stored: BTreeSet<(u32, u64)> = r.events.keys().copied().collect();
    let printed_set: BTreeSet<(u32, u64)> = printed.iter().copied().collect();
    assert_eq!(printed_set.len(), printed.len(), "an offset printed twice");
    assert_eq!(
        printed_set, stored,
        "every stored offset is printed, and only those"
    );
    let info = d.describe("t").expect("describe");
    assert!(
        info.state.ended,
        "the producer was closed: {:?}",
        info.state
    );
}

#[test]
fn produce_closes_at_end_of_input_unless_keep_open() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let gf = server.group_file.to_str().expect("utf-8").to_string();
    let strom = |args: &[&str], stdin: &str| {
        let mut full = vec!["--group-file", gf.as_str()];
        full.extend_from_slice(args);
        run_cli(&full, stdin, &[], CLI_TIMEOUT)
    };
    ok(strom(&["topic", "create", "open"], ""), "create");
    ok(
        strom(&["produce", "open", "--keep-open"], "{\"a\":1}\n"),
        "produce --keep-open",
    );
    let d = server.connect();
    let state = d.describe("open").expect("describe").state;
    assert_eq!(
        (state.open_producers, state.closed_producers),
        (1, 0),
        "{state:?}"
    );
    ok(strom(&["produce", "open"], "{\"a\":2}\n"), "second produce");
    let state = d.describe("open").expect("describe").state;
    assert_eq!(state.closed_producers, 1, "the default closes: {state:?}");
    // The README's example: produce, then consume --follow reaches the end.
    ok(strom(&["topic", "create", "t"], ""), "create");
    ok(
        strom(&["produce", "t"], "{\"a\":1}\n{\"a\":2}\n"),
        "produce",
    );
    let out = ok(
        strom(&["consume", "t", "--name", "c", "--follow"], ""),
        "consume --follow",
    );
    assert_eq!(out.lines().len(), 2);
    // --close is still accepted.
    ok(strom(&["topic", "create", "u"], ""), "create");
    ok(
        strom(&["produce", "u", "--close"], "{\"a\":1}\n"),
        "produce --close",
    );
}

#[test]
fn produce_max_event_bytes_sets_the_limit_and_the_error_names_it() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let gf = server.group_file.to_str().expect("utf-8").to_string();
    let strom = |args: &[&str], stdin: &str| {
        let mut full = vec!["--group-file", gf.as_str()];
        full.extend_from_slice(args);
        run_cli(&full, stdin, &[], CLI_TIMEOUT)
    };
    ok(strom(&["topic", "create", "t"], ""), "create");
    let out = strom(
        &[
            "produce",
            "t",
            "--keep-open",
            "--data-size",
            "2000",
            "--max-event-bytes",
            "1000",
        ],
        "{\"a\":1}\n",
    );
    assert_eq!(out.status.code(), Some(1), "stderr:\n{}", out.stderr);
    assert!(
        out.stderr.contains("line 1") && out.stderr.contains("--max-event-bytes"),
        "the error names the line and the flag: {}",
        out.stderr
    );
    assert!(!out.stderr.contains("max_batch_bytes"), "{}", out.stderr);
    let out = ok(
        strom(
            &[
                "produce",
                "t",
                "--data-size",
                "2000",
                "--max-event-bytes",
                "4000",
            ],
            "{\"a\":1}\n",
        ),
        "produce under the limit",
    );
    assert_eq!(positions(&out), vec![(0, 0)]);
}

/// `strom cluster up` in `dir`: the group file, and the pid and address of
/// each rank (from its log).
struct Cluster {
    dir: std::path::PathBuf,
    group_file: String,
    pids: Vec<i32>,
}

fn cluster_up(dir: &Path, servers: u32) -> Cluster {
    let d = dir.to_str().expect("utf-8");
    let n = servers.to_string();
    let out = ok(
        run_cli(
            &["cluster", "up", "--servers", &n, "--data-dir", d],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "cluster up",
    );
    let group_file = out.stdout.trim().to_string();
    let rec: Value =
        serde_json::from_slice(&std::fs::read(dir.join("cluster.json")).expect("cluster.json"))
            .expect("cluster.json is JSON");
    let pids = rec["pids"]
        .as_array()
        .expect("pids")
        .iter()
        .map(|p| p.as_i64().expect("pid") as i32)
        .collect();
    Cluster {
        dir: dir.to_path_buf(),
        group_file,
        pids,
    }
}

impl Cluster {
    /// The pid of the member listening on `addr` (from the members' logs).
    fn pid_of(&self, addr: &str) -> i32 {
        let deadline = Instant::now() + CLI_TIMEOUT;
        loop {
            for (rank, pid) in self.pids.iter().enumerate() {
                let log = std::fs::read_to_string(self.dir.join(format!("server-{rank}.log")))
                    .unwrap_or_default();
                if log.contains(&format!("listening on {addr}")) {
                    return *pid;
                }
            }
            assert!(Instant::now() < deadline, "no member log names {addr}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn down(&self) -> CliOutput {
        run_cli(
            &[
                "cluster",
                "down",
                "--data-dir",
                self.dir.to_str().expect("utf-8"),
            ],
            "",
            &[],
            CLI_TIMEOUT,
        )
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for &pid in &self.pids {
            // SAFETY: kill(2) on a pid this test started; no memory involved.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// A live process, not a zombie waiting for its parent.
fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .and_then(|s| s.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

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
    let input: String = (0..30).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    let out = run_cli(
        &["--group-file", &c.group_file, "produce", "t"],
        &input,
        &[],
        CLI_TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(1), "stderr:\n{}", out.stderr);
    let got = positions(&out);
    assert_eq!(
        got.len(),
        20,
        "the events on live partitions are printed; stderr:\n{}",
        out.stderr
    );
    assert!(got.iter().all(|(p, _)| *p != 1));
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
