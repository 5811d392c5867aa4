//! The registry's quota operations (docs/quotas.md): setting and removing
//! a quota, and handing out the table members enforce.

use strom_proto::ErrorCode;

use super::machine::RegistryCommand;
use super::Registry;
use crate::error::ServerError;
use crate::quota::{QuotaChange, QuotaTable};

impl Registry {
    /// Sets or removes one quota.
    pub async fn alter_quota(&self, change: QuotaChange) -> Result<(), ServerError> {
        let cmd = RegistryCommand::Quota(change);
        let mut inner = self.inner.lock().await;
        if let Err(e) = inner.state.check(&cmd) {
            return Err(ServerError::coded(ErrorCode::INVALID_ARGUMENT, e.0));
        }
        inner.commit(cmd).await
    }

    /// The quota table.
    pub async fn quota_table(&self) -> QuotaTable {
        self.inner.lock().await.state.quotas.clone()
    }
}
