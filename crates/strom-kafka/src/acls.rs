//! Kafka's ACL admin APIs (`CreateAcls`, `DescribeAcls`, `DeleteAcls`) over
//! Strom's ACLs (docs/security.md), so Kafka's admin tools (kafka-acls,
//! confluent-kafka's `AdminClient`) manage them. Each binding maps onto one
//! `strom_auth::AclEntry`: topic, group and cluster resources; literal and
//! prefixed patterns (a literal `*` is every name); principals `User:NAME`
//! and `User:*`; host `*` only. Changing ACLs needs `alter` on the cluster,
//! listing them `describe`; without `auth` the answer is
//! `SECURITY_DISABLED`, as Kafka's without an authorizer.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    ApiKey, CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;
use strom_auth::{AclEntry, Operation, Pattern, Permission, Resource, ResourceKind, SecurityTable};
use strom_proto::{Request, Response};

use crate::error::{kafka_code, kcode, FrameError};
use crate::guard;
use crate::request::{decode, Ctx, Reply};

const SECURITY_DISABLED: i16 = 54;
const INVALID_REQUEST: i16 = kcode::INVALID_REQUEST;
// Kafka's enums (org.apache.kafka.common.resource / acl).
const ANY: i8 = 1;
const MATCH: i8 = 2;
const LITERAL: i8 = 3;
const PREFIXED: i8 = 4;

fn kind_code(k: ResourceKind) -> i8 {
    match k {
        ResourceKind::Topic => 2,
        ResourceKind::Group => 3,
        ResourceKind::Cluster => 4,
        ResourceKind::Transform => 0, // not a Kafka resource: never listed
    }
}

fn kind_of(code: i8) -> Option<ResourceKind> {
    match code {
        2 => Some(ResourceKind::Topic),
        3 => Some(ResourceKind::Group),
        4 => Some(ResourceKind::Cluster),
        _ => None,
    }
}

const OPS: &[(i8, Operation)] = &[
    (2, Operation::All),
    (3, Operation::Read),
    (4, Operation::Write),
    (5, Operation::Create),
    (6, Operation::Delete),
    (7, Operation::Alter),
    (8, Operation::Describe),
    (9, Operation::Admin), // CLUSTER_ACTION
];

fn op_code(o: Operation) -> i8 {
    OPS.iter().find(|(_, x)| *x == o).map_or(0, |(c, _)| *c)
}

fn op_of(code: i8) -> Option<Operation> {
    OPS.iter().find(|(c, _)| *c == code).map(|(_, o)| *o)
}

fn perm_code(p: Permission) -> i8 {
    match p {
        Permission::Deny => 2,
        Permission::Allow => 3,
    }
}

fn principal_of(kafka: &str) -> String {
    match kafka {
        "User:*" => "*".to_string(),
        other => other.to_string(),
    }
}

fn kafka_principal(strom: &str) -> String {
    match strom {
        "*" => "User:*".to_string(),
        other => other.to_string(),
    }
}

/// The entry a Kafka binding describes, or why it cannot be one.
#[allow(clippy::too_many_arguments)]
fn entry(
    kind: i8,
    name: &str,
    pattern: i8,
    principal: &str,
    host: &str,
    op: i8,
    perm: i8,
) -> Result<AclEntry, String> {
    let resource = kind_of(kind).ok_or(format!(
        "resource type {kind} is not topic, group or cluster"
    ))?;
    let pattern = match (pattern, name) {
        (LITERAL, "*") => Pattern::Prefix(String::new()),
        (LITERAL, n) => Pattern::Literal(n.to_string()),
        (PREFIXED, n) => Pattern::Prefix(n.to_string()),
        (p, _) => return Err(format!("pattern type {p} is not LITERAL or PREFIXED")),
    };
    if host != "*" {
        return Err("Strom ACLs hold for every host: use host *".into());
    }
    let e = AclEntry {
        principal: principal_of(principal),
        resource,
        pattern,
        operation: op_of(op).ok_or(format!("operation {op} has no Strom equivalent"))?,
        permission: match perm {
            2 => Permission::Deny,
            3 => Permission::Allow,
            p => return Err(format!("permission type {p} is not ALLOW or DENY")),
        },
    };
    e.check()?;
    Ok(e)
}

/// A Kafka filter (describe, delete).
struct Filter {
    kind: i8,
    name: Option<String>,
    pattern: i8,
    principal: Option<String>,
    op: i8,
    perm: i8,
}

impl Filter {
    fn matches(&self, e: &AclEntry) -> bool {
        let (pat_code, pat_name) = match &e.pattern {
            Pattern::Prefix(p) if p.is_empty() => (LITERAL, "*"),
            Pattern::Literal(l) => (LITERAL, l.as_str()),
            Pattern::Prefix(p) => (PREFIXED, p.as_str()),
        };
        let name_ok = match (&self.name, self.pattern) {
            (None, _) => true,
            (Some(n), MATCH) => e.pattern.matches(n),
            (Some(n), _) => n == pat_name,
        };
        (self.kind == ANY || self.kind == kind_code(e.resource))
            && name_ok
            && (self.pattern == ANY || self.pattern == MATCH || self.pattern == pat_code)
            && self
                .principal
                .as_deref()
                .is_none_or(|p| principal_of(p) == e.principal)
            && (self.op == ANY || self.op == op_code(e.operation))
            && (self.perm == ANY || self.perm == perm_code(e.permission))
    }
}

fn s(x: &StrBytes) -> String {
    x.as_str().to_string()
}

/// Whether the connection may do `op` on the cluster: `NONE`, the refusal,
/// or `SECURITY_DISABLED` without `auth`.
pub(crate) fn gate(ctx: &Ctx, op: Operation) -> i16 {
    if !ctx.services.access.enabled() {
        return SECURITY_DISABLED;
    }
    match ctx.may(op, &Resource::cluster()) {
        true => kcode::NONE,
        false => kcode::CLUSTER_AUTHORIZATION_FAILED,
    }
}

/// The registry's security table, read now: here if this server holds
/// the registry (whole, SCRAM users included), else from it (a member's
/// request, so SCRAM users too).
pub(crate) async fn table(ctx: &Ctx) -> Result<SecurityTable, (i16, String)> {
    if let Some(r) = ctx.services.control.master_registry() {
        return Ok(r.security_table().await);
    }
    match ctx
        .services
        .control
        .ask_registry(Request::SecurityTable { have: u64::MAX })
        .await
    {
        Ok(Response::SecurityTable { json, .. }) => {
            serde_json::from_str(&json).map_err(|e| (kcode::UNKNOWN_SERVER_ERROR, e.to_string()))
        }
        Ok(_) => Err((kcode::UNKNOWN_SERVER_ERROR, "unexpected answer".into())),
        Err(e) => Err((kafka_code(&e), e.to_string())),
    }
}

async fn alter(ctx: &Ctx, add: bool, entries: &[AclEntry]) -> Result<(), (i16, String)> {
    let json =
        serde_json::to_string(entries).map_err(|e| (kcode::UNKNOWN_SERVER_ERROR, e.to_string()))?;
    let detail = match add {
        true => format!("CreateAcls {json}"),
        false => format!("DeleteAcls {json}"),
    };
    ctx.change(Request::AlterAcls { add, json }, &detail)
        .await
        .map(drop)
        .map_err(|e| (kafka_code(&e), e.to_string()))
}

pub fn create_acls(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: CreateAclsRequest = decode("CreateAcls", guard::CREATE_ACLS, v, false, body)?;
    let gated = gate(ctx, Operation::Alter);
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let mut results = Vec::with_capacity(req.creations.len());
        for a in &req.creations {
            let outcome = match gated {
                kcode::NONE => match entry(
                    a.resource_type,
                    a.resource_name.as_str(),
                    a.resource_pattern_type,
                    a.principal.as_str(),
                    a.host.as_str(),
                    a.operation,
                    a.permission_type,
                ) {
                    Ok(e) => alter(&ctx, true, &[e]).await,
                    Err(m) => Err((INVALID_REQUEST, m)),
                },
                code => Err((code, "not allowed".into())),
            };
            let mut r = AclCreationResult::default();
            if let Err((code, m)) = outcome {
                r = r
                    .with_error_code(code)
                    .with_error_message(Some(StrBytes::from_string(m)));
            }
            results.push(r);
        }
        let resp = CreateAclsResponse::default().with_results(results);
        Some(ctx.respond(ApiKey::CreateAcls, v, c, &resp))
    }))
}

pub fn describe_acls(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: DescribeAclsRequest = decode("DescribeAcls", guard::DESCRIBE_ACLS, v, false, body)?;
    let gated = gate(ctx, Operation::Describe);
    let filter = Filter {
        kind: req.resource_type_filter,
        name: req.resource_name_filter.as_ref().map(s),
        pattern: req.pattern_type_filter,
        principal: req.principal_filter.as_ref().map(s),
        op: req.operation,
        perm: req.permission_type,
    };
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let found = match gated {
            kcode::NONE => table(&ctx).await,
            code => Err((code, "not allowed".into())),
        };
        let resp = match found {
            Err((code, m)) => DescribeAclsResponse::default()
                .with_error_code(code)
                .with_error_message(Some(StrBytes::from_string(m))),
            Ok(t) => DescribeAclsResponse::default().with_resources(
                t.acls
                    .iter()
                    .filter(|e| filter.matches(e))
                    .map(describe)
                    .collect(),
            ),
        };
        Some(ctx.respond(ApiKey::DescribeAcls, v, c, &resp))
    }))
}

fn pattern_parts(e: &AclEntry) -> (String, i8) {
    match &e.pattern {
        Pattern::Prefix(p) if p.is_empty() => ("*".into(), LITERAL),
        Pattern::Literal(l) => (l.clone(), LITERAL),
        Pattern::Prefix(p) => (p.clone(), PREFIXED),
    }
}

fn describe(e: &AclEntry) -> DescribeAclsResource {
    let (name, pattern) = pattern_parts(e);
    DescribeAclsResource::default()
        .with_resource_type(kind_code(e.resource))
        .with_resource_name(StrBytes::from_string(name))
        .with_pattern_type(pattern)
        .with_acls(vec![AclDescription::default()
            .with_principal(StrBytes::from_string(kafka_principal(&e.principal)))
            .with_host(StrBytes::from_static_str("*"))
            .with_operation(op_code(e.operation))
            .with_permission_type(perm_code(e.permission))])
}

fn filter_of(f: &DeleteAclsFilter) -> Filter {
    Filter {
        kind: f.resource_type_filter,
        name: f.resource_name_filter.as_ref().map(s),
        pattern: f.pattern_type_filter,
        principal: f.principal_filter.as_ref().map(s),
        op: f.operation,
        perm: f.permission_type,
    }
}

pub fn delete_acls(ctx: &Arc<Ctx>, v: i16, c: i32, body: Bytes) -> Result<Reply, FrameError> {
    let req: DeleteAclsRequest = decode("DeleteAcls", guard::DELETE_ACLS, v, false, body)?;
    let gated = gate(ctx, Operation::Alter);
    let ctx = ctx.clone();
    Ok(Box::pin(async move {
        let mut results = Vec::with_capacity(req.filters.len());
        for f in &req.filters {
            let outcome = match gated {
                kcode::NONE => delete_matching(&ctx, &filter_of(f)).await,
                code => Err((code, "not allowed".into())),
            };
            results.push(match outcome {
                Ok(gone) => DeleteAclsFilterResult::default().with_matching_acls(gone),
                Err((code, m)) => DeleteAclsFilterResult::default()
                    .with_error_code(code)
                    .with_error_message(Some(StrBytes::from_string(m))),
            });
        }
        let resp = DeleteAclsResponse::default().with_filter_results(results);
        Some(ctx.respond(ApiKey::DeleteAcls, v, c, &resp))
    }))
}

async fn delete_matching(
    ctx: &Ctx,
    f: &Filter,
) -> Result<Vec<DeleteAclsMatchingAcl>, (i16, String)> {
    let t = table(ctx).await?;
    let gone: Vec<AclEntry> = t.acls.iter().filter(|e| f.matches(e)).cloned().collect();
    if !gone.is_empty() {
        alter(ctx, false, &gone).await?;
    }
    Ok(gone
        .iter()
        .map(|e| {
            let (name, pattern) = pattern_parts(e);
            DeleteAclsMatchingAcl::default()
                .with_resource_type(kind_code(e.resource))
                .with_resource_name(StrBytes::from_string(name))
                .with_pattern_type(pattern)
                .with_principal(StrBytes::from_string(kafka_principal(&e.principal)))
                .with_host(StrBytes::from_static_str("*"))
                .with_operation(op_code(e.operation))
                .with_permission_type(perm_code(e.permission))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_bindings_map_onto_strom_entries_and_filters_find_them() {
        let e = entry(2, "k.", PREFIXED, "User:bob", "*", 3, 3).unwrap();
        assert_eq!(e.principal, "User:bob");
        assert_eq!(e.pattern, Pattern::Prefix("k.".into()));
        assert_eq!(e.operation, Operation::Read);
        let any = entry(2, "*", LITERAL, "User:*", "*", 2, 2).unwrap();
        assert_eq!(
            (any.principal.as_str(), &any.pattern),
            ("*", &Pattern::Prefix(String::new()))
        );
        assert!(entry(2, "t", LITERAL, "User:bob", "10.0.0.1", 3, 3).is_err());
        assert!(entry(5, "t", LITERAL, "User:bob", "*", 3, 3).is_err());
        assert!(entry(2, "t", LITERAL, "bob", "*", 3, 3).is_err());
        let f = Filter {
            kind: ANY,
            name: Some("k.jobs".into()),
            pattern: MATCH,
            principal: None,
            op: ANY,
            perm: ANY,
        };
        assert!(f.matches(&e) && f.matches(&any));
        let f = Filter {
            kind: 3,
            name: None,
            pattern: ANY,
            principal: None,
            op: ANY,
            perm: ANY,
        };
        assert!(!f.matches(&e));
        let f = Filter {
            kind: 2,
            name: Some("k.".into()),
            pattern: PREFIXED,
            principal: Some("User:bob".into()),
            op: 3,
            perm: 3,
        };
        assert!(f.matches(&e) && !f.matches(&any));
    }
}
