//! What every API handler works with: the front end's context ([`Ctx`]),
//! the API keys and versions served, the request header, decoding a body
//! (checked by [`crate::guard`] first), and encoding the answer as a
//! [`Reply`]. Dispatch (`api.rs`) and the connection (`conn.rs`) sit
//! above it with the handlers.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use kafka_protocol::protocol::{Decodable, Encodable};
use strom_auth::{Operation, Principal, Resource};
use strom_proto::{Request, Response};
use strom_server::audit::{Actor, FrontEnd};
use strom_server::{ServerError, Services};

use crate::error::FrameError;
use crate::error_counts::ErrorCounts;
use crate::guard::{self, F};

/// What every handler needs: the services, who this broker is, and who
/// the connection is. Each connection has its own (`for_principal`),
/// sharing everything but the principal.
pub struct Ctx {
    pub services: Arc<Services>,
    /// The connection's principal (anonymous until SASL, `sasl.rs`).
    pub who: Arc<Principal>,
    /// The connection's client address (`None` in the listener's own
    /// context), for the audit trail.
    pub peer: Option<std::net::SocketAddr>,
    /// The Kafka listener's address, advertised in `Metadata`.
    pub host: String,
    pub port: i32,
    /// The producer ids `InitProducerId` hands out.
    pub producer_ids: Arc<crate::producer_ids::ProducerIds>,
    /// The Kafka groups this server coordinates.
    pub groups: Arc<crate::groups::Coordinator>,
    /// Request bytes read but not yet answered, over all connections
    /// (`kafka_queued_max_request_bytes`).
    pub inflight: Arc<tokio::sync::Semaphore>,
    /// Until when this connection's next request waits (quotas,
    /// `throttle.rs`).
    pub mute: Arc<crate::throttle::Mute>,
}

impl Ctx {
    /// The same context for a connection that is `who`.
    pub fn for_principal(&self, who: Principal) -> Arc<Ctx> {
        self.with(Arc::new(who), self.peer, self.mute.clone())
    }

    /// The same context for a new connection from `peer`.
    pub fn for_connection(&self, peer: std::net::SocketAddr) -> Arc<Ctx> {
        self.with(self.who.clone(), Some(peer), Default::default())
    }

    fn with(
        &self,
        who: Arc<Principal>,
        peer: Option<std::net::SocketAddr>,
        mute: Arc<crate::throttle::Mute>,
    ) -> Arc<Ctx> {
        Arc::new(Ctx {
            services: self.services.clone(),
            who,
            peer,
            host: self.host.clone(),
            port: self.port,
            producer_ids: self.producer_ids.clone(),
            groups: self.groups.clone(),
            inflight: self.inflight.clone(),
            mute,
        })
    }

    /// Whether the connection may do `op` to `res`; refusals go to the
    /// audit trail.
    pub fn may(&self, op: Operation, res: &Resource) -> bool {
        match self.services.access.check(&self.who, op, res) {
            Ok(()) => true,
            Err(e) => {
                let member = self.services.control.member();
                let why = e.to_string();
                self.services
                    .audit
                    .refused(member, &self.actor(), &op, res, &why);
                false
            }
        }
    }

    /// Whether the connection may see `res` in a listing: a check that
    /// hides what it may not describe, not a refusal to audit.
    pub fn sees(&self, res: &Resource) -> bool {
        self.services
            .access
            .check(&self.who, Operation::Describe, res)
            .is_ok()
    }

    /// Runs a registry request that changes something (creates, deletes,
    /// alters: [`strom_server::audit::changes`]) and records
    /// what it changed in the audit trail.
    pub async fn change(&self, req: Request, detail: &str) -> Result<Response, ServerError> {
        let changes = strom_server::audit::changes(&req);
        let r = self.services.control.ask_registry(req).await?;
        self.audited(&changes, detail);
        Ok(r)
    }

    /// Records changes made for this connection.
    pub fn audited(&self, changes: &[(Operation, Resource)], detail: &str) {
        let member = self.services.control.member();
        self.services
            .audit
            .done(member, &self.actor(), changes, Some(detail));
    }

    fn actor(&self) -> Actor<'_> {
        Actor {
            front_end: FrontEnd::Kafka,
            peer: self.peer.as_ref().map(|p| p as &dyn std::fmt::Display),
            principal: &self.who,
        }
    }

    /// [`may`](Self::may) on topic `name`: `NONE` or `TOPIC_AUTHORIZATION_FAILED`.
    pub fn topic_code(&self, op: Operation, name: &str) -> i16 {
        match self.may(op, &Resource::topic(name)) {
            true => crate::error::kcode::NONE,
            false => crate::error::kcode::TOPIC_AUTHORIZATION_FAILED,
        }
    }

    /// [`may`](Self::may) on group `name`: `NONE` or `GROUP_AUTHORIZATION_FAILED`.
    pub fn group_code(&self, op: Operation, name: &str) -> i16 {
        match self.may(op, &Resource::group(name)) {
            true => crate::error::kcode::NONE,
            false => crate::error::kcode::GROUP_AUTHORIZATION_FAILED,
        }
    }
    /// [`respond`], counting the response's error codes by API
    /// (`strom_kafka_errors_total`).
    pub fn respond<R: Encodable + ErrorCounts>(
        &self,
        key: ApiKey,
        version: i16,
        correlation: i32,
        body: &R,
    ) -> Bytes {
        let kafka = &self.services.stats.kafka;
        body.error_codes(&mut |code| {
            if code != crate::error::kcode::NONE {
                kafka.error(api_name(key), crate::error_counts::error_name(code));
            }
        });
        respond(key, version, correlation, body)
    }

    /// This broker's node id: the Strom member id (0 until a joining
    /// member has its id).
    pub fn node_id(&self) -> i32 {
        let m = self.services.control.member();
        if m == u32::MAX {
            0
        } else {
            m as i32
        }
    }
}

/// The API keys and versions served; exactly what `ApiVersions` advertises.
/// Only non-flexible versions, except `ApiVersions` v3 itself.
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 8),
    (ApiKey::Fetch, 4, 11),
    (ApiKey::ListOffsets, 1, 5),
    (ApiKey::Metadata, 0, 8),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 4),
    (ApiKey::DeleteTopics, 1, 3),
    (ApiKey::InitProducerId, 0, 1),
    (ApiKey::FindCoordinator, 0, 2),
    (ApiKey::JoinGroup, 0, 5),
    (ApiKey::SyncGroup, 0, 3),
    (ApiKey::Heartbeat, 0, 3),
    (ApiKey::LeaveGroup, 0, 2),
    (ApiKey::OffsetCommit, 2, 7),
    (ApiKey::OffsetFetch, 1, 5),
    (ApiKey::ListGroups, 0, 2),
    (ApiKey::DescribeGroups, 0, 4),
    // v0 is advertised because librdkafka requires it to use SASL at all;
    // a v0 client then sends raw SASL tokens, which this listener does
    // not read (every client of this decade sends v1 and SaslAuthenticate).
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 1),
    (ApiKey::CreateAcls, 1, 1),
    (ApiKey::DescribeAcls, 1, 1),
    (ApiKey::DeleteAcls, 1, 1),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    (ApiKey::AlterUserScramCredentials, 0, 0),
];

/// The name of an API this front end serves, as Kafka's request metrics
/// label it (`Produce`, `Fetch`, ...); `Unsupported` for the rest.
pub(crate) fn api_name(key: ApiKey) -> &'static str {
    match key {
        ApiKey::Produce => "Produce",
        ApiKey::Fetch => "Fetch",
        ApiKey::ListOffsets => "ListOffsets",
        ApiKey::Metadata => "Metadata",
        ApiKey::ApiVersions => "ApiVersions",
        ApiKey::CreateTopics => "CreateTopics",
        ApiKey::DeleteTopics => "DeleteTopics",
        ApiKey::InitProducerId => "InitProducerId",
        ApiKey::FindCoordinator => "FindCoordinator",
        ApiKey::JoinGroup => "JoinGroup",
        ApiKey::SyncGroup => "SyncGroup",
        ApiKey::Heartbeat => "Heartbeat",
        ApiKey::LeaveGroup => "LeaveGroup",
        ApiKey::OffsetCommit => "OffsetCommit",
        ApiKey::OffsetFetch => "OffsetFetch",
        ApiKey::ListGroups => "ListGroups",
        ApiKey::DescribeGroups => "DescribeGroups",
        ApiKey::SaslHandshake => "SaslHandshake",
        ApiKey::SaslAuthenticate => "SaslAuthenticate",
        ApiKey::CreateAcls => "CreateAcls",
        ApiKey::DescribeAcls => "DescribeAcls",
        ApiKey::DeleteAcls => "DeleteAcls",
        ApiKey::DescribeUserScramCredentials => "DescribeUserScramCredentials",
        ApiKey::AlterUserScramCredentials => "AlterUserScramCredentials",
        _ => "Unsupported",
    }
}

pub(crate) fn supported(key: ApiKey, version: i16) -> bool {
    SUPPORTED
        .iter()
        .any(|(k, lo, hi)| *k == key && (*lo..=*hi).contains(&version))
}

/// Checks `body` against `layout`, then decodes it; a panic inside the
/// decoder (which the guard should make impossible) is caught and treated
/// as a malformed body.
pub fn decode<R: Decodable>(
    api: &'static str,
    layout: &[F],
    version: i16,
    flexible: bool,
    body: Bytes,
) -> Result<R, FrameError> {
    let err = |detail: String| FrameError::Body {
        api,
        version,
        detail,
    };
    guard::check(&body, layout, version, flexible).map_err(|e| err(e.to_string()))?;
    let mut b = body;
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        R::decode(&mut b, version)
    }))
    .map_err(|_| err("decoder panicked".into()))?
    .map_err(|e| err(e.to_string()))
}

/// A response that is ready now.
pub fn ready(b: Bytes) -> Reply {
    Box::pin(std::future::ready(Some(b)))
}

/// A response to come: its bytes (header and body), or `None` when the
/// request gets no answer (`acks = 0`).
pub type Reply = Pin<Box<dyn Future<Output = Option<Bytes>> + Send>>;

/// A decoded request header.
pub struct Header {
    pub key: i16,
    pub version: i16,
    pub correlation: i32,
    pub client_id: Option<String>,
}

/// A response's bytes: the header for `key` at `version`, then `body`.
pub fn respond<R: Encodable>(key: ApiKey, version: i16, correlation: i32, body: &R) -> Bytes {
    // Sized up front: a fetch response of many record batches would
    // otherwise grow (and be copied) a dozen times.
    let size = body.compute_size(version).unwrap_or(0);
    let mut out = BytesMut::with_capacity(8 + size);
    out.put_i32(correlation);
    if key.response_header_version(version) >= 1 {
        out.put_u8(0); // no tagged fields
    }
    if let Err(e) = body.encode(&mut out, version) {
        // Our own responses at versions we advertise: a bug if it happens.
        tracing::error!(api = ?key, version, error = %e, "encoding a Kafka response failed");
        out.truncate(4);
        out.put_i16(crate::error::kcode::UNKNOWN_SERVER_ERROR);
    }
    out.freeze()
}

/// Parses the request header; the rest of `frame` is the body.
pub(crate) fn header(frame: &mut Bytes) -> Result<Header, FrameError> {
    let bad = |m: &str| FrameError::Header(m.to_string());
    if frame.len() < 10 {
        return Err(bad(
            "shorter than api key, version, correlation id and client id",
        ));
    }
    let key = frame.get_i16();
    let version = frame.get_i16();
    let correlation = frame.get_i32();
    let client_id = match frame.get_i16() {
        -1 => None,
        n if n < 0 => return Err(bad("negative client id length")),
        n if n as usize > frame.len() => return Err(bad("client id longer than the frame")),
        n => Some(String::from_utf8_lossy(&frame.split_to(n as usize)).into_owned()),
    };
    // Tagged header fields matter only to a request that will be decoded;
    // anything else is answered from the fixed part of the header.
    let flexible = ApiKey::try_from(key)
        .map(|k| supported(k, version) && k.request_header_version(version) >= 2)
        .unwrap_or(false);
    if flexible {
        let n = guard::header_tags(frame).map_err(|e| FrameError::Header(e.to_string()))?;
        frame.advance(n);
    }
    Ok(Header {
        key,
        version,
        correlation,
        client_id,
    })
}
