//! The parts of Kafka's *consumer* embedded protocol Strom reads: the
//! topics of a member's subscription and the partitions of its assignment
//! (`ConsumerProtocolSubscription` / `ConsumerProtocolAssignment`, every
//! version: both begin with a version, then the list this module wants).
//!
//! These bytes come from clients, opaque to the group protocol itself, so
//! they are parsed by hand with every count checked against the bytes
//! left; anything malformed is `None`.

use std::collections::BTreeMap;

/// A bounds-checked big-endian reader.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    /// An array count, refused if fewer than `min_item` bytes per item
    /// remain (so nothing is ever sized from an unchecked count).
    fn count(&mut self, min_item: usize) -> Option<usize> {
        let n = usize::try_from(self.i32()?).ok()?;
        (n.checked_mul(min_item)? <= self.0.len()).then_some(n)
    }

    fn string(&mut self) -> Option<String> {
        let n = usize::try_from(self.i16()?).ok()?;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

/// The topics a consumer subscribes to, or `None` if malformed.
pub fn subscribed_topics(subscription: &[u8]) -> Option<Vec<String>> {
    let mut c = Cursor(subscription);
    c.i16()?;
    let n = c.count(2)?;
    (0..n).map(|_| c.string()).collect()
}

/// The partitions assigned, by topic, or `None` if malformed. An empty
/// assignment (a member that got nothing, or none yet) is an empty map.
pub fn assigned_partitions(assignment: &[u8]) -> Option<BTreeMap<String, Vec<u32>>> {
    if assignment.is_empty() {
        return Some(BTreeMap::new());
    }
    let mut c = Cursor(assignment);
    c.i16()?;
    let topics = c.count(6)?;
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for _ in 0..topics {
        let topic = c.string()?;
        let n = c.count(4)?;
        let parts = out.entry(topic).or_default();
        for _ in 0..n {
            parts.push(u32::try_from(c.i32()?).ok()?);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as i16).to_be_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    /// A v1 subscription: version, topics, user data, owned partitions.
    fn subscription(topics: &[&str]) -> Vec<u8> {
        let mut b = 1i16.to_be_bytes().to_vec();
        b.extend_from_slice(&(topics.len() as i32).to_be_bytes());
        for t in topics {
            string(&mut b, t);
        }
        b.extend_from_slice(&(-1i32).to_be_bytes()); // no user data
        b.extend_from_slice(&0i32.to_be_bytes()); // no owned partitions
        b
    }

    fn assignment(parts: &[(&str, &[i32])]) -> Vec<u8> {
        let mut b = 0i16.to_be_bytes().to_vec();
        b.extend_from_slice(&(parts.len() as i32).to_be_bytes());
        for (t, ps) in parts {
            string(&mut b, t);
            b.extend_from_slice(&(ps.len() as i32).to_be_bytes());
            for p in *ps {
                b.extend_from_slice(&p.to_be_bytes());
            }
        }
        b.extend_from_slice(&(-1i32).to_be_bytes()); // no user data
        b
    }

    #[test]
    fn reads_subscribed_topics_and_assigned_partitions() {
        assert_eq!(
            subscribed_topics(&subscription(&["a", "runs"])),
            Some(vec!["a".to_string(), "runs".to_string()])
        );
        let a = assigned_partitions(&assignment(&[("runs", &[0, 3]), ("a", &[1])])).unwrap();
        assert_eq!(a["runs"], vec![0, 3]);
        assert_eq!(a["a"], vec![1]);
        assert_eq!(assigned_partitions(&[]), Some(BTreeMap::new()));
    }

    #[test]
    fn malformed_bytes_are_none_never_a_panic_or_a_huge_allocation() {
        let good = assignment(&[("runs", &[0, 1, 2])]);
        for cut in 1..good.len() - 4 {
            assert_eq!(assigned_partitions(&good[..cut]), None, "cut at {cut}");
        }
        let mut huge = 0i16.to_be_bytes().to_vec();
        huge.extend_from_slice(&i32::MAX.to_be_bytes());
        assert_eq!(assigned_partitions(&huge), None);
        assert_eq!(subscribed_topics(&huge), None);
        let mut negative = assignment(&[("runs", &[-1])]);
        assert_eq!(assigned_partitions(&negative), None);
        negative.truncate(2);
        assert_eq!(subscribed_topics(&negative), None);
        let bad_utf8 = [0, 0, 0, 0, 0, 1, 0, 1, 0xff];
        assert_eq!(subscribed_topics(&bad_utf8), None);
    }
}
