//! What a scoped token is limited to (docs/security.md, "Scopes"): topic
//! and group patterns and operations; empty lists limit nothing.

use crate::resource::{Operation, Pattern, Resource, ResourceKind};

/// The most patterns or operations a scope holds.
const MAX_SCOPE_ITEMS: usize = 64;

/// What a scoped token is limited to; empty lists limit nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    topics: Vec<Pattern>,
    groups: Vec<Pattern>,
    ops: Vec<Operation>,
}

impl Scope {
    /// `ops` names operations, or `produce` (write, describe), `consume`
    /// (read, describe) or `admin` (all).
    pub fn new(topics: &[String], groups: &[String], ops: &[String]) -> Result<Self, String> {
        if topics.len() + groups.len() + ops.len() > MAX_SCOPE_ITEMS {
            return Err(format!("a scope holds at most {MAX_SCOPE_ITEMS} items"));
        }
        let mut expanded = vec![];
        for o in ops {
            match o.to_ascii_lowercase().as_str() {
                "produce" => expanded.extend([Operation::Write, Operation::Describe]),
                "consume" => expanded.extend([Operation::Read, Operation::Describe]),
                "admin" => expanded.push(Operation::All),
                other => expanded.push(Operation::parse(other).ok_or_else(|| {
                    format!("unknown operation '{other}' (produce, consume, admin, or read, write, create, delete, describe, alter, all)")
                })?),
            }
        }
        let pats = |v: &[String]| v.iter().map(|s| Pattern::parse(s)).collect();
        Ok(Scope {
            topics: pats(topics),
            groups: pats(groups),
            ops: expanded,
        })
    }

    /// Whether the scope lets a request do `op` to `res`; why not if not.
    pub fn permits(&self, op: Operation, res: &Resource) -> Result<(), String> {
        if !self.ops.is_empty() && !self.ops.iter().any(|o| o.covers(op)) {
            return Err(format!(
                "its token's scope does not include the operation {op}"
            ));
        }
        let names = match res.kind {
            ResourceKind::Topic | ResourceKind::Transform => &self.topics,
            ResourceKind::Group => &self.groups,
            ResourceKind::Cluster if op == Operation::Describe => return Ok(()),
            ResourceKind::Cluster if self.topics.is_empty() && self.groups.is_empty() => {
                return Ok(())
            }
            ResourceKind::Cluster => {
                return Err("its token is scoped to topics or groups, not the cluster".into())
            }
        };
        if names.is_empty() || names.iter().any(|p| p.matches(&res.name)) {
            Ok(())
        } else {
            Err(format!("its token's scope does not include {res}"))
        }
    }
}
