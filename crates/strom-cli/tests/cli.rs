//! The `strom` command end to end against a real server process: topic
//! administration, produce from stdin, consume with resume after acks,
//! describe, error reporting, and the demo; `MIMALLOC_ALLOW_THP=0` turns
//! transparent huge pages off for a server.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{ok, run_cli, CliOutput, ServerProcess};
use serde_json::Value;

const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// Every stdout line is a JSON object; returns them.
fn json_lines(out: &CliOutput, what: &str) -> Vec<Value> {
    out.lines()
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{what}: stdout line {l:?} is not JSON: {e}"));
            assert!(v.is_object(), "{what}: stdout line {l:?} is not an object");
            v
        })
        .collect()
}

fn pos(v: &Value) -> (u64, u64) {
    (
        v["partition"].as_u64().expect("partition"),
        v["offset"].as_u64().expect("offset"),
    )
}

#[test]
fn cli_end_to_end_produce_consume_describe_restart() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let gf = server.group_file.to_str().expect("utf-8 path").to_string();
    let strom = |args: &[&str], stdin: &str| server.cli(args, stdin, CLI_TIMEOUT);

    // Create.
    let out = ok(
        strom(&["topic", "create", "t", "--partitions", "2"], ""),
        "topic create",
    );
    assert!(
        out.stdout.is_empty(),
        "create prints diagnostics on stderr only"
    );
    assert!(out.stderr.contains("created topic 't'"), "{}", out.stderr);

    // Produce 10 JSON lines.
    let input: String = (0..10).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    let out = ok(strom(&["produce", "t", "--keep-open"], &input), "produce");
    let ids = json_lines(&out, "produce");
    assert_eq!(ids.len(), 10, "one output line per event: {}", out.stdout);
    let mut meta_at: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for (i, v) in ids.iter().enumerate() {
        assert!(
            meta_at.insert(pos(v), i as u64).is_none(),
            "duplicate position {v}"
        );
    }
    let mut per_partition: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (p, o) in meta_at.keys() {
        per_partition.entry(*p).or_default().push(*o);
    }
    assert_eq!(
        per_partition.len(),
        2,
        "both partitions used: {per_partition:?}"
    );
    for (p, offs) in &per_partition {
        let want: Vec<u64> = (0..offs.len() as u64).collect();
        assert_eq!(offs, &want, "partition {p} offsets are dense from 0");
    }

    // Consume 4, then the remaining 6 under the same name.
    let check_consumed = |out: &CliOutput, what: &str| -> Vec<(u64, u64)> {
        let lines = json_lines(out, what);
        lines
            .iter()
            .map(|v| {
                let at = pos(v);
                let n = meta_at
                    .get(&at)
                    .unwrap_or_else(|| panic!("{what}: unknown event {v}"));
                assert_eq!(v["metadata"], serde_json::json!({ "n": n }), "{what}: {v}");
                assert_eq!(v["data_size"], 0, "{what}: {v}");
                assert!(v["timestamp_us"].as_u64().is_some_and(|t| t > 0), "{v}");
                at
            })
            .collect()
    };
    let out = ok(
        strom(
            &[
                "consume",
                "t",
                "--name",
                "c",
                "--from",
                "beginning",
                "--max",
                "4",
            ],
            "",
        ),
        "consume --max 4",
    );
    let first = check_consumed(&out, "first consume");
    assert_eq!(first.len(), 4, "--max 4 prints 4 events: {}", out.stdout);
    assert!(out.stderr.contains("consumed 4 events"), "{}", out.stderr);

    let out = ok(
        strom(&["consume", "t", "--name", "c"], ""),
        "consume (committed)",
    );
    let second = check_consumed(&out, "second consume");
    assert_eq!(
        second.len(),
        6,
        "a restarted consumer resumes after its acks: {}",
        out.stdout
    );
    let all: BTreeSet<_> = first.iter().chain(&second).copied().collect();
    assert_eq!(all.len(), 10, "no event twice, none missing");
    for w in second.windows(2) {
        if w[0].0 == w[1].0 {
            assert!(w[0].1 < w[1].1, "in order per partition: {second:?}");
        }
    }

    // Describe.
    let out = ok(strom(&["topic", "describe", "t", "--json"], ""), "describe");
    let d: Value = serde_json::from_str(&out.stdout).expect("describe --json is JSON");
    assert_eq!(d["name"], "t");
    let parts = d["partitions"].as_array().expect("partitions");
    assert_eq!(parts.len(), 2);
    let sum: u64 = parts
        .iter()
        .map(|p| p["next_offset"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, 10);
    for p in parts {
        let c = p["consumers"]
            .as_array()
            .expect("consumers")
            .iter()
            .find(|c| c["name"] == "c")
            .unwrap_or_else(|| panic!("consumer c on partition {p}"));
        assert_eq!(c["lag"], 0, "consumer c caught up: {p}");
        assert_eq!(c["committed"], p["next_offset"]);
    }
    let out = ok(strom(&["topic", "describe", "t"], ""), "describe (table)");
    assert!(
        out.stdout.contains("c=") && out.stdout.contains("topic"),
        "{}",
        out.stdout
    );

    // List, with the flag and with STROM_GROUP_FILE.
    let out = ok(strom(&["topic", "list"], ""), "list");
    assert!(
        out.stdout
            .lines()
            .any(|l| l.split_whitespace().next() == Some("t")),
        "list shows t:\n{}",
        out.stdout
    );
    let out = ok(
        run_cli(
            &["topic", "list", "--json"],
            "",
            &[("STROM_GROUP_FILE", gf.as_str())],
            CLI_TIMEOUT,
        ),
        "list with STROM_GROUP_FILE",
    );
    let l: Value = serde_json::from_str(&out.stdout).expect("list --json is JSON");
    assert!(
        l.as_array()
            .expect("array")
            .iter()
            .any(|t| t["name"] == "t"),
        "{l}"
    );
    let out = run_cli(&["topic", "list"], "", &[], CLI_TIMEOUT);
    assert!(!out.status.success(), "no group file is an error");
    assert!(out.stderr.contains("group file"), "{}", out.stderr);
    assert!(out.stdout.is_empty());

    // A bad partition type fails with a clear message.
    let out = strom(&["topic", "create", "bad", "--type", "disk"], "");
    assert!(!out.status.success(), "bad --type must fail");
    assert!(
        out.stderr.contains("disk") && out.stderr.contains("memory") && out.stderr.contains("file"),
        "the error names the bad type and the valid ones: {}",
        out.stderr
    );
    assert!(out.stdout.is_empty());

    // An invalid line on a json-validated topic stops produce with an
    // error naming the line; the lines before it were produced.
    ok(
        strom(&["topic", "create", "v", "--validator", "json"], ""),
        "create v",
    );
    let out = strom(
        &["produce", "v"],
        "{\"a\":1}\n{\"a\":2}\n{not json\n{\"a\":4}\n",
    );
    assert!(!out.status.success(), "an invalid line fails produce");
    assert!(
        out.stderr.contains("line 3"),
        "names the line: {}",
        out.stderr
    );
    // One record per line taken: lines 1 and 2 stored, then line 3's
    // error in its place, and nothing after it.
    let records = json_lines(&out, "produce v");
    let lines: Vec<u64> = records
        .iter()
        .map(|r| r["line"].as_u64().unwrap())
        .collect();
    assert_eq!(
        lines,
        vec![1, 2, 3],
        "the records name lines 1-3: {}",
        out.stdout
    );
    assert!(
        records[..2].iter().all(|r| r.get("offset").is_some()),
        "the lines before it were produced: {}",
        out.stdout
    );
    assert_eq!(
        records[2]["error"]["name"], "INVALID_METADATA",
        "line 3's record is its error: {}",
        out.stdout
    );
    let out = ok(
        strom(&["consume", "v", "--name", "x", "--from", "beginning"], ""),
        "consume v",
    );
    let metas: Vec<Value> = json_lines(&out, "consume v")
        .into_iter()
        .map(|v| v["metadata"].clone())
        .collect();
    assert_eq!(
        metas,
        vec![serde_json::json!({"a":1}), serde_json::json!({"a":2})]
    );

    // After a server restart, the committed position of c still holds.
    let (status, stderr) = server.terminate(Duration::from_secs(15));
    assert!(status.success(), "clean exit; stderr:\n{stderr}");
    let server = ServerProcess::start(base.path());
    let gf2 = server.group_file.to_str().unwrap().to_string();
    let out = ok(
        run_cli(
            &["--group-file", &gf2, "produce", "t"],
            "{\"n\":10}\n",
            &[],
            CLI_TIMEOUT,
        ),
        "produce after restart",
    );
    assert_eq!(json_lines(&out, "produce after restart").len(), 1);
    let out = ok(
        run_cli(
            &["--group-file", &gf2, "consume", "t", "--name", "c"],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "consume after restart",
    );
    let lines = json_lines(&out, "consume after restart");
    assert_eq!(lines.len(), 1, "only the new event: {}", out.stdout);
    assert_eq!(lines[0]["metadata"], serde_json::json!({"n": 10}));
}

#[test]
fn demo_runs_and_reports_throughput() {
    let out = ok(
        run_cli(
            &["demo", "--events", "300", "--data-size", "1024"],
            "",
            &[],
            Duration::from_secs(120),
        ),
        "demo",
    );
    assert!(out.stdout.contains("events/s"), "{}", out.stdout);
    assert!(
        out.stdout.contains("0 events with wrong data"),
        "{}",
        out.stdout
    );
    // A clean shutdown closes every log before its files go away.
    assert!(!out.stderr.contains("WARN"), "{}", out.stderr);
}

/// `MIMALLOC_ALLOW_THP=0`, documented for servers that care more about tail
/// latency than large-copy bandwidth (docs/configuration.md), turns
/// transparent huge pages off for the server process.
#[test]
fn mimalloc_allow_thp_0_turns_huge_pages_off_for_a_server() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(common::strom_bin())
        .args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(tmp.path().join("data"))
        .env("MIMALLOC_ALLOW_THP", "0")
        .env_remove("STROM_GROUP_FILE")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // mimalloc turns them off as it starts: look until it has (or for 10 s).
    let status_of = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/status"));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let thp = loop {
        let status = status_of(child.id()).unwrap_or_default();
        let thp = status
            .lines()
            .find_map(|l| l.strip_prefix("THP_enabled:"))
            .map(|v| v.trim().to_string());
        if thp.as_deref() == Some("0") || std::time::Instant::now() > deadline {
            break thp;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        thp.as_deref(),
        Some("0"),
        "THP_enabled of a server started with MIMALLOC_ALLOW_THP=0"
    );
}
