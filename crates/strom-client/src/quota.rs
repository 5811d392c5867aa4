//! The registry's quotas (docs/quotas.md), for `strom quota`: a change
//! and the table travel as the JSON of `strom_server::quota`'s types,
//! which the server checks.

use strom_proto::{Request, Response};

use crate::driver::Driver;
use crate::error::{unexpected, Result};

impl Driver {
    /// Sets or removes one quota (`json`: a `strom_server::quota::QuotaChange`).
    pub fn alter_quota(&self, json: String) -> Result<()> {
        self.admin(Request::AlterQuotas { json }).map(|_| ())
    }

    /// The group's quota table as JSON.
    pub fn quota_table(&self) -> Result<String> {
        match self.admin(Request::QuotaTable { have: u64::MAX })? {
            Response::QuotaTable { json, .. } => Ok(json),
            other => Err(unexpected(other)),
        }
    }
}
