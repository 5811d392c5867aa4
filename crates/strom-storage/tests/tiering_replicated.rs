//! Tiering of a replicated partition (docs/tiering.md, "Replicated
//! topics"): two copies of one partition, a leader and a follower holding
//! byte-identical files (`append_replica`), share one directory tier under
//! one key prefix. The leader copies closed segments below its high
//! watermark; the follower records a segment only once the tier holds a
//! copy identical to its own files, and drops only those locally. A
//! missing, partial, damaged or not-yet-committed copy never lets the
//! follower drop a segment; a new leader copies again what the old one left
//! half done, once per segment; the follower never deletes tier objects;
//! and a crash at every step of a follower's pass (simulated disk, the
//! leader's puts not yet durable in the tier's directory) never leaves a
//! local segment dropped that the tier does not durably hold.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::TestBatch;
use strom_storage::sim::{SimFs, SimRng};
use strom_storage::tier::{DirTier, TierRole, TierSettings, TierStore, TieredLog};
use strom_storage::vfs::{RealFs, Vfs};
use strom_storage::{AppendBatch, LogConfig, PartitionLog, ReplicaBatch};

const PREFIX: &str = "topic.1/0";

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

fn open(dir: &Path, store: &Arc<dyn TierStore>, role: TierRole) -> TieredLog {
    open_on(Arc::new(RealFs), dir, store, role, true)
}

fn open_on(
    vfs: Arc<dyn Vfs>,
    dir: &Path,
    store: &Arc<dyn TierStore>,
    role: TierRole,
    create: bool,
) -> TieredLog {
    let settings = TierSettings {
        prefix: PREFIX.into(),
        local_retention_bytes: Some(0),
        cache_segments: 2,
        role,
        ..TierSettings::default()
    };
    TieredLog::open_with(vfs, dir, config(), create, store.clone(), settings).unwrap()
}

/// A leader and a follower of one partition, in `base`, sharing the tier
/// in `base/tier`; `n` batches appended on the leader and copied to the
/// follower, both sealed.
struct Pair {
    tier: PathBuf,
    leader: TieredLog,
    follower: TieredLog,
}

fn pair(base: &Path, n: u64) -> Pair {
    let tier = base.join("tier");
    let store: Arc<dyn TierStore> = Arc::new(DirTier::new(&tier).unwrap());
    let leader = open(&base.join("l"), &store, TierRole::Leader { below: 0 });
    let follower = open(&base.join("f"), &store, TierRole::Follower { below: 0 });
    append(&leader, n);
    copy_to(&leader, &follower);
    for log in [&leader, &follower] {
        log.sync_all().unwrap();
        log.seal_rolled().unwrap();
    }
    Pair {
        tier: tier.join(PREFIX),
        leader,
        follower,
    }
}

fn append(log: &TieredLog, n: u64) {
    for i in 0..n {
        let b = TestBatch::standard(i);
        log.append(AppendBatch {
            count: b.count,
            meta: &b.meta,
            data: &b.data,
        })
        .unwrap();
    }
}

/// What a follower's fetches do: the leader's batches, as read, stored at
/// the leader's offsets with its timestamps.
fn copy_to(leader: &TieredLog, follower: &TieredLog) {
    let mut from = follower.next_offset();
    while from < leader.next_offset() {
        for b in leader.read(from, 64 << 10).unwrap() {
            let mut data = Vec::new();
            leader
                .read_data(b.base_offset, &[(0, b.data_len)], &mut data)
                .unwrap();
            follower
                .append_replica(ReplicaBatch {
                    base_offset: b.base_offset,
                    count: b.count,
                    timestamp_us: b.timestamp_us,
                    meta: &b.meta,
                    data: &data,
                })
                .unwrap();
            from = b.base_offset + u64::from(b.count);
        }
    }
}

/// Base offsets of the objects ending with `.ext` in the tier.
fn objects(tier: &Path, ext: &str) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(tier) else {
        return Vec::new();
    };
    let mut out: Vec<u64> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(&format!(".{ext}"))?.parse().ok()
        })
        .collect();
    out.sort_unstable();
    out
}

/// Temporary objects (puts cut short) in the tier.
fn temporaries(tier: &Path) -> usize {
    std::fs::read_dir(tier).map_or(0, |d| {
        d.filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .count()
    })
}

/// Reads every batch of `log` from offset 0, meta and data.
fn reads_everything(log: &TieredLog) {
    assert_eq!(log.first_offset(), 0);
    let mut from = 0;
    while from < log.next_offset() {
        for b in log.read(from, 1024).unwrap() {
            let mut out = Vec::new();
            log.read_data(b.base_offset, &[(0, b.data_len)], &mut out)
                .unwrap();
            from = b.base_offset + u64::from(b.count);
        }
    }
}

fn key_path(tier: &Path, base: u64, ext: &str) -> PathBuf {
    tier.join(format!("{base:020}.{ext}"))
}

/// Every batch of `log` from offset 0: base offset, meta, data.
fn all_batches(log: &TieredLog) -> Vec<(u64, Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut from = log.first_offset();
    while from < log.next_offset() {
        for b in log.read(from, 1024).unwrap() {
            let mut data = Vec::new();
            log.read_data(b.base_offset, &[(0, b.data_len)], &mut data)
                .unwrap();
            out.push((b.base_offset, b.meta.to_vec(), data.concat()));
            from = b.base_offset + u64::from(b.count);
        }
    }
    out
}

/// Every batch of `log` read from offset 0 equals the leader's.
fn same_batches(log: &TieredLog, leader: &TieredLog) {
    assert_eq!(log.first_offset(), 0);
    assert!(all_batches(log) == all_batches(leader), "the copies differ");
}

#[test]
fn a_follower_never_drops_a_segment_the_tier_does_not_have() {
    let base = tempfile::tempdir().unwrap();
    let p = pair(base.path(), 120);
    let closed = p.follower.local().closed_segments();
    assert!(closed.len() >= 5, "segments rolled ({})", closed.len());
    let local = p.follower.local().stats().segments;
    p.follower
        .set_tier_role(TierRole::Follower { below: u64::MAX });

    // Nothing in the tier: nothing recorded, nothing dropped.
    assert_eq!(p.follower.copy_all().unwrap(), 0);
    assert_eq!(p.follower.local().stats().segments, local);

    // A damaged copy of the same length, and a half-written one (a put cut
    // short: its temporary object, and a `.log` without its `.data`).
    std::fs::create_dir_all(&p.tier).unwrap();
    let first = &closed[0];
    let mut log = std::fs::read(&first.log_path).unwrap();
    log[10] ^= 0xff;
    std::fs::write(key_path(&p.tier, first.base, "log"), &log).unwrap();
    std::fs::copy(&first.data_path, key_path(&p.tier, first.base, "data")).unwrap();
    let second = &closed[1];
    std::fs::copy(&second.log_path, key_path(&p.tier, second.base, "log")).unwrap();
    let data = std::fs::read(&second.data_path).unwrap();
    std::fs::write(
        key_path(&p.tier, second.base, "data.tmp"),
        &data[..data.len() / 2],
    )
    .unwrap();
    assert_eq!(p.follower.copy_all().unwrap(), 0);
    assert_eq!(p.follower.local().stats().segments, local);
    assert!(p.follower.manifest().segments.is_empty());

    // The leader copies the segments below its high watermark only (here
    // the end of the third closed segment): the follower records those
    // three and drops them, and keeps the rest.
    let hwm = closed[2].next;
    p.leader.set_tier_role(TierRole::Leader { below: hwm });
    assert_eq!(p.leader.copy_all().unwrap(), 3);
    assert_eq!(p.follower.copy_all().unwrap(), 3);
    assert_eq!(p.follower.local().first_offset(), hwm);
    assert_eq!(p.follower.local().stats().segments, local - 3);

    // Once the leader's high watermark moves, the follower records only up
    // to the one it knows.
    p.leader.set_tier_role(TierRole::Leader { below: u64::MAX });
    let copied = p.leader.copy_all().unwrap();
    assert_eq!(copied as usize, closed.len() - 3);
    p.follower.set_tier_role(TierRole::Follower {
        below: closed[3].next,
    });
    assert_eq!(p.follower.copy_all().unwrap(), 1);
    assert_eq!(p.follower.local().first_offset(), closed[3].next);
    same_batches(&p.follower, &p.leader);

    // A cut inside a segment only in the tier is refused; a cut in the
    // local segments leaves every tier object in place.
    assert!(p.follower.truncate_from(1).is_err());
    let before = objects(&p.tier, "log");
    let end = p.follower.next_offset();
    p.follower.truncate_from(end - 1).unwrap();
    assert_eq!(objects(&p.tier, "log"), before);
    assert_eq!(p.follower.manifest().segments.len(), 4);
}

#[test]
fn a_new_leader_copies_again_what_the_old_one_left_half_done_once_per_segment() {
    let base = tempfile::tempdir().unwrap();
    let p = pair(base.path(), 120);
    let closed = p.leader.local().closed_segments();
    // The old leader copied two segments, then died putting the third:
    // its `.log` is in the tier, its `.data` only half, as a temporary.
    p.leader.set_tier_role(TierRole::Leader {
        below: closed[1].next,
    });
    assert_eq!(p.leader.copy_all().unwrap(), 2);
    let third = &closed[2];
    std::fs::copy(&third.log_path, key_path(&p.tier, third.base, "log")).unwrap();
    let data = std::fs::read(&third.data_path).unwrap();
    std::fs::write(
        key_path(&p.tier, third.base, "data.tmp"),
        &data[..data.len() / 3],
    )
    .unwrap();
    drop(p.leader);

    // The follower had recorded the first segment only; it now leads.
    p.follower.set_tier_role(TierRole::Follower {
        below: closed[0].next,
    });
    assert_eq!(p.follower.copy_all().unwrap(), 1);
    p.follower
        .set_tier_role(TierRole::Leader { below: u64::MAX });
    let copied = p.follower.copy_all().unwrap() as usize;
    assert_eq!(copied, closed.len() - 1, "every later segment copied");

    // Each segment once in the tier, no temporary object left, no gap.
    let m = p.follower.manifest();
    let bases: Vec<u64> = m.segments.iter().map(|s| s.base).collect();
    assert_eq!(objects(&p.tier, "log"), bases);
    assert_eq!(objects(&p.tier, "data"), bases);
    assert_eq!(temporaries(&p.tier), 0, "a temporary object left");
    assert_eq!(bases[0], 0);
    assert!(m.segments.windows(2).all(|w| w[0].next == w[1].base));
    assert_eq!(
        p.follower.local().stats().segments,
        1,
        "only the active one"
    );
    reads_everything(&p.follower);
}

const SIM_TIER: &str = "/tier";

fn sim_open(fs: &SimFs, dir: &str, role: TierRole, create: bool) -> TieredLog {
    let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
    let store: Arc<dyn TierStore> =
        Arc::new(DirTier::with_vfs(vfs.clone(), Path::new(SIM_TIER)).unwrap());
    open_on(vfs, Path::new(dir), &store, role, create)
}

/// What a leader killed between the rename of its put and the fsync of
/// the tier directory leaves: every closed segment's objects in place, in
/// the page cache, their directory entries not durable.
fn put_without_directory_fsync(fs: &SimFs, leader: &TieredLog) {
    let tier = Path::new(SIM_TIER).join(PREFIX);
    for dir in [tier.parent().unwrap(), &tier] {
        fs.create_dir(dir).unwrap();
        fs.sync_dir(dir.parent().unwrap()).unwrap();
    }
    for seg in leader.local().closed_segments() {
        for (path, ext) in [(&seg.log_path, "log"), (&seg.data_path, "data")] {
            let bytes = fs.open(path, false).and_then(|f| {
                let mut b = vec![0u8; f.len()? as usize];
                f.read_exact_at(&mut b, 0).map(|()| b)
            });
            let bytes = bytes.unwrap();
            let key = key_path(&tier, seg.base, ext);
            let tmp = PathBuf::from(format!("{}.tmp", key.display()));
            let f = fs.open(&tmp, true).unwrap();
            f.write_all_at(&[&bytes[..]], 0).unwrap();
            f.sync_data().unwrap();
            fs.rename(&tmp, &key).unwrap();
        }
    }
}

/// Crashes the follower's first pass after `ops` mutating operations;
/// returns whether the crash point was reached.
fn crash_during_adoption(ops: u64, seed: u64) -> bool {
    let fs = SimFs::new();
    let leader = sim_open(&fs, "/data/l", TierRole::Leader { below: 0 }, true);
    let follower = sim_open(&fs, "/data/f", TierRole::Follower { below: 0 }, true);
    append(&leader, 40);
    copy_to(&leader, &follower);
    for log in [&leader, &follower] {
        log.sync_all().unwrap();
        log.seal_rolled().unwrap();
    }
    put_without_directory_fsync(&fs, &leader);
    let closed = follower.local().closed_segments().len();
    follower.set_tier_role(TierRole::Follower { below: u64::MAX });
    fs.crash_after(ops);
    let _ = follower.copy_all();
    let crashed = fs.crashed();
    drop((leader, follower));
    let image = fs.crash_image(&mut SimRng::new(seed));
    let leader = sim_open(&image, "/data/l", TierRole::Leader { below: 0 }, false);
    let follower = sim_open(&image, "/data/f", TierRole::Follower { below: 0 }, false);
    // Whatever the follower dropped is durably in the tier: all readable.
    same_batches(&follower, &leader);
    // The leader (restarted, or a new one) copies what it never recorded.
    leader.set_tier_role(TierRole::Leader { below: u64::MAX });
    leader
        .copy_all()
        .unwrap_or_else(|e| panic!("ops {ops} seed {seed}: {e}"));
    follower.set_tier_role(TierRole::Follower { below: u64::MAX });
    follower
        .copy_all()
        .unwrap_or_else(|e| panic!("ops {ops} seed {seed}: {e}"));
    let recorded = follower.manifest().segments.len();
    assert_eq!(
        recorded, closed,
        "ops {ops} seed {seed}: the next pass records the rest"
    );
    same_batches(&follower, &leader);
    crashed
}

#[test]
fn crash_at_every_step_of_recording_never_drops_a_segment_not_durably_in_the_tier() {
    let mut ops = 1;
    while crash_during_adoption(ops, ops) {
        crash_during_adoption(ops, ops ^ 0x5eed);
        ops += 1;
    }
    assert!(ops > 20, "the pass has many crash points ({ops})");
    eprintln!(
        "crashed the follower's pass at each of {} operations",
        ops - 1
    );
}
