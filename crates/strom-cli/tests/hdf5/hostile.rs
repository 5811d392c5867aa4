//! Hostile and mistaken sources for `strom topic load`: malformed
//! `FILE:/DATASET` arguments, files that are not HDF5 or are damaged,
//! paths that do not lead to a dataset, links and storage that point
//! outside the file, element types numpy cannot describe, and dimensions
//! too large for an event. Each must fail with exit status 1 and a clear
//! message, never a panic, and produce nothing into the topic.

use std::path::Path;

use super::common::ServerProcess;
use super::{cli, create_topic, path, py};

/// Writes the hostile file: datasets Strom must refuse, and an external
/// link and external storage pointing at other files.
const WRITE_HOSTILE: &str = r#"
import sys, os, h5py, numpy as np
d = os.path.dirname(sys.argv[1])
with h5py.File(os.path.join(d, "other.h5"), "w") as o:
    o["secret"] = np.arange(4)
with open(os.path.join(d, "raw.bin"), "wb") as r:
    r.write(bytes(range(16)))
with h5py.File(sys.argv[1], "w") as f:
    f.create_group("g").create_group("inner")
    f["ok"] = np.arange(10, dtype="<i4")
    f.create_dataset("vlen", data=["a", "bc"], dtype=h5py.string_dtype())
    f.create_dataset("rec", data=np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8")]))
    f.create_dataset("opaque", data=np.zeros(3, dtype="V4"))
    f.create_dataset("enum", data=np.zeros(3, dtype="u1"), dtype=h5py.enum_dtype({"RED": 0, "GREEN": 1}, basetype="u1"))
    f.create_dataset("long", data=np.zeros(3, dtype=np.longdouble))
    f.create_dataset("ref", (2,), dtype=h5py.ref_dtype)
    f.create_dataset("huge", shape=(2**40, 2**40), dtype="u1", chunks=(1, 1024))
    f.create_dataset("wide", shape=(3, 2**30), dtype="<f8", chunks=(1, 1024))
    f.create_dataset("long_axis", shape=(2**40,), dtype="u1", chunks=(4096,))
    f["ext"] = h5py.ExternalLink("other.h5", "/secret")
    f.create_dataset("extstore", shape=(16,), dtype="u1", external=[("raw.bin", 0, 16)])
    f.create_dataset("nullspace", data=h5py.Empty("f4"))
"#;

/// Runs a load that must fail; its stderr.
fn refused(server: &ServerProcess, args: &[&str], want: &[&str]) -> String {
    let mut full = vec!["topic", "load"];
    full.extend_from_slice(args);
    let out = cli(server, &full);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{args:?} must fail with status 1: {}",
        out.stderr
    );
    assert!(!out.stderr.contains("panicked"), "{args:?}: {}", out.stderr);
    assert!(
        out.stderr.contains("strom: error:"),
        "{args:?}: {}",
        out.stderr
    );
    for w in want {
        assert!(
            out.stderr.contains(w),
            "{args:?}: wanted '{w}' in: {}",
            out.stderr
        );
    }
    assert!(out.stdout.trim().is_empty(), "{args:?}: {}", out.stdout);
    out.stderr
}

/// The topic received no event and no producer.
fn untouched(server: &ServerProcess, topic: &str) {
    let out = cli(server, &["topic", "describe", topic, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("describe JSON");
    assert_eq!(v["partitions"][0]["next_offset"], 0, "{v}");
    assert_eq!(v["state"]["open_producers"], 0, "{v}");
    assert_eq!(v["state"]["closed_producers"], 0, "{v}");
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("writing a file");
    path(&p).to_string()
}

#[test]
fn hostile_sources_are_refused_before_anything_is_produced() {
    let t0 = std::time::Instant::now();
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(tmp.path());
    create_topic(&server, "t");
    let h = tmp.path().join("hostile.h5");
    py::run(WRITE_HOSTILE, &[path(&h)]);
    let h = path(&h).to_string();
    let t = ["--topic", "t"];
    let load = |src: &str, extra: &[&str], want: &[&str]| {
        let mut args = vec![src];
        args.extend_from_slice(&t);
        args.extend_from_slice(extra);
        refused(&server, &args, want);
    };
    // The argument.
    load(&h, &[], &["expected FILE:/DATASET"]);
    load(&format!("{h}:ok"), &[], &["expected FILE:/DATASET"]);
    load(&format!("{h}:/"), &[], &["root group"]);
    load(&format!("{h}:/g//inner"), &[], &["empty component"]);
    load(&format!("{h}:/g/../ok"), &[], &["'..' component"]);
    load(&format!("{h}:/ok:/x"), &[], &["more than one ':/'"]);
    load(
        &format!("{h}:/ok"),
        &["--chunk", "0"],
        &["--chunk takes a positive"],
    );
    load(&format!("{h}:/ok"), &["--chunk", "hdf5"], &["not chunked"]);
    // The file.
    let missing = path(&tmp.path().join("missing.h5")).to_string();
    load(
        &format!("{missing}:/x"),
        &[],
        &["missing.h5", "No such file"],
    );
    load(
        &format!("{}:/x", path(tmp.path())),
        &[],
        &["not a regular file"],
    );
    let text = write(tmp.path(), "text.h5", b"just some text, not HDF5 at all\n");
    load(&format!("{text}:/x"), &[], &["not an HDF5 file"]);
    let whole = std::fs::read(&h).expect("reading the hostile file");
    let cut = write(tmp.path(), "cut.h5", &whole[..whole.len() / 3]);
    load(&format!("{cut}:/ok"), &[], &["cut.h5"]);
    let mut garbage = whole[..8].to_vec(); // the HDF5 signature, then noise
    garbage.extend((0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8));
    let noise = write(tmp.path(), "noise.h5", &garbage);
    load(&format!("{noise}:/ok"), &[], &["noise.h5"]);
    // The path.
    load(
        &format!("{h}:/nope"),
        &[],
        &["no dataset /nope", "has no member 'nope'"],
    );
    load(
        &format!("{h}:/g/nope/x"),
        &[],
        &["group /g has no member 'nope'"],
    );
    load(&format!("{h}:/g"), &[], &["/g is a group, not a dataset"]);
    load(&format!("{h}:/ok/x"), &[], &["/ok is not a group"]);
    load(
        &format!("{h}:/ext"),
        &[],
        &["external or user-defined link"],
    );
    load(&format!("{h}:/extstore"), &[], &["external file"]);
    load(&format!("{h}:/nullspace"), &[], &["null dataspace"]);
    // Element types.
    for (ds, why) in [
        ("vlen", "variable-length string"),
        ("rec", "compound type"),
        ("opaque", "opaque"),
        ("enum", "an enum"),
        ("long", "a float of 16 bytes"),
        ("ref", "reference"),
    ] {
        load(
            &format!("{h}:/{ds}"),
            &[],
            &["cannot describe it as a numpy dtype", why],
        );
    }
    // Sizes: checked before anything is allocated or produced.
    load(
        &format!("{h}:/huge"),
        &[],
        &["1099511627776 bytes", "over the limit"],
    );
    load(&format!("{h}:/wide"), &[], &["8589934592 bytes", "--chunk"]);
    load(
        &format!("{h}:/ok"),
        &["--max-event-bytes", "0"],
        &["must be positive"],
    );
    untouched(&server, "t");
    eprintln!("hostile sources took {:.2?}", t0.elapsed());
}

/// Writes a checksummed dataset, then flips bytes inside its third chunk
/// (rows 20..30): the damage is only found when that chunk is read.
const WRITE_DAMAGED_CHUNK: &str = r#"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "w") as f:
    d = f.create_dataset("sum", data=np.arange(160.0).reshape(40, 4), chunks=(10, 4), fletcher32=True)
    at = d.id.get_chunk_info(2).byte_offset
with open(sys.argv[1], "r+b") as f:
    f.seek(at + 8)
    f.write(b"\xff" * 16)
"#;

#[test]
fn a_chunk_damaged_part_way_stops_the_load_and_holds_the_stream_open() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(tmp.path());
    create_topic(&server, "t");
    let f = tmp.path().join("damaged.h5");
    py::run(WRITE_DAMAGED_CHUNK, &[path(&f)]);
    let src = format!("{}:/sum", path(&f));
    let err = refused(
        &server,
        &[&src, "--topic", "t"],
        &[
            "reading rows 20..21",
            "20 events",
            "stored before the failure",
        ],
    );
    assert!(err.contains("holds the stream open"), "{err}");
    eprintln!("the damaged chunk: {err}");
    let out = cli(&server, &["topic", "describe", "t", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("describe JSON");
    assert_eq!(
        v["partitions"][0]["next_offset"], 20,
        "the rows before the damage: {v}"
    );
    assert_eq!(v["state"]["ended"], false, "the stream is held open: {v}");
    assert_eq!(v["state"]["open_producers"], 1, "{v}");
}
