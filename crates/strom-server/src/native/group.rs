//! Consumer-group streams of the native protocol: `GroupSubscribe` joins a
//! member stream to a partition's shared cursor (its pushes are `Deliver`
//! frames), and `GroupAck` resolves or gives back events. The stream's
//! entry in the session holds the member's place: unsubscribing, or the
//! connection closing, hands every event it held to the other members.

use std::sync::Arc;

use strom_proto::{ConsumerGroupMode, ConsumerGroupSpec, ErrorCode, Response};

use super::Session;
use crate::error::ServerError;
use crate::share::{self, MemberGuard, MemberOut};
use crate::sink::Credit;

/// Turns the credit a member grants into credit at the cursor, for as
/// long as the stream lives; dropping it (abort) leaves the cursor.
async fn member_stream(guard: MemberGuard, credit: Arc<Credit>) {
    loop {
        credit.wait().await;
        guard.grant(credit.take_all());
    }
}

impl Session {
    pub(super) fn group_subscribe(
        &mut self,
        stream: u64,
        spec: &ConsumerGroupSpec,
        partition: u32,
        consumer: u64,
        prefetch: u32,
    ) -> Result<Response, ServerError> {
        if spec.mode != ConsumerGroupMode::Shared {
            return Err(ServerError::coded(
                ErrorCode::INVALID_ARGUMENT,
                "partitioned consumer groups are not served by this server yet",
            ));
        }
        let p = self.partition(&spec.topic, partition)?;
        let cursor = share::cursor(self.svc.data.host(), &p, spec)?;
        self.unsubscribe(stream);
        let out = MemberOut {
            writer: self.writer.clone(),
            version: self.version,
            stream,
        };
        let guard = cursor.join(consumer, self.svc.data.prefetch(prefetch), out);
        let credit = Credit::new(0);
        let task = tokio::spawn(member_stream(guard, credit.clone()));
        self.streams.insert(stream, (task, credit));
        Ok(Response::Subscribed {
            start_offset: cursor.floor(),
        })
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
        let p = match self.partition(topic, partition) {
            Ok(p) => p,
            Err(e) => return self.respond(id, Err(e)),
        };
        let Some(cursor) = p.shares.get(group) else {
            let e = ServerError::coded(
                ErrorCode::CONSUMER_GROUP_NOT_FOUND,
                format!("no member of consumer group '{group}' has subscribed to partition {partition} of topic '{topic}' on this server (since it started); subscribe, then ack"),
            );
            return self.respond(id, Err(e));
        };
        self.respond_later(id, async move {
            let floor = cursor.ack(acks, nacks).await?;
            Ok(Response::Acked { floor })
        });
    }
}
