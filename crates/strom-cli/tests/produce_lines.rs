//! `strom produce` names the input line of every record it prints, so a
//! script can match acknowledgements to input lines even when a server is
//! killed mid-run: a kill-and-compare test against the real server binary.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::procs::{finish, spawn, CLI_TIMEOUT};
use common::{ok, read_all, run_cli, wait_for, ServerProcess};
use serde_json::Value;

/// One printed record: the input line it names, and where its event was
/// stored (`None` for an error record).
fn record(text: &str) -> (u64, Option<(u32, u64)>) {
    let v: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
    let line = v["line"]
        .as_u64()
        .unwrap_or_else(|| panic!("record {text:?} names no input line"));
    if v.get("error").is_some() {
        assert!(
            v["error"]["code"].as_u64().is_some() && v["error"]["message"].is_string(),
            "an error record carries a code and a message: {text}"
        );
        return (line, None);
    }
    let p = v["partition"].as_u64().expect("partition") as u32;
    let o = v["offset"].as_u64().expect("offset");
    (line, Some((p, o)))
}

#[test]
fn produce_records_name_their_input_line_across_a_kill_9() {
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
                "--durability",
                "always",
            ],
            "",
            &[],
            CLI_TIMEOUT,
        ),
        "topic create",
    );
    let mut child = spawn(
        &["--group-file", &gf, "produce", "t", "--keep-open"],
        Stdio::piped(),
        Stdio::piped(),
    );
    // Input: {"id":N} on line N, until told to stop; a blank line every
    // 1000 lines checks that line numbers count them too.
    let stop = Arc::new(AtomicBool::new(false));
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 1u64;
            while !stop.load(Ordering::Relaxed) {
                let mut chunk = String::new();
                for _ in 0..100 {
                    if n.is_multiple_of(1000) {
                        chunk.push('\n');
                    } else {
                        chunk.push_str(&format!("{{\"id\":{n}}}\n"));
                    }
                    n += 1;
                }
                if stdin.write_all(chunk.as_bytes()).is_err() {
                    break; // produce stopped reading
                }
            }
        })
    };
    let printed = Arc::new(Mutex::new(Vec::<String>::new()));
    let reader = {
        let printed = printed.clone();
        let out = BufReader::new(child.stdout.take().expect("stdout is piped"));
        std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { break };
                printed.lock().expect("lock").push(line);
            }
        })
    };
    let count = || printed.lock().expect("lock").len();
    wait_for("acknowledgements before the kill", || count() >= 300);
    let addr = server.addr.clone();
    server.kill9();
    let server = ServerProcess::restart_on(base.path(), &addr);
    let at_restart = count();
    wait_for("records after the restart (or produce's exit)", || {
        count() >= at_restart + 300 || reader.is_finished()
    });
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    let (code, stderr) = finish(child, "strom produce");
    reader.join().expect("reader");
    let printed = printed.lock().expect("lock").clone();

    let records: Vec<_> = printed.iter().map(|l| record(l)).collect();
    // One record per input line taken, in input order: lines 1, 2, ...
    // with the blank ones (every 1000th) skipped, none missing.
    let lines: Vec<u64> = records.iter().map(|r| r.0).collect();
    let expected: Vec<u64> = (1..)
        .filter(|n: &u64| !n.is_multiple_of(1000))
        .take(lines.len())
        .collect();
    assert_eq!(
        lines, expected,
        "one record per input line, in order; stderr:\n{stderr}"
    );
    let acked: Vec<_> = records
        .iter()
        .filter_map(|(l, p)| p.map(|p| (*l, p)))
        .collect();
    let failed = records.len() - acked.len();
    assert!(acked.len() >= 300, "events were acknowledged");
    assert_eq!(
        code,
        Some(if failed == 0 { 0 } else { 1 }),
        "exit status says whether a line failed; stderr:\n{stderr}"
    );
    // Every acknowledged line's event is stored where its record says.
    let d = server.connect();
    let stored = read_all(&d, "t", "check", Duration::from_secs(20));
    for (line, pos) in &acked {
        let ev = stored
            .events
            .get(pos)
            .unwrap_or_else(|| panic!("line {line} was acknowledged at {pos:?}, not stored"));
        assert_eq!(
            String::from_utf8_lossy(&ev.meta),
            format!("{{\"id\":{line}}}"),
            "the event at {pos:?} is line {line}'s"
        );
    }
}
