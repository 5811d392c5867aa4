//! `strom consume --select EXPR` against a real server: a `where`
//! predicate with a byte range, an N-d sub-array of array payloads, and
//! the errors for a malformed expression and for a selection the data
//! cannot satisfy.

mod common;

use std::time::Duration;

use common::{ok, run_cli, CliOutput, ServerProcess};
use serde_json::Value;
use strom_client::select::{ArrayLayout, Order};
use strom_client::TopicSpec;

const CLI_TIMEOUT: Duration = Duration::from_secs(60);

fn consume(server: &ServerProcess, topic: &str, name: &str, select: &str) -> CliOutput {
    let gf = server.group_file.to_str().expect("utf-8 path");
    let args = [
        "--group-file",
        gf,
        "consume",
        topic,
        "--name",
        name,
        "--select",
        select,
    ];
    run_cli(&args, "", &[], CLI_TIMEOUT)
}

fn lines(out: &CliOutput) -> Vec<Value> {
    out.lines()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn consume_select_where_fetches_the_byte_range_of_matching_events_only() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let d = server.connect();
    let t = d.create_topic(TopicSpec::new("w", 1)).unwrap();
    let p = t.producer().unwrap();
    for i in 0u8..5 {
        let data: Vec<u8> = (0..16).map(|b| i * 16 + b).collect();
        p.push(format!(r#"{{"i": {i}, "kind": "frame"}}"#), data)
            .unwrap();
    }
    p.close().unwrap();
    let out = ok(
        consume(&server, "w", "c", "i >= 3 then bytes[2:6]"),
        "consume --select where",
    );
    let got = lines(&out);
    assert_eq!(got.len(), 5, "every event is printed: {}", out.stdout);
    for (i, v) in got.iter().enumerate() {
        assert_eq!(v["data_size"], 16);
        let i = i as u8;
        if i >= 3 {
            assert_eq!(v["fetched_size"], 4, "{v}");
            assert_eq!(
                v["data_prefix_hex"],
                hex(&[i * 16 + 2, i * 16 + 3, i * 16 + 4, i * 16 + 5])
            );
        } else {
            assert_eq!(v["fetched_size"], 0, "{v}");
            assert_eq!(v["data_prefix_hex"], "");
        }
    }
    // A bare word compares as a string: every event is a frame.
    let out = ok(
        consume(&server, "w", "s", "kind == frame"),
        "consume --select kind",
    );
    for v in lines(&out) {
        assert_eq!(v["fetched_size"], 16, "{v}");
    }
}

#[test]
fn consume_select_array_fetches_the_sub_array() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let d = server.connect();
    let t = d.create_topic(TopicSpec::new("a", 1)).unwrap();
    // A 3 x 4 column-major array of bytes: element (r, c) = 10 r + c.
    let layout = ArrayLayout {
        dtype: "|u1".into(),
        shape: vec![3, 4],
        order: Order::F,
    };
    let data: Vec<u8> = (0..4)
        .flat_map(|c| (0..3).map(move |r| 10 * r + c))
        .collect();
    let p = t.producer().unwrap();
    p.push_with("{}", data, None, &layout.to_descriptor())
        .unwrap();
    p.close().unwrap();
    let out = ok(
        consume(&server, "a", "c", "[1:, ::-3]"),
        "consume --select array",
    );
    let got = lines(&out);
    assert_eq!(got.len(), 1, "{}", out.stdout);
    // Columns 3 and 0 of rows 1 and 2, column-major like the source.
    assert_eq!(got[0]["fetched_size"], 4);
    assert_eq!(got[0]["data_prefix_hex"], hex(&[13, 23, 10, 20]));
}

#[test]
fn consume_select_refuses_bad_expressions_and_unsatisfiable_selections() {
    let base = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(base.path());
    let d = server.connect();
    let t = d.create_topic(TopicSpec::new("p", 1)).unwrap();
    let p = t.producer().unwrap();
    p.push("{}", b"plain bytes".to_vec()).unwrap();
    p.close().unwrap();

    let out = consume(&server, "p", "c", "everything please");
    assert!(!out.status.success(), "a malformed --select must fail");
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    assert!(
        out.stderr.contains("bad selector 'everything please'"),
        "{}",
        out.stderr
    );

    let out = consume(&server, "p", "c", "[0]");
    assert!(
        !out.status.success(),
        "an array selection of plain data must fail"
    );
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    assert!(
        out.stderr.contains("has no array descriptor"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("DATA_SELECTOR"), "{}", out.stderr);
}
