//! The audit trail (docs/security.md, "Audit"): every create, delete and
//! alter a principal made, and every refusal, from every front end
//! (native, Kafka, HTTP). Each record goes to the server's log (target
//! `strom::audit`) and, with `auth` on, to the `strom.audit` topic.
//!
//! Recording never blocks a request: records wait in a bounded queue that
//! [`writer`] drains into this member's own partition of `strom.audit`;
//! a full queue drops the topic copy (the log line is always written) and
//! counts it (`strom_audit_dropped_total`). Only members write the topic
//! ([`crate::service::Access`] refuses anyone else); without an ACL only
//! super users read it.

pub(crate) mod writer;

pub use crate::service::access::changes;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;
use serde::Serialize;
use strom_auth::{Operation, Principal, Resource};
use tokio::sync::mpsc;

/// The topic audit records are appended to.
pub const AUDIT_TOPIC: &str = "strom.audit";

/// Records waiting for the writer, at most; more are dropped (and counted).
const QUEUE: usize = 4096;

/// Which front end a request came through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FrontEnd {
    Native,
    Kafka,
    Http,
}

/// Whether the request was refused or done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Refused,
    Done,
}

/// One audit record: the metadata (JSON) of one event of `strom.audit`.
#[derive(Clone, Debug, Serialize)]
pub struct Record {
    /// Milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// The member that decided.
    pub member: u32,
    pub front_end: FrontEnd,
    /// The client's address, if the front end knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    pub principal: String,
    pub outcome: Outcome,
    pub operation: String,
    pub resource: String,
    /// The refusal's message, or what was changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Who did what, where from: what every record names.
pub struct Actor<'a> {
    pub front_end: FrontEnd,
    pub peer: Option<&'a dyn fmt::Display>,
    pub principal: &'a Principal,
}

/// The audit trail of one server.
pub struct AuditLog {
    /// Whether records also go to `strom.audit` (`auth` on).
    to_topic: bool,
    tx: mpsc::Sender<Record>,
    rx: Mutex<Option<mpsc::Receiver<Record>>>,
    recorded: AtomicU64,
    written: AtomicU64,
    dropped: AtomicU64,
}

impl AuditLog {
    pub fn new(to_topic: bool) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        AuditLog {
            to_topic,
            tx,
            rx: Mutex::new(Some(rx)),
            recorded: AtomicU64::new(0),
            written: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// A refusal of `op` on `res`, with the refusal's message.
    pub fn refused(
        &self,
        member: u32,
        who: &Actor,
        op: &dyn fmt::Display,
        res: &dyn fmt::Display,
        why: &str,
    ) {
        tracing::warn!(target: "strom::audit", front_end = ?who.front_end, peer = %Peer(who.peer), principal = %who.principal, operation = %op, resource = %res, error = %why, "refused");
        self.push(
            member,
            who,
            Outcome::Refused,
            op,
            res,
            Some(why.to_string()),
        );
    }

    /// Changes a request made (creates, deletes, alters).
    pub fn done(
        &self,
        member: u32,
        who: &Actor,
        changes: &[(Operation, Resource)],
        detail: Option<&str>,
    ) {
        for (op, res) in changes {
            tracing::info!(target: "strom::audit", front_end = ?who.front_end, peer = %Peer(who.peer), principal = %who.principal, operation = %op, resource = %res, detail, "done");
            self.push(
                member,
                who,
                Outcome::Done,
                op,
                res,
                detail.map(str::to_string),
            );
        }
    }

    fn push(
        &self,
        member: u32,
        who: &Actor,
        outcome: Outcome,
        op: &dyn fmt::Display,
        res: &dyn fmt::Display,
        detail: Option<String>,
    ) {
        self.recorded.fetch_add(1, Relaxed);
        if !self.to_topic {
            return;
        }
        let r = Record {
            time_ms: now_ms(),
            member,
            front_end: who.front_end,
            peer: who.peer.map(|p| p.to_string()),
            principal: who.principal.to_string(),
            outcome,
            operation: op.to_string(),
            resource: res.to_string(),
            detail,
        };
        if self.tx.try_send(r).is_err() {
            self.dropped.fetch_add(1, Relaxed);
        }
    }

    /// Whether records go to `strom.audit`.
    pub fn to_topic(&self) -> bool {
        self.to_topic
    }

    /// Records made (logged), written to the topic, and dropped from it.
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.recorded.load(Relaxed),
            self.written.load(Relaxed),
            self.dropped.load(Relaxed),
        )
    }

    /// The counts, for the metrics tap.
    pub fn snapshot(&self) -> crate::health::AuditSnapshot {
        let (recorded, written, dropped) = self.counts();
        crate::health::AuditSnapshot {
            to_topic: self.to_topic,
            recorded,
            written,
            dropped,
        }
    }

    /// The queue's receiving end, for the one writer.
    fn take_queue(&self) -> Option<mpsc::Receiver<Record>> {
        self.rx.lock().take()
    }
}

/// An optional peer address for the log line (`-` without one).
struct Peer<'a>(Option<&'a dyn fmt::Display>);

impl fmt::Display for Peer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(p) => p.fmt(f),
            None => f.write_str("-"),
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(p: &Principal) -> Actor<'_> {
        Actor {
            front_end: FrontEnd::Native,
            peer: None,
            principal: p,
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_blocking() {
        let log = AuditLog::new(true);
        let p = Principal::anonymous();
        for _ in 0..QUEUE + 10 {
            log.refused(1, &actor(&p), &Operation::Read, &Resource::topic("t"), "no");
        }
        assert_eq!(log.counts(), ((QUEUE + 10) as u64, 0, 10));
    }

    #[test]
    fn without_the_topic_records_are_only_counted() {
        let log = AuditLog::new(false);
        let p = Principal::anonymous();
        log.done(
            1,
            &actor(&p),
            &[(Operation::Create, Resource::topic("t"))],
            None,
        );
        assert_eq!(log.counts(), (1, 0, 0));
        assert!(log.take_queue().unwrap().try_recv().is_err());
    }

    #[test]
    fn a_record_is_json_naming_who_what_and_how_it_ended() {
        let log = AuditLog::new(true);
        let p = Principal::anonymous();
        let peer = "10.0.0.9:4000";
        let who = Actor {
            front_end: FrontEnd::Kafka,
            peer: Some(&peer),
            principal: &p,
        };
        log.done(
            3,
            &who,
            &[(Operation::Delete, Resource::topic("sim.a"))],
            Some("DeleteTopics"),
        );
        let r = log.take_queue().unwrap().try_recv().unwrap();
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["member"], 3);
        assert_eq!(v["front_end"], "kafka");
        assert_eq!(v["peer"], "10.0.0.9:4000");
        assert_eq!(v["principal"], p.to_string());
        assert_eq!(v["outcome"], "done");
        assert_eq!(v["operation"], Operation::Delete.to_string());
        assert_eq!(v["resource"], Resource::topic("sim.a").to_string());
        assert_eq!(v["detail"], "DeleteTopics");
    }
}
