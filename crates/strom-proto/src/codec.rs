//! Primitive encoding: a bounds-checked [`Reader`] and the [`Wire`] trait that
//! every message field implements.
//!
//! All integers are little-endian. Strings and byte strings carry a `u32`
//! length; sequences a `u32` count that is checked against the bytes that
//! remain (times the element's minimum size) before anything is allocated.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::ProtoError;

/// A cursor over received bytes that never reads past the end.
pub struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
    version: u8,
}

impl<'a> Reader<'a> {
    /// A reader of bytes encoded at this build's [`crate::PROTOCOL_VERSION`].
    pub fn new(buf: &'a Bytes) -> Self {
        Self::at(buf, crate::PROTOCOL_VERSION)
    }

    /// A reader of bytes encoded at protocol `version` (a frame header's):
    /// nested structs read fields added after `version` as their default.
    pub fn at(buf: &'a Bytes, version: u8) -> Self {
        Reader {
            buf,
            pos: 0,
            version,
        }
    }

    /// The protocol version the bytes were encoded at.
    pub fn version(&self) -> u8 {
        self.version
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    fn need(&self, n: u64, what: &'static str) -> Result<usize, ProtoError> {
        if n > self.remaining() as u64 {
            return Err(ProtoError::Truncated {
                what,
                needed: n,
                remaining: self.remaining(),
            });
        }
        Ok(n as usize)
    }

    /// Takes the next `n` bytes as a zero-copy slice of the input.
    pub fn take(&mut self, n: u64, what: &'static str) -> Result<Bytes, ProtoError> {
        let n = self.need(n, what)?;
        let out = self.buf.slice(self.pos..self.pos + n);
        self.pos += n;
        Ok(out)
    }

    /// Takes everything that remains.
    pub fn rest(&mut self) -> Bytes {
        let out = self.buf.slice(self.pos..);
        self.pos = self.buf.len();
        out
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], ProtoError> {
        let n = self.need(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(out)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, ProtoError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub fn u16(&mut self, what: &'static str) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub fn u32(&mut self, what: &'static str) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub fn u64(&mut self, what: &'static str) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Reads a count and checks that `count * min_elem_size` bytes remain.
    pub fn count(&mut self, min_elem_size: usize, what: &'static str) -> Result<usize, ProtoError> {
        let n = self.u32(what)? as u64;
        self.need(n * min_elem_size.max(1) as u64, what)?;
        Ok(n as usize)
    }

    /// Errors when bytes remain (a message must consume its whole body).
    pub fn finish(&self) -> Result<(), ProtoError> {
        match self.remaining() {
            0 => Ok(()),
            n => Err(ProtoError::Trailing(n)),
        }
    }
}

/// A value with a wire encoding.
pub trait Wire: Sized {
    /// The fewest bytes any encoding of this type takes (guards allocation).
    const MIN_SIZE: usize;
    fn put(&self, out: &mut BytesMut);
    /// Encodes for a peer speaking protocol `version`. Only types holding
    /// fields added in a later version (`wire_struct!` with `field @ N`)
    /// and the containers around them encode differently per version.
    fn put_v(&self, _version: u8, out: &mut BytesMut) {
        self.put(out)
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError>;
}

macro_rules! wire_int {
    ($($t:ty => $m:ident, $put:ident;)*) => {$(
        impl Wire for $t {
            const MIN_SIZE: usize = std::mem::size_of::<$t>();
            fn put(&self, out: &mut BytesMut) { out.$put(*self) }
            fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> { r.$m(stringify!($t)) }
        }
    )*};
}
wire_int! { u8 => u8, put_u8; u16 => u16, put_u16_le; u32 => u32, put_u32_le; u64 => u64, put_u64_le; }

impl Wire for bool {
    const MIN_SIZE: usize = 1;
    fn put(&self, out: &mut BytesMut) {
        out.put_u8(*self as u8)
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        match r.u8("bool")? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(ProtoError::Unknown {
                what: "bool value",
                value: v as u64,
            }),
        }
    }
}

impl Wire for Bytes {
    const MIN_SIZE: usize = 4;
    fn put(&self, out: &mut BytesMut) {
        out.put_u32_le(self.len() as u32);
        out.put_slice(self);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let n = r.u32("byte string length")?;
        r.take(n as u64, "byte string")
    }
}

impl Wire for String {
    const MIN_SIZE: usize = 4;
    fn put(&self, out: &mut BytesMut) {
        out.put_u32_le(self.len() as u32);
        out.put_slice(self.as_bytes());
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let b = Bytes::get(r)?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtoError::invalid("string", "not UTF-8"))
    }
}

impl<T: Wire> Wire for Option<T> {
    const MIN_SIZE: usize = 1;
    fn put(&self, out: &mut BytesMut) {
        match self {
            None => out.put_u8(0),
            Some(v) => {
                out.put_u8(1);
                v.put(out)
            }
        }
    }
    fn put_v(&self, version: u8, out: &mut BytesMut) {
        match self {
            None => out.put_u8(0),
            Some(v) => {
                out.put_u8(1);
                v.put_v(version, out)
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        match bool::get(r)? {
            false => Ok(None),
            true => Ok(Some(T::get(r)?)),
        }
    }
}

impl<T: Wire> Wire for Vec<T> {
    const MIN_SIZE: usize = 4;
    fn put(&self, out: &mut BytesMut) {
        out.put_u32_le(self.len() as u32);
        for v in self {
            v.put(out);
        }
    }
    fn put_v(&self, version: u8, out: &mut BytesMut) {
        out.put_u32_le(self.len() as u32);
        for v in self {
            v.put_v(version, out);
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let n = r.count(T::MIN_SIZE, "sequence")?;
        // The count is checked against `MIN_SIZE` bytes per element, but an
        // element can be far larger in memory than its smallest encoding
        // (structs declare a `MIN_SIZE` of 0): reserve no more than the
        // bytes that remain, and let a vector of real elements grow.
        let mut v = Vec::with_capacity(n.min(r.remaining() / std::mem::size_of::<T>().max(1)));
        for _ in 0..n {
            v.push(T::get(r)?);
        }
        Ok(v)
    }
}

impl<A: Wire, B: Wire> Wire for (A, B) {
    const MIN_SIZE: usize = A::MIN_SIZE + B::MIN_SIZE;
    fn put(&self, out: &mut BytesMut) {
        self.0.put(out);
        self.1.put(out);
    }
    fn put_v(&self, version: u8, out: &mut BytesMut) {
        self.0.put_v(version, out);
        self.1.put_v(version, out);
    }
    fn get(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        Ok((A::get(r)?, B::get(r)?))
    }
}

/// Implements [`Wire`] for a struct by encoding its fields in order.
/// `field @ N` marks a field added in protocol version `N`: written only for
/// peers speaking `N` or later (see [`Wire::put_v`]), and read as its
/// `Default` from bytes of an older version (see [`Reader::version`]).
#[macro_export]
macro_rules! wire_struct {
    ($t:ident { $($f:ident $(@ $since:literal)?),* $(,)? }) => {
        impl $crate::codec::Wire for $t {
            const MIN_SIZE: usize = 0;
            fn put(&self, out: &mut bytes::BytesMut) {
                $crate::codec::Wire::put_v(self, $crate::PROTOCOL_VERSION, out)
            }
            #[allow(unused_variables)]
            fn put_v(&self, version: u8, out: &mut bytes::BytesMut) {
                $( if $crate::wire_struct!(@sent version $(, $since)?) {
                    $crate::codec::Wire::put_v(&self.$f, version, out);
                } )*
            }
            fn get(r: &mut $crate::codec::Reader<'_>) -> Result<Self, $crate::error::ProtoError> {
                Ok($t { $( $f: $crate::wire_struct!(@get r $(, $since)?), )* })
            }
        }
    };
    (@sent $v:expr) => { true };
    (@sent $v:expr, $since:literal) => { $v >= $since };
    (@get $r:ident) => { $crate::codec::Wire::get($r)? };
    (@get $r:ident, $since:literal) => {
        if $r.version() >= $since { $crate::codec::Wire::get($r)? } else { Default::default() }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_count_is_rejected_before_allocation() {
        let mut b = BytesMut::new();
        b.put_u32_le(u32::MAX);
        let b = b.freeze();
        let mut r = Reader::new(&b);
        assert!(matches!(
            Vec::<u64>::get(&mut r),
            Err(ProtoError::Truncated { .. })
        ));
    }

    #[test]
    fn round_trips_primitives() {
        let mut b = BytesMut::new();
        (7u64, "héllo".to_string()).put(&mut b);
        Some(vec![1u32, 2, 3]).put(&mut b);
        let b = b.freeze();
        let mut r = Reader::new(&b);
        assert_eq!(<(u64, String)>::get(&mut r).unwrap(), (7, "héllo".into()));
        assert_eq!(
            Option::<Vec<u32>>::get(&mut r).unwrap(),
            Some(vec![1, 2, 3])
        );
        r.finish().unwrap();
    }
}
