//! The registry's security operations (docs/security.md), for `strom acl`
//! and `strom token`: ACL entries and the security table travel as the
//! JSON of `strom_auth`'s types, which the server checks.

use strom_proto::{Request, Response};

use crate::driver::Driver;
use crate::error::{unexpected, Result};

impl Driver {
    /// Adds (`add`) or removes the ACL entries of `json` (an array of
    /// `strom_auth::AclEntry`).
    pub fn alter_acls(&self, add: bool, json: String) -> Result<()> {
        self.admin(Request::AlterAcls { add, json }).map(|_| ())
    }

    /// The group's security table (ACLs and revoked token ids) as JSON.
    pub fn security_table(&self) -> Result<String> {
        match self.admin(Request::SecurityTable { have: u64::MAX })? {
            Response::SecurityTable { json, .. } => Ok(json),
            other => Err(unexpected(other)),
        }
    }

    /// Sets a SCRAM user's credentials for the Kafka port (`json`: an
    /// array of `strom_auth::scram::ScramCredential`; `[]` removes it).
    pub fn set_scram_user(&self, user: &str, json: String) -> Result<()> {
        self.admin(Request::SetScramUser {
            user: user.into(),
            json,
        })
        .map(|_| ())
    }

    /// How the registry master guards itself: `protected` (no auth,
    /// loopback and same-node only), `auth`, `insecure`, or `unknown`
    /// (a server older than protocol version 9).
    pub fn security_mode(&self) -> Result<&'static str> {
        let d = self.clone();
        let master = self.master_addr();
        let g = self.block_on(async move { Ok(d.conn(&master).await?.greeting()) })?;
        Ok(match g.security {
            1 => "protected",
            2 => "auth",
            3 => "insecure",
            _ => "unknown",
        })
    }

    /// Revokes the token whose id is `id`.
    pub fn revoke_token(&self, id: &str) -> Result<()> {
        self.admin(Request::RevokeToken { id: id.into() })
            .map(|_| ())
    }
}
