//! `strom topic create --overflow` and what `topic describe` shows of it,
//! against a real `strom server` process: memory topics default to
//! `block`, `drop-oldest` counts the events it dropped, and file topics
//! refuse the option with a message saying why.

mod common;

use std::time::Duration;

use common::{CliOutput, ServerProcess};
use serde_json::Value;

const CLI_TIMEOUT: Duration = Duration::from_secs(60);

fn describe_json(strom: &dyn Fn(&[&str]) -> CliOutput, name: &str) -> Value {
    let out = strom(&["topic", "describe", name, "--json"]);
    assert!(out.status.success(), "describe failed: {}", out.stderr);
    serde_json::from_str(&out.stdout).expect("describe --json prints JSON")
}

#[test]
fn topic_create_overflow_is_stored_shown_and_refused_on_file_topics() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let strom = |args: &[&str]| server.cli(args, "", CLI_TIMEOUT);

    // Memory topics block by default, and say so.
    let out = strom(&["topic", "create", "mon-default", "--type", "memory"]);
    assert!(out.status.success(), "{}", out.stderr);
    assert_eq!(describe_json(&strom, "mon-default")["overflow"], "block");
    let out = strom(&["topic", "describe", "mon-default"]);
    assert!(
        out.stdout.contains("overflow    block (default)"),
        "{}",
        out.stdout
    );

    // drop-oldest, with a 64 KiB bound: the dropped events are counted.
    let out = strom(&[
        "topic",
        "create",
        "mon",
        "--type",
        "memory",
        "--overflow",
        "drop-oldest",
        "--retention-bytes",
        "65536",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    let topic = server.connect().open_topic("mon").expect("topic exists");
    let p = topic.producer().expect("producer");
    for i in 0..32u32 {
        p.push(format!("{{\"i\":{i}}}"), vec![0u8; 8 << 10])
            .expect("push")
            .wait()
            .expect("stored");
    }
    let v = describe_json(&strom, "mon");
    assert_eq!(v["overflow"], "drop-oldest", "{v}");
    let part = &v["partitions"][0];
    let first = part["first_offset"].as_u64().expect("first_offset");
    assert!(first > 0, "the bound forced old events out: {v}");
    assert_eq!(part["dropped_events"].as_u64(), Some(first), "{v}");
    let out = strom(&["topic", "describe", "mon"]);
    assert!(out.stdout.contains("DROPPED"), "{}", out.stdout);
    assert!(
        out.stdout.contains("overflow    drop-oldest\n"),
        "{}",
        out.stdout
    );

    // File topics keep their retention semantics: --overflow is refused.
    let out = strom(&["topic", "create", "files", "--overflow", "block"]);
    assert!(
        !out.status.success(),
        "--overflow on a file topic must fail"
    );
    assert!(
        out.stderr.contains("only to memory topics"),
        "{}",
        out.stderr
    );
    assert!(describe_json(&strom, "mon-default")["overflow"].is_string());
    let out = strom(&["topic", "describe", "files"]);
    assert!(!out.status.success(), "the refused topic was not created");

    // An unknown policy names the accepted ones.
    let out = strom(&[
        "topic",
        "create",
        "x",
        "--type",
        "memory",
        "--overflow",
        "sideways",
    ]);
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("'block' or 'drop-oldest'"),
        "{}",
        out.stderr
    );
}
