//! HDF5 in and out (docs/hdf5.md) against a real `strom server`, with
//! h5py on the other side: h5py writes datasets of every dtype Strom maps,
//! `strom topic load` produces them, `strom topic stage-out --format hdf5`
//! writes them back (per-event, append, concat, gzip), and h5py must read
//! the same values, dtype and shape, with attributes naming the source.
//! Events produced through the client with numpy descriptors (C and
//! Fortran order, big-endian, 0-d, empty) go out the same way. Hostile
//! sources and events that cannot be appended fail with clear errors and
//! produce nothing. Needs python/.venv with h5py (`make python-setup`).

#![cfg(feature = "hdf5")]

mod common;

#[path = "hdf5/py.rs"]
mod py;

#[path = "hdf5/hostile.rs"]
mod hostile;

/// Array descriptors as the numpy path writes them.
#[path = "stage_out/arrays.rs"]
#[allow(dead_code)]
mod arrays;

use std::path::Path;
use std::time::{Duration, Instant};

use arrays::{counting, desc};
use common::{ok, CliOutput, ServerProcess};
use serde_json::{json, Value};
use strom_client::TopicSpec;

const RUN: Duration = Duration::from_secs(120);

fn cli(server: &ServerProcess, args: &[&str]) -> CliOutput {
    server.cli(args, "", RUN)
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The one JSON line a command printed on stdout.
fn summary(out: &CliOutput) -> Value {
    serde_json::from_str(out.stdout.trim()).expect("a JSON summary on stdout")
}

fn create_topic(server: &ServerProcess, name: &str) {
    ok(cli(server, &["topic", "create", name]), "topic create");
}

/// The topic's stream state, from `topic describe --json`.
fn state(server: &ServerProcess, name: &str) -> Value {
    let out = ok(
        cli(server, &["topic", "describe", name, "--json"]),
        "describe",
    );
    serde_json::from_str::<Value>(&out.stdout).expect("describe JSON")["state"].clone()
}

fn load(server: &ServerProcess, src: &str, topic: &str, extra: &[&str]) -> Value {
    let mut args = vec!["topic", "load", src, "--topic", topic];
    args.extend_from_slice(extra);
    summary(&ok(cli(server, &args), &format!("load {src}")))
}

fn stage_out(server: &ServerProcess, topic: &str, to: &Path, extra: &[&str]) -> CliOutput {
    let mut args = vec![
        "topic",
        "stage-out",
        topic,
        "--to",
        path(to),
        "--format",
        "hdf5",
    ];
    args.extend_from_slice(extra);
    cli(server, &args)
}

#[test]
fn h5py_datasets_load_and_stage_out_back_identically() {
    let t0 = Instant::now();
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(tmp.path());
    let src = tmp.path().join("in.h5");
    py::run(py::WRITE_SOURCES, &[path(&src)]);
    // (dataset, --chunk, layouts to check)
    let cases: &[(&str, Option<&str>, &[&str])] = &[
        ("/grp/temps", None, &["append", "per-event"]),
        ("/grp/temps", Some("hdf5"), &["concat"]),
        ("/counts", Some("8"), &["concat", "per-event"]),
        ("/flags", None, &["append"]),
        ("/be", Some("3"), &["concat"]),
        ("/z", None, &["per-event"]),
        ("/names", None, &["append"]),
        ("/half", None, &["per-event"]),
        ("/scalar", None, &["per-event"]),
    ];
    for (i, (dataset, chunk, layouts)) in cases.iter().enumerate() {
        let topic = format!("t{i}");
        create_topic(&server, &topic);
        let mut extra = vec![];
        if let Some(c) = chunk {
            extra.extend(["--chunk", c]);
        }
        let s = load(
            &server,
            &format!("{}:{dataset}", path(&src)),
            &topic,
            &extra,
        );
        assert_eq!(s["source_dataset"], *dataset, "{s}");
        let st = state(&server, &topic);
        assert_eq!(
            st["open_producers"], 0,
            "{dataset}: the producer closed: {st}"
        );
        assert_eq!(st["ended"], true, "{dataset}: the stream ended: {st}");
        let rows_per_event = match *chunk {
            None => "0".to_string(),
            Some(_) => s["rows_per_event"].to_string(),
        };
        for layout in *layouts {
            let to = tmp.path().join(format!("out-{i}-{layout}"));
            let compress = if *layout == "per-event" {
                "gzip:6"
            } else {
                "none"
            };
            let out = ok(
                stage_out(
                    &server,
                    &topic,
                    &to,
                    &["--hdf5-layout", layout, "--compress", compress],
                ),
                &format!("stage-out {dataset} {layout}"),
            );
            assert_eq!(summary(&out)["events"], s["events"], "{dataset} {layout}");
            let file = to.join(&topic).join("p0/events.h5");
            let said = py::run(
                py::CHECK_ROUND_TRIP,
                &[path(&file), path(&src), dataset, layout, &rows_per_event],
            );
            assert!(said.starts_with("ok"), "{dataset} {layout}: {said}");
        }
    }
    eprintln!("round trip 1 took {:.2?}", t0.elapsed());
}

/// What the client pushes: metadata, descriptor, data (numpy's vocabulary).
fn client_cases() -> Vec<(Value, Vec<u8>, Vec<u8>)> {
    let f4: Vec<u8> = [1.5f32, -2.0, 3.25, 0.0, 1e-3, 7.0]
        .iter()
        .flat_map(|f| f.to_le_bytes())
        .collect();
    vec![
        (
            json!({"kind": "f4 C", "frame": 3, "name": "a", "ok": true, "ratio": 0.5,
                   "big": u64::MAX, "nested": {"x": [1, 2]}, "strom_offset": "shadowed"}),
            desc("<f4", &[2, 3], "C"),
            f4,
        ),
        (
            json!({"kind": "i2 F"}),
            desc("<i2", &[2, 3], "F"),
            counting(12),
        ),
        (
            json!({"kind": "be i4 F"}),
            desc(">i4", &[3, 2, 2], "F"),
            counting(48),
        ),
        (
            json!({"kind": "0-d f8"}),
            desc("<f8", &[], "C"),
            counting(8),
        ),
        (json!({"kind": "empty"}), desc("<f4", &[0, 3], "C"), vec![]),
        (
            json!({"kind": "c16"}),
            desc("<c16", &[2], "C"),
            counting(32),
        ),
        (json!({"kind": "bytes"}), vec![], counting(100)),
        (
            json!({"kind": "datetime"}),
            desc("<M8[ns]", &[2], "C"),
            counting(16),
        ),
        (json!({"kind": "no data"}), vec![], vec![]),
    ]
}

/// Reads every `/events/<offset>` and checks it against what numpy makes
/// of the bytes pushed. argv: events.h5, expectations as JSON.
const CHECK_CLIENT: &str = r#"
import sys, json, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
want = json.loads(sys.argv[2])
assert sorted(f["events"]) == sorted("%012d" % int(k) for k in want), (list(f["events"]), list(want))
for off, w in want.items():
    d = f["events"]["%012d" % int(off)]
    a = np.frombuffer(bytes.fromhex(w["hex"]), w["dtype"]).reshape(w["shape"], order=w["order"])
    got = d[()]
    assert got.dtype == a.dtype, (off, got.dtype, a.dtype)
    assert got.shape == a.shape, (off, got.shape, a.shape)
    assert np.array_equal(got, a), (off, got, a)
    assert d.attrs["strom_offset"] == int(off)
    assert json.loads(d.attrs["strom_metadata"]) == w["meta"]
    assert d.attrs["kind"] == w["meta"]["kind"]
first = f["events"]["%012d" % 0]
assert first.attrs["frame"] == 3 and first.attrs["name"] == "a"
assert first.attrs["ok"] == True and first.attrs["ratio"] == 0.5
assert first.attrs["big"] == 2**64 - 1 and first.attrs["big"].dtype == np.uint64
assert json.loads(first.attrs["nested"]) == {"x": [1, 2]}
assert first.attrs["strom_offset"] == 0, "metadata never shadows strom_ attributes"
assert first.compression == "gzip" and first.chunks is not None
assert f.attrs["strom_topic"] == "np" and f.attrs["strom_partition"] == 0
print("ok")
"#;

#[test]
fn numpy_described_client_events_go_out_as_hdf5_h5py_reads() {
    let t0 = Instant::now();
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(tmp.path());
    let driver = server.connect();
    let topic = driver
        .create_topic(TopicSpec::new("np", 1))
        .expect("creating the topic");
    let producer = topic.producer().expect("a producer");
    let mut futures = Vec::new();
    for (meta, d, data) in client_cases() {
        futures.push(producer.push_with(meta, data, None, &d).expect("pushing"));
    }
    producer.flush().expect("flushing");
    for f in futures {
        f.wait().expect("stored");
    }
    let to = tmp.path().join("out");
    let out = ok(
        stage_out(&server, "np", &to, &["--compress", "gzip"]),
        "stage-out",
    );
    assert_eq!(summary(&out)["events"], client_cases().len());
    let dir = to.join("np");
    let mut want = serde_json::Map::new();
    for (i, (meta, d, data)) in client_cases().into_iter().enumerate() {
        let Ok(v) = serde_json::from_slice::<Value>(&d) else {
            continue;
        };
        if v["dtype"] == "<M8[ns]" {
            continue;
        }
        want.insert(
            i.to_string(),
            json!({"dtype": v["dtype"], "shape": v["shape"], "order": v["order"],
                   "hex": arrays::hex(&data), "meta": meta}),
        );
    }
    let said = py::run(
        CHECK_CLIENT,
        &[
            path(&dir.join("p0/events.h5")),
            &Value::Object(want).to_string(),
        ],
    );
    assert_eq!(said.trim(), "ok");
    // Data HDF5 does not hold as an array goes to data.bin, with a note.
    let index = std::fs::read_to_string(dir.join("p0/events.jsonl")).expect("index");
    let lines: Vec<Value> = index
        .lines()
        .map(|l| serde_json::from_str(l).expect("a line"))
        .collect();
    let by_kind = |k: &str| {
        lines
            .iter()
            .find(|l| l["metadata"]["kind"] == k)
            .expect("a line")
            .clone()
    };
    assert_eq!(by_kind("f4 C")["data"]["dataset"], "/events/000000000000");
    assert_eq!(by_kind("f4 C")["data"]["format"], "hdf5");
    assert_eq!(by_kind("bytes")["data"]["file"], "data.bin");
    let note = by_kind("datetime")["note"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(note.contains("has no HDF5 type"), "{note}");
    assert_eq!(by_kind("no data")["data"], Value::Null);
    let m: Value = serde_json::from_slice(&std::fs::read(dir.join("MANIFEST.json")).expect("m"))
        .expect("manifest JSON");
    assert_eq!(m["format"], "hdf5");
    assert_eq!(m["hdf5"]["layout"], "per-event");
    assert_eq!(m["partitions"][0]["hdf5_datasets"], 6);
    assert_eq!(m["partitions"][0]["raw_fallbacks"], 2);
    eprintln!("round trip 2 took {:.2?}", t0.elapsed());
}

#[test]
fn append_refuses_an_event_of_another_shape_unless_fallback_is_asked() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(tmp.path());
    let driver = server.connect();
    let topic = driver
        .create_topic(TopicSpec::new("mixed", 1))
        .expect("creating the topic");
    let producer = topic.producer().expect("a producer");
    let mut futures = Vec::new();
    for i in 0..3u8 {
        let f = producer.push_with(
            json!({"i": i}),
            vec![i; 16],
            None,
            &desc("<f4", &[2, 2], "C"),
        );
        futures.push(f.expect("pushing"));
    }
    let f = producer.push_with(json!({"i": 3}), vec![9; 12], None, &desc("<f4", &[3], "C"));
    futures.push(f.expect("pushing"));
    producer.flush().expect("flushing");
    for f in futures {
        f.wait().expect("stored");
    }
    let to = tmp.path().join("out");
    let out = stage_out(&server, "mixed", &to, &["--hdf5-layout", "append"]);
    assert_eq!(out.status.code(), Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("event 0/3") && out.stderr.contains("--hdf5-fallback"),
        "the error names the event and the way out: {}",
        out.stderr
    );
    assert!(
        out.stderr.contains("[3]") && out.stderr.contains("[2, 2]"),
        "{}",
        out.stderr
    );
    assert!(!to.join("mixed").exists(), "nothing staged out");
    let out = ok(
        stage_out(
            &server,
            "mixed",
            &to,
            &["--hdf5-layout", "append", "--hdf5-fallback"],
        ),
        "stage-out with fallback",
    );
    assert_eq!(summary(&out)["events"], 4);
    let said = py::run(
        r#"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
assert f["data"].shape == (3, 2, 2), f["data"].shape
assert f["data"].dtype == np.dtype("<f4")
assert f["data"][()].tobytes() == bytes([0] * 16 + [1] * 16 + [2] * 16)
assert list(f["index"]["offset"]) == [0, 1, 2]
assert f["events"]["000000000003"].shape == (3,)
assert f["events"]["000000000003"][()].tobytes() == bytes([9] * 12)
print("ok")
"#,
        &[path(&to.join("mixed/p0/events.h5"))],
    );
    assert_eq!(said.trim(), "ok");
}

#[test]
fn hdf5_options_need_format_hdf5_and_valid_values() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(tmp.path());
    create_topic(&server, "t");
    let to = tmp.path().join("out");
    let cases: &[(&[&str], &str)] = &[
        (
            &["--format", "raw", "--compress", "gzip"],
            "apply only to --format hdf5",
        ),
        (
            &["--format", "npy", "--hdf5-layout", "append"],
            "apply only to --format hdf5",
        ),
        (&["--format", "hdf5", "--compress", "gzip:12"], "gzip:0..9"),
        (&["--format", "hdf5", "--compress", "lzf"], "gzip:0..9"),
        (&["--format", "hdf5", "--hdf5-fallback"], "append or concat"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["topic", "stage-out", "t", "--to", path(&to)];
        args.extend_from_slice(extra);
        let out = cli(&server, &args);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {}", out.stderr);
        assert!(out.stderr.contains(want), "{extra:?}: {}", out.stderr);
        assert!(!to.join("t").exists());
    }
}
