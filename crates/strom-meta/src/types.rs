//! The Raft type configuration of the metadata quorum: node ids are `u64`,
//! a node carries its address string (`BasicNode`), a log entry's
//! application data is an opaque encoded command ([`Blob`]), and the
//! state machine's answer is opaque bytes or the machine's refusal
//! ([`Reply`]). Nothing here knows what a command means.

use std::fmt;
use std::io::Cursor;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A member's id in the quorum.
pub type NodeId = u64;
/// A member's address, as the network layer understands it.
pub type Node = openraft::BasicNode;

openraft::declare_raft_types!(
    /// The openraft type configuration of Strom's metadata log.
    pub TypeConfig:
        D = Blob,
        R = Reply,
        NodeId = NodeId,
        Node = Node,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Node>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Node>;
pub type StorageError = openraft::StorageError<NodeId>;

/// Opaque bytes (an encoded command, a snapshot chunk). Serialized as a
/// hex string, so that the JSON encoding of the log and of the RPCs costs
/// two characters per byte rather than a number and a comma.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Blob(pub Vec<u8>);

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blob({} bytes)", self.0.len())
    }
}

impl fmt::Display for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.0.len())
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut out = String::with_capacity(self.0.len() * 2);
        for b in &self.0 {
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 15)] as char);
        }
        s.serialize_str(&out)
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        unhex(text.as_bytes())
            .map(Blob)
            .map_err(serde::de::Error::custom)
    }
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

/// Decodes lowercase hex. The output is half the input's size, which the
/// input already occupies in memory.
fn unhex(text: &[u8]) -> Result<Vec<u8>, String> {
    let pairs = text.chunks_exact(2);
    if !pairs.remainder().is_empty() {
        return Err(format!("a hex blob of odd length {}", text.len()));
    }
    let mut out = Vec::with_capacity(text.len() / 2);
    for (i, pair) in pairs.enumerate() {
        match (nibble(pair[0]), nibble(pair[1])) {
            (Some(h), Some(l)) => out.push(h << 4 | l),
            _ => return Err(format!("a non-hex character in a blob at byte {}", i * 2)),
        }
    }
    Ok(out)
}

/// What applying one log entry answered: the machine's response bytes, or
/// its refusal (the same on every replica, since `apply` is deterministic).
/// Blank and membership entries answer empty bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reply(pub Result<Blob, String>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_round_trips_as_hex() {
        let b = Blob((0..=255u8).collect());
        let text = serde_json::to_string(&b).unwrap();
        assert_eq!(&text[..7], "\"000102");
        assert_eq!(serde_json::from_str::<Blob>(&text).unwrap(), b);
    }

    #[test]
    fn bad_hex_is_an_error_not_a_panic() {
        for bad in ["\"abc\"", "\"zz\"", "\"AB\"", "12", "\"\u{e9}\u{e9}\""] {
            assert!(serde_json::from_str::<Blob>(bad).is_err(), "{bad}");
        }
    }
}
