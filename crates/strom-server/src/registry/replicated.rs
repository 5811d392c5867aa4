//! The registry's state machine as a [`strom_meta::Machine`], so the
//! metadata quorum (issue 17, docs/replication.md) can replicate it: the
//! same [`RegistryCommand`]s the master appends to `registry.log` today,
//! encoded as the log's JSON, applied with [`RegistryState::apply`] (which
//! checks first and changes nothing on a refusal), and snapshotted as
//! `registry.snapshot`'s JSON. Not yet used by the running server: the
//! registry still commits through its own store (`store.rs`).

use strom_meta::Machine;

use super::machine::{Persisted, RegistryCommand, RegistryState};

/// Encodes a command for [`strom_meta::Meta::propose`].
pub fn encode(cmd: &RegistryCommand) -> Vec<u8> {
    serde_json::to_vec(cmd).expect("a registry command encodes as JSON (registry.log does)")
}

/// The registry state, applied from the quorum's log.
#[derive(Default)]
pub struct RegistryMachine {
    state: RegistryState,
}

impl RegistryMachine {
    pub fn state(&self) -> &RegistryState {
        &self.state
    }
}

impl Machine for RegistryMachine {
    fn apply(&mut self, cmd: &[u8]) -> Result<Vec<u8>, String> {
        let cmd: RegistryCommand = serde_json::from_slice(cmd)
            .map_err(|e| format!("a registry command that does not decode: {e}"))?;
        self.state.apply(&cmd).map_err(|r| r.0)?;
        Ok(Vec::new())
    }

    fn snapshot(&self) -> Vec<u8> {
        // The same encoding `registry.snapshot` uses; an empty snapshot
        // would silently drop the registry, so a failure here is a bug.
        serde_json::to_vec(&self.state.to_persisted())
            .expect("the registry state encodes as JSON (registry.snapshot does)")
    }

    fn restore(&mut self, snap: &[u8]) -> Result<(), String> {
        let p: Persisted = serde_json::from_slice(snap)
            .map_err(|e| format!("a registry snapshot that does not decode: {e}"))?;
        self.state = RegistryState::from_persisted(p).map_err(|e| e.0)?;
        Ok(())
    }
}
