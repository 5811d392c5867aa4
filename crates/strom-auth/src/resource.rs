//! The vocabulary of permissions: what a request does ([`Operation`]) to
//! which thing ([`Resource`] of a [`ResourceKind`]), how an ACL names
//! things ([`Pattern`]), and whether it allows or denies ([`Permission`]).
//! A leaf: the ACLs, scopes and tokens are built from it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What a request does to a resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    Read,
    Write,
    Create,
    Delete,
    Describe,
    Alter,
    Admin,
    All,
}

impl Operation {
    pub const NAMES: &'static [(&'static str, Operation)] = &[
        ("read", Operation::Read),
        ("write", Operation::Write),
        ("create", Operation::Create),
        ("delete", Operation::Delete),
        ("describe", Operation::Describe),
        ("alter", Operation::Alter),
        ("admin", Operation::Admin),
        ("all", Operation::All),
    ];

    pub fn parse(s: &str) -> Option<Operation> {
        let s = s.to_ascii_lowercase();
        Self::NAMES.iter().find(|(n, _)| *n == s).map(|(_, o)| *o)
    }

    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, o)| *o == self)
            .map_or("?", |(n, _)| n)
    }

    /// Whether an ACL granting `self` covers a request for `asked`.
    pub fn covers(self, asked: Operation) -> bool {
        self == Operation::All
            || self == asked
            || (asked == Operation::Describe
                && matches!(
                    self,
                    Operation::Read | Operation::Write | Operation::Delete | Operation::Alter
                ))
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The kinds of things ACLs protect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceKind {
    Topic,
    Group,
    Transform,
    /// The group of servers itself: members, ACLs, tokens, moves.
    Cluster,
}

impl ResourceKind {
    pub fn parse(s: &str) -> Option<ResourceKind> {
        match s.to_ascii_lowercase().as_str() {
            "topic" => Some(ResourceKind::Topic),
            "group" => Some(ResourceKind::Group),
            "transform" => Some(ResourceKind::Transform),
            "cluster" => Some(ResourceKind::Cluster),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ResourceKind::Topic => "topic",
            ResourceKind::Group => "group",
            ResourceKind::Transform => "transform",
            ResourceKind::Cluster => "cluster",
        }
    }
}

/// One resource a request touches.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Resource {
    pub kind: ResourceKind,
    pub name: String,
}

impl Resource {
    pub fn topic(name: impl Into<String>) -> Self {
        Resource {
            kind: ResourceKind::Topic,
            name: name.into(),
        }
    }

    pub fn group(name: impl Into<String>) -> Self {
        Resource {
            kind: ResourceKind::Group,
            name: name.into(),
        }
    }

    pub fn cluster() -> Self {
        Resource {
            kind: ResourceKind::Cluster,
            name: "strom".into(),
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            ResourceKind::Cluster => f.write_str("the cluster"),
            k => write!(f, "{} '{}'", k.name(), self.name),
        }
    }
}

/// Which names of a kind an entry covers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    Literal(String),
    Prefix(String),
}

impl Pattern {
    /// `sim.*` is the prefix `sim.`, `*` every name, anything else a literal.
    pub fn parse(s: &str) -> Pattern {
        match s.strip_suffix('*') {
            Some(prefix) => Pattern::Prefix(prefix.to_string()),
            None => Pattern::Literal(s.to_string()),
        }
    }

    pub fn matches(&self, name: &str) -> bool {
        match self {
            Pattern::Literal(l) => l == name,
            Pattern::Prefix(p) => name.starts_with(p.as_str()),
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Literal(l) => f.write_str(l),
            Pattern::Prefix(p) => write!(f, "{p}*"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    Allow,
    Deny,
}
