//! With `always` durability, an append is acknowledged only after its
//! fdatasync: a partition manager over a simulated disk acks a stream of
//! batches, then the machine loses power at once (every write not yet
//! synced is dropped or torn), and every acknowledged batch must be found,
//! intact, at its offset. Replying before the syncer has run fails this.

use std::path::Path;
use std::sync::{mpsc, Arc};

use bytes::Bytes;
use strom_proto::{BatchBuilder, Durability, TopicSpec};
use strom_storage::sim::{SimFs, SimRng};
use strom_storage::vfs::Vfs;
use strom_storage::{Appended, FileLog, LogConfig, OffsetStore, PartitionLog};

use super::PartitionManager;
use crate::batch::ValidBatch;

const DIR: &str = "/p";

fn batch(i: u64) -> (Bytes, Vec<Bytes>) {
    let data = Bytes::from(vec![i as u8; 100 + (i as usize % 7) * 50]);
    let mut b = BatchBuilder::new();
    b.push(format!("{{\"i\":{i}}}").as_bytes(), &[], data.len() as u64);
    (b.finish(), vec![data])
}

#[test]
fn acks_with_always_come_after_fdatasync() {
    for seed in 0..20u64 {
        let fs = SimFs::new();
        let vfs: Arc<dyn Vfs> = Arc::new(fs.clone());
        let log = FileLog::create_with(vfs, Path::new(DIR), LogConfig::default()).unwrap();
        let mut spec = TopicSpec::new("t", 1);
        spec.durability = Durability::Always;
        let parts = crate::partition::Parts {
            log: Arc::new(log),
            offsets: OffsetStore::in_memory(),
            mem: None,
            block_bound: None,
            dir: None,
        };
        let pm = PartitionManager::start(&spec, 0, parts, false).unwrap();
        let (tx, rx) = mpsc::channel::<(u64, Appended)>();
        for i in 0..40u64 {
            let (meta, data) = batch(i);
            let tx = tx.clone();
            let batch = ValidBatch::check(1, meta, data).unwrap();
            pm.append(
                batch,
                Box::new(move |r| {
                    let _ = tx.send((i, r.expect("append")));
                }),
            );
        }
        // Power is lost as soon as the last ack arrives, before any later sync.
        let acked: Vec<(u64, Appended)> = (0..40).map(|_| rx.recv().unwrap()).collect();
        let image = fs.crash_image(&mut SimRng::new(seed));
        let vfs: Arc<dyn Vfs> = Arc::new(image);
        let after = FileLog::open_with(vfs, Path::new(DIR), LogConfig::default()).unwrap();
        for (i, a) in acked {
            let got = after
                .read(a.base_offset, 1)
                .unwrap_or_else(|e| panic!("seed {seed}: acked batch {i} unreadable: {e}"));
            let first = got.first().unwrap_or_else(|| {
                panic!("seed {seed}: acked batch {i} at {} was lost", a.base_offset)
            });
            assert_eq!(first.base_offset, a.base_offset, "seed {seed}");
            assert_eq!(first.meta, batch(i).0, "seed {seed}: batch {i}");
            let mut data = Vec::new();
            after
                .read_data(a.base_offset, &[(0, first.data_len)], &mut data)
                .unwrap();
            assert_eq!(data.concat(), batch(i).1[0], "seed {seed}: data of {i}");
        }
        pm.shutdown();
    }
}
