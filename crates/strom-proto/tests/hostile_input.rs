//! Decoders never panic on arbitrary bytes, and what they accept
//! re-encodes to the same bytes (a cheap, always-on fuzz run).

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use strom_proto::{
    BatchBuilder, BatchView, FrameHeader, Push, Request, Response, FRAME_HEADER_LEN,
};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn message_decoders_never_panic(opcode in 0u16..40, body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let body = Bytes::from(body);
        if let Ok(m) = Request::decode(opcode, &body) {
            let mut out = BytesMut::new();
            m.encode(&mut out);
            prop_assert_eq!(&out[..], &body[..]);
        }
        let _ = Response::decode(opcode, &body);
        let _ = Push::decode(opcode, &body);
    }

    #[test]
    fn frame_header_decoder_never_panics(h in proptest::array::uniform24(any::<u8>()), max in 4096u32..u32::MAX) {
        let h: [u8; FRAME_HEADER_LEN] = h;
        if let Ok(d) = FrameHeader::decode(&h, max) {
            prop_assert!(20 + d.body_len as u64 + d.bulk_len <= max as u64);
        }
    }

    #[test]
    fn batch_parser_never_panics_and_stays_in_bounds(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let len = bytes.len();
        if let Ok(v) = BatchView::parse(Bytes::from(bytes)) {
            let mut payload = 0usize;
            for e in v.iter() {
                payload += e.metadata.len() + e.descriptor.len();
            }
            prop_assert!(payload <= len);
        }
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
