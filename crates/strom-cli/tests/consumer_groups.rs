//! Consumer groups through the CLI and the real `strom server`: several
//! `strom consume --group G --mode shared` processes split a topic, each
//! event printed by exactly one of them; `strom group list|describe|delete`
//! show and remove the group; a member killed with SIGKILL hands what it
//! held to the others, which print it with `deliveries` above 1; members
//! of a partitioned group read every event between them and all exit at
//! the end of the stream.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::Stdio;

use common::procs::*;
use common::{ok, run_cli, ServerProcess};
use serde_json::Value;

/// `(partition, offset) -> deliveries` of every line a consume printed.
fn printed(stdout: &str) -> Vec<((u32, u64), u64)> {
    stdout
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            let p = v["partition"].as_u64().expect("partition") as u32;
            let o = v["offset"].as_u64().expect("offset");
            let d = v["deliveries"]
                .as_u64()
                .expect("group lines carry deliveries");
            ((p, o), d)
        })
        .collect()
}

fn shared_consume(gf: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--group-file",
        gf,
        "consume",
        "t",
        "--group",
        "g",
        "--mode",
        "shared",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[test]
fn shared_consumers_split_a_topic_and_group_commands_show_it() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let gf = server.group_file.to_str().expect("utf-8").to_string();
    let all: BTreeSet<(u32, u64)> = fill(&server, "t", 2, 400, 0).into_iter().collect();
    let outputs: Vec<_> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..3)
            .map(|_| {
                let args = shared_consume(&gf, &["--prefetch", "8"]);
                s.spawn(move || {
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    ok(run_cli(&args, "", &[], CLI_TIMEOUT), "shared consume")
                })
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("consume thread"))
            .collect()
    });
    let mut seen = BTreeMap::new();
    for out in &outputs {
        for (pos, deliveries) in printed(&out.stdout) {
            assert_eq!(deliveries, 1, "nobody died: first deliveries only");
            assert!(seen.insert(pos, ()).is_none(), "{pos:?} printed twice");
        }
    }
    assert_eq!(
        seen.keys().copied().collect::<BTreeSet<_>>(),
        all,
        "every event printed by exactly one member"
    );

    let d = ok(
        server.cli(&["group", "describe", "g", "--json"], "", CLI_TIMEOUT),
        "group describe",
    );
    let v: Value = serde_json::from_str(&d.stdout).expect("describe prints JSON");
    assert_eq!(v["mode"], "shared");
    assert_eq!(v["topic"], "t");
    assert_eq!(v["lag"], 0, "{v}");
    assert_eq!(v["pending"], 0);
    for p in v["partitions"].as_array().expect("partitions") {
        assert_eq!(p["committed"], p["next_offset"], "{p}");
    }
    let l = ok(
        server.cli(&["group", "list", "--json"], "", CLI_TIMEOUT),
        "group list",
    );
    assert!(l.stdout.contains("\"group\": \"g\""), "{}", l.stdout);
    let table = ok(
        server.cli(&["group", "describe", "g"], "", CLI_TIMEOUT),
        "table",
    );
    assert!(table.stdout.contains("PARTITION"), "{}", table.stdout);

    ok(
        server.cli(&["group", "delete", "g"], "", CLI_TIMEOUT),
        "delete",
    );
    let gone = server.cli(&["group", "describe", "g"], "", CLI_TIMEOUT);
    assert!(!gone.status.success());
    assert!(gone.stderr.contains("no consumer group"), "{}", gone.stderr);
}

#[test]
fn a_shared_member_killed_with_sigkill_hands_its_events_to_the_others() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let gf = server.group_file.to_str().expect("utf-8").to_string();
    let all: BTreeSet<(u32, u64)> = fill(&server, "t", 1, 200, 0).into_iter().collect();
    // A member that prefetches 50 events, prints one, and dies.
    let args = shared_consume(&gf, &["--prefetch", "50", "--follow"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut victim = spawn(&args, Stdio::null(), Stdio::piped());
    let mut out = BufReader::new(victim.stdout.take().expect("stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("the victim prints a line");
    send(&victim, libc::SIGKILL);
    let _ = victim.wait();
    let (victim_pos, _) = printed(&first)[0];

    let args = shared_consume(&gf, &["--prefetch", "100"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let rest = ok(run_cli(&args, "", &[], CLI_TIMEOUT), "the survivor");
    let got = printed(&rest.stdout);
    let positions: BTreeSet<_> = got.iter().map(|(p, _)| *p).collect();
    assert_eq!(positions.len(), got.len(), "no event twice in one member");
    let mut union = positions.clone();
    union.insert(victim_pos);
    assert_eq!(union, all, "nothing lost");
    let redelivered = got.iter().filter(|(_, d)| *d >= 2).count();
    assert!(
        redelivered >= 40,
        "the events the victim held come back with deliveries >= 2 ({redelivered} did)"
    );
    let d = ok(
        server.cli(&["group", "describe", "g", "--json"], "", CLI_TIMEOUT),
        "describe",
    );
    let v: Value = serde_json::from_str(&d.stdout).expect("JSON");
    assert!(v["redelivered"].as_u64().expect("redelivered") >= 40, "{v}");
}

#[test]
fn partitioned_consumers_split_the_partitions_and_all_reach_the_end() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let gf = server.group_file.to_str().expect("utf-8").to_string();
    let all: BTreeSet<(u32, u64)> = fill(&server, "t", 6, 600, 0).into_iter().collect();
    ok(
        server.cli(&["topic", "complete", "t"], "", CLI_TIMEOUT),
        "complete",
    );
    let outputs: Vec<_> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..3)
            .map(|k| {
                let gf = gf.clone();
                s.spawn(move || {
                    let label = format!("w{k}");
                    let args = [
                        "--group-file",
                        &gf,
                        "consume",
                        "t",
                        "--group",
                        "pg",
                        "--name",
                        &label,
                        "--follow",
                        "--session-timeout",
                        "2",
                    ];
                    ok(run_cli(&args, "", &[], CLI_TIMEOUT), "partitioned consume")
                })
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("consume thread"))
            .collect()
    });
    let mut seen = BTreeSet::new();
    for out in &outputs {
        for (pos, _) in printed(&out.stdout) {
            seen.insert(pos);
        }
    }
    assert_eq!(seen, all, "every event read by the group");
    let v: Value = serde_json::from_str(
        &ok(
            server.cli(&["group", "describe", "pg", "--json"], "", CLI_TIMEOUT),
            "describe",
        )
        .stdout,
    )
    .expect("JSON");
    assert_eq!(v["mode"], "partitioned");
    assert_eq!(v["lag"], 0, "{v}");
}
