//! Who a connection is. A connection gets one [`Principal`] when it
//! connects (or when it authenticates, once), and every request on it is
//! decided for that principal.
//!
//! ACLs and `super_users` name principals as strings:
//! - `User:NAME` matches a principal of that name, however it proved it
//!   (a token's subject, a SASL user, a certificate's common name, or the
//!   user name of a same-node peer's uid);
//! - `uid:N` matches a same-node peer whose kernel credentials give uid N;
//! - `*` matches every principal, the anonymous one included (as Kafka's
//!   `User:*`).

use std::fmt;

use crate::scope::Scope;

/// How a principal was established.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    /// Nothing proved.
    Anonymous,
    /// A member of the group (the cluster secret); trusted with everything.
    Member,
    /// A Strom token (native `Authenticate`, or Kafka SASL/OAUTHBEARER or PLAIN).
    Token,
    /// The kernel's credentials of a same-node peer (`SO_PEERCRED`).
    PeerUid,
    /// A verified TLS client certificate.
    Certificate,
    /// A SASL user stored in the registry (SCRAM).
    Sasl,
}

/// One connection's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The user name; empty for the anonymous principal and for members.
    pub name: String,
    pub mechanism: Mechanism,
    /// A same-node peer's uid.
    pub uid: Option<u32>,
    /// A member's id.
    pub member: Option<u32>,
    /// What a token limits this principal to (none: no limit beyond ACLs).
    pub scope: Option<Scope>,
    /// The token's id, checked against the registry's revocation list.
    pub token_id: Option<String>,
    /// When the token expires, in seconds since the Unix epoch.
    pub expires: Option<u64>,
}

impl Principal {
    pub fn anonymous() -> Self {
        Principal {
            name: String::new(),
            mechanism: Mechanism::Anonymous,
            uid: None,
            member: None,
            scope: None,
            token_id: None,
            expires: None,
        }
    }

    /// A member of the group (`member_auth`'s `NO_ID` before it joined).
    pub fn member(id: u32) -> Self {
        Principal {
            mechanism: Mechanism::Member,
            member: Some(id),
            ..Self::anonymous()
        }
    }

    /// A named user, proved by `mechanism` (certificate, SASL).
    pub fn user(name: impl Into<String>, mechanism: Mechanism) -> Self {
        Principal {
            name: name.into(),
            mechanism,
            ..Self::anonymous()
        }
    }

    /// A same-node peer; `name` is its user name if the system knows it.
    pub fn peer_uid(uid: u32, name: Option<String>) -> Self {
        Principal {
            name: name.unwrap_or_else(|| format!("uid:{uid}")),
            mechanism: Mechanism::PeerUid,
            uid: Some(uid),
            ..Self::anonymous()
        }
    }

    pub fn is_anonymous(&self) -> bool {
        self.mechanism == Mechanism::Anonymous
    }

    pub fn is_member(&self) -> bool {
        self.mechanism == Mechanism::Member
    }

    /// Whether an ACL's or `super_users`' principal string names this one.
    pub fn matches(&self, pattern: &str) -> bool {
        if pattern == "*" || pattern == "User:*" {
            return true;
        }
        if self.is_anonymous() {
            return pattern == "User:ANONYMOUS";
        }
        if let Some(uid) = pattern.strip_prefix("uid:") {
            return self.uid.is_some_and(|u| uid.parse() == Ok(u));
        }
        match pattern.strip_prefix("User:") {
            Some(name) => !self.name.is_empty() && name == self.name,
            None => false,
        }
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.mechanism, self.member, self.uid) {
            (Mechanism::Anonymous, ..) => f.write_str("User:ANONYMOUS"),
            (Mechanism::Member, Some(m), _) => write!(f, "member:{m}"),
            (Mechanism::Member, None, _) => f.write_str("member"),
            (Mechanism::PeerUid, _, Some(uid)) if self.name != format!("uid:{uid}") => {
                write!(f, "User:{} (uid:{uid})", self.name)
            }
            (Mechanism::PeerUid, _, Some(uid)) => write!(f, "uid:{uid}"),
            _ => write!(f, "User:{}", self.name),
        }
    }
}

/// Whether `s` is a principal string ACLs accept.
pub fn valid_pattern(s: &str) -> bool {
    if s == "*" || s == "User:*" {
        return true;
    }
    if let Some(uid) = s.strip_prefix("uid:") {
        return uid.parse::<u32>().is_ok();
    }
    s.strip_prefix("User:")
        .is_some_and(|n| !n.is_empty() && n.len() <= 256 && !n.chars().any(|c| c.is_control()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn principals_match_their_acl_names_only() {
        let alice = Principal::user("alice", Mechanism::Token);
        assert!(alice.matches("User:alice") && alice.matches("*"));
        assert!(!alice.matches("User:bob") && !alice.matches("uid:1000"));
        let bob = Principal::peer_uid(1000, Some("bob".into()));
        assert!(bob.matches("uid:1000") && bob.matches("User:bob"));
        assert!(!bob.matches("uid:1001"));
        assert_eq!(bob.to_string(), "User:bob (uid:1000)");
        let anon = Principal::anonymous();
        assert!(anon.matches("*") && anon.matches("User:ANONYMOUS"));
        assert!(!anon.matches("User:") && !anon.matches("User:alice"));
        assert!(valid_pattern("User:alice") && valid_pattern("uid:7") && valid_pattern("*"));
        assert!(!valid_pattern("alice") && !valid_pattern("uid:x") && !valid_pattern("User:"));
    }
}
