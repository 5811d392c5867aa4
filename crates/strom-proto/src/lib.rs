//! Strom wire protocol: frames, messages, the batch layout and data selections.
//!
//! This crate is a pure codec. It owns the byte layout of everything that
//! crosses a connection and of the metadata section of a batch (which storage
//! keeps verbatim). It does no I/O, has no async, and must never depend on
//! another Strom crate. Every decoder checks each length and count against the
//! bytes that remain before using it, so hostile input yields a [`ProtoError`],
//! never a panic or an unbounded allocation.

pub mod batch;
pub mod codec;
pub mod error;
pub mod frame;
pub mod group;
pub mod message;
pub mod selection;
pub mod topic;

pub use batch::{stamp_of, BatchBuilder, BatchView, EventEntry, ProducerStamp, Section};
pub use error::{ErrorCode, ProtoError};
pub use frame::{FrameHeader, FrameKind, FRAME_HEADER_LEN};
pub use group::{
    ConsumerGroupInfo, ConsumerGroupMode, ConsumerGroupSpec, GroupConsumerInfo, GroupPartitionInfo,
    Run,
};
pub use message::{Push, Request, Response};
pub use selection::Selection;
pub use topic::{
    Compression, Durability, GroupFile, GroupMember, MemberInfo, Overflow, PartitionInfo,
    PartitionStatus, PartitionType, ReplicaBatchHead, ReplicaRole, StartPos, TopicInfo, TopicSpec,
    TopicState,
};

/// The newest version of the wire protocol this build speaks. Every frame
/// header carries the version its body is encoded in; a connection starts
/// at [`MIN_PROTOCOL_VERSION`] and `Hello` settles the newest version both
/// sides speak (docs/protocol.md, "Versions").
pub const PROTOCOL_VERSION: u8 = 9;
/// The oldest version this build still reads and writes.
pub const MIN_PROTOCOL_VERSION: u8 = 1;
/// Default cap on one frame (header excluded): 256 MiB.
pub const DEFAULT_MAX_FRAME: u32 = 256 << 20;
