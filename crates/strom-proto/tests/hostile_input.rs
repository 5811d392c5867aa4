//! Decoders never panic on arbitrary bytes, never allocate from a length
//! they did not check against the bytes present, and what they accept
//! survives a round trip.
//!
//! The properties live in the fuzz target bodies (`fuzz/src/proto.rs`),
//! shared with the cargo-fuzz targets. Here, on the stable toolchain, they
//! run over the committed corpus, 100,000 deterministically mutated inputs,
//! and proptest's random ones, all under a counting global allocator.

use bytes::Bytes;
use proptest::prelude::*;
use strom_proto::{BatchBuilder, BatchView, FRAME_HEADER_LEN};

#[allow(dead_code)]
#[macro_use]
#[path = "../../../fuzz/src/replay.rs"]
mod replay;
#[path = "../../../fuzz/src/proto.rs"]
mod targets;

#[global_allocator]
static ALLOC: replay::Counting = replay::Counting;

replay_tests!(0x5354_524F_4D00_0001);

/// The samples behind the seeds name opcodes 1..=N of each message kind,
/// and N + 1 is unknown to the decoder: an opcode added without a sample
/// (so without a seed) fails here.
#[test]
fn every_opcode_has_a_seed() {
    use strom_proto::{ErrorCode, Push, Request, Response};
    type IsUnknown = fn(u16) -> bool;
    let kinds: [(&str, Vec<u16>, IsUnknown); 3] = [
        (
            "request",
            targets::sample_requests()
                .iter()
                .map(Request::opcode)
                .collect(),
            |op| {
                Request::decode(strom_proto::PROTOCOL_VERSION, op, &Bytes::new())
                    .is_err_and(|e| e.code() == ErrorCode::UNKNOWN_OPCODE)
            },
        ),
        (
            "response",
            targets::sample_responses()
                .iter()
                .map(Response::opcode)
                .collect(),
            |op| {
                Response::decode(strom_proto::PROTOCOL_VERSION, op, &Bytes::new())
                    .is_err_and(|e| e.code() == ErrorCode::UNKNOWN_OPCODE)
            },
        ),
        (
            "push",
            targets::sample_pushes().iter().map(Push::opcode).collect(),
            |op| {
                Push::decode(strom_proto::PROTOCOL_VERSION, op, &Bytes::new())
                    .is_err_and(|e| e.code() == ErrorCode::UNKNOWN_OPCODE)
            },
        ),
    ];
    let seeds = targets::seeds();
    for (kind, ops, unknown) in kinds {
        let n = ops.len() as u16;
        assert_eq!(ops, (1..=n).collect::<Vec<_>>(), "{kind} samples");
        assert!(unknown(n + 1), "{kind} opcode {} has no sample", n + 1);
        for op in 1..=n {
            let name = format!("op{op:02}");
            assert!(
                seeds.iter().any(|(t, s, _)| *t == kind && *s == name),
                "{kind} has no seed for opcode {op}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn message_decoders_never_panic(opcode in 0u8..40, body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut input = vec![opcode];
        input.extend_from_slice(&body);
        for (name, target) in [("request", targets::request as fn(&[u8])), ("response", targets::response), ("push", targets::push)] {
            replay::run_one(name, target, &input, targets::bound, "proptest input");
        }
    }

    #[test]
    fn frame_decoder_never_panics(h in proptest::array::uniform24(any::<u8>()), body in proptest::collection::vec(any::<u8>(), 0..128)) {
        let h: [u8; FRAME_HEADER_LEN] = h;
        let mut input = h.to_vec();
        input.extend_from_slice(&body);
        replay::run_one("frame", targets::frame, &input, targets::bound, "proptest input");
    }

    #[test]
    fn batch_parser_never_panics_and_stays_in_bounds(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        replay::run_one("batch", targets::batch, &bytes, targets::bound, "proptest input");
    }

    #[test]
    fn built_batches_parse_back(events in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 0..40), 0u64..5000), 1..50)) {
        let mut b = BatchBuilder::new();
        for (m, d) in &events {
            b.push(m, b"", *d);
        }
        let v = BatchView::parse(b.finish()).unwrap();
        let got: Vec<_> = v.iter().map(|e| (e.metadata.to_vec(), e.data_len)).collect();
        prop_assert_eq!(got, events);
    }
}

/// Regression: `Vec<T>` checked a count against the smallest encoding of
/// `T` (1 byte for a struct) but reserved `count * size_of::<T>()`, so a
/// `Topics` response of N bytes claiming N topics reserved N * ~220 bytes
/// (a 256 MiB frame: ~56 GiB) before decoding the first one.
#[test]
fn a_count_of_large_structs_reserves_no_more_than_the_input() {
    // A count of all the bytes that follow, then a first topic whose name
    // claims 4 GiB: decoding fails at once, after reserving for the count.
    let len = 64 * 1024;
    let mut body = vec![0xFFu8; len];
    body[0..4].copy_from_slice(&(len as u32 - 4).to_le_bytes());
    let body = Bytes::from(body);
    let peak = replay::measure(|| {
        assert!(strom_proto::Response::decode(strom_proto::PROTOCOL_VERSION, 5, &body).is_err());
    });
    assert!(
        peak <= body.len(),
        "held {peak} bytes for a {}-byte body",
        body.len()
    );
}

/// Parsing and iterating a batch slices the section: what it allocates
/// does not grow with the section.
#[test]
fn a_batch_section_is_parsed_and_iterated_without_copying() {
    let mut b = BatchBuilder::new();
    for i in 0..500u32 {
        b.push(format!("{{\"i\":{i}}}").as_bytes(), b"desc", 1);
    }
    let section: Bytes = b.finish();
    let peak = replay::measure(|| {
        let v = BatchView::parse(section.clone()).unwrap();
        assert_eq!(v.iter().filter(|e| e.descriptor == "desc").count(), 500);
    });
    assert!(
        peak <= 64,
        "held {peak} bytes for a {}-byte section",
        section.len()
    );
}
