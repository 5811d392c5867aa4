//! Tiering of a replicated topic on three real `strom server` processes
//! with a 3-voter metadata quorum and one directory tier
//! (docs/tiering.md, "Replicated topics"): the leader copies each closed
//! segment below the high watermark to the tier, once; the followers record
//! the copies they verified against their own files and drop their local
//! segments past the local retention. The partition's leader is killed
//! with SIGKILL while copies run; the producer (`acks=all`) carries on with
//! the new leader. Every acknowledged event is then read back from every
//! live member (offsets only in the tier included), the tier holds each
//! segment once, with no gap, and every live copy keeps only its active
//! segment locally.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use common::raw::{connect, request_frame};
use common::replicated::*;
use common::{member_id, wait_for, ServerProcess};
use strom_client::TopicSpec;
use strom_proto::{
    BatchView, FrameHeader, FrameKind, Push, Request, Response, StartPos, FRAME_HEADER_LEN,
};
use strom_storage::tier::Manifest;

/// Small segments (about 40 events of the run's producer each), so that
/// segments roll, and are copied, all the time.
const SEGMENT_BYTES: u64 = 4096;

fn config(tier: &Path) -> String {
    format!(
        "tier_dir = \"{}\"\ntier_local_retention_bytes = 0\ntier_check_ms = 50\n\
         tier_cache_segments = 2\n",
        tier.display()
    )
}

/// Three members, each a voter of the metadata quorum and with the same
/// tier, and the replicated topic with small segments.
fn start_group(base: &Path) -> Group {
    let cfg = base.join("server.toml");
    std::fs::write(&cfg, config(&base.join("tier"))).expect("writing the config");
    let cfg = cfg.to_str().expect("utf-8 path");
    let args = ["--config", cfg, "--meta-voters", "3"];
    let zero = ServerProcess::start_with(&base.join("m0"), &args);
    let mut joined = BTreeMap::new();
    for i in 1..=2 {
        let dir = base.join(format!("m{i}"));
        let p = zero.join_member(&dir, &args, member_stderr(base, i));
        wait_for("the member's id", || member_id(&dir).is_some());
        joined.insert(member_id(&dir).unwrap(), (p, dir));
    }
    let d = zero.connect();
    wait_for("a quorum of three voters", || {
        d.members().is_ok_and(|ms| {
            ms.iter()
                .filter(|m| m.alive && (m.role == "leader" || m.role == "voter"))
                .count()
                == 3
        })
    });
    let spec = TopicSpec {
        replication_factor: 3,
        segment_bytes: Some(SEGMENT_BYTES),
        ..TopicSpec::new(TOPIC, PARTITIONS)
    };
    d.create_topic(spec).expect("creating the replicated topic");
    Group { zero, joined, d }
}

/// `<dir>/topics/<topic>.<id>`: the topic's directory under a data dir,
/// whose name is also its key prefix in the tier.
fn topic_dir_name(data: &Path) -> String {
    std::fs::read_dir(data.join("topics"))
        .expect("listing the topics")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with(&format!("{TOPIC}.")))
        .expect("the topic's directory")
}

/// Base offsets of the files ending with `.ext` in `dir`.
fn bases(dir: &Path, ext: &str) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<u64> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(&format!(".{ext}"))?.parse().ok()
        })
        .collect();
    out.sort_unstable();
    out
}

fn manifest(dir: &Path) -> Manifest {
    match std::fs::read(dir.join(strom_storage::tier::MANIFEST_FILE)) {
        Ok(b) => Manifest::decode(&b).expect("a valid tier manifest"),
        Err(_) => Manifest::default(),
    }
}

/// Whether the copy of partition `p` in `dir` keeps only its active
/// segment locally, and its manifest lists every segment below it.
fn only_active_local(dir: &Path) -> bool {
    let local = bases(dir, "log");
    let m = manifest(dir);
    local.len() == 1 && m.segments.last().map(|s| s.next) == local.first().copied()
}

/// Reads partition `p` of the topic from the member at `addr` itself (a
/// raw `Subscribe` from the beginning, not routed to the leader) until it
/// has every offset below `end`: offset -> metadata.
fn read_member(addr: &str, p: u32, end: u64) -> BTreeMap<u64, Vec<u8>> {
    let mut s = connect(addr);
    let sub = Request::Subscribe {
        stream: 1,
        topic: TOPIC.into(),
        partition: p,
        consumer: format!("member-read-{p}"),
        start: StartPos::Beginning,
        prefetch: 256,
    };
    s.write_all(&request_frame(1, &sub, b""))
        .expect("subscribing");
    let mut got = BTreeMap::new();
    let mut buf = BytesMut::new();
    let deadline = Instant::now() + WAIT;
    while got.len() < end as usize {
        assert!(
            Instant::now() < deadline,
            "reading {p} from {addr}: {} of {end} offsets",
            got.len()
        );
        let mut chunk = [0u8; 65536];
        match s.read(&mut chunk) {
            Ok(0) => panic!("{addr} closed the connection while reading partition {p}"),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => continue,
        }
        while let Some((h, body)) = next_frame(&mut buf) {
            if h.kind == FrameKind::Response {
                if let Ok(Response::Error { message, .. }) =
                    Response::decode(h.version, h.opcode, &body)
                {
                    panic!("reading {p} from {addr}: {message}");
                }
            }
            if h.kind != FrameKind::Push {
                continue;
            }
            if let Ok(Push::Events {
                base_offset, meta, ..
            }) = Push::decode(h.version, h.opcode, &body)
            {
                let view = BatchView::parse(meta).expect("a valid batch from the member");
                for (i, e) in view.iter().enumerate() {
                    got.insert(base_offset + i as u64, e.metadata.to_vec());
                }
                let credit = Request::Credit {
                    stream: 1,
                    events: view.count(),
                };
                s.write_all(&request_frame(0, &credit, b""))
                    .expect("granting credit");
            }
        }
    }
    got
}

/// Takes one whole frame off the front of `buf`, if it holds one.
fn next_frame(buf: &mut BytesMut) -> Option<(FrameHeader, Bytes)> {
    let h: [u8; FRAME_HEADER_LEN] = buf.get(..FRAME_HEADER_LEN)?.try_into().ok()?;
    let h = FrameHeader::decode(&h, u32::MAX).expect("a valid frame header");
    let len = FRAME_HEADER_LEN + h.body_len as usize + h.bulk_len as usize;
    if buf.len() < len {
        return None;
    }
    let frame = buf.split_to(len).freeze();
    Some((
        h,
        frame.slice(FRAME_HEADER_LEN..FRAME_HEADER_LEN + h.body_len as usize),
    ))
}

/// The tier holds every closed segment of partition `p` once: the objects
/// are exactly the segments `manifest` lists (a `.log` and a `.data` each,
/// of the recorded sizes, no temporary object left), and those follow each
/// other from offset 0 with no gap.
fn tier_holds_each_segment_once(tier: &Path, m: &Manifest) {
    let logs = bases(tier, "log");
    let listed: Vec<u64> = m.segments.iter().map(|s| s.base).collect();
    assert_eq!(logs, listed, "segments in the tier ({tier:?})");
    assert_eq!(bases(tier, "data"), listed, "data files in the tier");
    let temporaries = std::fs::read_dir(tier)
        .expect("listing the tier")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .count();
    assert_eq!(temporaries, 0, "a copy left half done");
    assert_eq!(m.segments.first().map(|s| s.base), Some(0));
    for w in m.segments.windows(2) {
        assert_eq!(w[0].next, w[1].base, "a gap or overlap in the tier");
    }
    for s in &m.segments {
        let size = |ext: &str| {
            std::fs::metadata(tier.join(format!("{:020}.{ext}", s.base)))
                .expect("a tier object")
                .len()
        };
        assert_eq!((size("log"), size("data")), (s.log_len, s.data_len));
    }
}

#[test]
fn replicated_topic_is_tiered_once_and_reads_back_everywhere_after_a_leader_kill_9() {
    let base = tempfile::tempdir().expect("tempdir");
    let mut g = start_group(base.path());
    let tier_topic = base
        .path()
        .join("tier")
        .join(topic_dir_name(&g.zero.data_dir));
    let p = led_by_member_1(&g.d);
    let tier_p = tier_topic.join(p.to_string());
    let r = run(&g);

    // Kill the leader while it copies: once the tier holds some of its
    // segments, and more keep coming.
    wait_for("the leader's first copies in the tier", || {
        bases(&tier_p, "log").len() >= 2
    });
    let at_kill = r.acked_on(p);
    let (_, epoch) = leader(&g.d, p);
    drop(g.joined.remove(&1).expect("member 1"));
    eprintln!(
        "killed member 1 with {} segments of partition {p} in the tier, {at_kill} acked on it",
        bases(&tier_p, "log").len()
    );
    wait_for("a new leader of the partition", || {
        leader(&g.d, p).1 > epoch
    });
    // Enough after the failover for the new leader to roll and copy.
    let rolled = bases(&tier_p, "log").len() + 3;
    wait_for("the new leader's copies", || {
        r.acked_on(p) > at_kill + 100 && bases(&tier_p, "log").len() >= rolled
    });
    let (h, seen) = r.finish();
    check(&g, &h, &seen);

    let live: Vec<(u32, PathBuf)> = std::iter::once((0, g.zero.data_dir.clone()))
        .chain(g.joined.iter().map(|(id, (_, d))| (*id, d.clone())))
        .collect();
    let addrs: BTreeMap<u32, String> =
        g.d.members()
            .expect("members")
            .into_iter()
            .map(|m| (m.id, m.addr))
            .collect();
    for q in 0..PARTITIONS {
        let dirs: Vec<PathBuf> = live
            .iter()
            .map(|(_, d)| d.join("topics").join(topic_dir_name(d)).join(q.to_string()))
            .collect();
        wait_for("every live copy to keep only its active segment", || {
            dirs.iter().all(|d| only_active_local(d))
        });
        // Every copy recorded the same segments, and the tier holds them.
        let ms: Vec<Manifest> = dirs.iter().map(|d| manifest(d)).collect();
        assert!(
            ms.windows(2).all(|w| w[0] == w[1]),
            "partition {q}: manifests differ"
        );
        tier_holds_each_segment_once(&tier_topic.join(q.to_string()), &ms[0]);
        let acked: BTreeMap<u64, u64> = h
            .acked
            .iter()
            .filter(|a| a.1 == q)
            .map(|a| (a.2, a.0))
            .collect();
        let end = acked.keys().last().map_or(0, |o| o + 1);
        let first_local = bases(&dirs[0], "log")[0];
        assert!(first_local > 0, "partition {q}: offsets only in the tier");
        for (id, _) in &live {
            let got = read_member(&addrs[id], q, end);
            for (offset, seq) in &acked {
                let meta = got.get(offset).map(|m| seq_of(m));
                assert_eq!(
                    meta,
                    Some(*seq),
                    "member {id}, partition {q}, offset {offset}"
                );
            }
        }
        eprintln!(
            "partition {q}: {} segments in the tier, local from {first_local}, {} acked events \
             read from each of members {:?}",
            ms[0].segments.len(),
            acked.len(),
            live.iter().map(|l| l.0).collect::<BTreeSet<_>>()
        );
    }
}
