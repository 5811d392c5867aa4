//! Strom's identity and permission model (docs/security.md), as pure
//! computation: no I/O, no network, no clock of its own (callers pass the
//! time).
//!
//! - [`principal`]: who a connection is ([`Principal`]), and how ACLs name
//!   principals (`User:alice`, `uid:1234`, `*`).
//! - [`token`]: Strom tokens, HMAC-SHA256 bearer tokens signed with a key
//!   derived from the cluster secret, carrying a subject, an expiry and
//!   optional scopes ([`Claims`], [`TokenKey`]).
//! - [`resource`]: operations, resources, name patterns (a leaf);
//! - [`scope`]: what a scoped token is limited to;
//! - [`acl`]: ACL entries (principal, resource pattern, operation, allow or
//!   deny), the table the registry replicates ([`SecurityTable`]) and the
//!   one decision function ([`SecurityTable::decide`]).

pub mod acl;
pub mod principal;
pub mod resource;
pub mod scope;
pub mod scram;
pub mod token;

pub use acl::{
    AclEntry, Decision, Operation, Pattern, Permission, Resource, ResourceKind, SecurityTable,
};
pub use principal::{Mechanism, Principal};
pub use token::{Claims, Scope, TokenError, TokenKey};
