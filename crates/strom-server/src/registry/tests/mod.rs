//! Tests of the registry: the pure machine, recovery of its files, power
//! loss on a simulated disk, and operations through a live [`Registry`].

mod leases;
mod machine;
mod moves;
mod partitioned;
mod power_loss;
mod recovery;
mod replicated;
mod through_registry;

use std::path::Path;
use std::sync::Arc;

use strom_proto::{ErrorCode, TopicSpec};
use strom_storage::sim::SimRng;
use strom_storage::vfs::{RealFs, Vfs};

use super::files::StoreError;
use super::machine::{RegistryCommand, RegistryState, TopicMeta};
use super::store::{Limits, Store};
use crate::error::ServerError;

/// What `Inner::commit` does, without the registry around it.
fn commit(store: &mut Store, state: &mut RegistryState, cmd: RegistryCommand) {
    state.check(&cmd).unwrap();
    store.append(&cmd).unwrap();
    state.apply_checked(&cmd);
    if store.compaction_due() {
        store.compact(state).unwrap();
    }
}

fn open_real(dir: &Path) -> Result<(Store, RegistryState), StoreError> {
    Store::open(Arc::new(RealFs), dir, Limits::default())
}

pub(super) fn create(state: &RegistryState, name: &str, placement: Vec<u32>) -> RegistryCommand {
    RegistryCommand::CreateTopic {
        meta: Box::new(TopicMeta {
            id: state.next_topic_id,
            spec: TopicSpec::new(name, placement.len() as u32),
            placement,
            producers: Default::default(),
            next_producer: 1,
            completed: false,
            leases: Default::default(),
            expired: Default::default(),
            replicas: Vec::new(),
        }),
    }
}

fn pick<'a, T>(rng: &mut SimRng, items: impl ExactSizeIterator<Item = &'a T>) -> Option<&'a T> {
    let n = items.len() as u64;
    if n == 0 {
        return None;
    }
    let i = rng.below(n) as usize;
    items.into_iter().nth(i)
}

/// A random command that applies to `st` (ids and placement chosen as an
/// operation would choose them). `st` must have at least one member.
fn random_command(st: &RegistryState, rng: &mut SimRng) -> RegistryCommand {
    use RegistryCommand as C;
    let members: Vec<u32> = st.members.keys().copied().collect();
    let open: Vec<&TopicMeta> = st.topics.values().filter(|t| !t.state().ended).collect();
    let any_topic = pick(rng, st.topics.values());
    let open_topic = pick(rng, open.iter()).copied();
    match rng.below(9) {
        0 if any_topic.is_some() => C::DeleteTopic {
            name: any_topic.map(|t| t.spec.name.clone()).unwrap_or_default(),
        },
        1 | 2 if open_topic.is_some() => {
            let t = open_topic.unwrap();
            C::RegisterProducer {
                topic: t.spec.name.clone(),
                producer: t.next_producer + rng.below(2),
                lease_ms: (rng.below(2) == 0).then_some(1000),
            }
        }
        3 if rng.below(2) == 0 => {
            match any_topic.and_then(|t| pick(rng, t.leases.keys()).map(|p| (t, *p))) {
                Some((t, p)) => C::ExpireProducer {
                    topic: t.spec.name.clone(),
                    producer: p,
                },
                None => C::MemberJoined {
                    id: rng.below(6) as u32,
                    addr: format!("10.0.0.{}:1", rng.below(250)),
                },
            }
        }
        3 => match any_topic.and_then(|t| pick(rng, t.producers.keys()).map(|p| (t, *p))) {
            Some((t, p)) => C::CloseProducer {
                topic: t.spec.name.clone(),
                producer: p,
            },
            None => C::MemberJoined {
                id: rng.below(6) as u32,
                addr: format!("10.0.0.{}:1", rng.below(250)),
            },
        },
        4 if any_topic.is_some() && rng.below(3) == 0 => C::CompleteTopic {
            topic: any_topic.map(|t| t.spec.name.clone()).unwrap_or_default(),
        },
        5 if open_topic.is_some() => C::AddPartitions {
            topic: open_topic.unwrap().spec.name.clone(),
            placement: (0..1 + rng.below(3))
                .map(|_| members[rng.below(members.len() as u64) as usize])
                .collect(),
            replicas: Vec::new(),
        },
        6 => C::MemberJoined {
            id: rng.below(6) as u32,
            addr: format!("10.0.0.{}:1", rng.below(250)),
        },
        7 => C::MemberAddress {
            id: members[rng.below(members.len() as u64) as usize],
            addr: format!("10.0.1.{}:2", rng.below(250)),
        },
        _ => {
            let n = 1 + rng.below(4) as usize;
            let placement = (0..n)
                .map(|_| members[rng.below(members.len() as u64) as usize])
                .collect();
            let mut cmd = create(st, &format!("t{}", rng.below(1_000_000)), placement);
            if let C::CreateTopic { meta } = &mut cmd {
                meta.id += rng.below(2);
            }
            cmd
        }
    }
}

/// A state with member 0 and `n` random commands applied.
fn random_history(seed: u64, n: usize) -> Vec<RegistryCommand> {
    let mut rng = SimRng::new(seed);
    let mut st = RegistryState::default();
    let mut out = vec![RegistryCommand::MemberJoined {
        id: 0,
        addr: "127.0.0.1:7000".into(),
    }];
    st.apply(&out[0]).unwrap();
    while out.len() < n {
        let cmd = random_command(&st, &mut rng);
        // A random name may collide with an existing topic; skip those.
        if st.apply(&cmd).is_ok() {
            out.push(cmd);
        }
    }
    out
}

fn assert_corrupt(err: &ServerError, file: &str) {
    assert_eq!(err.code(), ErrorCode::CORRUPT, "{err}");
    let text = err.to_string();
    assert!(text.contains(file), "the error should name {file}: {text}");
    assert!(
        text.contains("at byte"),
        "the error should give the offset: {text}"
    );
}

fn sim_dir(fs: &strom_storage::sim::SimFs) -> &'static Path {
    let dir = Path::new("/reg");
    if !fs.exists(dir).unwrap() {
        fs.create_dir(dir).unwrap();
        fs.sync_dir(Path::new("/")).unwrap();
    }
    dir
}
