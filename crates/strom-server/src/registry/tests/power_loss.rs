//! Power loss at a random point of a registry's life, on a simulated disk
//! that drops or tears every write not yet synced, with injected I/O errors
//! and frequent compactions: every command whose append returned `Ok`
//! survives, a failed append leaves nothing behind, and the files always
//! reopen. `STROM_SIM_SEED=s` replays one seed.

use strom_storage::sim::{Fault, FaultOp, SimFs};

use super::*;

const EIO: i32 = 5;

fn run(seed: u64) {
    let mut rng = SimRng::new(seed);
    let fs = SimFs::new();
    let dir = sim_dir(&fs);
    let limits = Limits {
        records: 1 + rng.below(8),
        bytes: 200 + rng.below(3_000),
    };
    fs.crash_after(rng.below(160));
    // The acknowledged state, and the one a command in flight would give.
    let mut acked = RegistryState::default();
    let mut in_flight: Option<RegistryState> = None;
    if let Ok((mut store, st)) = Store::open(Arc::new(fs.clone()), dir, limits) {
        acked = st;
        let mut first = Some(RegistryCommand::MemberJoined {
            id: 0,
            addr: "m0".into(),
        });
        for _ in 0..60 {
            let cmd = first
                .take()
                .unwrap_or_else(|| random_command(&acked, &mut rng));
            let mut next = acked.clone();
            if next.apply(&cmd).is_err() {
                continue;
            }
            if rng.below(8) == 0 {
                fs.inject(Fault {
                    op: if rng.below(2) == 0 {
                        FaultOp::Write
                    } else {
                        FaultOp::Sync
                    },
                    errno: EIO,
                    path_contains: "registry".into(),
                    times: Some(1),
                });
            }
            match store.append(&cmd) {
                Ok(_) => {
                    acked = next;
                    if store.compaction_due() {
                        let _ = store.compact(&acked);
                    }
                }
                Err(_) if fs.crashed() => {
                    in_flight = Some(next);
                    break;
                }
                Err(_) => {
                    if acked.members.is_empty() {
                        first = Some(cmd);
                    }
                }
            }
        }
    }
    let image = fs.crash_image(&mut rng);
    let (mut store, mut st) = Store::open(Arc::new(image.clone()), dir, limits)
        .unwrap_or_else(|e| panic!("seed {seed}: the registry does not reopen: {e}"));
    assert!(
        st == acked || Some(&st) == in_flight.as_ref(),
        "seed {seed}: recovered {st:?}\nacknowledged {acked:?}\nin flight {in_flight:?}"
    );
    // The recovered registry takes new commands, and they survive too.
    let cmd = RegistryCommand::MemberJoined {
        id: 9,
        addr: "after".into(),
    };
    commit(&mut store, &mut st, cmd);
    drop(store);
    let again = image.crash_image(&mut rng);
    let (_, reread) = Store::open(Arc::new(again), dir, limits).unwrap();
    assert_eq!(reread, st, "seed {seed}");
}

#[test]
fn acknowledged_commands_survive_power_loss_at_any_point() {
    if let Some(seed) = std::env::var("STROM_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return run(seed);
    }
    for seed in 0..400 {
        run(seed);
    }
}
