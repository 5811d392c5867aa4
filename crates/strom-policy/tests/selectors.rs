//! Partition selectors: round-robin cycles, hash is stable and pinned,
//! explicit partitions are honoured and range-checked.

use std::collections::HashSet;

use serde_json::json;
use strom_policy::{fnv1a64, hash_partition, MetadataInput, PolicyError, TopicPolicy};

fn partition_of(p: &TopicPolicy, md: MetadataInput, explicit: Option<u32>, n: u32) -> u32 {
    p.prepare(md, explicit, n).unwrap().0
}

#[test]
fn round_robin_cycles_through_all_partitions() {
    let p = TopicPolicy::new("none", None, "round-robin", "json").unwrap();
    let got: Vec<u32> = (0..7)
        .map(|_| partition_of(&p, "{}".into(), None, 3))
        .collect();
    assert_eq!(got, [0, 1, 2, 0, 1, 2, 0]);
}

#[test]
fn round_robin_is_shared_safely_across_threads() {
    let p = TopicPolicy::new("none", None, "round-robin", "json").unwrap();
    let counts = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut c = [0u32; 4];
                    for _ in 0..1000 {
                        c[partition_of(&p, "{}".into(), None, 4) as usize] += 1;
                    }
                    c
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .fold([0u32; 4], |mut acc, c| {
                for (a, b) in acc.iter_mut().zip(c) {
                    *a += b;
                }
                acc
            })
    });
    assert_eq!(counts, [1000; 4]);
}

#[test]
fn hash_values_are_pinned() {
    // If these change, every client in every language places keys differently.
    assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    assert_eq!(fnv1a64(b"user-1"), 0xf84b_a2aa_754a_4bd4);
    assert_eq!(hash_partition(&json!("foobar"), 10), 8);
    assert_eq!(hash_partition(&json!("foobar"), 7), 6);
    assert_eq!(hash_partition(&json!("user-1"), 1024), 980);
    assert_eq!(hash_partition(&json!(42), 10), 1);
    assert_eq!(hash_partition(&json!(42), 1024), 547);
    assert_eq!(hash_partition(&json!({"a": 1}), 1024), 177);
    assert_eq!(hash_partition(&json!(""), 7), 2);
    assert_eq!(hash_partition(&json!("été"), 10), 9);
    assert_eq!(hash_partition(&json!(true), 1024), 933);
}

#[test]
fn same_key_goes_to_same_partition() {
    let p = TopicPolicy::new("json", None, "hash:user", "json").unwrap();
    let a = partition_of(&p, r#"{"user":"alice","n":1}"#.into(), None, 16);
    let b = partition_of(&p, json!({"n": 2, "user": "alice"}).into(), None, 16);
    assert_eq!(a, b);
    assert_eq!(a, hash_partition(&json!("alice"), 16));
    let spread: HashSet<u32> = (0..200)
        .map(|i| partition_of(&p, json!({"user": format!("u{i}")}).into(), None, 16))
        .collect();
    assert!(spread.len() > 8, "hash should spread keys: {spread:?}");
}

#[test]
fn hash_field_may_be_a_json_pointer() {
    let p = TopicPolicy::new("none", None, "hash:/run/id", "json").unwrap();
    let got = partition_of(&p, r#"{"run":{"id":17}}"#.into(), None, 64);
    assert_eq!(got, hash_partition(&json!(17), 64));
}

#[test]
fn hash_without_field_or_on_non_object_is_a_selection_error() {
    let p = TopicPolicy::new("none", None, "hash:user", "json").unwrap();
    for md in [r#"{"name":"x"}"#, "[1]", "\"user\""] {
        let err = p.prepare(md.into(), None, 4).unwrap_err();
        assert!(matches!(err, PolicyError::Selection(_)), "{md}: {err:?}");
        assert_eq!(err.code(), 402);
    }
}

#[test]
fn explicit_partition_in_range_is_honoured() {
    let p = TopicPolicy::new("none", None, "explicit", "json").unwrap();
    assert_eq!(partition_of(&p, "{}".into(), Some(3), 4), 3);
    assert_eq!(partition_of(&p, "{}".into(), Some(0), 4), 0);
}

#[test]
fn explicit_partition_out_of_range_or_missing_is_rejected() {
    let p = TopicPolicy::new("none", None, "explicit", "json").unwrap();
    for explicit in [Some(4), Some(u32::MAX), None] {
        let err = p.prepare("{}".into(), explicit, 4).unwrap_err();
        assert!(
            matches!(err, PolicyError::Selection(_)),
            "{explicit:?}: {err:?}"
        );
    }
}

#[test]
fn explicit_partition_overrides_other_selectors() {
    let rr = TopicPolicy::new("none", None, "round-robin", "json").unwrap();
    assert_eq!(partition_of(&rr, "{}".into(), Some(2), 3), 2);
    assert_eq!(partition_of(&rr, "{}".into(), None, 3), 0);
    let hash = TopicPolicy::new("none", None, "hash:user", "json").unwrap();
    assert_eq!(partition_of(&hash, "{}".into(), Some(1), 3), 1);
    assert!(hash.prepare("{}".into(), Some(3), 3).is_err());
}

#[test]
fn zero_partitions_is_a_selection_error() {
    let p = TopicPolicy::new("none", None, "round-robin", "json").unwrap();
    assert_eq!(p.prepare("{}".into(), None, 0).unwrap_err().code(), 402);
}
