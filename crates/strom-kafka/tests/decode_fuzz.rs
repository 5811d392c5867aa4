//! Feeds 10,000 random and mutated request frames through the Kafka
//! front end's header parser, guard and decoders (`check_request`): none
//! may panic or reserve memory for a count the frame does not hold (an
//! abort would fail this test), and valid seeds must decode.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use strom_kafka::check_request;
use strom_kafka::error::FrameError;

/// A request frame (without the size prefix).
fn frame(key: i16, version: i16, flexible_header: bool, body: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    b.put_i16(key);
    b.put_i16(version);
    b.put_i32(7);
    b.put_i16(4);
    b.put_slice(b"fuzz");
    if flexible_header {
        b.put_u8(0);
    }
    b.put_slice(body);
    b.to_vec()
}

fn string(b: &mut BytesMut, s: &str) {
    b.put_i16(s.len() as i16);
    b.put_slice(s.as_bytes());
}

fn record_batch() -> Bytes {
    let recs: Vec<Record> = (0..3)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i,
            sequence: -1,
            timestamp: 1000,
            key: Some(Bytes::from_static(b"k")),
            value: Some(Bytes::from(vec![b'v'; 20])),
            headers: IndexMap::new(),
        })
        .collect();
    let mut out = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut out,
        recs.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .expect("encoding a record batch");
    out.freeze()
}

fn seeds() -> Vec<Vec<u8>> {
    let mut out = vec![frame(18, 0, false, &[])];
    // ApiVersions v3: compact strings, tagged fields.
    out.push(frame(
        18,
        3,
        true,
        &[5, b'r', b'd', b'k', b'a', 4, b'2', b'.', b'0', 0],
    ));
    for v in [1i16, 4, 8] {
        let mut b = BytesMut::new();
        b.put_i32(2);
        string(&mut b, "alpha");
        string(&mut b, "beta");
        if v >= 4 {
            b.put_u8(1);
        }
        if v >= 8 {
            b.put_u8(0);
            b.put_u8(0);
        }
        out.push(frame(3, v, false, &b));
    }
    // CreateTopics v2: one topic, no assignments, one config.
    let mut b = BytesMut::new();
    b.put_i32(1);
    string(&mut b, "t");
    b.put_i32(3);
    b.put_i16(-1);
    b.put_i32(0);
    b.put_i32(1);
    string(&mut b, "retention.ms");
    string(&mut b, "1000");
    b.put_i32(1000);
    b.put_u8(0);
    out.push(frame(19, 2, false, &b));
    // DeleteTopics v1.
    let mut b = BytesMut::new();
    b.put_i32(1);
    string(&mut b, "t");
    b.put_i32(1000);
    out.push(frame(20, 1, false, &b));
    // InitProducerId v0.
    out.push(frame(22, 0, false, &[0xff, 0xff, 0, 0, 0x27, 0x10]));
    // Produce v3 and v8: one topic, one partition, one record batch.
    let batch = record_batch();
    for v in [3i16, 8] {
        let mut b = BytesMut::new();
        b.put_i16(-1);
        b.put_i16(1);
        b.put_i32(1000);
        b.put_i32(1);
        string(&mut b, "t");
        b.put_i32(1);
        b.put_i32(0);
        b.put_i32(batch.len() as i32);
        b.put_slice(&batch);
        out.push(frame(0, v, false, &b));
    }
    // ListOffsets v1 and v5.
    for v in [1i16, 5] {
        let mut b = BytesMut::new();
        b.put_i32(-1);
        if v >= 2 {
            b.put_u8(0);
        }
        b.put_i32(1);
        string(&mut b, "t");
        b.put_i32(2);
        for p in 0..2 {
            b.put_i32(p);
            if v >= 4 {
                b.put_i32(-1);
            }
            b.put_i64(-2);
        }
        out.push(frame(2, v, false, &b));
    }
    // Fetch v4 and v11.
    for v in [4i16, 11] {
        let mut b = BytesMut::new();
        b.put_i32(-1);
        b.put_i32(500);
        b.put_i32(1);
        b.put_i32(1 << 20);
        b.put_u8(0);
        if v >= 7 {
            b.put_i32(0);
            b.put_i32(-1);
        }
        b.put_i32(1);
        string(&mut b, "t");
        b.put_i32(1);
        b.put_i32(0);
        if v >= 9 {
            b.put_i32(-1);
        }
        b.put_i64(0);
        if v >= 5 {
            b.put_i64(-1);
        }
        b.put_i32(1 << 20);
        if v >= 7 {
            b.put_i32(0);
        }
        if v >= 11 {
            string(&mut b, "");
        }
        out.push(frame(1, v, false, &b));
    }
    // The group APIs.
    let mut b = BytesMut::new();
    string(&mut b, "g");
    b.put_u8(0);
    out.push(frame(10, 1, false, &b)); // FindCoordinator v1
    let mut b = BytesMut::new();
    string(&mut b, "g");
    b.put_i32(10_000);
    b.put_i32(30_000);
    string(&mut b, "");
    b.put_i16(-1); // group instance id (v5)
    string(&mut b, "consumer");
    b.put_i32(1);
    string(&mut b, "range");
    b.put_i32(3);
    b.put_slice(b"sub");
    out.push(frame(11, 5, false, &b)); // JoinGroup v5
    let mut b = BytesMut::new();
    string(&mut b, "g");
    b.put_i32(1);
    string(&mut b, "m-1");
    b.put_i16(-1);
    b.put_i32(1);
    string(&mut b, "m-1");
    b.put_i32(2);
    b.put_slice(b"as");
    out.push(frame(14, 3, false, &b)); // SyncGroup v3
    let mut b = BytesMut::new();
    string(&mut b, "g");
    b.put_i32(1);
    string(&mut b, "m-1");
    b.put_i16(-1);
    out.push(frame(12, 3, false, &b)); // Heartbeat v3
    let mut b = BytesMut::new();
    string(&mut b, "g");
    string(&mut b, "m-1");
    out.push(frame(13, 2, false, &b)); // LeaveGroup v2
    let mut b = BytesMut::new();
    string(&mut b, "g");
    b.put_i32(1);
    string(&mut b, "m-1");
    b.put_i16(-1);
    b.put_i32(1);
    string(&mut b, "t");
    b.put_i32(2);
    for p in 0..2 {
        b.put_i32(p);
        b.put_i64(42);
        b.put_i32(-1);
        b.put_i16(-1);
    }
    out.push(frame(8, 7, false, &b)); // OffsetCommit v7
    let mut b = BytesMut::new();
    string(&mut b, "g");
    b.put_i32(1);
    string(&mut b, "t");
    b.put_i32(2);
    b.put_i32(0);
    b.put_i32(1);
    out.push(frame(9, 5, false, &b)); // OffsetFetch v5
    out.push(frame(16, 2, false, &[])); // ListGroups v2
    let mut b = BytesMut::new();
    b.put_i32(2);
    string(&mut b, "g");
    string(&mut b, "h");
    b.put_u8(0);
    out.push(frame(15, 4, false, &b)); // DescribeGroups v4
    out
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut f = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        if f.is_empty() {
            break;
        }
        match rng.below(6) {
            0 => {
                let i = rng.below(f.len());
                f[i] = rng.next() as u8;
            }
            1 => {
                // A count or length at a random place: huge, negative, -1.
                let i = rng.below(f.len());
                let v: i32 = [i32::MAX, -1, -2, 0x00ff_ffff, 65_535][rng.below(5)];
                for (k, b) in v.to_be_bytes().iter().enumerate() {
                    if let Some(x) = f.get_mut(i + k) {
                        *x = *b;
                    }
                }
            }
            2 => f.truncate(rng.below(f.len())),
            3 => {
                let i = rng.below(f.len());
                let junk: Vec<u8> = (0..rng.below(16)).map(|_| rng.next() as u8).collect();
                f.splice(i..i, junk);
            }
            4 => {
                // A 16-bit length at a random place.
                let i = rng.below(f.len());
                let v: i16 = [i16::MAX, -1, -3][rng.below(3)];
                for (k, b) in v.to_be_bytes().iter().enumerate() {
                    if let Some(x) = f.get_mut(i + k) {
                        *x = *b;
                    }
                }
            }
            _ => {
                let i = rng.below(f.len());
                f.remove(i);
            }
        }
    }
    f
}

fn panicked(r: &Result<(), FrameError>) -> bool {
    matches!(r, Err(FrameError::Body { detail, .. }) if detail.contains("panicked"))
}

#[test]
fn valid_seed_requests_decode() {
    for (i, s) in seeds().into_iter().enumerate() {
        if let Err(e) = check_request(Bytes::from(s)) {
            panic!("seed {i} does not decode: {e}");
        }
    }
}

#[test]
fn ten_thousand_random_and_mutated_frames_never_panic() {
    let seeds = seeds();
    let mut rng = Rng(0x5EED_CAFE_F00D_0001);
    let mut refused = 0;
    for n in 0..10_000 {
        let f = if n % 10 == 0 {
            (0..rng.below(200)).map(|_| rng.next() as u8).collect()
        } else {
            let s = &seeds[rng.below(seeds.len())];
            mutate(&mut rng, s)
        };
        let r = check_request(Bytes::from(f.clone()));
        assert!(!panicked(&r), "frame {n} made a decoder panic: {f:02x?}");
        refused += usize::from(r.is_err());
    }
    assert!(
        refused > 1000,
        "mutations are refused ({refused} of 10,000)"
    );
}
