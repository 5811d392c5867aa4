//! ACLs and the one decision every request goes through.
//!
//! An [`AclEntry`] allows or denies one principal (or `*`) one
//! [`Operation`] on the resources a [`Pattern`] names (a literal name or a
//! prefix) of one [`ResourceKind`]. [`SecurityTable`] is what the registry
//! replicates: the entries, the revoked token ids, and a version that
//! grows with every change. [`SecurityTable::decide`] is as Kafka's
//! authorizer: a member or super user may do anything; otherwise a matching
//! deny wins, then a matching allow, and no match is a refusal. `Read`,
//! `Write`, `Delete` and `Alter` imply `Describe`; `All` is every operation.
//! A token's scope limits even a super user.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::principal::{valid_pattern, Principal};
pub use crate::resource::{Operation, Pattern, Permission, Resource, ResourceKind};

/// One ACL.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AclEntry {
    /// `User:NAME`, `uid:N` or `*` ([`crate::principal`]).
    pub principal: String,
    pub resource: ResourceKind,
    pub pattern: Pattern,
    pub operation: Operation,
    pub permission: Permission,
}

impl AclEntry {
    /// Checks the entry's principal string and pattern.
    pub fn check(&self) -> Result<(), String> {
        if !valid_pattern(&self.principal) {
            return Err(format!(
                "principal '{}' is not User:NAME, uid:N or *",
                self.principal
            ));
        }
        let name = match &self.pattern {
            Pattern::Literal(l) => l,
            Pattern::Prefix(p) => p,
        };
        if name.len() > 1024 || name.chars().any(|c| c.is_control()) {
            return Err("a resource pattern is at most 1024 printable characters".into());
        }
        if matches!(&self.pattern, Pattern::Literal(l) if l.is_empty()) {
            return Err("an empty literal resource name matches nothing".into());
        }
        Ok(())
    }

    fn applies(&self, p: &Principal, op: Operation, res: &Resource) -> bool {
        self.resource == res.kind
            && self.operation.covers(op)
            && self.pattern.matches(&res.name)
            && p.matches(&self.principal)
    }
}

impl fmt::Display for AclEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let perm = match self.permission {
            Permission::Allow => "allow",
            Permission::Deny => "deny",
        };
        write!(
            f,
            "{perm} {} {} on {} {}",
            self.principal,
            self.operation,
            self.resource.name(),
            self.pattern
        )
    }
}

/// What the registry replicates for security: ACLs and revoked tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecurityTable {
    /// Grows with every change; members fetch the table when it moved.
    #[serde(default)]
    pub version: u64,
    #[serde(default)]
    pub acls: BTreeSet<AclEntry>,
    /// Revoked token ids (`jti`).
    #[serde(default)]
    pub revoked: BTreeSet<String>,
    /// SCRAM users for the Kafka port: user -> their credentials, one per
    /// mechanism (salted and hashed; never the password). Given only to
    /// members.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub scram: std::collections::BTreeMap<String, Vec<crate::scram::ScramCredential>>,
}

/// The answer to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Why not, for the error message.
    Deny(String),
}

/// The most ACL entries and revoked ids a table holds (a bound on what a
/// member accepts from the registry and the registry from a client).
pub const MAX_ENTRIES: usize = 100_000;

impl SecurityTable {
    /// Whether nothing was ever recorded (such a table is not written).
    pub fn is_empty(&self) -> bool {
        *self == SecurityTable::default()
    }

    /// Whether `p` may do `op` to `res` at `now` (seconds since the epoch).
    pub fn decide(
        &self,
        p: &Principal,
        op: Operation,
        res: &Resource,
        super_users: &[String],
        now: u64,
    ) -> Decision {
        if p.is_member() {
            return Decision::Allow;
        }
        if let Some(exp) = p.expires.filter(|e| *e <= now) {
            return Decision::Deny(format!("its token expired at {exp} (Unix seconds)"));
        }
        if let Some(id) = p.token_id.as_ref().filter(|id| self.revoked.contains(*id)) {
            return Decision::Deny(format!("its token {id} was revoked"));
        }
        if let Some(scope) = &p.scope {
            if let Err(why) = scope.permits(op, res) {
                return Decision::Deny(why);
            }
        }
        if super_users.iter().any(|s| p.matches(s)) {
            return Decision::Allow;
        }
        if let Some(d) = self
            .acls
            .iter()
            .find(|a| a.permission == Permission::Deny && a.applies(p, op, res))
        {
            return Decision::Deny(format!("an ACL denies it ({d})"));
        }
        if self
            .acls
            .iter()
            .any(|a| a.permission == Permission::Allow && a.applies(p, op, res))
        {
            return Decision::Allow;
        }
        Decision::Deny("no ACL allows it".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::principal::Mechanism;
    use crate::scope::Scope;

    fn acl(
        principal: &str,
        kind: ResourceKind,
        pat: &str,
        op: Operation,
        perm: Permission,
    ) -> AclEntry {
        AclEntry {
            principal: principal.into(),
            resource: kind,
            pattern: Pattern::parse(pat),
            operation: op,
            permission: perm,
        }
    }

    #[test]
    fn deny_wins_then_allow_then_nothing_is_refused() {
        let mut t = SecurityTable::default();
        t.acls.insert(acl(
            "User:alice",
            ResourceKind::Topic,
            "sim.*",
            Operation::Write,
            Permission::Allow,
        ));
        t.acls.insert(acl(
            "*",
            ResourceKind::Topic,
            "sim.secret",
            Operation::All,
            Permission::Deny,
        ));
        let alice = Principal::user("alice", Mechanism::Token);
        let d = |p: &Principal, op, t2: &SecurityTable, name: &str| {
            t2.decide(p, op, &Resource::topic(name), &[], 10)
        };
        assert_eq!(d(&alice, Operation::Write, &t, "sim.a"), Decision::Allow);
        assert_eq!(
            d(&alice, Operation::Describe, &t, "sim.a"),
            Decision::Allow,
            "write implies describe"
        );
        assert!(matches!(
            d(&alice, Operation::Read, &t, "sim.a"),
            Decision::Deny(_)
        ));
        assert!(
            matches!(d(&alice, Operation::Write, &t, "sim.secret"), Decision::Deny(m) if m.contains("denies"))
        );
        assert!(
            matches!(d(&alice, Operation::Write, &t, "other"), Decision::Deny(m) if m.contains("no ACL"))
        );
        let bob = Principal::user("bob", Mechanism::Token);
        assert!(matches!(
            d(&bob, Operation::Write, &t, "sim.a"),
            Decision::Deny(_)
        ));
        let su = ["User:bob".to_string()];
        assert_eq!(
            t.decide(&bob, Operation::Delete, &Resource::topic("x"), &su, 10),
            Decision::Allow
        );
        assert_eq!(
            d(&Principal::member(2), Operation::Delete, &t, "sim.secret"),
            Decision::Allow
        );
    }

    #[test]
    fn expiry_revocation_and_scope_limit_even_super_users() {
        let t = SecurityTable {
            revoked: ["gone".to_string()].into(),
            ..Default::default()
        };
        let su = ["User:root".to_string()];
        let mut p = Principal::user("root", Mechanism::Token);
        let res = Resource::topic("a");
        assert_eq!(
            t.decide(&p, Operation::Delete, &res, &su, 10),
            Decision::Allow
        );
        p.expires = Some(10);
        assert!(
            matches!(t.decide(&p, Operation::Read, &res, &su, 10), Decision::Deny(m) if m.contains("expired"))
        );
        p.expires = Some(11);
        p.token_id = Some("gone".into());
        assert!(
            matches!(t.decide(&p, Operation::Read, &res, &su, 10), Decision::Deny(m) if m.contains("revoked"))
        );
        p.token_id = Some("live".into());
        p.scope = Some(Scope::new(&["b*".into()], &[], &["consume".into()]).unwrap());
        assert!(
            matches!(t.decide(&p, Operation::Read, &res, &su, 10), Decision::Deny(m) if m.contains("scope"))
        );
        assert_eq!(
            t.decide(&p, Operation::Read, &Resource::topic("b1"), &su, 10),
            Decision::Allow
        );
        assert!(matches!(
            t.decide(&p, Operation::Write, &Resource::topic("b1"), &su, 10),
            Decision::Deny(_)
        ));
    }

    #[test]
    fn entries_with_bad_principals_or_names_are_refused() {
        let ok = acl(
            "User:a",
            ResourceKind::Group,
            "g",
            Operation::Read,
            Permission::Allow,
        );
        assert!(ok.check().is_ok());
        assert!(acl(
            "a",
            ResourceKind::Group,
            "g",
            Operation::Read,
            Permission::Allow
        )
        .check()
        .is_err());
        assert!(acl(
            "User:a",
            ResourceKind::Group,
            "",
            Operation::Read,
            Permission::Allow
        )
        .check()
        .is_err());
        assert!(acl(
            "User:a",
            ResourceKind::Group,
            "*",
            Operation::Read,
            Permission::Allow
        )
        .check()
        .is_ok());
    }
}
