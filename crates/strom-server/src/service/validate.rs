//! Server-side validation of produced batches with their topic's policy
//! (`strom-policy`): the metadata of every event must pass the topic's
//! validator, as Strom's own clients check before sending.
//! `DataService::produce` checks every batch, whichever front end and
//! client it came from, so no client gets around its topic's validator
//! (docs/kafka.md, *Validation*).
//!
//! Compiled policies are cached per topic and rebuilt when the topic's
//! spec changes (a topic deleted and created again under its name).

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use strom_policy::{MetadataInput, PolicyError, TopicPolicy};
use strom_proto::{BatchView, ErrorCode, TopicSpec};

use crate::batch::ValidBatch;
use crate::error::ServerError;

/// Topics whose policies are cached at most; past it the cache starts over.
const MAX_CACHED: usize = 4096;

/// Why a batch was refused: which event, and the validator's reason.
#[derive(Debug, thiserror::Error)]
#[error("event {index} of the batch: {reason}")]
pub struct Invalid {
    /// The event's position in the batch (0-based): Kafka's batch index.
    pub index: usize,
    pub reason: String,
}

impl From<Invalid> for ServerError {
    fn from(e: Invalid) -> Self {
        ServerError::coded(ErrorCode::INVALID_METADATA, e.to_string())
    }
}

/// A topic's spec and its compiled policy (`None`: it accepts anything).
type Cached = (TopicSpec, Option<Arc<TopicPolicy>>);

/// The compiled policies of the topics batches were checked for.
#[derive(Default)]
pub struct Validation {
    cache: Mutex<HashMap<String, Cached>>,
}

impl Validation {
    /// The policy of `spec`'s topic, `None` when its validator accepts
    /// anything (`none` with the `json` serializer).
    fn policy(&self, spec: &TopicSpec) -> Result<Option<Arc<TopicPolicy>>, ServerError> {
        let mut cache = self.cache.lock();
        if let Some((s, p)) = cache.get(&spec.name) {
            if s == spec {
                return Ok(p.clone());
            }
        }
        let policy = if spec.validator == "none" && spec.serializer == "json" {
            None
        } else {
            let p = TopicPolicy::new(
                &spec.validator,
                spec.schema.as_deref(),
                &spec.selector,
                &spec.serializer,
            )
            .map_err(|e| {
                ServerError::coded(
                    ErrorCode::BAD_POLICY_SPEC,
                    format!("topic '{}': {e}", spec.name),
                )
            })?;
            Some(Arc::new(p))
        };
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(spec.name.clone(), (spec.clone(), policy.clone()));
        Ok(policy)
    }

    /// Checks every event's metadata of `batch` against the policy of
    /// `spec`'s topic: the first event refused is an [`Invalid`] (as a
    /// `ServerError` of code `INVALID_METADATA`, naming the event).
    pub fn check(&self, spec: &TopicSpec, batch: &ValidBatch) -> Result<(), CheckError> {
        let Some(policy) = self.policy(spec)? else {
            return Ok(());
        };
        let view = BatchView::parse(batch.meta().clone()).map_err(|e| {
            ServerError::coded(ErrorCode::INVALID_ARGUMENT, format!("batch metadata: {e}"))
        })?;
        for (index, entry) in view.iter().enumerate() {
            check_one(&policy, entry.metadata).map_err(|e| Invalid {
                index,
                reason: e.to_string(),
            })?;
        }
        Ok(())
    }
}

/// Why [`Validation::check`] refused a batch.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// An event's metadata does not pass the validator.
    #[error(transparent)]
    Invalid(#[from] Invalid),
    /// The topic's policy or the batch could not be read.
    #[error(transparent)]
    Server(#[from] ServerError),
}

impl From<CheckError> for ServerError {
    fn from(e: CheckError) -> Self {
        match e {
            CheckError::Invalid(i) => i.into(),
            CheckError::Server(s) => s,
        }
    }
}

/// One event's stored metadata against `policy`: JSON text as the client
/// hands it over, or the binary serializer's encoding, decoded first.
fn check_one(policy: &TopicPolicy, meta: bytes::Bytes) -> Result<(), PolicyError> {
    let input = if policy.serializer_is_json() {
        MetadataInput::Json(meta)
    } else {
        MetadataInput::Value(policy.decode(&meta)?)
    };
    policy.prepare(input, Some(0), 1).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use strom_proto::BatchBuilder;

    fn batch(metas: &[&str]) -> ValidBatch {
        let mut b = BatchBuilder::new();
        for m in metas {
            b.push(m.as_bytes(), &[], 0);
        }
        ValidBatch::check(metas.len() as u32, b.finish(), Vec::new()).unwrap()
    }

    fn spec(validator: &str) -> TopicSpec {
        let mut s = TopicSpec::new("t", 1);
        s.validator = validator.into();
        s.schema = Some(r#"{"type":"object","required":["run"]}"#.into());
        s
    }

    #[test]
    fn the_first_refused_event_is_named() {
        let v = Validation::default();
        let s = spec("json-schema");
        assert!(v
            .check(&s, &batch(&[r#"{"run":1}"#, r#"{"run":2}"#]))
            .is_ok());
        match v.check(&s, &batch(&[r#"{"run":1}"#, r#"{"shot":2}"#, "nope"])) {
            Err(CheckError::Invalid(i)) => {
                assert_eq!(i.index, 1);
                assert!(i.reason.contains("run"), "{}", i.reason);
            }
            other => panic!("expected the second event refused: {other:?}"),
        }
        let e: ServerError = v.check(&s, &batch(&["nope"])).unwrap_err().into();
        assert_eq!(e.code(), ErrorCode::INVALID_METADATA);
    }

    #[test]
    fn a_changed_spec_rebuilds_the_policy() {
        let v = Validation::default();
        assert!(v.check(&spec("json"), &batch(&[r#"{"shot":2}"#])).is_ok());
        assert!(v.check(&spec("json"), &batch(&["nope"])).is_err());
        assert!(v.check(&spec("none"), &batch(&["nope"])).is_ok());
        assert!(v
            .check(&spec("json-schema"), &batch(&[r#"{"shot":2}"#]))
            .is_err());
    }
}
