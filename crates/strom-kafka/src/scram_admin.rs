//! Kafka's SCRAM user admin APIs (`DescribeUserScramCredentials`,
//! `AlterUserScramCredentials`) over the users the registry stores for the
//! Kafka port's SASL/SCRAM (docs/security.md), so `kafka-configs
//! --alter --add-config 'SCRAM-SHA-256=[password=…]'` and confluent-kafka's
//! `AdminClient` manage them as `strom user set` does.
//!
//! A client sends a salted password (`Hi(password, salt, iterations)`),
//! never the password; the server keeps only the stored and server keys
//! derived from it. Each user's alterations are applied at once by the
//! registry (`ScramUpdate::Alter`), so concurrent changes to one user's
//! two mechanisms do not undo each other. Listing users needs `describe`
//! on the cluster, changing them `alter`; without `auth` the answer is
//! `SECURITY_DISABLED`, as for the ACL APIs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, ApiKey,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;
use strom_auth::scram::{Mechanism, ScramCredential, ScramUpdate};
use strom_auth::{Operation, SecurityTable};
use strom_proto::Request;

use crate::error::{kafka_code, kcode, FrameError};
use crate::guard;
use crate::request::{decode, Ctx, Reply};

const RESOURCE_NOT_FOUND: i16 = 91;
const DUPLICATE_RESOURCE: i16 = 92;
const UNACCEPTABLE_CREDENTIAL: i16 = 93;

/// Kafka's number for a SCRAM mechanism.
fn mechanism(code: i8) -> Option<Mechanism> {
    match code {
        1 => Some(Mechanism::Sha256),
        2 => Some(Mechanism::Sha512),
        _ => None,
    }
}

fn code_of(name: &str) -> i8 {
    match Mechanism::parse(name) {
        Some(Mechanism::Sha256) => 1,
        Some(Mechanism::Sha512) => 2,
        None => 0,
    }
}

fn text(m: String) -> Option<StrBytes> {
    Some(StrBytes::from_string(m))
}

pub fn describe(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: DescribeUserScramCredentialsRequest = decode(
        "DescribeUserScramCredentials",
        guard::DESCRIBE_USER_SCRAM,
        v,
        true,
        body,
    )?;
    let gated = crate::acls::gate(ctx, Operation::Describe);
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let mut resp = DescribeUserScramCredentialsResponse::default();
        let table = match gated {
            kcode::NONE => crate::acls::table(&ctx).await,
            code => Err((code, "not allowed".into())),
        };
        match table {
            Ok(t) => resp.results = described(&t, req.users.as_deref()),
            Err((code, m)) => {
                resp.error_code = code;
                resp.error_message = text(m);
            }
        }
        Some(ctx.respond(ApiKey::DescribeUserScramCredentials, v, c, &resp))
    }))
}

/// Each named user (every user for `None`) with its mechanisms.
fn described(
    t: &SecurityTable,
    named: Option<&[kafka_protocol::messages::describe_user_scram_credentials_request::UserName]>,
) -> Vec<DescribeUserScramCredentialsResult> {
    let names: Vec<String> = match named {
        None => t.scram.keys().cloned().collect(),
        Some(n) => n.iter().map(|u| u.name.as_str().to_string()).collect(),
    };
    let mut seen = BTreeSet::new();
    names
        .iter()
        .map(|name| {
            let mut r = DescribeUserScramCredentialsResult::default()
                .with_user(StrBytes::from_string(name.clone()));
            if !seen.insert(name) {
                r.error_code = DUPLICATE_RESOURCE;
                r.error_message = text(format!("user '{name}' is asked for twice"));
            } else if let Some(creds) = t.scram.get(name) {
                r.credential_infos = creds
                    .iter()
                    .map(|c| {
                        CredentialInfo::default()
                            .with_mechanism(code_of(&c.mechanism))
                            .with_iterations(c.iterations as i32)
                    })
                    .collect();
            } else {
                r.error_code = RESOURCE_NOT_FOUND;
                r.error_message = text(format!("no SCRAM credentials for user '{name}'"));
            }
            r
        })
        .collect()
}

/// One user's requested changes, checked.
#[derive(Default)]
struct Change {
    set: Vec<ScramCredential>,
    remove: Vec<String>,
    mechanisms: BTreeSet<i8>,
    error: Option<(i16, String)>,
}

impl Change {
    fn fail(&mut self, code: i16, m: String) {
        self.error.get_or_insert((code, m));
    }

    /// Notes `mech` for this user; a second change of it is refused.
    fn claim(&mut self, user: &str, mech: i8) -> Option<Mechanism> {
        if !self.mechanisms.insert(mech) {
            self.fail(
                DUPLICATE_RESOURCE,
                format!("mechanism {mech} of user '{user}' is changed twice"),
            );
            return None;
        }
        let m = mechanism(mech);
        if m.is_none() {
            self.fail(
                kcode::UNSUPPORTED_SASL_MECHANISM,
                format!("unknown SCRAM mechanism {mech}"),
            );
        }
        m
    }
}

fn changes(req: &AlterUserScramCredentialsRequest) -> BTreeMap<String, Change> {
    let mut by_user: BTreeMap<String, Change> = BTreeMap::new();
    for d in &req.deletions {
        let user = d.name.as_str().to_string();
        let ch = by_user.entry(user.clone()).or_default();
        if let Some(m) = ch.claim(&user, d.mechanism) {
            ch.remove.push(m.name().to_string());
        }
    }
    for u in &req.upsertions {
        let user = u.name.as_str().to_string();
        let ch = by_user.entry(user.clone()).or_default();
        let Some(m) = ch.claim(&user, u.mechanism) else {
            continue;
        };
        let iterations = u32::try_from(u.iterations).unwrap_or(0);
        match ScramCredential::from_salted(m, &u.salt, iterations, &u.salted_password) {
            Ok(c) => ch.set.push(c),
            Err(e) => ch.fail(UNACCEPTABLE_CREDENTIAL, e),
        }
    }
    by_user
}

pub fn alter(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: AlterUserScramCredentialsRequest = decode(
        "AlterUserScramCredentials",
        guard::ALTER_USER_SCRAM,
        v,
        true,
        body,
    )?;
    let gated = crate::acls::gate(ctx, Operation::Alter);
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let mut results = Vec::new();
        for (user, ch) in changes(&req) {
            let outcome = match (gated, ch.error) {
                (kcode::NONE, None) => apply(&ctx, &user, ch.set, ch.remove).await,
                (kcode::NONE, Some(e)) => Err(e),
                (code, _) => Err((code, "not allowed".into())),
            };
            let mut r =
                AlterUserScramCredentialsResult::default().with_user(StrBytes::from_string(user));
            if let Err((code, m)) = outcome {
                r.error_code = code;
                r.error_message = text(m);
            }
            results.push(r);
        }
        let resp = AlterUserScramCredentialsResponse::default().with_results(results);
        Some(ctx.respond(ApiKey::AlterUserScramCredentials, v, c, &resp))
    }))
}

/// Applies one user's checked change; removing a mechanism the user does
/// not have is `RESOURCE_NOT_FOUND`, as in Kafka.
async fn apply(
    ctx: &Ctx,
    user: &str,
    set: Vec<ScramCredential>,
    remove: Vec<String>,
) -> Result<(), (i16, String)> {
    if !remove.is_empty() {
        let t = crate::acls::table(ctx).await?;
        let has = t.scram.get(user).cloned().unwrap_or_default();
        if let Some(m) = remove
            .iter()
            .find(|m| !has.iter().any(|c| c.mechanism.eq_ignore_ascii_case(m)))
        {
            return Err((
                RESOURCE_NOT_FOUND,
                format!("user '{user}' has no {m} credential"),
            ));
        }
    }
    let update = ScramUpdate::Alter { set, remove };
    let json =
        serde_json::to_string(&update).map_err(|e| (kcode::UNKNOWN_SERVER_ERROR, e.to_string()))?;
    let req = Request::SetScramUser {
        user: user.to_string(),
        json,
    };
    ctx.change(req, &format!("AlterUserScramCredentials {user}"))
        .await
        .map(drop)
        .map_err(|e| (kafka_code(&e), e.to_string()))
}
