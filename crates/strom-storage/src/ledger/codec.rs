//! The payload of a ledger record: a `u8` kind, then a little-endian body.
//! Pure functions over bytes. Decoding checks every count against the
//! bytes that remain before it allocates, and rejects an unknown kind, a
//! short body and trailing bytes: a hostile file gets an error, never a
//! panic or an oversized allocation.

use super::{DeadLetter, LedgerRecord, LedgerSnapshot, MAX_SPEC};

const START: u8 = 1;
const ACKED: u8 = 2;
const REDELIVERED: u8 = 3;
const DISPATCHED: u8 = 4;
const DEAD_LETTERED: u8 = 5;
// 6 is reserved for the partition fence of docs/design/consumer-groups.md.
const SNAPSHOT: u8 = 7;

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Lengths are written as `u32`; the caller caps the payload far below.
fn put_len(out: &mut Vec<u8>, n: usize) {
    put_u32(out, u32::try_from(n).unwrap_or(u32::MAX));
}

fn put_spec(out: &mut Vec<u8>, spec: &[u8]) {
    put_len(out, spec.len());
    out.extend_from_slice(spec);
}

fn put_pairs(out: &mut Vec<u8>, pairs: &[(u64, u32)]) {
    put_len(out, pairs.len());
    for &(a, b) in pairs {
        put_u64(out, a);
        put_u32(out, b);
    }
}

fn put_letter(out: &mut Vec<u8>, offset: u64, l: &DeadLetter) {
    put_u64(out, offset);
    put_u32(out, l.deliveries);
    put_u32(out, l.dlq_partition);
    put_u64(out, l.dlq_offset);
}

/// Encodes a record's payload.
pub(crate) fn encode(r: &LedgerRecord) -> Vec<u8> {
    let mut out = Vec::new();
    match r {
        LedgerRecord::Start { floor, spec } => {
            out.push(START);
            put_u64(&mut out, *floor);
            put_spec(&mut out, spec);
        }
        LedgerRecord::Acked(ranges) => {
            out.push(ACKED);
            put_pairs(&mut out, ranges);
        }
        LedgerRecord::Redelivered(counts) => {
            out.push(REDELIVERED);
            put_pairs(&mut out, counts);
        }
        LedgerRecord::Dispatched(upto) => {
            out.push(DISPATCHED);
            put_u64(&mut out, *upto);
        }
        LedgerRecord::DeadLettered { offset, letter } => {
            out.push(DEAD_LETTERED);
            put_letter(&mut out, *offset, letter);
        }
        LedgerRecord::Snapshot(s) => {
            out.push(SNAPSHOT);
            put_u64(&mut out, s.floor);
            put_u64(&mut out, s.dispatched);
            put_spec(&mut out, &s.spec);
            put_len(&mut out, s.acked.len());
            for &(first, end) in &s.acked {
                put_u64(&mut out, first);
                put_u64(&mut out, end);
            }
            put_pairs(&mut out, &s.deliveries);
            put_len(&mut out, s.dead.len());
            for (offset, letter) in &s.dead {
                put_letter(&mut out, *offset, letter);
            }
            put_u64(&mut out, s.acked_total);
            put_u64(&mut out, s.redelivered_total);
            put_u64(&mut out, s.dead_total);
        }
    }
    out
}

/// A cursor over a payload; every read is bounds-checked.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let left = self.buf.len() - self.at;
        if n > left {
            return Err(format!(
                "{what} needs {n} bytes at payload byte {}, {left} left",
                self.at
            ));
        }
        let s = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4, what)?);
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(b))
    }

    /// Reads a count of elements of `size` bytes each and checks that they
    /// fit in what is left.
    fn count(&mut self, size: usize, what: &str) -> Result<usize, String> {
        let n = self.u32(what)? as usize;
        let left = self.buf.len() - self.at;
        if n.checked_mul(size).is_none_or(|b| b > left) {
            return Err(format!(
                "a count of {n} {what} does not fit in the {left} bytes left"
            ));
        }
        Ok(n)
    }

    fn spec(&mut self) -> Result<Vec<u8>, String> {
        let n = self.count(1, "spec bytes")?;
        if n > MAX_SPEC {
            return Err(format!("a spec of {n} bytes, over the limit of {MAX_SPEC}"));
        }
        Ok(self.take(n, "the spec")?.to_vec())
    }

    fn pairs(&mut self, what: &str) -> Result<Vec<(u64, u32)>, String> {
        let n = self.count(12, what)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push((self.u64(what)?, self.u32(what)?));
        }
        Ok(v)
    }

    fn letter(&mut self) -> Result<(u64, DeadLetter), String> {
        let offset = self.u64("a dead letter")?;
        let letter = DeadLetter {
            deliveries: self.u32("a dead letter")?,
            dlq_partition: self.u32("a dead letter")?,
            dlq_offset: self.u64("a dead letter")?,
        };
        Ok((offset, letter))
    }
}

/// Decodes a record's payload; the error says what is wrong.
pub(crate) fn decode(payload: &[u8]) -> Result<LedgerRecord, String> {
    let Some((&kind, body)) = payload.split_first() else {
        return Err("an empty ledger record".into());
    };
    let mut r = Reader { buf: body, at: 0 };
    let rec = match kind {
        START => LedgerRecord::Start {
            floor: r.u64("the floor")?,
            spec: r.spec()?,
        },
        ACKED => LedgerRecord::Acked(r.pairs("acked ranges")?),
        REDELIVERED => LedgerRecord::Redelivered(r.pairs("delivery counts")?),
        DISPATCHED => LedgerRecord::Dispatched(r.u64("the dispatch mark")?),
        DEAD_LETTERED => {
            let (offset, letter) = r.letter()?;
            LedgerRecord::DeadLettered { offset, letter }
        }
        SNAPSHOT => {
            let floor = r.u64("the floor")?;
            let dispatched = r.u64("the dispatch mark")?;
            let spec = r.spec()?;
            let n = r.count(16, "acked ranges")?;
            let mut acked = Vec::with_capacity(n);
            for _ in 0..n {
                acked.push((r.u64("acked ranges")?, r.u64("acked ranges")?));
            }
            let deliveries = r.pairs("delivery counts")?;
            let n = r.count(24, "dead letters")?;
            let mut dead = Vec::with_capacity(n);
            for _ in 0..n {
                dead.push(r.letter()?);
            }
            LedgerRecord::Snapshot(Box::new(LedgerSnapshot {
                floor,
                dispatched,
                spec,
                acked,
                deliveries,
                dead,
                acked_total: r.u64("the totals")?,
                redelivered_total: r.u64("the totals")?,
                dead_total: r.u64("the totals")?,
            }))
        }
        other => return Err(format!("unknown ledger record kind {other}")),
    };
    if r.at != body.len() {
        return Err(format!(
            "{} unexpected bytes after a ledger record of kind {kind}",
            body.len() - r.at
        ));
    }
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimRng;

    fn samples() -> Vec<LedgerRecord> {
        let letter = DeadLetter {
            deliveries: 5,
            dlq_partition: 3,
            dlq_offset: 77,
        };
        vec![
            LedgerRecord::Start {
                floor: 10,
                spec: b"spec".to_vec(),
            },
            LedgerRecord::Acked(vec![(10, 3), (u64::MAX - 1, u32::MAX)]),
            LedgerRecord::Redelivered(vec![(11, 2)]),
            LedgerRecord::Acked(Vec::new()),
            LedgerRecord::Dispatched(99),
            LedgerRecord::DeadLettered { offset: 12, letter },
            LedgerRecord::Snapshot(Box::new(LedgerSnapshot {
                floor: 4,
                dispatched: 9,
                spec: vec![1, 2, 3],
                acked: vec![(5, 7)],
                deliveries: vec![(4, 3)],
                dead: vec![(8, letter)],
                acked_total: 1,
                redelivered_total: 2,
                dead_total: 3,
            })),
        ]
    }

    #[test]
    fn every_record_kind_round_trips() {
        for r in samples() {
            assert_eq!(decode(&encode(&r)), Ok(r));
        }
    }

    #[test]
    fn short_long_and_unknown_payloads_are_errors() {
        for r in samples() {
            let bytes = encode(&r);
            for cut in 0..bytes.len() {
                assert!(decode(&bytes[..cut]).is_err(), "{r:?} cut at {cut}");
            }
            let mut long = bytes.clone();
            long.push(0);
            assert!(decode(&long).is_err(), "{r:?} with a trailing byte");
        }
        assert!(decode(&[6]).is_err());
        assert!(decode(&[0xFF, 0, 0]).is_err());
    }

    #[test]
    fn huge_counts_are_refused_before_allocating() {
        // An Acked record claiming u32::MAX ranges in 4 bytes.
        let mut p = vec![ACKED];
        p.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&p).unwrap_err().contains("does not fit"));
        let mut rng = SimRng::new(7);
        for _ in 0..20_000 {
            let len = rng.below(64) as usize;
            let mut p: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            if let Some(k) = p.first_mut() {
                *k = 1 + (*k % 7);
            }
            let _ = decode(&p);
        }
    }
}
