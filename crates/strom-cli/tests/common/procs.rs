//! Driving the `strom` CLI as a child process for the interruption and
//! failure tests: spawning it, sending real signals, waiting for its exit,
//! filling topics and checking that a resumed consumer got exactly the rest.

use std::collections::BTreeSet;
use std::io::{BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use strom_client::TopicSpec;

use super::{ok, run_cli, CliOutput, ServerProcess};

pub const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// `(partition, offset)` of a JSON line printed by `produce` or `consume`.
pub fn pos(line: &str) -> (u32, u64) {
    let v: Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("line {line:?} is not JSON: {e}"));
    (
        v["partition"].as_u64().expect("partition") as u32,
        v["offset"].as_u64().expect("offset"),
    )
}

pub fn positions(out: &CliOutput) -> Vec<(u32, u64)> {
    out.lines().iter().map(|l| pos(l)).collect()
}

/// Creates `topic` and stores `n` events through the client; returns
/// every stored position.
pub fn fill(
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
    // No lease: the topic stays open after this producer is dropped.
    let p = t
        .producer_with(strom_client::ProducerOptions {
            lease: None,
            ..Default::default()
        })
        .expect("a producer");
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
pub fn spawn(args: &[&str], stdin: Stdio, stdout: Stdio) -> Child {
    Command::new(super::strom_bin())
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
pub fn follow_consumer(gf: &str) -> (Child, BufReader<std::process::ChildStdout>) {
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

pub fn send(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let rc = unsafe { libc::kill(child.id() as i32, sig) };
    assert_eq!(rc, 0, "kill({sig}) failed");
}

/// Waits (bounded) for the child; returns its exit code and stderr.
pub fn finish(mut child: Child, what: &str) -> (Option<i32>, String) {
    let mut err = child.stderr.take().expect("stderr is piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let Some(status) = super::wait_bounded(&mut child, CLI_TIMEOUT) else {
        panic!(
            "{what} did not exit; stderr:\n{}",
            reader.join().unwrap_or_default()
        );
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

pub fn consume_rest(gf: &str, topic: &str, name: &str) -> Vec<(u32, u64)> {
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
pub fn assert_exact_resume(all: &[(u32, u64)], first: &[(u32, u64)], second: &[(u32, u64)]) {
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
