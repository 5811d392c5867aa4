//! `strom regulate` against a real one-member group: under a `strom gen`
//! whose rate goes up and then down (set over its control endpoint), the
//! regulator starts members through its default launcher, rebalances onto
//! them, stops at its maximum, then drains the members it started (the
//! latest first) down to its minimum. Every decision is a JSON line; the
//! metrics endpoint counts them; no acknowledged event is lost and
//! `strom verify` passes. Also: a dry run starts nothing, and a bad
//! policy is refused with a reason.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::http::{metrics, promtool_check, sample_sum};
use common::procs::{send, spawn, CLI_TIMEOUT};
use common::{ok, run_cli, wait_bounded, ServerProcess};
use serde_json::Value;

/// Produce target per member (bytes/s): far under what the high rate
/// writes with 3 members, far over what the low rate writes with 1.
const TARGET: &str = "20000";
/// Events per second: high (about 150-300 KB/s) and low (2-3 KB/s).
const HIGH: u32 = 1500;
const LOW: u32 = 10;
/// Longest any step of the scenario may take.
const STEP: Duration = Duration::from_secs(120);

/// A `strom` child whose stdout JSON lines arrive on a channel and whose
/// stderr is collected (and scanned for `prefix`, sent on `addr`).
struct Piped {
    child: Child,
    lines: Receiver<Value>,
    addr: Receiver<String>,
    stderr: Arc<Mutex<String>>,
    err_thread: Option<std::thread::JoinHandle<()>>,
    seen: Vec<Value>,
}

impl Piped {
    fn start(args: &[&str], prefix: &'static str) -> Piped {
        let mut child = spawn(args, Stdio::null(), Stdio::piped());
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("{line:?} on stdout is not JSON: {e}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let (atx, addr) = mpsc::channel();
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let err = child.stderr.take().expect("stderr");
        let err_thread = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if let Some(a) = line.strip_prefix(prefix) {
                    let _ = atx.send(a.trim_end_matches("/metrics").to_string());
                }
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Piped {
            child,
            lines,
            addr,
            stderr,
            err_thread: Some(err_thread),
            seen: Vec::new(),
        }
    }

    fn addr(&self) -> String {
        self.addr
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no address printed; stderr:\n{}", self.stderr()))
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits (bounded) for it to exit on its own; its exit code and stderr.
    fn finish(&mut self, what: &str) -> (Option<i32>, String) {
        let status = wait_bounded(&mut self.child, CLI_TIMEOUT);
        let status = status.unwrap_or_else(|| panic!("{what} did not exit:\n{}", self.stderr()));
        // Its stderr reader ends with the pipe: then it has it all.
        if let Some(t) = self.err_thread.take() {
            let _ = t.join();
        }
        (status.code(), self.stderr())
    }

    /// Reads lines until one satisfies `pred`; returns it.
    fn until(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + STEP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) => {
                    self.seen.push(v.clone());
                    if pred(&v) {
                        return v;
                    }
                }
                Err(_) => panic!(
                    "{what}: not within {STEP:?}; last lines:\n{}\nstderr:\n{}",
                    tail(&self.seen),
                    self.stderr()
                ),
            }
        }
    }
}

impl Drop for Piped {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Kills, at the end of a test that failed half-way, the servers the
/// regulator started: the processes whose command line names `dir`.
struct Launched(String);

impl Drop for Launched {
    fn drop(&mut self) {
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return;
        };
        for e in procs.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmd).contains(&self.0) {
                // SAFETY: kill(2) on a pid; no memory is involved.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

fn tail(lines: &[Value]) -> String {
    let from = lines.len().saturating_sub(30);
    lines[from..]
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

fn is(v: &Value, kind: &str, action: &str) -> bool {
    v["type"] == kind && v["action"] == action
}

/// A JSON `POST` to gen's control endpoint; its status code.
fn post(addr: &str, path: &str, body: &str) -> u16 {
    let mut s = TcpStream::connect(addr).expect("connecting to gen's control endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("sending the request");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("reading the response");
    resp.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {resp:?}"))
}

fn set_rate(gen: &str, rate: u32) {
    assert_eq!(post(gen, "/rate", &format!("{{\"rate\": {rate}}}")), 200);
}

/// Member ids in the group (`member list --json`).
fn member_ids(server: &ServerProcess) -> Vec<u64> {
    let out = ok(
        server.cli(&["member", "list", "--json"], "", CLI_TIMEOUT),
        "member list",
    );
    let v: Value = serde_json::from_str(&out.stdout).expect("member list --json");
    v.as_array()
        .expect("a list")
        .iter()
        .map(|m| m["id"].as_u64().expect("an id"))
        .collect()
}

fn regulate_args<'a>(gf: &'a str, dir: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "--group-file",
        gf,
        "regulate",
        "--dir",
        dir,
        "--min-members",
        "1",
        "--max-members",
        "3",
        "--target-produce",
        TARGET,
        "--hysteresis",
        "0.2",
        "--up-samples",
        "2",
        "--down-samples",
        "3",
        "--cooldown",
        "2",
        "--interval",
        "0.5",
        "--join-timeout",
        "30",
    ];
    a.extend_from_slice(extra);
    a
}

#[test]
fn members_are_added_as_the_rate_rises_and_drained_as_it_falls() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&tmp.path().join("g"));
    let gf = server.group_file.to_str().unwrap().to_string();
    ok(
        server.cli(
            &["topic", "create", "ramp", "--partitions", "6"],
            "",
            CLI_TIMEOUT,
        ),
        "topic create",
    );
    let dir = tmp.path().join("members");
    let dir_s = dir.to_str().unwrap().to_string();
    let _launched = Launched(dir_s.clone());
    let mut reg = Piped::start(
        &regulate_args(&gf, &dir_s, &["--metrics-listen", "127.0.0.1:0"]),
        "regulator metrics on http://",
    );
    let http = reg.addr();
    // Idle: it holds with its one member.
    let d = reg.until("a decision with rates", |v| {
        v["type"] == "decision" && v["group"].is_object()
    });
    assert_eq!(
        (d["action"].as_str(), d["members"].as_u64()),
        (Some("hold"), Some(1)),
        "{d}"
    );

    let mut gen = Piped::start(
        &[
            "--group-file",
            &gf,
            "gen",
            "--topic",
            "ramp",
            "--devices",
            "60",
            "--idempotent",
            "true",
            "--json",
            "--control-listen",
            "127.0.0.1:0",
        ],
        "control listening on http://",
    );
    let gen_addr = gen.addr();
    set_rate(&gen_addr, HIGH);
    assert_eq!(post(&gen_addr, "/start", ""), 200);

    // Up: two members added, one at a time, each after a decision saying
    // why (produce over its band), then held at the maximum.
    let mut added = Vec::new();
    for _ in 0..2 {
        let d = reg.until("an add", |v| is(v, "decision", "add"));
        let reason = d["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("produce_bytes_per_s over target"), "{d}");
        let per = d["per_member"]["produce_bytes_per_s"].as_f64().unwrap();
        assert!(per > 20000.0 * 1.2, "{d}");
        let o = reg.until("the add's outcome", |v| is(v, "outcome", "add"));
        assert_eq!(o["ok"], true, "{o}");
        assert!(
            o["moves"].as_u64().unwrap() > 0,
            "the rebalance moves partitions: {o}"
        );
        added.push(o["member"].as_u64().unwrap());
    }
    let d = reg.until("held at the maximum", |v| {
        v["type"] == "decision"
            && v["reason"]
                .as_str()
                .is_some_and(|r| r.contains("at the maximum of 3"))
    });
    assert_eq!(
        (d["members"].as_u64(), d["started"].as_u64()),
        (Some(3), Some(2)),
        "{d}"
    );
    let mut ids = member_ids(&server);
    ids.sort_unstable();
    assert_eq!(ids, [0, added[0], added[1]]);
    // Both new members lead partitions now.
    let info = server.connect().describe("ramp").unwrap();
    for m in &added {
        assert!(
            info.partitions.iter().any(|p| u64::from(p.member) == *m),
            "member {m} leads a partition: {:?}",
            info.partitions.iter().map(|p| p.member).collect::<Vec<_>>()
        );
    }
    let text = metrics(&http);
    promtool_check(&text);
    assert_eq!(
        sample_sum(&text, "strom_regulator_members", ""),
        3.0,
        "{text}"
    );
    assert_eq!(
        sample_sum(&text, "strom_regulator_decisions_total", "action=\"add\""),
        2.0,
        "{text}"
    );
    assert!(
        sample_sum(&text, "strom_regulator_produce_bytes_per_second", "") > 60000.0,
        "{text}"
    );

    // Down: the members it started are drained, the latest first, until
    // the minimum; each leaves the group and its server stops by itself.
    set_rate(&gen_addr, LOW);
    let mut drained = Vec::new();
    for _ in 0..2 {
        let d = reg.until("a drain", |v| is(v, "decision", "drain"));
        assert!(
            d["reason"].as_str().unwrap().contains("under target"),
            "{d}"
        );
        let o = reg.until("the drain's outcome", |v| is(v, "outcome", "drain"));
        assert_eq!(o["ok"], true, "{o}");
        drained.push(o["member"].as_u64().unwrap());
    }
    assert_eq!(drained, [added[1], added[0]]);
    reg.until("one member left, nothing moving", |v| {
        v["type"] == "decision" && v["members"] == 1 && v["draining"] == 0 && v["moving"] == false
    });
    assert_eq!(member_ids(&server), [0]);
    for n in 1..=2 {
        stops_having_left(&dir.join(format!("m{n}.log")));
    }

    // No acknowledged event lost: the generator's every push acknowledged
    // with no error, and verify reads exactly those, in order, once each.
    send(&gen.child, libc::SIGINT);
    let summary = gen.until("gen's summary", |v| v["type"] == "summary");
    let (code, err) = gen.finish("gen");
    assert_eq!(code, Some(0), "gen: {summary}\n{err}");
    let sent = summary["sent"].as_u64().unwrap();
    assert_eq!(summary["acked"].as_u64(), Some(sent), "{summary}");
    assert_eq!(summary["errors"], 0, "{summary}");
    send(&reg.child, libc::SIGTERM);
    let (code, err) = reg.finish("regulate");
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let adds = reg.seen.iter().filter(|v| is(v, "decision", "add")).count();
    assert_eq!(adds, 2, "never more than the maximum");

    let out = server.cli(
        &[
            "verify",
            "--topic",
            "ramp",
            "--name",
            "checker",
            "--json",
            "--idle-timeout",
            "10",
        ],
        "",
        CLI_TIMEOUT,
    );
    let report: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("no verify report ({e}): {}{}", out.stdout, out.stderr));
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["events"].as_u64(), Some(sent), "{report}");
    assert_eq!(report["end"], "end_of_stream", "{report}");
}

#[test]
fn members_it_started_are_drained_when_it_stops_with_stop_started() {
    stop_started(&[]);
}

#[test]
fn a_launcher_that_returns_at_once_like_a_job_submission_works_too() {
    // The server runs on in the background; the launcher exits 0 at once.
    stop_started(&[
        "--launch",
        "sh -c '{strom} server --join {group_file} --data-dir {data_dir} 2> {dir}/bg.log &'",
    ]);
}

/// Below its minimum of 2 the regulator (with `launch` arguments) adds a
/// member, whose rebalance gives it a partition; on SIGTERM with
/// `--stop-started` it drains it, and the member leaves and stops.
fn stop_started(launch: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&tmp.path().join("g"));
    let gf = server.group_file.to_str().unwrap().to_string();
    ok(
        server.cli(
            &["topic", "create", "t", "--partitions", "2"],
            "",
            CLI_TIMEOUT,
        ),
        "topic create",
    );
    let dir = tmp.path().join("members");
    let dir_s = dir.to_str().unwrap().to_string();
    let _launched = Launched(dir_s.clone());
    let mut extra = vec!["--stop-started", "--stop-timeout", "60"];
    extra.extend_from_slice(launch);
    let mut args = regulate_args(&gf, &dir_s, &extra);
    let i = args.iter().position(|a| *a == "--min-members").unwrap();
    args[i + 1] = "2";
    let mut reg = Piped::start(&args, "no address is printed");
    // Below its minimum: it adds a member at once, which takes a partition.
    let d = reg.until("an add", |v| is(v, "decision", "add"));
    assert!(
        d["reason"]
            .as_str()
            .unwrap()
            .contains("below the minimum 2"),
        "{d}"
    );
    let o = reg.until("the add's outcome", |v| is(v, "outcome", "add"));
    assert_eq!(o["ok"], true, "{o}");
    let m = o["member"].as_u64().unwrap();
    reg.until("the rebalance done", |v| {
        v["type"] == "decision" && v["members"] == 2 && v["moving"] == false
    });
    let info = server.connect().describe("t").unwrap();
    assert!(
        info.partitions.iter().any(|p| u64::from(p.member) == m),
        "{info:?}"
    );

    send(&reg.child, libc::SIGTERM);
    let o = reg.until("the stop's outcome", |v| is(v, "outcome", "stop"));
    assert_eq!(
        (o["ok"].as_bool(), o["member"].as_u64()),
        (Some(true), Some(m)),
        "{o}"
    );
    let (code, err) = reg.finish("regulate");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(member_ids(&server), [0]);
    let info = server.connect().describe("t").unwrap();
    assert!(info.partitions.iter().all(|p| p.member == 0), "{info:?}");
    let log = if launch.is_empty() {
        "m1.log"
    } else {
        "bg.log"
    };
    stops_having_left(&dir.join(log));
}

/// The server whose output is `log` stops, saying it left its group (it
/// learns so on its next heartbeat after the registry let it go).
fn stops_having_left(log: &Path) {
    let said = || {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .contains("strom server: this member left its group")
    };
    common::wait_for(&format!("{} to say it left", log.display()), said);
}

#[test]
fn a_dry_run_decides_and_prints_but_starts_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(&tmp.path().join("g"));
    let gf = server.group_file.to_str().unwrap().to_string();
    let dir = tmp.path().join("members");
    let dir_s = dir.to_str().unwrap().to_string();
    // Below its minimum of 2: it would add a member at once.
    let mut args = regulate_args(&gf, &dir_s, &["--dry-run", "--duration", "3"]);
    let i = args.iter().position(|a| *a == "--min-members").unwrap();
    args[i + 1] = "2";
    let out = run_cli(&args, "", &[], CLI_TIMEOUT);
    assert!(out.status.success(), "{}", out.stderr);
    let lines: Vec<Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON lines"))
        .collect();
    let add = lines
        .iter()
        .find(|v| is(v, "decision", "add"))
        .unwrap_or_else(|| panic!("no add decision:\n{}", out.stdout));
    assert!(
        add["reason"]
            .as_str()
            .unwrap()
            .contains("below the minimum 2"),
        "{add}"
    );
    assert_eq!(add["dry_run"], true);
    assert!(
        lines.iter().all(|v| v["type"] == "decision"),
        "no outcome in a dry run"
    );
    assert!(!dir.exists(), "a dry run launches nothing");
    assert_eq!(member_ids(&server), [0]);
}

#[test]
fn a_bad_policy_is_refused_with_a_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let policy = tmp.path().join("policy.toml");
    let refused = |args: &[&str], says: &str| {
        let mut full = vec!["--address", "127.0.0.1:1", "regulate", "--dry-run"];
        full.extend_from_slice(args);
        let out = run_cli(&full, "", &[], CLI_TIMEOUT);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(says), "{args:?}: {}", out.stderr);
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    };
    refused(&[], "no target");
    refused(&["--target-produce=-5"], "positive");
    refused(&["--target-lag", "NaN"], "positive");
    refused(
        &[
            "--target-disk",
            "1",
            "--min-members",
            "4",
            "--max-members",
            "2",
        ],
        "max_members",
    );
    refused(&["--target-disk", "1", "--hysteresis", "1.5"], "hysteresis");
    refused(&["--target-disk", "1", "--interval", "0"], "interval");
    refused(
        &["--target-disk", "1", "--launch", "strom {nope}"],
        "unknown placeholder",
    );
    refused(
        &["--target-disk", "1", "--launch", "sh -c 'x"],
        "unterminated",
    );
    write(&policy, "max_members = 3\nmin_memebrs = 1\n");
    let p = policy.to_str().unwrap();
    refused(&["--policy", p], "min_memebrs");
    write(&policy, "[targets]\nproduce_bytes_per_s = \"lots\"\n");
    refused(&["--policy", p], "produce_bytes_per_s");
    refused(
        &["--policy", "/nonexistent/policy.toml"],
        "reading the policy file",
    );
    // Without --dry-run, the launcher needs a directory.
    let out = run_cli(
        &["--address", "127.0.0.1:1", "regulate", "--target-disk", "1"],
        "",
        &[],
        CLI_TIMEOUT,
    );
    assert!(out.stderr.contains("--dir"), "{}", out.stderr);
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}
