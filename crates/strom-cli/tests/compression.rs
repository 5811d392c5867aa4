//! Data-part compression against a real `strom server`: a compressed
//! topic gives back every byte pushed while its `.data` files hold fewer;
//! selectors and brokers address the uncompressed view; a plain topic
//! stores data as pushed; bad options are refused at creation; and stored
//! frames that are corrupt or lie fail their own event with
//! `DECODE_FAILED`, the events around them are read normally.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{ok, raw, read_all, ServerProcess};
use strom_client::{
    ConsumerOptions, DataBuffer, Driver, ErrorCode, EventMeta, Next, Selection, StartPos, TopicSpec,
};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A compressible array: little-endian f32 values of a smooth field.
fn array(n: usize, seed: u32) -> Vec<u8> {
    let mut v: Vec<u8> = (0..n.div_ceil(4))
        .flat_map(|i| (300.0f32 + ((i as u32 + seed) % 4096) as f32 / 64.0).to_le_bytes())
        .collect();
    v.truncate(n);
    v
}

/// The events the tests push: arrays of several sizes, one empty data
/// part, one incompressible part, one array in two segments.
fn events() -> Vec<(String, Vec<Bytes>)> {
    let mut out = Vec::new();
    for i in 0..24u32 {
        let data = match i {
            5 => vec![],
            9 => vec![Bytes::from(common::Rng::new(9).bytes(3000))],
            13 => {
                let a = array(50_000, i);
                vec![
                    Bytes::copy_from_slice(&a[..777]),
                    Bytes::copy_from_slice(&a[777..]),
                ]
            }
            _ => vec![Bytes::from(array(1000 + 4000 * i as usize, i))],
        };
        out.push((format!("{{\"i\":{i}}}"), data));
    }
    out
}

fn joined(segs: &[Bytes]) -> Vec<u8> {
    segs.iter().flat_map(|s| s.iter().copied()).collect()
}

/// Pushes `events()` to partition 0 of `topic` and closes the producer.
fn push_all(d: &Driver, topic: &str) -> u64 {
    let p = d.open_topic(topic).unwrap().producer().unwrap();
    let mut futs = Vec::new();
    let mut bytes = 0;
    for (meta, data) in events() {
        bytes += joined(&data).len() as u64;
        futs.push(p.push_with(meta, data, Some(0), b"").unwrap());
    }
    for f in futs {
        f.wait().unwrap();
    }
    p.close().unwrap();
    bytes
}

/// Bytes in the `.data` files under `dir`.
fn data_file_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            let path = e.path();
            if path.is_dir() {
                data_file_bytes(&path)
            } else if path.extension().is_some_and(|x| x == "data") {
                e.metadata().unwrap().len()
            } else {
                0
            }
        })
        .sum()
}

fn assert_read_back_byte_for_byte(d: &Driver, topic: &str) {
    let got = read_all(d, topic, "check", TIMEOUT);
    let want = events();
    assert_eq!(got.len(), want.len());
    for (i, (meta, data)) in want.iter().enumerate() {
        let ev = &got.events[&(0, i as u64)];
        assert_eq!(ev.meta, meta.as_bytes(), "metadata of event {i}");
        assert_eq!(ev.data, joined(data), "data of event {i}");
    }
}

#[test]
fn a_compressed_topic_gives_back_every_byte_and_stores_fewer() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let out = server.cli(
        &[
            "topic",
            "create",
            "zz",
            "--partitions",
            "1",
            "--durability",
            "never",
            "--compression",
            "zstd:3",
        ],
        "",
        TIMEOUT,
    );
    ok(out, "topic create --compression zstd:3");
    let text = ok(
        server.cli(&["topic", "describe", "zz"], "", TIMEOUT),
        "describe",
    );
    assert!(
        text.stdout.contains("compression zstd:3"),
        "{}",
        text.stdout
    );
    let json = ok(
        server.cli(&["topic", "describe", "zz", "--json"], "", TIMEOUT),
        "describe --json",
    );
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["compression"], "zstd:3");

    let d = server.connect();
    let pushed = push_all(&d, "zz");
    let stored = data_file_bytes(&server.data_dir);
    assert!(
        stored * 3 < pushed,
        "{stored} bytes stored for {pushed} pushed"
    );
    assert_read_back_byte_for_byte(&d, "zz");
}

#[test]
fn a_plain_topic_stores_data_as_pushed() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let d = server.connect();
    d.create_topic(TopicSpec::new("plain", 1)).unwrap();
    let pushed = push_all(&d, "plain");
    assert_eq!(data_file_bytes(&server.data_dir), pushed);
    assert_read_back_byte_for_byte(&d, "plain");
    let text = ok(
        server.cli(&["topic", "describe", "plain"], "", TIMEOUT),
        "describe",
    );
    assert!(text.stdout.contains("compression none"), "{}", text.stdout);
}

/// Two buffers per event, the first one 100 bytes: selected bytes cross
/// from one into the other.
fn split_broker(
    _: &EventMeta,
    _: &Selection,
    len: u64,
) -> Result<Vec<Box<dyn DataBuffer>>, String> {
    let first = len.min(100) as usize;
    Ok(vec![
        Box::new(vec![0u8; first]),
        Box::new(vec![0u8; len as usize - first]),
    ])
}

#[test]
fn selectors_and_brokers_address_the_uncompressed_view() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let d = server.connect();
    d.create_topic(TopicSpec::new("sel", 1).with_compression("lz4"))
        .unwrap();
    push_all(&d, "sel");
    let want = events();
    let cases: Vec<(Selection, bool)> = vec![
        (
            Selection::Range {
                offset: 500,
                len: 300,
            },
            false,
        ),
        (
            Selection::Strided {
                offset: 8,
                block: 4,
                stride: 64,
                count: 10,
            },
            true,
        ),
    ];
    for (k, (sel, split)) in cases.into_iter().enumerate() {
        let opts = ConsumerOptions {
            start: StartPos::Beginning,
            selector: Arc::new(sel.clone()),
            broker: if split {
                Arc::new(split_broker)
            } else {
                ConsumerOptions::default().broker
            },
            ..Default::default()
        };
        let c = d
            .open_topic("sel")
            .unwrap()
            .consumer_with(&format!("sel{k}"), opts)
            .unwrap();
        for (i, (_, data)) in want.iter().enumerate() {
            let Next::Event(ev) = c.pull_timeout(TIMEOUT).unwrap() else {
                panic!("the stream ended before event {i}");
            };
            let full = joined(data);
            assert_eq!(
                ev.data_size(),
                full.len() as u64,
                "uncompressed size of event {i}"
            );
            let ranges = sel.resolve(full.len() as u64).unwrap_or_default();
            let expect: Vec<u8> = ranges
                .iter()
                .flat_map(|&(o, l)| full[o as usize..(o + l) as usize].iter().copied())
                .collect();
            assert_eq!(ev.data_vec(), expect, "selection {sel:?} of event {i}");
        }
    }
}

#[test]
fn bad_compression_options_are_refused_at_creation() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let out = server.cli(
        &["topic", "create", "g", "--compression", "gzip"],
        "",
        TIMEOUT,
    );
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("unknown compression 'gzip'"),
        "{}",
        out.stderr
    );
    let d = server.connect();
    let e = d
        .create_topic(TopicSpec::new("z", 1).with_compression("zstd:99"))
        .err()
        .expect("zstd:99 is refused");
    assert_eq!(e.code(), ErrorCode::INVALID_TOPIC_SPEC, "{e}");
}

/// A frame as docs/compression.md lays it out.
fn frame(codec: u8, len: u64, payload: &[u8]) -> Vec<u8> {
    let mut f = b"SZ".to_vec();
    f.extend_from_slice(&[codec, 0]);
    f.extend_from_slice(&len.to_le_bytes());
    f.extend_from_slice(payload);
    f
}

#[test]
fn corrupt_or_lying_frames_fail_their_own_event_only() {
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(dir.path());
    let d = server.connect();
    d.create_topic(TopicSpec::new("bad", 1).with_compression("zstd"))
        .unwrap();
    // Written by a raw client that frames as it likes.
    let parts: Vec<Vec<u8>> = vec![
        frame(0, 5, b"hello"),
        frame(9, 5, b"hello"),          // unknown codec
        frame(0, 100, b"hello"),        // lying length
        frame(1, 1 << 40, b"\x28\xb5"), // huge length
        frame(2, 1 << 20, b"tiny"),     // more than lz4 can expand to
        b"plain".to_vec(),              // no frame
        frame(0, 5, b"world"),
    ];
    let mut b = strom_proto::BatchBuilder::new();
    for (i, p) in parts.iter().enumerate() {
        b.push(format!("{{\"i\":{i}}}").as_bytes(), b"", p.len() as u64);
    }
    let req = strom_proto::Request::Produce {
        topic: "bad".into(),
        partition: 0,
        count: parts.len() as u32,
        acks_all: false,
        meta: b.finish(),
    };
    let mut s = raw::connect(&server.addr);
    std::io::Write::write_all(&mut s, &raw::request_frame(3, &req, &parts.concat())).unwrap();
    let got = raw::read_until_reply(&mut s, 3, "the raw produce");
    assert!(
        raw::responses(&got)
            .iter()
            .any(|(id, r)| *id == 3 && matches!(r, strom_proto::Response::Produced { .. })),
        "the server stores what it is sent"
    );
    let c = d.open_topic("bad").unwrap().consumer("reader").unwrap();
    let Next::Event(first) = c.pull_timeout(TIMEOUT).unwrap() else {
        panic!("an event")
    };
    assert_eq!(first.data(), b"hello");
    for offset in 1..=5u64 {
        let e = c
            .pull_timeout(TIMEOUT)
            .err()
            .expect("a decode error in the event's place");
        assert_eq!(e.code(), ErrorCode::DECODE_FAILED, "{e}");
        assert!(
            e.to_string()
                .contains(&format!("event {offset} of partition 0")),
            "{e}"
        );
    }
    let Next::Event(last) = c.pull_timeout(TIMEOUT).unwrap() else {
        panic!("an event")
    };
    assert_eq!((last.offset, last.data()), (6, &b"world"[..]));
    let mut server = server;
    assert!(server.is_alive(), "the server carries on");
}

/// `strom bench` on a compressed topic: reports the data stored beside
/// the data pushed (the smoke version of the figures in the docs).
#[test]
fn bench_reports_fewer_bytes_stored_on_a_compressed_topic() {
    let run = |compression: &str| {
        let args = [
            "bench",
            "produce",
            "--events",
            "40",
            "--data-size",
            "65536",
            "--payload",
            "array",
            "--compression",
            compression,
            "--json",
        ];
        let out = ok(
            common::run_cli(&args, "", &[], TIMEOUT),
            "strom bench produce",
        );
        let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert_eq!(v["produced"], 40, "{v}");
        assert_eq!(v["data_bytes_pushed"], 40 * 65536, "{v}");
        v["data_bytes_stored"].as_u64().expect("bytes stored")
    };
    let plain = run("none");
    let zstd = run("zstd:1");
    assert_eq!(plain, 40 * 65536);
    assert!(zstd * 3 < plain, "zstd:1 stored {zstd} bytes of {plain}");
}
