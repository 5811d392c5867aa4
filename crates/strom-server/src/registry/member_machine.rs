//! The registry's record of members that leave (docs/elasticity.md):
//! members being drained (their partitions move away; no new topic is
//! placed on them) and members that left for good (their ids are never
//! given out again, and they may not rejoin). Pure, as the rest of the
//! machine.

use serde::{Deserialize, Serialize};

use super::machine::{RegistryState, Rejected};

/// A change to a member's place in the group.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum MemberCommand {
    /// Every partition moves off `id`; then it leaves. `dead`: it is gone
    /// already (`strom member remove`), so nothing is copied from it.
    Draining { id: u32, dead: bool },
    /// `id` holds nothing any more and leaves the group for good.
    Left { id: u32 },
}

pub(super) fn check(state: &RegistryState, cmd: &MemberCommand) -> Result<(), Rejected> {
    let (MemberCommand::Draining { id, .. } | MemberCommand::Left { id }) = cmd;
    if !state.members.contains_key(id) {
        return Err(Rejected(format!("there is no member {id}")));
    }
    if let MemberCommand::Left { id } = cmd {
        if let Some(t) = state.topics.values().find(|t| t.holders().contains_key(id)) {
            return Err(Rejected(format!(
                "member {id} still holds partitions of topic '{}'",
                t.spec.name
            )));
        }
    }
    Ok(())
}

pub(super) fn apply(state: &mut RegistryState, cmd: &MemberCommand) {
    match cmd {
        MemberCommand::Draining { id, dead } => {
            state.draining.insert(*id, *dead);
        }
        MemberCommand::Left { id } => {
            state.draining.remove(id);
            state.members.remove(id);
            state.removed.insert(*id);
        }
    }
}
