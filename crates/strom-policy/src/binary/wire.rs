//! Varint primitives and a bounds-checked reader for the binary serializer.

use crate::PolicyError;

/// Appends `v` as unsigned LEB128.
pub fn put_varint(out: &mut Vec<u8>, mut v: u128) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a length or count.
pub fn put_len(out: &mut Vec<u8>, len: usize) {
    put_varint(out, len as u128);
}

/// Zigzag-maps a signed integer so small magnitudes encode short.
pub fn zigzag(n: i128) -> u128 {
    ((n << 1) ^ (n >> 127)) as u128
}

/// Inverse of [`zigzag`].
pub fn unzigzag(z: u128) -> i128 {
    ((z >> 1) as i128) ^ -((z & 1) as i128)
}

/// Longest varint accepted, in bytes (70 bits: every i64/u64 zigzag fits).
const MAX_VARINT_BYTES: usize = 10;

/// A cursor over untrusted bytes; every read is bounds-checked.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    fn truncated(&self, what: &str) -> PolicyError {
        PolicyError::Decode(format!("truncated input: {what} at byte {}", self.pos))
    }

    pub fn byte(&mut self, what: &str) -> Result<u8, PolicyError> {
        match self.buf.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(self.truncated(what)),
        }
    }

    /// Takes exactly `n` bytes, failing if fewer remain.
    pub fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], PolicyError> {
        if n > self.remaining() {
            return Err(PolicyError::Decode(format!(
                "{what} of {n} bytes at byte {} overruns the {} remaining bytes",
                self.pos,
                self.remaining()
            )));
        }
        let start = self.pos;
        self.pos += n;
        self.buf
            .get(start..self.pos)
            .ok_or_else(|| self.truncated(what))
    }

    /// Reads an unsigned LEB128 value of at most 10 bytes.
    pub fn varint(&mut self, what: &str) -> Result<u128, PolicyError> {
        let start = self.pos;
        let mut value: u128 = 0;
        for i in 0..MAX_VARINT_BYTES {
            let b = self.byte(what)?;
            value |= u128::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(PolicyError::Decode(format!(
            "{what} varint at byte {start} is longer than {MAX_VARINT_BYTES} bytes"
        )))
    }

    /// Reads a length that must fit in the remaining bytes.
    pub fn len(&mut self, what: &str) -> Result<usize, PolicyError> {
        let start = self.pos;
        let v = self.varint(what)?;
        match usize::try_from(v) {
            Ok(n) if n <= self.remaining() => Ok(n),
            _ => Err(PolicyError::Decode(format!(
                "{what} {v} at byte {start} exceeds the {} remaining bytes",
                self.remaining()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_round_trips_extremes() {
        for n in [0i128, -1, 1, -64, 63, i64::MIN.into(), u64::MAX.into()] {
            assert_eq!(unzigzag(zigzag(n)), n);
            let mut out = Vec::new();
            put_varint(&mut out, zigzag(n));
            assert!(out.len() <= MAX_VARINT_BYTES);
            assert_eq!(Reader::new(&out).varint("n").unwrap(), zigzag(n));
        }
        assert_eq!(zigzag(-1), 1);
        assert_eq!(zigzag(1), 2);
    }

    #[test]
    fn overlong_and_truncated_varints_are_errors() {
        assert!(Reader::new(&[0x80; 11]).varint("x").is_err());
        assert!(Reader::new(&[0x80, 0x80]).varint("x").is_err());
        assert!(Reader::new(&[0x05, 1, 2]).len("x").is_err());
        assert_eq!(Reader::new(&[0x02, 1, 2]).len("x").unwrap(), 2);
    }
}
