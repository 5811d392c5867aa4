//! The error codes a response carries, as Kafka's brokers count them for
//! their `ErrorsPerSec` metric (`AbstractResponse.errorCounts()`): every
//! non-zero error code in it, the top-level one and each topic's,
//! partition's, group's or member's. [`crate::request::Ctx::respond`] counts
//! them by API into the server's metrics tap (`strom_kafka_errors_total`).

use kafka_protocol::messages as m;

/// What a response can report of its error codes.
pub trait ErrorCounts {
    /// Calls `f` with every error code in the response, zeros included
    /// (the caller skips them).
    fn error_codes(&self, f: &mut dyn FnMut(i16));
}

/// Responses with a single, top-level error code.
macro_rules! top_level {
    ($($t:ty),* $(,)?) => {$(
        impl ErrorCounts for $t {
            fn error_codes(&self, f: &mut dyn FnMut(i16)) {
                f(self.error_code);
            }
        }
    )*};
}

top_level!(
    m::InitProducerIdResponse,
    m::JoinGroupResponse,
    m::SyncGroupResponse,
    m::HeartbeatResponse,
    m::ListGroupsResponse,
    m::SaslHandshakeResponse,
    m::SaslAuthenticateResponse,
    m::DescribeAclsResponse,
    m::ApiVersionsResponse,
);

impl ErrorCounts for m::ProduceResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        for t in &self.responses {
            t.partition_responses.iter().for_each(|p| f(p.error_code));
        }
    }
}

impl ErrorCounts for m::FetchResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        f(self.error_code);
        for t in &self.responses {
            t.partitions.iter().for_each(|p| f(p.error_code));
        }
    }
}

impl ErrorCounts for m::ListOffsetsResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        for t in &self.topics {
            t.partitions.iter().for_each(|p| f(p.error_code));
        }
    }
}

impl ErrorCounts for m::MetadataResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        f(self.error_code);
        for t in &self.topics {
            f(t.error_code);
            t.partitions.iter().for_each(|p| f(p.error_code));
        }
    }
}

impl ErrorCounts for m::CreateTopicsResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        self.topics.iter().for_each(|t| f(t.error_code));
    }
}

impl ErrorCounts for m::DeleteTopicsResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        self.responses.iter().for_each(|t| f(t.error_code));
    }
}

impl ErrorCounts for m::FindCoordinatorResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        f(self.error_code);
        self.coordinators.iter().for_each(|c| f(c.error_code));
    }
}

impl ErrorCounts for m::LeaveGroupResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        f(self.error_code);
        self.members.iter().for_each(|x| f(x.error_code));
    }
}

impl ErrorCounts for m::OffsetCommitResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        for t in &self.topics {
            t.partitions.iter().for_each(|p| f(p.error_code));
        }
    }
}

impl ErrorCounts for m::OffsetFetchResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        f(self.error_code);
        for t in &self.topics {
            t.partitions.iter().for_each(|p| f(p.error_code));
        }
        for g in &self.groups {
            f(g.error_code);
            for t in &g.topics {
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
        }
    }
}

impl ErrorCounts for m::DescribeGroupsResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        self.groups.iter().for_each(|g| f(g.error_code));
    }
}

impl ErrorCounts for m::CreateAclsResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        self.results.iter().for_each(|r| f(r.error_code));
    }
}

impl ErrorCounts for m::DescribeUserScramCredentialsResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        f(self.error_code);
        self.results.iter().for_each(|r| f(r.error_code));
    }
}

impl ErrorCounts for m::AlterUserScramCredentialsResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        self.results.iter().for_each(|r| f(r.error_code));
    }
}

impl ErrorCounts for m::DeleteAclsResponse {
    fn error_codes(&self, f: &mut dyn FnMut(i16)) {
        for r in &self.filter_results {
            f(r.error_code);
            r.matching_acls.iter().for_each(|a| f(a.error_code));
        }
    }
}

/// The name of a Kafka error code this front end answers with, as
/// Kafka's `Errors` enum spells it; `OTHER` for any other.
pub fn error_name(code: i16) -> &'static str {
    match kafka_protocol::error::ResponseError::try_from_code(code) {
        None => "NONE",
        Some(e) => known_name(e.code()),
    }
}

fn known_name(code: i16) -> &'static str {
    match code {
        -1 => "UNKNOWN_SERVER_ERROR",
        1 => "OFFSET_OUT_OF_RANGE",
        2 => "CORRUPT_MESSAGE",
        3 => "UNKNOWN_TOPIC_OR_PARTITION",
        5 => "LEADER_NOT_AVAILABLE",
        6 => "NOT_LEADER_OR_FOLLOWER",
        10 => "MESSAGE_TOO_LARGE",
        15 => "COORDINATOR_NOT_AVAILABLE",
        16 => "NOT_COORDINATOR",
        17 => "INVALID_TOPIC_EXCEPTION",
        19 => "NOT_ENOUGH_REPLICAS",
        20 => "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        22 => "ILLEGAL_GENERATION",
        23 => "INCONSISTENT_GROUP_PROTOCOL",
        24 => "INVALID_GROUP_ID",
        25 => "UNKNOWN_MEMBER_ID",
        26 => "INVALID_SESSION_TIMEOUT",
        27 => "REBALANCE_IN_PROGRESS",
        29 => "TOPIC_AUTHORIZATION_FAILED",
        30 => "GROUP_AUTHORIZATION_FAILED",
        31 => "CLUSTER_AUTHORIZATION_FAILED",
        33 => "UNSUPPORTED_SASL_MECHANISM",
        34 => "ILLEGAL_SASL_STATE",
        35 => "UNSUPPORTED_VERSION",
        36 => "TOPIC_ALREADY_EXISTS",
        37 => "INVALID_PARTITIONS",
        38 => "INVALID_REPLICATION_FACTOR",
        41 => "NOT_CONTROLLER",
        42 => "INVALID_REQUEST",
        44 => "POLICY_VIOLATION",
        45 => "OUT_OF_ORDER_SEQUENCE_NUMBER",
        47 => "INVALID_PRODUCER_EPOCH",
        56 => "KAFKA_STORAGE_ERROR",
        58 => "SASL_AUTHENTICATION_FAILED",
        69 => "GROUP_ID_NOT_FOUND",
        73 => "TOPIC_DELETION_DISABLED",
        79 => "MEMBER_ID_REQUIRED",
        81 => "GROUP_MAX_SIZE_REACHED",
        82 => "FENCED_INSTANCE_ID",
        87 => "INVALID_RECORD",
        91 => "RESOURCE_NOT_FOUND",
        92 => "DUPLICATE_RESOURCE",
        93 => "UNACCEPTABLE_CREDENTIAL",
        _ => "OTHER",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::kcode;

    #[test]
    fn every_partition_error_of_a_produce_response_is_reported() {
        let mut r = m::ProduceResponse::default();
        let mut t = m::produce_response::TopicProduceResponse::default();
        for code in [kcode::NONE, kcode::NOT_LEADER_OR_FOLLOWER, kcode::NONE] {
            t.partition_responses.push(
                m::produce_response::PartitionProduceResponse::default().with_error_code(code),
            );
        }
        r.responses.push(t);
        let mut seen = Vec::new();
        r.error_codes(&mut |c| seen.push(c));
        assert_eq!(seen, vec![0, kcode::NOT_LEADER_OR_FOLLOWER, 0]);
    }

    #[test]
    fn the_codes_this_front_end_answers_with_have_kafkas_names() {
        assert_eq!(
            error_name(kcode::NOT_LEADER_OR_FOLLOWER),
            "NOT_LEADER_OR_FOLLOWER"
        );
        assert_eq!(
            error_name(kcode::SASL_AUTHENTICATION_FAILED),
            "SASL_AUTHENTICATION_FAILED"
        );
        assert_eq!(
            error_name(kcode::TOPIC_AUTHORIZATION_FAILED),
            "TOPIC_AUTHORIZATION_FAILED"
        );
        assert_eq!(
            error_name(crate::groups::gcode::REBALANCE_IN_PROGRESS),
            "REBALANCE_IN_PROGRESS"
        );
        assert_eq!(error_name(kcode::NONE), "NONE");
        assert_eq!(error_name(12345), "OTHER");
    }

    /// Each name is Kafka's own (kafka-protocol's variant, CamelCase
    /// turned into Kafka's SCREAMING_SNAKE spelling).
    #[test]
    fn every_known_name_is_the_one_kafka_protocol_gives() {
        for code in -1..200i16 {
            let ours = known_name(code);
            if ours == "OTHER" {
                continue;
            }
            let theirs = kafka_protocol::error::ResponseError::try_from_code(code)
                .map(|e| e.to_string())
                .unwrap_or_default();
            let mut snake = String::new();
            for (i, ch) in theirs.chars().enumerate() {
                if ch.is_uppercase() && i > 0 {
                    snake.push('_');
                }
                snake.push(ch.to_ascii_uppercase());
            }
            assert_eq!(ours, snake, "code {code}");
        }
    }
}
