//! Consumer-group streams of the native protocol. Shared groups:
//! `GroupSubscribe` joins a member stream to a partition's shared cursor
//! (its pushes are `Deliver` frames), and `GroupAck` resolves or gives back
//! events. The stream's entry in the session holds the member's place:
//! unsubscribing, or the connection closing, hands every event it held to
//! the other members. Partitioned groups: `GroupSubscribe` is checked
//! against the partition's fence and streams from the group's committed
//! offset until a newer fence ends it (`FENCED`); `GroupCommit` commits
//! for the fenced holder only. Each is a service operation
//! (`service/groups.rs`); this file only streams.

use std::sync::Arc;

use strom_net::{OutFrame, WriterHandle};
use strom_proto::{ConsumerGroupMode, ConsumerGroupSpec, ErrorCode, Push, Response};
use tokio::sync::watch;

use super::{stream, Session};
use crate::error::ServerError;
use crate::partition::PartitionManager;
use crate::service::groups::{Holder, MemberGuard, MemberOut};
use crate::sink::Credit;

/// A partitioned group's stream: the ordinary stream, until the fence
/// moves past `epoch`; then `StreamError { FENCED }` ends it.
#[allow(clippy::too_many_arguments)]
async fn fenced_stream(
    pm: Arc<PartitionManager>,
    version: u8,
    stream: u64,
    pos: u64,
    credit: Arc<Credit>,
    writer: WriterHandle,
    mut fence: watch::Receiver<Holder>,
    epoch: u64,
    reader: Arc<stream::Reader>,
) {
    let moved = async {
        loop {
            if fence.borrow_and_update().epoch != epoch {
                return;
            }
            if fence.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    };
    let w = writer.clone();
    tokio::select! {
        _ = stream::run(pm, version, stream, pos, credit, w, reader) => {}
        _ = moved => {
            let push = Push::StreamError {
                code: ErrorCode::FENCED,
                message: format!("the partition was reassigned (epoch {epoch} is fenced)"),
            };
            let _ = writer.send(OutFrame::push(version, stream, &push)).await;
        }
    }
}

/// Turns the credit a member grants into credit at the cursor, for as
/// long as the stream lives; dropping it (abort) leaves the cursor.
async fn member_stream(guard: MemberGuard, credit: Arc<Credit>) {
    loop {
        credit.wait().await;
        guard.grant(credit.take_all());
    }
}

impl Session {
    pub(super) async fn group_subscribe(
        &mut self,
        stream: u64,
        spec: &ConsumerGroupSpec,
        partition: u32,
        consumer: u64,
        epoch: u64,
        prefetch: u32,
    ) -> Result<Response, ServerError> {
        if spec.mode == ConsumerGroupMode::Partitioned {
            return self.partitioned_subscribe(stream, spec, partition, consumer, epoch, prefetch);
        }
        let cursor = self.svc.shared_group(spec, partition).await?;
        self.unsubscribe(stream);
        let out = Arc::new(MemberPushes {
            writer: self.writer.clone(),
            version: self.version,
            stream,
        });
        let guard = cursor.join(consumer, self.svc.data.prefetch(prefetch), out);
        let credit = Credit::new(0);
        let task = tokio::spawn(member_stream(guard, credit.clone()));
        self.streams.insert(stream, (task, credit));
        Ok(Response::Subscribed {
            start_offset: cursor.floor(),
        })
    }

    fn partitioned_subscribe(
        &mut self,
        stream: u64,
        spec: &ConsumerGroupSpec,
        partition: u32,
        consumer: u64,
        epoch: u64,
        prefetch: u32,
    ) -> Result<Response, ServerError> {
        let start = self
            .svc
            .partitioned_group(spec, partition, consumer, epoch)?;
        let pos = start.pos;
        let credit = Credit::new(self.svc.data.prefetch(prefetch));
        self.unsubscribe(stream);
        let task = tokio::spawn(fenced_stream(
            start.partition,
            self.version,
            stream,
            pos,
            credit.clone(),
            self.writer.clone(),
            start.fence,
            epoch,
            self.stream_reader(),
        ));
        self.streams.insert(stream, (task, credit));
        Ok(Response::Subscribed { start_offset: pos })
    }

    /// Commits a partitioned group's offset for its fenced holder.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn group_commit(
        &mut self,
        id: u64,
        topic: &str,
        partition: u32,
        group: String,
        consumer: u64,
        epoch: u64,
        offset: u64,
    ) {
        let svc = self.svc.clone();
        let topic = topic.to_string();
        self.respond_later(id, async move {
            svc.group_commit(topic, partition, group, consumer, epoch, offset)
                .await?;
            Ok(Response::Done)
        });
    }

    pub(super) fn group_ack(
        &mut self,
        id: u64,
        topic: &str,
        partition: u32,
        group: &str,
        acks: Vec<(u64, u32)>,
        nacks: Vec<(u64, u32)>,
    ) {
        let svc = self.svc.clone();
        let (topic, group) = (topic.to_string(), group.to_string());
        self.respond_later(id, async move {
            let floor = svc
                .group_ack(&topic, partition, &group, acks, nacks)
                .await?;
            Ok(Response::Acked { floor })
        });
    }
}

/// A shared group member's stream on this connection: the cursor's pushes
/// as native `Push` frames.
struct MemberPushes {
    writer: WriterHandle,
    version: u8,
    stream: u64,
}

impl MemberOut for MemberPushes {
    /// Queues the frame without waiting; a full queue hands it to a task
    /// (credit bounds what a member can have queued).
    fn push(&self, p: &Push) {
        let frame = OutFrame::push(self.version, self.stream, p);
        if let Err(frame) = self.writer.try_send_frame(frame) {
            let w = self.writer.clone();
            tokio::spawn(async move {
                let _ = w.send(frame).await;
            });
        }
    }
}
