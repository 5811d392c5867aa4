//! The `strom` command under interruption, against the real binary and a
//! real server process: Ctrl-C (a real SIGINT) and SIGTERM during `consume`
//! and `produce`, a reader that closes the pipe early, closing at the end of
//! input, and the event size flag.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::procs::*;
use common::{ok, run_cli, ServerProcess};

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
    let strom = |args: &[&str], stdin: &str| server.cli(args, stdin, CLI_TIMEOUT);
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
    let strom = |args: &[&str], stdin: &str| server.cli(args, stdin, CLI_TIMEOUT);
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
