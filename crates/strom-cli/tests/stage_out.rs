//! `strom topic stage-out` against a real `strom server`: events with
//! numpy-described arrays (C and Fortran order, 0-d, empty), events with
//! plain bytes, with an opaque or wrong descriptor, and without data are
//! staged out as raw, npy and jsonl, then read back by
//! examples/stage_out/read_stage_out.py (json and numpy only), whose output
//! must match what was produced byte for byte. Also: binary-serialized
//! metadata, the .npy header writer, and hostile input (a bad --to, an
//! unknown topic, format or partition, an existing stage-out without
//! --force) failing cleanly, and bad options refused before connecting.

mod common;

/// The .npy header writer, compiled here too so its unit tests run with
/// this test binary.
#[allow(dead_code)]
#[path = "../src/stage_out/npy.rs"]
mod npy;

/// Array layouts and element orders, as the checks see them.
#[path = "stage_out/arrays.rs"]
mod arrays;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use arrays::{c_order, counting, desc, hex, layout};
use common::{ok, CliOutput, ServerProcess};
use serde_json::{json, Value};
use strom_client::{Driver, TopicSpec};

const RUN: Duration = Duration::from_secs(120);

/// One event as produced: where it landed and what it holds.
#[derive(Clone, Debug)]
struct Produced {
    partition: u32,
    offset: u64,
    meta: Value,
    descriptor: Vec<u8>,
    data: Vec<u8>,
}

/// The events of the main test: (metadata, descriptor, data).
fn cases() -> Vec<(Value, Vec<u8>, Vec<u8>)> {
    let mut v = vec![
        (
            json!({"kind": "f4 C 2x3"}),
            desc("<f4", &[2, 3], "C"),
            [1.5f32, -2.0, 3.25, 0.0, 1e-3, 7.0]
                .iter()
                .flat_map(|f| f.to_le_bytes())
                .collect(),
        ),
        (
            json!({"kind": "i2 F 2x3"}),
            desc("<i2", &[2, 3], "F"),
            counting(12),
        ),
        (
            json!({"kind": "u1 1-d", "nested": {"x": [1, 2.5, "é"]}}),
            desc("|u1", &[5], "C"),
            counting(5),
        ),
        (
            json!({"kind": "c16"}),
            desc("<c16", &[2], "C"),
            counting(32),
        ),
        (
            json!({"kind": "0-d f8"}),
            desc("<f8", &[], "C"),
            counting(8),
        ),
        (
            json!({"kind": "empty array"}),
            desc("<f4", &[0], "C"),
            vec![],
        ),
        (
            json!({"kind": "plain bytes"}),
            vec![],
            common::Rng::new(5).bytes(1000),
        ),
        (json!({"kind": "no data"}), vec![], vec![]),
        (
            json!({"kind": "opaque descriptor"}),
            b"\x01\x02opaque".to_vec(),
            counting(100),
        ),
        (
            json!({"kind": "wrong size"}),
            desc("<f4", &[10], "C"),
            counting(12),
        ),
        (
            json!({"kind": "f8 256x64"}),
            desc("<f8", &[256, 64], "C"),
            common::Rng::new(9).bytes(256 * 64 * 8),
        ),
        (
            json!({"kind": "big-endian i4 F 3x2x2"}),
            desc(">i4", &[3, 2, 2], "F"),
            counting(48),
        ),
    ];
    for i in 0..20u64 {
        let (_, data) = common::event_payload("bulk", i);
        v.push((json!({"kind": "bulk", "i": i}), vec![], data));
    }
    v
}

/// Creates `name` with two partitions and pushes every case, alternating
/// partitions; returns what landed where.
fn produce(driver: &Driver, name: &str) -> Vec<Produced> {
    let spec = TopicSpec {
        selector: "explicit".into(),
        ..TopicSpec::new(name, 2)
    };
    let topic = driver.create_topic(spec).expect("creating the topic");
    let producer = topic.producer().expect("a producer");
    let mut pending = Vec::new();
    for (i, (meta, descriptor, data)) in cases().into_iter().enumerate() {
        let p = (i % 2) as u32;
        let fut = producer
            .push_with(meta.clone(), data.clone(), Some(p), &descriptor)
            .expect("pushing");
        pending.push((fut, meta, descriptor, data));
    }
    producer.flush().expect("flushing");
    pending
        .into_iter()
        .map(|(fut, meta, descriptor, data)| {
            let id = fut.wait().expect("stored");
            Produced {
                partition: id.partition,
                offset: id.offset,
                meta,
                descriptor,
                data,
            }
        })
        .collect()
}

fn stage_out(server: &ServerProcess, topic: &str, to: &Path, extra: &[&str]) -> CliOutput {
    let to = to.to_str().expect("utf-8 path");
    let mut args = vec!["topic", "stage-out", topic, "--to", to];
    args.extend_from_slice(extra);
    server.cli(&args, "", RUN)
}

/// A Python with numpy: the repository's venv, else python3; `None` (with
/// the reason printed) when neither has numpy.
fn python() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/.venv/bin/python");
    for py in [venv, PathBuf::from("python3")] {
        let has_numpy = Command::new(&py)
            .args(["-c", "import numpy"])
            .output()
            .is_ok_and(|o| o.status.success());
        if has_numpy {
            return Some(py);
        }
    }
    eprintln!("SKIPPED the Python read-back: neither python/.venv (make python-setup) nor python3 has numpy");
    None
}

fn reader_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/stage_out/read_stage_out.py")
}

/// Runs the reader with `--dump`; its lines by (partition, offset).
fn read_back(py: &Path, dir: &Path) -> BTreeMap<(u32, u64), Value> {
    let out = Command::new(py)
        .arg(reader_script())
        .arg(dir)
        .arg("--dump")
        .output()
        .expect("running read_stage_out.py");
    assert!(
        out.status.success(),
        "read_stage_out.py failed on {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("a JSON line");
            let key = (
                v["partition"].as_u64().expect("partition") as u32,
                v["offset"].as_u64().expect("offset"),
            );
            (key, v)
        })
        .collect()
}

/// What the reader must report for `e` in `format`.
fn expect_line(e: &Produced, format: &str, got: &Value) {
    let at = format!("{format} {}/{} ({})", e.partition, e.offset, e.meta["kind"]);
    assert_eq!(got["metadata_encoding"], "json", "{at}");
    assert_eq!(got["metadata"], e.meta, "{at}: metadata");
    assert_eq!(got["data_len"], e.data.len(), "{at}: data_len");
    let arr = layout(&e.descriptor, e.data.len());
    let file_format = match format {
        "jsonl" => Value::Null,
        "npy" if arr.is_some() => "npy".into(),
        _ if e.data.is_empty() => Value::Null,
        _ => "raw".into(),
    };
    assert_eq!(got["file_format"], file_format, "{at}: where the data went");
    let data_hex = if file_format.is_null() {
        Value::Null
    } else {
        hex(&e.data).into()
    };
    assert_eq!(got["data_hex"], data_hex, "{at}: data bytes");
    match (&arr, file_format.is_null()) {
        (Some(l), false) => {
            assert_eq!(got["array"]["dtype"], l.dtype, "{at}: dtype");
            assert_eq!(got["array"]["shape"], json!(l.shape), "{at}: shape");
            let c = c_order(&e.data, &l.shape, l.itemsize, l.fortran);
            assert_eq!(got["array"]["c_order_hex"], hex(&c), "{at}: element order");
        }
        _ => assert!(got.get("array").is_none(), "{at}: no array expected"),
    }
}

fn check_all(produced: &[Produced], format: &str, got: &BTreeMap<(u32, u64), Value>) {
    assert_eq!(got.len(), produced.len(), "{format}: events read back");
    for e in produced {
        let line = got
            .get(&(e.partition, e.offset))
            .unwrap_or_else(|| panic!("{format}: {}/{} missing", e.partition, e.offset));
        expect_line(e, format, line);
    }
}

/// The same check without Python: every index line's data range holds
/// exactly the produced bytes, and every .npy header says what the
/// descriptor said (runs even where numpy is missing).
fn check_files_in_rust(produced: &[Produced], format: &str, dir: &Path) {
    let mut lines = BTreeMap::new();
    for p in 0..2 {
        for l in index_lines(dir, p) {
            let key = (p, l["offset"].as_u64().expect("offset"));
            lines.insert(key, l);
        }
    }
    assert_eq!(lines.len(), produced.len(), "{format}: index lines");
    for e in produced {
        let l = &lines[&(e.partition, e.offset)];
        let at = format!("{format} {}/{}", e.partition, e.offset);
        assert_eq!(l["data_len"], e.data.len(), "{at}");
        if l["data"].is_null() {
            assert!(format == "jsonl" || e.data.is_empty(), "{at}: data missing");
            continue;
        }
        let file = dir
            .join(format!("p{}", e.partition))
            .join(l["data"]["file"].as_str().expect("file"));
        let bytes = std::fs::read(&file).expect("the data file");
        let start = l["data"]["offset"].as_u64().expect("offset") as usize;
        let len = l["data"]["length"].as_u64().expect("length") as usize;
        assert_eq!(
            bytes.get(start..start + len),
            Some(&e.data[..]),
            "{at}: bytes"
        );
        if l["data"]["format"] == "npy" {
            let lay = layout(&e.descriptor, e.data.len()).expect("an array");
            let want = npy::preamble(&lay.dtype, lay.fortran, &lay.shape).expect("a header");
            assert_eq!(&bytes[..start], &want[..], "{at}: .npy header");
            assert_eq!(bytes.len(), start + len, "{at}: nothing after the array");
        }
    }
}

/// Files under `dir`, recursively.
fn count_files(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("reading a directory")
        .map(|e| {
            let p = e.expect("an entry").path();
            if p.is_dir() {
                count_files(&p)
            } else {
                1
            }
        })
        .sum()
}

fn manifest(dir: &Path) -> Value {
    let text = std::fs::read(dir.join("MANIFEST.json")).expect("MANIFEST.json");
    serde_json::from_slice(&text).expect("the manifest is JSON")
}

fn index_lines(dir: &Path, p: u32) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join(format!("p{p}/events.jsonl"))).expect("index");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("an index line"))
        .collect()
}

/// Only `TOPIC` in `to`: no hidden temporary directory left behind.
fn assert_no_leftovers(to: &Path) {
    let hidden: Vec<_> = std::fs::read_dir(to)
        .expect("reading --to")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .collect();
    assert!(hidden.is_empty(), "left behind: {hidden:?}");
}

#[test]
fn every_format_reads_back_byte_for_byte_with_numpy() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(tmp.path());
    let produced = produce(&server.connect(), "frames");
    let py = python();
    for format in ["raw", "npy", "jsonl"] {
        let to = tmp.path().join(format!("out-{format}"));
        let out = ok(
            stage_out(&server, "frames", &to, &["--format", format]),
            "stage-out",
        );
        let summary: Value = serde_json::from_str(out.stdout.trim()).expect("a JSON summary");
        assert_eq!(summary["events"], produced.len(), "{format}: {summary}");
        let dir = to.join("frames");
        let m = manifest(&dir);
        assert_eq!(m["format_name"], "strom-stage-out");
        assert_eq!(m["format"], format);
        assert_eq!(m["topic"], "frames");
        assert_eq!(m["events"], produced.len());
        assert_eq!(
            m["files"],
            count_files(&dir),
            "{format}: files in the manifest"
        );
        assert_eq!(summary["files"], m["files"]);
        let total: usize = produced.iter().map(|e| e.data.len()).sum();
        assert_eq!(m["data_bytes"], total);
        assert!(!m["strom_version"].as_str().unwrap_or("").is_empty());
        assert_no_leftovers(&to);
        check_files_in_rust(&produced, format, &dir);
        if let Some(py) = &py {
            check_all(&produced, format, &read_back(py, &dir));
        }
    }
}

#[test]
fn npy_index_lines_note_the_raw_fallback_and_keep_descriptors() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(tmp.path());
    let produced = produce(&server.connect(), "frames");
    let to = tmp.path().join("out");
    ok(
        stage_out(&server, "frames", &to, &["--format", "npy"]),
        "stage-out",
    );
    let dir = to.join("frames");
    let lines: Vec<Value> = (0..2).flat_map(|p| index_lines(&dir, p)).collect();
    let find = |kind: &str| {
        let e = produced
            .iter()
            .find(|e| e.meta["kind"] == kind)
            .expect("a case");
        lines
            .iter()
            .find(|l| l["partition"] == e.partition && l["offset"] == e.offset)
            .expect("its index line")
            .clone()
    };
    let wrong = find("wrong size");
    assert!(
        wrong["note"]
            .as_str()
            .is_some_and(|n| n.contains("describes 40 bytes but the data has 12")),
        "{wrong}"
    );
    assert_eq!(wrong["data"]["file"], "data.bin");
    let opaque = find("opaque descriptor");
    assert_eq!(opaque["descriptor_hex"], hex(b"\x01\x02opaque"));
    assert!(opaque["note"].as_str().is_some(), "{opaque}");
    let arr = find("i2 F 2x3");
    assert_eq!(
        arr["array"],
        json!({"dtype": "<i2", "shape": [2, 3], "order": "F"})
    );
    assert_eq!(arr["data"]["format"], "npy");
    assert_eq!(arr["data"]["offset"], 128, "data after a 128-byte preamble");
    assert!(arr.get("note").is_none());
    let npy = std::fs::read(
        dir.join(format!("p{}", arr["partition"]))
            .join(arr["data"]["file"].as_str().expect("a file name")),
    )
    .expect("the .npy file");
    assert_eq!(&npy[..6], b"\x93NUMPY");
    let none = find("no data");
    assert_eq!(none["data"], Value::Null);
    assert_eq!(none["data_len"], 0);
}

#[test]
fn binary_metadata_is_hex_with_its_decoded_value() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(tmp.path());
    let driver = server.connect();
    let schema =
        r#"{"type":"object","properties":{"step":{"type":"integer"}},"required":["step"]}"#;
    let spec = TopicSpec {
        serializer: "binary".into(),
        schema: Some(schema.into()),
        ..TopicSpec::new("bin", 1)
    };
    let topic = driver.create_topic(spec).expect("creating the topic");
    let producer = topic.producer().expect("a producer");
    for step in 0..3 {
        producer
            .push(json!({"step": step, "extra": "x"}), vec![step as u8; 3])
            .expect("pushing");
    }
    producer.flush().expect("flushing");
    let stored = common::read_all(&driver, "bin", "check", RUN);
    let to = tmp.path().join("out");
    ok(stage_out(&server, "bin", &to, &[]), "stage-out");
    let dir = to.join("bin");
    assert_eq!(manifest(&dir)["serializer"], "binary");
    let lines = index_lines(&dir, 0);
    assert_eq!(lines.len(), 3);
    for (step, l) in lines.iter().enumerate() {
        let raw = &stored.events[&(0, step as u64)].meta;
        assert_eq!(l["metadata_encoding"], "hex");
        assert_eq!(l["metadata"], hex(raw), "the stored bytes");
        assert_eq!(l["metadata_decoded"], json!({"step": step, "extra": "x"}));
        assert_eq!(l["data"]["offset"], step * 3);
    }
    if let Some(py) = python() {
        let got = read_back(&py, &dir);
        assert_eq!(got[&(0, 1)]["data_hex"], "010101");
        assert_eq!(
            got[&(0, 1)]["metadata_decoded"],
            json!({"step": 1, "extra": "x"})
        );
    }
}

/// Asserts a clean refusal: non-zero exit, `needle` on stderr, no panic.
fn refused(out: &CliOutput, needle: &str) {
    assert!(
        !out.status.success(),
        "expected a failure; stdout:\n{}",
        out.stdout
    );
    assert!(
        out.stderr.contains(needle),
        "stderr lacks {needle:?}:\n{}",
        out.stderr
    );
    assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
}

/// A server with topic `t` holding three small events.
fn small_topic(tmp: &Path) -> ServerProcess {
    let server = ServerProcess::start(tmp);
    ok(
        server.cli(&["topic", "create", "t", "--partitions", "2"], "", RUN),
        "create",
    );
    ok(
        server.cli(
            &["produce", "t", "--data-size", "16", "--keep-open"],
            "{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n",
            RUN,
        ),
        "produce",
    );
    server
}

#[test]
fn to_that_is_a_file_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = small_topic(tmp.path());
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").expect("writing a file");
    refused(
        &stage_out(&server, "t", &file, &[]),
        "is a file, not a directory",
    );
    refused(
        &stage_out(&server, "t", &file.join("below"), &[]),
        "cannot read it",
    );
    assert_eq!(std::fs::read(&file).expect("the file"), b"x");
}

#[test]
fn to_that_is_not_writable_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = small_topic(tmp.path());
    let ro = tmp.path().join("read-only");
    std::fs::create_dir(&ro).expect("mkdir");
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).expect("chmod");
    // root writes anywhere; /proc/self is a directory nobody can add to.
    let probe = ro.join("probe");
    let to = if std::fs::create_dir(&probe).is_ok() {
        let _ = std::fs::remove_dir(&probe);
        PathBuf::from("/proc/self")
    } else {
        ro.clone()
    };
    refused(&stage_out(&server, "t", &to, &[]), "cannot write there");
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

#[test]
fn unknown_topic_format_partition_and_from_are_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = small_topic(tmp.path());
    let to = tmp.path().join("out");
    refused(&stage_out(&server, "nope", &to, &[]), "nope");
    assert!(!to.exists(), "nothing is created for an unknown topic");
    refused(
        &stage_out(&server, "t", &to, &["--format", "parquet"]),
        "possible values: raw, npy, jsonl, hdf5",
    );
    refused(
        &stage_out(&server, "t", &to, &["--partitions", "0,7"]),
        "has no partition 7",
    );
    refused(
        &stage_out(&server, "t", &to, &["--from", "9"]),
        "past the end of partition",
    );
    refused(&stage_out(&server, "t", &to, &["--from", "soon"]), "--from");
    assert!(!to.exists());
}

#[test]
fn an_existing_stage_out_is_replaced_only_with_force() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = small_topic(tmp.path());
    let to = tmp.path().join("out");
    ok(stage_out(&server, "t", &to, &[]), "first stage-out");
    let dir = to.join("t");
    let first = std::fs::read(dir.join("MANIFEST.json")).expect("manifest");
    ok(
        server.cli(&["produce", "t", "--keep-open"], "{\"a\":4}\n", RUN),
        "produce more",
    );
    refused(
        &stage_out(&server, "t", &to, &[]),
        "pass --force to replace it",
    );
    assert_eq!(
        std::fs::read(dir.join("MANIFEST.json")).expect("manifest"),
        first,
        "the refused run left the old stage-out alone"
    );
    assert_no_leftovers(&to);
    ok(
        stage_out(&server, "t", &to, &["--force"]),
        "forced stage-out",
    );
    assert_eq!(manifest(&dir)["events"], 4);
    assert_no_leftovers(&to);
    // A directory that is not a stage-out is never replaced.
    let other = tmp.path().join("other");
    std::fs::create_dir_all(other.join("t")).expect("mkdir");
    std::fs::write(other.join("t/precious"), b"keep").expect("write");
    refused(
        &stage_out(&server, "t", &other, &["--force"]),
        "not a complete stage-out",
    );
    assert_eq!(
        std::fs::read(other.join("t/precious")).expect("kept"),
        b"keep"
    );
}

#[test]
fn an_empty_topic_and_one_partition_stage_out() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = small_topic(tmp.path());
    ok(
        server.cli(&["topic", "create", "empty", "--partitions", "3"], "", RUN),
        "create",
    );
    let to = tmp.path().join("out");
    ok(stage_out(&server, "empty", &to, &[]), "empty stage-out");
    let m = manifest(&to.join("empty"));
    assert_eq!(m["events"], 0);
    assert_eq!(m["partitions"].as_array().map(Vec::len), Some(3));
    assert_eq!(m["end_of_stream"], false);
    // --follow reads to the end of the stream.
    ok(
        server.cli(&["topic", "complete", "empty"], "", RUN),
        "complete",
    );
    ok(
        stage_out(&server, "empty", &to, &["--follow", "--force"]),
        "follow",
    );
    assert_eq!(manifest(&to.join("empty"))["end_of_stream"], true);
    ok(
        stage_out(
            &server,
            "t",
            &to,
            &["--partitions", "1", "--format", "jsonl"],
        ),
        "one partition",
    );
    let m = manifest(&to.join("t"));
    assert_eq!(m["partitions"][0]["id"], 1);
    assert_eq!(m["partitions"].as_array().map(Vec::len), Some(1));
    let lines = index_lines(&to.join("t"), 1);
    assert_eq!(m["events"], lines.len());
    assert!(lines
        .iter()
        .all(|l| l["data"].is_null() && l["data_len"] == 16));
}

/// Hidden entries of `to` (temporary directories of unfinished runs).
fn hidden(to: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(to)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with('.'))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Starts `strom topic stage-out live --to TO --follow` (the topic does
/// not end while the test holds its producer, so it runs until stopped)
/// and waits until it writes.
fn start_following(server: &ServerProcess, to: &Path) -> std::process::Child {
    let child = Command::new(common::strom_bin())
        .arg("--group-file")
        .arg(&server.group_file)
        .args(["topic", "stage-out", "live", "--follow", "--to"])
        .arg(to)
        .env_remove("STROM_ADDRESS")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawning strom");
    common::wait_for("the temporary directory", || !hidden(to).is_empty());
    child
}

#[test]
fn a_stopped_or_killed_stage_out_is_never_taken_for_a_complete_one() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(tmp.path());
    let driver = server.connect();
    let topic = driver
        .create_topic(TopicSpec::new("live", 2))
        .expect("creating the topic");
    // Held open to the end: the stream does not end under --follow.
    let producer = topic.producer().expect("a producer");
    for i in 0..3u8 {
        producer.push(json!({"i": i}), vec![i; 4]).expect("pushing");
    }
    producer.flush().expect("flushing");
    let to = tmp.path().join("out");
    // SIGINT: exits 130 and removes what it wrote.
    let mut child = start_following(&server, &to);
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = common::wait_bounded(&mut child, RUN).expect("exits after SIGINT");
    assert_eq!(status.code(), Some(130));
    assert!(!to.join("live").exists());
    assert!(hidden(&to).is_empty(), "left behind: {:?}", hidden(&to));
    // SIGKILL: the hidden directory stays, DIR/TOPIC never appears.
    let mut child = start_following(&server, &to);
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    assert!(!to.join("live").exists());
    let left = hidden(&to);
    assert_eq!(left.len(), 1, "{left:?}");
    // The next run says so, and completes.
    let out = ok(stage_out(&server, "live", &to, &[]), "after a crash");
    assert!(out.stderr.contains("did not finish"), "{}", out.stderr);
    assert_eq!(manifest(&to.join("live"))["events"], 3);
    assert_eq!(
        hidden(&to),
        left,
        "a crashed run's directory is not touched"
    );
    drop(producer);
}

/// Not run by default: times `raw` and `npy` on 128 arrays of 4 MiB with
/// array descriptors (docs/stage-out.md, "Measured"). Run with
/// `cargo test -p strom-cli --test stage_out -- --ignored --nocapture`.
#[test]
#[ignore]
fn measure_npy_and_raw_on_4_mib_arrays() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(tmp.path());
    let driver = server.connect();
    let spec = TopicSpec {
        durability: strom_client::Durability::Never,
        ..TopicSpec::new("arrays", 2)
    };
    let topic = driver.create_topic(spec).expect("creating the topic");
    let producer = topic.producer().expect("a producer");
    let d = desc("<f4", &[1024, 1024], "C");
    let data = common::Rng::new(3).bytes(4 << 20);
    for i in 0..128u32 {
        producer
            .push_with(json!({"i": i}), data.clone(), None, &d)
            .expect("pushing");
    }
    producer.flush().expect("flushing");
    for round in 0..3 {
        for format in ["raw", "npy"] {
            let to = tmp.path().join(format!("out-{format}"));
            let out = ok(
                stage_out(&server, "arrays", &to, &["--format", format, "--force"]),
                "stage-out",
            );
            let s: Value = serde_json::from_str(out.stdout.trim()).expect("a summary");
            let secs = s["seconds"].as_f64().unwrap_or(0.0);
            println!(
                "round {round} {format}: {} events, {} files, {secs:.3} s, {:.0} MB/s",
                s["events"],
                s["files"],
                s["data_bytes"].as_f64().unwrap_or(0.0) / secs / 1e6
            );
        }
    }
}

#[test]
fn bad_options_are_refused_before_connecting() {
    // Nothing listens at this address: an option error must come first,
    // not a connection error (nor a wait for one).
    let tmp = tempfile::tempdir().expect("tempdir");
    let to = tmp.path().join("out");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "topic",
            "stage-out",
            "t",
            "--to",
            to.to_str().expect("utf-8"),
            "--address",
            "127.0.0.1:1",
        ];
        args.extend_from_slice(extra);
        common::run_cli(&args, "", &[], RUN)
    };
    for (extra, needle) in [
        (&["--from", "soon"][..], "--from"),
        (&["--compress", "gzip"][..], "apply only to --format hdf5"),
        (&["--idle-timeout=-1"][..], "--idle-timeout"),
    ] {
        let out = run(extra);
        refused(&out, needle);
        assert!(
            !out.stderr.to_lowercase().contains("connect"),
            "{extra:?} was checked after connecting:\n{}",
            out.stderr
        );
    }
    assert!(!to.exists());
}
