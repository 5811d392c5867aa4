//! The registry's security table (docs/security.md): ACL entries and
//! revoked token ids, replicated with the rest of the registry. Every
//! change bumps the table's version, which members compare to fetch a
//! fresh copy. Pure, as the rest of the machine.

use serde::{Deserialize, Serialize};
use strom_auth::acl::MAX_ENTRIES;
use strom_auth::AclEntry;

use super::machine::{RegistryState, Rejected};

/// A change to the security table.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum SecurityCommand {
    AddAcls {
        entries: Vec<AclEntry>,
    },
    RemoveAcls {
        entries: Vec<AclEntry>,
    },
    RevokeToken {
        id: String,
    },
    /// A SCRAM user's credentials (none: the user is removed).
    SetScram {
        user: String,
        credentials: Vec<strom_auth::scram::ScramCredential>,
    },
}

pub(super) fn check(state: &RegistryState, cmd: &SecurityCommand) -> Result<(), Rejected> {
    let t = &state.security;
    match cmd {
        SecurityCommand::AddAcls { entries } => {
            for e in entries {
                e.check().map_err(Rejected)?;
            }
            if t.acls.len() + entries.len() > MAX_ENTRIES {
                return Err(Rejected(format!(
                    "a group holds at most {MAX_ENTRIES} ACLs"
                )));
            }
        }
        SecurityCommand::RemoveAcls { .. } => {}
        SecurityCommand::SetScram { user, credentials } => {
            if user.is_empty()
                || user.len() > 256
                || user.chars().any(|c| c.is_control() || c == ':')
            {
                return Err(Rejected(
                    "a user name is 1 to 256 printable characters without ':'".into(),
                ));
            }
            for c in credentials {
                c.check().map_err(Rejected)?;
            }
            if credentials.len() > 2 || t.scram.len() >= MAX_ENTRIES {
                return Err(Rejected(
                    "one credential per SCRAM mechanism, and at most 100000 users".into(),
                ));
            }
        }
        SecurityCommand::RevokeToken { id } => {
            if id.is_empty() || id.len() > 128 {
                return Err(Rejected("a token id is 1 to 128 characters".into()));
            }
            if t.revoked.len() >= MAX_ENTRIES {
                return Err(Rejected(format!(
                    "a group holds at most {MAX_ENTRIES} revoked tokens"
                )));
            }
        }
    }
    Ok(())
}

pub(super) fn apply(state: &mut RegistryState, cmd: &SecurityCommand) {
    let t = &mut state.security;
    match cmd {
        SecurityCommand::AddAcls { entries } => t.acls.extend(entries.iter().cloned()),
        SecurityCommand::RemoveAcls { entries } => {
            for e in entries {
                t.acls.remove(e);
            }
        }
        SecurityCommand::RevokeToken { id } => {
            t.revoked.insert(id.clone());
        }
        SecurityCommand::SetScram { user, credentials } if credentials.is_empty() => {
            t.scram.remove(user);
        }
        SecurityCommand::SetScram { user, credentials } => {
            t.scram.insert(user.clone(), credentials.clone());
        }
    }
    t.version += 1;
}
