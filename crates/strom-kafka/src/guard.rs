//! The guard in front of the `kafka-protocol` decoders: a walk over a
//! request body, driven by a small layout of each supported request and
//! version, that checks every array count, string and bytes length against
//! the bytes that remain, and caps the total number of array elements.
//!
//! `kafka-protocol` calls `Vec::with_capacity(n)` with counts read off the
//! wire; a body that passes this walk holds every element it announces, so
//! those reservations are bounded by the frame (itself capped) times the
//! in-memory size of an element, and by [`MAX_ELEMENTS`] overall. The walk
//! allocates nothing.

use bytes::Buf;

/// Most array elements, over all arrays, one request may hold. A fetch or
/// produce of 100,000 partitions in one request is far past any client's
/// habits; it bounds what the decoder reserves.
pub const MAX_ELEMENTS: usize = 100_000;

/// A field's wire type.
#[derive(Clone, Copy)]
pub enum T {
    I8,
    I16,
    I32,
    I64,
    /// A (nullable) string: i16 length, or compact in flexible versions.
    Str,
    /// (Nullable) bytes: i32 length, or compact in flexible versions.
    Bytes,
    /// An array of structs.
    Arr(&'static [F]),
    /// An array of i32.
    ArrI32,
    /// An array of strings.
    ArrStr,
}

/// A field present in versions `min..=max`.
#[derive(Clone, Copy)]
pub struct F(pub i16, pub i16, pub T);

const ALL: i16 = i16::MAX;

/// What is wrong with a body, for the log line that closes the connection.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("{what} needs {needed} bytes, {remaining} remain")]
    Short {
        what: &'static str,
        needed: u64,
        remaining: usize,
    },
    #[error("a negative length {0} where only -1 (null) is allowed")]
    Negative(i64),
    #[error("more than {MAX_ELEMENTS} array elements in one request")]
    TooManyElements,
    #[error("a varint longer than 5 bytes")]
    Varint,
}

struct Walk<'a> {
    buf: &'a [u8],
    flexible: bool,
    elements: usize,
}

impl Walk<'_> {
    fn need(&self, n: u64, what: &'static str) -> Result<(), GuardError> {
        if n > self.buf.len() as u64 {
            return Err(GuardError::Short {
                what,
                needed: n,
                remaining: self.buf.len(),
            });
        }
        Ok(())
    }

    fn skip(&mut self, n: u64, what: &'static str) -> Result<(), GuardError> {
        self.need(n, what)?;
        self.buf.advance(n as usize);
        Ok(())
    }

    fn uvarint(&mut self) -> Result<u32, GuardError> {
        let mut v = 0u32;
        for i in 0..5 {
            self.need(1, "varint")?;
            let b = self.buf.get_u8();
            v |= u32::from(b & 0x7f) << (i * 7);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(GuardError::Varint)
    }

    /// A length or count: `None` for null.
    fn len(&mut self, wide: bool) -> Result<Option<u64>, GuardError> {
        if self.flexible {
            return Ok(self.uvarint()?.checked_sub(1).map(u64::from));
        }
        let n = if wide {
            self.need(4, "length")?;
            i64::from(self.buf.get_i32())
        } else {
            self.need(2, "length")?;
            i64::from(self.buf.get_i16())
        };
        match n {
            -1 => Ok(None),
            n if n < 0 => Err(GuardError::Negative(n)),
            n => Ok(Some(n as u64)),
        }
    }

    fn count(&mut self) -> Result<u64, GuardError> {
        let n = self.len(true)?.unwrap_or(0);
        // Every element takes at least one byte.
        self.need(n, "array")?;
        self.elements = self.elements.saturating_add(n as usize);
        if self.elements > MAX_ELEMENTS {
            return Err(GuardError::TooManyElements);
        }
        Ok(n)
    }

    fn tagged(&mut self) -> Result<(), GuardError> {
        if !self.flexible {
            return Ok(());
        }
        let n = self.uvarint()?;
        self.need(u64::from(n), "tagged fields")?;
        for _ in 0..n {
            self.uvarint()?;
            let size = self.uvarint()?;
            self.skip(u64::from(size), "tagged field")?;
        }
        Ok(())
    }

    fn fields(&mut self, fields: &[F], version: i16) -> Result<(), GuardError> {
        for F(min, max, t) in fields {
            if version < *min || version > *max {
                continue;
            }
            match t {
                T::I8 => self.skip(1, "int8")?,
                T::I16 => self.skip(2, "int16")?,
                T::I32 => self.skip(4, "int32")?,
                T::I64 => self.skip(8, "int64")?,
                T::Str => {
                    if let Some(n) = self.len(false)? {
                        self.skip(n, "string")?;
                    }
                }
                T::Bytes => {
                    if let Some(n) = self.len(true)? {
                        self.skip(n, "bytes")?;
                    }
                }
                T::ArrI32 => {
                    let n = self.count()?;
                    self.skip(n * 4, "int32 array")?;
                }
                T::ArrStr => {
                    for _ in 0..self.count()? {
                        if let Some(n) = self.len(false)? {
                            self.skip(n, "string")?;
                        }
                    }
                }
                T::Arr(inner) => {
                    for _ in 0..self.count()? {
                        self.fields(inner, version)?;
                        self.tagged()?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Walks `body` as `layout` at `version` (`flexible`: compact lengths and
/// tagged fields). Trailing bytes are left alone.
pub fn check(body: &[u8], layout: &[F], version: i16, flexible: bool) -> Result<(), GuardError> {
    unwalked(body, layout, version, flexible).map(drop)
}

/// [`check`], returning how many bytes of `body` the layout left over.
pub fn unwalked(
    body: &[u8],
    layout: &[F],
    version: i16,
    flexible: bool,
) -> Result<usize, GuardError> {
    let mut w = Walk {
        buf: body,
        flexible,
        elements: 0,
    };
    w.fields(layout, version)?;
    w.tagged()?;
    Ok(w.buf.len())
}

/// Skips the flexible request header's tagged fields, returning the bytes
/// consumed.
pub fn header_tags(buf: &[u8]) -> Result<usize, GuardError> {
    let mut w = Walk {
        buf,
        flexible: true,
        elements: 0,
    };
    w.tagged()?;
    Ok(buf.len() - w.buf.len())
}

use T::*;

pub const API_VERSIONS: &[F] = &[F(3, ALL, Str), F(3, ALL, Str)];

pub const METADATA: &[F] = &[
    F(0, ALL, Arr(&[F(0, ALL, Str)])),
    F(4, ALL, I8),
    F(8, 10, I8),
    F(8, ALL, I8),
];

pub const CREATE_TOPICS: &[F] = &[
    F(
        0,
        ALL,
        Arr(&[
            F(0, ALL, Str),
            F(0, ALL, I32),
            F(0, ALL, I16),
            F(0, ALL, Arr(&[F(0, ALL, I32), F(0, ALL, ArrI32)])),
            F(0, ALL, Arr(&[F(0, ALL, Str), F(0, ALL, Str)])),
        ]),
    ),
    F(0, ALL, I32),
    F(1, ALL, I8),
];

pub const DELETE_TOPICS: &[F] = &[F(0, 5, ArrStr), F(0, ALL, I32)];

pub const INIT_PRODUCER_ID: &[F] = &[
    F(0, ALL, Str),
    F(0, ALL, I32),
    F(3, ALL, I64),
    F(3, ALL, I16),
];

pub const PRODUCE: &[F] = &[
    F(3, ALL, Str),
    F(0, ALL, I16),
    F(0, ALL, I32),
    F(
        0,
        ALL,
        Arr(&[
            F(0, 12, Str),
            F(0, ALL, Arr(&[F(0, ALL, I32), F(0, ALL, Bytes)])),
        ]),
    ),
];

pub const FETCH: &[F] = &[
    F(0, 14, I32),
    F(0, ALL, I32),
    F(0, ALL, I32),
    F(3, ALL, I32),
    F(4, ALL, I8),
    F(7, ALL, I32),
    F(7, ALL, I32),
    F(
        0,
        ALL,
        Arr(&[
            F(0, 12, Str),
            F(
                0,
                ALL,
                Arr(&[
                    F(0, ALL, I32),
                    F(9, ALL, I32),
                    F(0, ALL, I64),
                    F(12, ALL, I32),
                    F(5, ALL, I64),
                    F(0, ALL, I32),
                ]),
            ),
        ]),
    ),
    F(7, ALL, Arr(&[F(7, 12, Str), F(7, ALL, ArrI32)])),
    F(11, ALL, Str),
];

pub const LIST_OFFSETS: &[F] = &[
    F(0, ALL, I32),
    F(2, ALL, I8),
    F(
        0,
        ALL,
        Arr(&[
            F(0, ALL, Str),
            F(
                0,
                ALL,
                Arr(&[F(0, ALL, I32), F(4, ALL, I32), F(0, ALL, I64)]),
            ),
        ]),
    ),
];

pub const FIND_COORDINATOR: &[F] = &[F(0, ALL, Str), F(1, ALL, I8)];

pub const JOIN_GROUP: &[F] = &[
    F(0, ALL, Str),
    F(0, ALL, I32),
    F(1, ALL, I32),
    F(0, ALL, Str),
    F(5, ALL, Str),
    F(0, ALL, Str),
    F(0, ALL, Arr(&[F(0, ALL, Str), F(0, ALL, Bytes)])),
];

pub const SYNC_GROUP: &[F] = &[
    F(0, ALL, Str),
    F(0, ALL, I32),
    F(0, ALL, Str),
    F(3, ALL, Str),
    F(0, ALL, Arr(&[F(0, ALL, Str), F(0, ALL, Bytes)])),
];

pub const HEARTBEAT: &[F] = &[
    F(0, ALL, Str),
    F(0, ALL, I32),
    F(0, ALL, Str),
    F(3, ALL, Str),
];

pub const LEAVE_GROUP: &[F] = &[F(0, ALL, Str), F(0, 2, Str)];

pub const OFFSET_COMMIT: &[F] = &[
    F(0, ALL, Str),
    F(1, ALL, I32),
    F(1, ALL, Str),
    F(7, ALL, Str),
    F(2, 4, I64),
    F(
        0,
        ALL,
        Arr(&[
            F(0, ALL, Str),
            F(
                0,
                ALL,
                Arr(&[
                    F(0, ALL, I32),
                    F(0, ALL, I64),
                    F(6, ALL, I32),
                    F(0, ALL, Str),
                ]),
            ),
        ]),
    ),
];

pub const OFFSET_FETCH: &[F] = &[
    F(0, ALL, Str),
    F(0, ALL, Arr(&[F(0, ALL, Str), F(0, ALL, ArrI32)])),
    F(7, ALL, I8),
];

pub const LIST_GROUPS: &[F] = &[];

pub const DESCRIBE_GROUPS: &[F] = &[F(0, ALL, ArrStr), F(3, ALL, I8)];

pub const SASL_HANDSHAKE: &[F] = &[F(0, ALL, Str)];

/// One ACL filter (DescribeAcls' body; each of DeleteAcls' filters).
const ACL_FILTER: &[F] = &[
    F(0, ALL, I8),
    F(0, ALL, Str),
    F(1, ALL, I8),
    F(0, ALL, Str),
    F(0, ALL, Str),
    F(0, ALL, I8),
    F(0, ALL, I8),
];

pub const CREATE_ACLS: &[F] = &[F(
    0,
    ALL,
    Arr(&[
        F(0, ALL, I8),
        F(0, ALL, Str),
        F(1, ALL, I8),
        F(0, ALL, Str),
        F(0, ALL, Str),
        F(0, ALL, I8),
        F(0, ALL, I8),
    ]),
)];

pub const DESCRIBE_ACLS: &[F] = ACL_FILTER;

pub const DELETE_ACLS: &[F] = &[F(0, ALL, Arr(ACL_FILTER))];

pub const SASL_AUTHENTICATE: &[F] = &[F(0, ALL, Bytes)];

/// The users asked for (a nullable array of names); flexible from v0.
pub const DESCRIBE_USER_SCRAM: &[F] = &[F(0, ALL, Arr(&[F(0, ALL, Str)]))];

/// Deletions (name, mechanism), then upsertions (name, mechanism,
/// iterations, salt, salted password); flexible from v0.
pub const ALTER_USER_SCRAM: &[F] = &[
    F(0, ALL, Arr(&[F(0, ALL, Str), F(0, ALL, I8)])),
    F(
        0,
        ALL,
        Arr(&[
            F(0, ALL, Str),
            F(0, ALL, I8),
            F(0, ALL, I32),
            F(0, ALL, Bytes),
            F(0, ALL, Bytes),
        ]),
    ),
];

/// The layout of a served API key's request body, and whether `version`
/// uses the flexible (compact, tagged) encoding.
pub fn layout_of(
    key: kafka_protocol::messages::ApiKey,
    version: i16,
) -> Option<(&'static [F], bool)> {
    use kafka_protocol::messages::ApiKey as K;
    let layout: &'static [F] = match key {
        K::ApiVersions => return Some((API_VERSIONS, version >= 3)),
        K::Metadata => METADATA,
        K::CreateTopics => CREATE_TOPICS,
        K::DeleteTopics => DELETE_TOPICS,
        K::InitProducerId => INIT_PRODUCER_ID,
        K::Produce => PRODUCE,
        K::Fetch => FETCH,
        K::ListOffsets => LIST_OFFSETS,
        K::FindCoordinator => FIND_COORDINATOR,
        K::JoinGroup => JOIN_GROUP,
        K::SyncGroup => SYNC_GROUP,
        K::Heartbeat => HEARTBEAT,
        K::LeaveGroup => LEAVE_GROUP,
        K::OffsetCommit => OFFSET_COMMIT,
        K::OffsetFetch => OFFSET_FETCH,
        K::ListGroups => LIST_GROUPS,
        K::DescribeGroups => DESCRIBE_GROUPS,
        K::SaslHandshake => SASL_HANDSHAKE,
        K::SaslAuthenticate => SASL_AUTHENTICATE,
        K::CreateAcls => CREATE_ACLS,
        K::DescribeAcls => DESCRIBE_ACLS,
        K::DeleteAcls => DELETE_ACLS,
        K::DescribeUserScramCredentials => return Some((DESCRIBE_USER_SCRAM, true)),
        K::AlterUserScramCredentials => return Some((ALTER_USER_SCRAM, true)),
        _ => return None,
    };
    Some((layout, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_array_count_past_the_body_is_refused() {
        // Metadata v1: topics array claiming 2^31-1 entries, 2 bytes follow.
        let body = [0x7f, 0xff, 0xff, 0xff, 0, 1];
        assert!(matches!(
            check(&body, METADATA, 1, false),
            Err(GuardError::Short { .. })
        ));
    }

    #[test]
    fn a_well_formed_metadata_request_passes() {
        let mut body = vec![0, 0, 0, 1, 0, 3];
        body.extend_from_slice(b"abc");
        body.push(1);
        check(&body, METADATA, 4, false).unwrap();
        assert!(check(&body[..7], METADATA, 4, false).is_err());
    }

    #[test]
    fn too_many_elements_are_refused() {
        // DeleteTopics v1: 200,000 empty strings (2 bytes each), timeout.
        let mut body = 200_000i32.to_be_bytes().to_vec();
        body.extend(std::iter::repeat_n(0u8, 400_000));
        body.extend_from_slice(&[0, 0, 0, 0]);
        assert!(matches!(
            check(&body, DELETE_TOPICS, 1, false),
            Err(GuardError::TooManyElements)
        ));
    }
}
