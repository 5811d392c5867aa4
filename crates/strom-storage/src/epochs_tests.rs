use std::path::Path;

use super::*;
use crate::sim::{SimFs, SimRng};

const PATH: &str = "/p0/leader-epochs";

fn disk() -> SimFs {
    let fs = SimFs::new();
    fs.create_dir(Path::new("/p0")).unwrap();
    fs.sync_dir(Path::new("/")).unwrap();
    fs
}

fn open(fs: &SimFs) -> Result<EpochHistory> {
    EpochHistory::open(Arc::new(fs.clone()), Path::new(PATH))
}

fn pairs(h: &EpochHistory) -> Vec<(u64, u64)> {
    h.entries()
        .iter()
        .map(|e| (e.epoch, e.start_offset))
        .collect()
}

fn write_file(fs: &SimFs, bytes: &[u8]) {
    let f = fs.open(Path::new(PATH), true).unwrap();
    f.set_len(0).unwrap();
    f.write_all_at(&[bytes], 0).unwrap();
    f.sync_data().unwrap();
    fs.sync_dir(Path::new("/p0")).unwrap();
}

#[test]
fn end_offset_for_answers_as_offsets_for_leader_epoch() {
    let fs = disk();
    let h = open(&fs).unwrap();
    assert_eq!(h.end_offset_for(3, 10), None, "no epoch known");
    h.assign(1, 0).unwrap();
    h.assign(2, 5).unwrap();
    h.assign(4, 9).unwrap();
    assert_eq!(h.end_offset_for(0, 12), None, "older than every epoch");
    assert_eq!(h.end_offset_for(1, 12), Some((1, 5)));
    assert_eq!(h.end_offset_for(2, 12), Some((2, 9)));
    assert_eq!(
        h.end_offset_for(3, 12),
        Some((2, 9)),
        "an unknown epoch answers for the largest one below it"
    );
    assert_eq!(
        h.end_offset_for(4, 12),
        Some((4, 12)),
        "latest ends at the log end"
    );
    assert_eq!(h.end_offset_for(9, 12), Some((4, 12)));
    assert_eq!(
        h.latest(),
        Some(EpochEntry {
            epoch: 4,
            start_offset: 9
        })
    );
}

#[test]
fn assign_refuses_going_back_and_repeats_are_no_ops() {
    let fs = disk();
    let h = open(&fs).unwrap();
    h.assign(2, 5).unwrap();
    h.assign(2, 5).unwrap();
    assert_eq!(pairs(&h), vec![(2, 5)], "a repeated assign adds nothing");
    for (epoch, start) in [(2, 6), (1, 7), (3, 4)] {
        let e = h.assign(epoch, start).unwrap_err();
        assert_eq!(e.code(), 308, "assign({epoch}, {start}): {e}");
    }
    h.assign(3, 5).unwrap();
    assert_eq!(pairs(&h), vec![(2, 5), (3, 5)]);
    assert_eq!(pairs(&open(&fs).unwrap()), vec![(2, 5), (3, 5)]);
}

#[test]
fn assign_and_truncate_survive_reopen() {
    let fs = disk();
    let h = open(&fs).unwrap();
    for (epoch, start) in [(1, 0), (2, 5), (3, 5), (5, 20)] {
        h.assign(epoch, start).unwrap();
    }
    assert_eq!(pairs(&open(&fs).unwrap()), pairs(&h));
    h.truncate_from(21).unwrap();
    assert_eq!(pairs(&h).len(), 4, "no entry starts at or past 21");
    h.truncate_from(5).unwrap();
    assert_eq!(pairs(&h), vec![(1, 0)]);
    let h = open(&fs).unwrap();
    assert_eq!(pairs(&h), vec![(1, 0)], "truncation is durable");
    h.assign(6, 5).unwrap();
    assert_eq!(pairs(&open(&fs).unwrap()), vec![(1, 0), (6, 5)]);
}

fn valid_file() -> Vec<u8> {
    encode(&[
        EpochEntry {
            epoch: 1,
            start_offset: 0,
        },
        EpochEntry {
            epoch: 2,
            start_offset: 5,
        },
    ])
}

#[test]
fn any_damaged_byte_or_cut_is_corrupt_not_a_panic() {
    let good = valid_file();
    for i in 0..good.len() {
        for bit in [0x01u8, 0x80] {
            let mut bad = good.clone();
            bad[i] ^= bit;
            let fs = disk();
            write_file(&fs, &bad);
            let e = open(&fs)
                .err()
                .unwrap_or_else(|| panic!("byte {i} bit {bit:#x}"));
            assert_eq!(e.code(), 301, "byte {i}: {e}");
        }
    }
    for len in 0..good.len() {
        let fs = disk();
        write_file(&fs, &good[..len]);
        assert_eq!(open(&fs).err().map(|e| e.code()), Some(301), "cut to {len}");
    }
    let fs = disk();
    write_file(&fs, &good);
    assert_eq!(pairs(&open(&fs).unwrap()), vec![(1, 0), (2, 5)]);
}

#[test]
fn well_framed_but_invalid_content_is_corrupt() {
    let framed = |index: u64, payload: &[u8]| {
        let mut b = record::file_header(MAGIC).to_vec();
        b.extend_from_slice(&record::encode(index, payload));
        b
    };
    let entry = |epoch: u64, start: u64| {
        let mut b = epoch.to_le_bytes().to_vec();
        b.extend_from_slice(&start.to_le_bytes());
        b
    };
    let cases = [
        ("17-byte payload", framed(1, &[0u8; 17])),
        ("count disagrees", framed(3, &entry(1, 0))),
        (
            "epochs go back",
            framed(2, &[entry(2, 0), entry(1, 5)].concat()),
        ),
        (
            "epoch repeated",
            framed(2, &[entry(2, 0), entry(2, 5)].concat()),
        ),
        (
            "starts go back",
            framed(2, &[entry(1, 5), entry(2, 4)].concat()),
        ),
        ("wrong magic", {
            let mut b = framed(1, &entry(1, 0));
            b[..4].copy_from_slice(b"STRQ");
            b
        }),
    ];
    for (what, bytes) in cases {
        let fs = disk();
        write_file(&fs, &bytes);
        let e = open(&fs).err().unwrap_or_else(|| panic!("{what} accepted"));
        assert_eq!(e.code(), 301, "{what}: {e}");
    }
}

#[test]
fn an_oversized_file_is_refused_before_it_is_read() {
    let fs = disk();
    write_file(&fs, &valid_file());
    let f = fs.open(Path::new(PATH), true).unwrap();
    f.set_len(MAX_FILE_LEN + 1).unwrap();
    fs.reset_read_counters();
    let e = open(&fs).err().unwrap();
    assert_eq!(e.code(), 301, "{e}");
    assert_eq!(fs.bytes_read("leader-epochs"), 0, "nothing read");
}

#[test]
fn power_loss_during_assign_or_truncate_leaves_old_or_new_history() {
    for step in 0..40u64 {
        for seed in 0..4 {
            let fs = disk();
            let h = open(&fs).unwrap();
            h.assign(1, 0).unwrap();
            h.assign(2, 5).unwrap();
            fs.crash_after(step);
            let (old, new) = if step % 2 == 0 {
                let _ = h.assign(3, 9);
                (vec![(1, 0), (2, 5)], vec![(1, 0), (2, 5), (3, 9)])
            } else {
                let _ = h.truncate_from(5);
                (vec![(1, 0), (2, 5)], vec![(1, 0)])
            };
            let img = fs.crash_image(&mut SimRng::new(seed));
            let got = pairs(&open(&img).unwrap_or_else(|e| panic!("step {step} seed {seed}: {e}")));
            assert!(
                got == old || got == new,
                "step {step} seed {seed}: {got:?} is neither {old:?} nor {new:?}"
            );
        }
    }
}
