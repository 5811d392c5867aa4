//! The registry's security operations: adding and removing ACLs, revoking
//! tokens, and handing out the table members decide requests with.

use strom_auth::{AclEntry, SecurityTable};
use strom_proto::ErrorCode;

use super::machine::RegistryCommand;
use super::security_machine::SecurityCommand;
use super::Registry;
use crate::error::ServerError;

impl Registry {
    /// Adds (`add`) or removes ACL entries.
    pub async fn alter_acls(&self, add: bool, entries: Vec<AclEntry>) -> Result<(), ServerError> {
        for e in &entries {
            e.check()
                .map_err(|m| ServerError::coded(ErrorCode::INVALID_ARGUMENT, m))?;
        }
        let cmd = match add {
            true => SecurityCommand::AddAcls { entries },
            false => SecurityCommand::RemoveAcls { entries },
        };
        self.commit_security(cmd).await
    }

    /// Revokes the token with id `id` for the rest of its life.
    pub async fn revoke_token(&self, id: String) -> Result<(), ServerError> {
        if id.is_empty() || id.len() > 128 {
            return Err(ServerError::coded(
                ErrorCode::INVALID_ARGUMENT,
                "a token id is 1 to 128 characters",
            ));
        }
        self.commit_security(SecurityCommand::RevokeToken { id })
            .await
    }

    /// Changes a SCRAM user's credentials (`update` replaces them all, or
    /// sets and removes single mechanisms), under the registry's lock so
    /// that concurrent changes of one user's mechanisms do not undo each
    /// other; a user left with none is removed.
    pub async fn set_scram(
        &self,
        user: String,
        update: strom_auth::scram::ScramUpdate,
    ) -> Result<(), ServerError> {
        let mut inner = self.inner.lock().await;
        let current = inner.state.security.scram.get(&user).cloned();
        let credentials = update.apply(current.as_deref().unwrap_or_default());
        let cmd = RegistryCommand::Security(SecurityCommand::SetScram { user, credentials });
        if let Err(e) = inner.state.check(&cmd) {
            return Err(ServerError::coded(ErrorCode::INVALID_ARGUMENT, e.0));
        }
        inner.commit(cmd).await?;
        self.security_changed(&inner.state.security);
        Ok(())
    }

    /// Sets what runs after every security change committed here (once;
    /// later calls are ignored).
    pub fn on_security_change(&self, hook: super::SecurityHook) {
        let _ = self.security_hook.set(hook);
    }

    fn security_changed(&self, table: &SecurityTable) {
        if let Some(hook) = self.security_hook.get() {
            hook(table);
        }
    }

    /// The security table.
    pub async fn security_table(&self) -> SecurityTable {
        self.inner.lock().await.state.security.clone()
    }

    async fn commit_security(&self, cmd: SecurityCommand) -> Result<(), ServerError> {
        let mut inner = self.inner.lock().await;
        if let Err(e) = inner.state.check(&RegistryCommand::Security(cmd.clone())) {
            return Err(ServerError::coded(ErrorCode::INVALID_ARGUMENT, e.0));
        }
        inner.commit(RegistryCommand::Security(cmd)).await?;
        self.security_changed(&inner.state.security);
        Ok(())
    }
}
