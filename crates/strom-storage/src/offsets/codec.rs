//! The records of the consumer offset file (version 2) as
//! [`crate::RecordFile`] payloads: pure functions over bytes, no I/O.
//!
//! A payload is a `u8` kind and a little-endian body. The only kind is
//! `1`, a commit: `offset: u64`, then the consumer name (UTF-8, at most
//! [`MAX_NAME`] bytes) up to the end of the payload. A payload of any other
//! kind, a short body, a name that is too long or not UTF-8 does not decode.

use crate::record_file::Codec;

/// The longest consumer name (version 1 stored its length in a u16).
pub const MAX_NAME: usize = u16::MAX as usize;

const COMMIT: u8 = 1;
/// Kind and offset.
const COMMIT_HEAD: usize = 9;

/// One committed offset of one consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Commit {
    pub name: String,
    pub offset: u64,
}

/// The codec of the offset file.
pub struct OffsetCodec;

impl Codec for OffsetCodec {
    type Record = Commit;

    fn encode(&self, c: &Commit) -> Result<Vec<u8>, String> {
        if c.name.len() > MAX_NAME {
            return Err(format!(
                "a consumer name of {} bytes is longer than {MAX_NAME} bytes",
                c.name.len()
            ));
        }
        let mut out = Vec::with_capacity(COMMIT_HEAD + c.name.len());
        out.push(COMMIT);
        out.extend_from_slice(&c.offset.to_le_bytes());
        out.extend_from_slice(c.name.as_bytes());
        Ok(out)
    }

    fn decode(&self, payload: &[u8]) -> Result<Commit, String> {
        match payload.first() {
            Some(&COMMIT) => {}
            Some(kind) => return Err(format!("an offset record of unknown kind {kind}")),
            None => return Err("an empty offset record".into()),
        }
        if payload.len() < COMMIT_HEAD {
            return Err(format!(
                "an offset commit of {} bytes, shorter than {COMMIT_HEAD}",
                payload.len()
            ));
        }
        let name = &payload[COMMIT_HEAD..];
        if name.len() > MAX_NAME {
            return Err(format!(
                "a consumer name of {} bytes, over the limit of {MAX_NAME}",
                name.len()
            ));
        }
        let name = std::str::from_utf8(name)
            .map_err(|e| format!("a consumer name that is not UTF-8: {e}"))?;
        let mut offset = [0u8; 8];
        offset.copy_from_slice(&payload[1..COMMIT_HEAD]);
        Ok(Commit {
            name: name.to_string(),
            offset: u64::from_le_bytes(offset),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(name: &str, offset: u64) -> Commit {
        Commit {
            name: name.into(),
            offset,
        }
    }

    #[test]
    fn a_commit_round_trips_with_an_empty_or_a_maximal_name() {
        for c in [
            commit("", 0),
            commit("orders-reader", u64::MAX),
            commit(&"n".repeat(MAX_NAME), 7),
        ] {
            let bytes = OffsetCodec.encode(&c).unwrap();
            assert_eq!(OffsetCodec.decode(&bytes).unwrap(), c);
        }
    }

    #[test]
    fn a_name_over_the_limit_neither_encodes_nor_decodes() {
        let c = commit(&"n".repeat(MAX_NAME + 1), 1);
        assert!(OffsetCodec.encode(&c).is_err());
        let mut bytes = vec![COMMIT];
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(c.name.as_bytes());
        assert!(OffsetCodec.decode(&bytes).is_err());
    }

    #[test]
    fn hostile_payloads_are_errors() {
        let mut bad_utf8 = vec![COMMIT];
        bad_utf8.extend_from_slice(&1u64.to_le_bytes());
        bad_utf8.extend_from_slice(&[0xFF, 0xFE]);
        for p in [
            &[][..],
            &[2, 0, 0, 0, 0, 0, 0, 0, 0],
            &[COMMIT, 1, 2],
            &bad_utf8,
        ] {
            assert!(OffsetCodec.decode(p).is_err(), "{p:?} decoded");
        }
        // Every prefix and every byte of a seeded garbage stream: never a panic.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for len in 0..200 {
            let p: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let _ = OffsetCodec.decode(&p);
        }
    }
}
