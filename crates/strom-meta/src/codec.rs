//! The one place where the metadata quorum's bytes are encoded: the Raft
//! RPCs exchanged between members (a request envelope [`Rpc`] and its
//! answer [`RpcReply`]) and the records of the durable log. Everything is
//! serde + JSON behind a one-byte format version, so another encoding can
//! replace it here alone. Decoding never panics: input over
//! [`MAX_RPC`] is refused before it is parsed, JSON carries no counts that
//! could size an allocation, and serde_json bounds nesting depth.

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::types::{Blob, NodeId, SnapshotMeta, TypeConfig, Vote};

/// The version byte in front of every RPC.
pub const RPC_VERSION: u8 = 1;
/// The largest RPC (request or answer) accepted, in bytes.
pub const MAX_RPC: usize = 64 << 20;
/// An append-entries RPC larger than this is split (down to one entry):
/// openraft gives each one only the heartbeat interval to be sent,
/// written and fsynced by the follower, and answered.
pub const MAX_APPEND: usize = 1 << 20;

/// A Raft RPC from one member to another.
#[derive(Debug, Serialize, Deserialize)]
pub enum Rpc {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(SnapshotChunk),
}

/// An install-snapshot request, with its data as a [`Blob`] (openraft's
/// own request serializes bytes as a list of numbers).
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotChunk {
    pub vote: Vote,
    pub meta: SnapshotMeta,
    pub offset: u64,
    pub data: Blob,
    pub done: bool,
}

impl From<InstallSnapshotRequest<TypeConfig>> for SnapshotChunk {
    fn from(r: InstallSnapshotRequest<TypeConfig>) -> Self {
        SnapshotChunk {
            vote: r.vote,
            meta: r.meta,
            offset: r.offset,
            data: Blob(r.data),
            done: r.done,
        }
    }
}

impl From<SnapshotChunk> for InstallSnapshotRequest<TypeConfig> {
    fn from(c: SnapshotChunk) -> Self {
        InstallSnapshotRequest {
            vote: c.vote,
            meta: c.meta,
            offset: c.offset,
            data: c.data.0,
            done: c.done,
        }
    }
}

pub type SnapshotResult =
    Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

/// The answer to an [`Rpc`]: Raft's own result, or the receiver's refusal
/// to handle the request at all (it did not decode, or the node stopped).
#[derive(Debug, Serialize, Deserialize)]
pub enum RpcReply {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(SnapshotResult),
    Refused(String),
}

/// Bytes that could not be decoded: what was expected and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot decode {what}: {reason}")]
pub struct DecodeError {
    pub what: &'static str,
    pub reason: String,
}

/// Encodes a value as JSON. Encoding the crate's own types cannot fail
/// (no maps with non-string keys, no failing `Serialize`); should it, the
/// error says so rather than panicking.
pub fn to_json<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    serde_json::to_vec(value).map_err(|e| e.to_string())
}

/// Decodes JSON bytes as a `T`; `what` names the value in the error.
pub fn from_json<T: DeserializeOwned>(bytes: &[u8], what: &'static str) -> Result<T, DecodeError> {
    serde_json::from_slice(bytes).map_err(|e| DecodeError {
        what,
        reason: e.to_string(),
    })
}

/// Encodes an RPC or an answer: the version byte, then JSON.
pub fn encode_rpc<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    let mut out = vec![RPC_VERSION];
    serde_json::to_writer(&mut out, value).map_err(|e| e.to_string())?;
    Ok(out)
}

/// Decodes what [`encode_rpc`] wrote, refusing other versions and input
/// over [`MAX_RPC`].
pub fn decode_rpc<T: DeserializeOwned>(bytes: &[u8], what: &'static str) -> Result<T, DecodeError> {
    let err = |reason: String| DecodeError { what, reason };
    if bytes.len() > MAX_RPC {
        return Err(err(format!(
            "{} bytes, over the limit of {MAX_RPC}",
            bytes.len()
        )));
    }
    match bytes.split_first() {
        None => Err(err("empty input".into())),
        Some((&RPC_VERSION, body)) => from_json(body, what),
        Some((v, _)) => Err(err(format!(
            "format version {v}; this build reads version {RPC_VERSION}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_rpc_bytes_are_errors() {
        let mut inputs: Vec<Vec<u8>> = vec![
            vec![],
            vec![RPC_VERSION],
            vec![2, b'{', b'}'],
            b"\x01{\"Vote\":{}}".to_vec(),
            b"\x01{\"AppendEntries\":{\"entries\":[{\"payload\":{\"Normal\":\"0\"}}]}}".to_vec(),
            b"\x01{\"InstallSnapshot\":{\"data\":\"zz\"}}".to_vec(),
        ];
        let mut deep = vec![RPC_VERSION];
        deep.extend(std::iter::repeat_n(b'[', 100_000));
        inputs.push(deep);
        inputs.push(vec![RPC_VERSION; MAX_RPC + 1]);
        for bytes in &inputs {
            assert!(decode_rpc::<Rpc>(bytes, "a Raft RPC").is_err());
        }
    }

    fn append_entries() -> Vec<u8> {
        use crate::types::{Blob, Entry, LogId};
        use openraft::{CommittedLeaderId, EntryPayload};
        let entry = |i: u64| Entry {
            log_id: LogId::new(CommittedLeaderId::new(2, 1), i),
            payload: EntryPayload::Normal(Blob(vec![i as u8; 5])),
        };
        let rpc = Rpc::AppendEntries(AppendEntriesRequest {
            vote: Vote::new_committed(2, 1),
            prev_log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), 4)),
            entries: (5..9).map(entry).collect(),
            leader_commit: Some(LogId::new(CommittedLeaderId::new(1, 1), 4)),
        });
        encode_rpc(&rpc).unwrap()
    }

    #[test]
    fn randomly_mutated_rpcs_decode_or_fail_without_panicking() {
        let good = append_entries();
        assert!(decode_rpc::<Rpc>(&good, "rpc").is_ok());
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..5_000 {
            let mut bytes = good.clone();
            for _ in 0..1 + next() % 4 {
                let at = (next() % bytes.len() as u64) as usize;
                bytes[at] = next() as u8;
            }
            let _ = decode_rpc::<Rpc>(&bytes, "rpc");
            let _ = decode_rpc::<RpcReply>(&bytes, "answer");
        }
    }

    #[test]
    fn every_prefix_of_a_valid_rpc_is_refused() {
        let rpc = Rpc::Vote(VoteRequest::new(Vote::new(3, 1), None));
        let bytes = encode_rpc(&rpc).unwrap();
        assert!(decode_rpc::<Rpc>(&bytes, "rpc").is_ok());
        for n in 0..bytes.len() {
            assert!(decode_rpc::<Rpc>(&bytes[..n], "rpc").is_err(), "prefix {n}");
        }
    }
}
