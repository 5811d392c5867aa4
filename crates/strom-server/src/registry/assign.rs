//! The sticky assignor of partitioned consumer groups (design §4): a pure
//! function from the partition count, the live members and who holds what
//! now, to who should hold what. Balanced (sizes differ by at most one), and
//! it moves only what must move: each member keeps its held partitions up
//! to its quota, and only the excess and the free partitions change hands.

use std::collections::BTreeMap;

/// The target assignment of `n` partitions over `live` (sorted consumer
/// ids), keeping as much of `held` (partition -> consumer) as balance allows.
/// Partitions held by consumers not in `live`, or at or above `n`, are free.
pub fn assign(n: u32, live: &[u64], held: &BTreeMap<u32, u64>) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    let k = live.len() as u32;
    if k == 0 || n == 0 {
        return out;
    }
    let (base, extra) = (n / k, n % k);
    // What each live member holds now, lowest partitions first.
    let mut holding: BTreeMap<u64, Vec<u32>> = live.iter().map(|c| (*c, Vec::new())).collect();
    for (p, c) in held.range(..n) {
        if let Some(v) = holding.get_mut(c) {
            v.push(*p);
        }
    }
    // The `extra` members holding the most (ties: lower id) get one more.
    let mut by_size: Vec<u64> = live.to_vec();
    by_size.sort_by_key(|c| (std::cmp::Reverse(holding[c].len()), *c));
    let quota: BTreeMap<u64, u32> = by_size
        .iter()
        .enumerate()
        .map(|(i, c)| (*c, base + u32::from((i as u32) < extra)))
        .collect();
    let mut size: BTreeMap<u64, u32> = BTreeMap::new();
    for (c, parts) in &holding {
        let keep = quota[c] as usize;
        for p in parts.iter().take(keep) {
            out.insert(*p, *c);
        }
        size.insert(*c, parts.len().min(keep) as u32);
    }
    // Free partitions, ascending, to the member furthest below its quota
    // (ties: lower id).
    for p in 0..n {
        if out.contains_key(&p) {
            continue;
        }
        let Some(c) = live
            .iter()
            .filter(|c| size[*c] < quota[*c])
            .max_by_key(|c| (quota[*c] - size[*c], std::cmp::Reverse(**c)))
        else {
            break;
        };
        out.insert(p, *c);
        *size.get_mut(c).expect("every live member has a size") += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Partitions held by a live member that end up with another one
    /// (partitions of departed members must move and do not count).
    fn moved(live: &[u64], held: &BTreeMap<u32, u64>, target: &BTreeMap<u32, u64>) -> usize {
        held.iter()
            .filter(|(p, c)| live.contains(c) && target.get(p).is_some_and(|t| t != *c))
            .count()
    }

    /// The fewest moves of any balanced assignment, by brute force over
    /// every choice of the members that get the larger quota: given the
    /// quotas, a member must give up exactly what it holds beyond its own.
    fn min_moves(n: u32, live: &[u64], held: &BTreeMap<u32, u64>) -> usize {
        let k = live.len() as u32;
        let (base, extra) = (n / k, n % k);
        let sizes: Vec<u32> = live
            .iter()
            .map(|c| held.range(..n).filter(|(_, h)| *h == c).count() as u32)
            .collect();
        (0u32..1 << k)
            .filter(|mask| mask.count_ones() == extra)
            .map(|mask| {
                sizes
                    .iter()
                    .enumerate()
                    .map(|(i, s)| s.saturating_sub(base + (mask >> i & 1)) as usize)
                    .sum::<usize>()
            })
            .min()
            .unwrap_or(0)
    }

    /// Tiny deterministic generator, so the cases are reproducible.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self, m: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % m
        }
    }

    #[test]
    fn balanced_and_minimal_moves() {
        let mut rng = Lcg(7);
        for k in 1..=6u64 {
            for n in 0..=12u32 {
                for _ in 0..40 {
                    // Members 1..=8; some of them live, some held partitions
                    // belonging to departed ones, some partitions free.
                    let mut live: Vec<u64> = (1..=8).filter(|_| rng.next(2) == 0).collect();
                    live.truncate(k as usize);
                    while live.len() < k as usize {
                        let c = 1 + rng.next(8);
                        if !live.contains(&c) {
                            live.push(c);
                        }
                    }
                    live.sort_unstable();
                    let held: BTreeMap<u32, u64> = (0..n)
                        .filter_map(|p| match rng.next(10) {
                            0 => None,
                            _ => Some((p, 1 + rng.next(8))),
                        })
                        .collect();
                    let t = assign(n, &live, &held);
                    assert_eq!(t.len() as u32, n, "every partition is assigned");
                    let mut sizes: BTreeMap<u64, u32> = live.iter().map(|c| (*c, 0)).collect();
                    for c in t.values() {
                        *sizes.get_mut(c).expect("only live members hold partitions") += 1;
                    }
                    let (lo, hi) = (sizes.values().min(), sizes.values().max());
                    assert!(hi.unwrap() - lo.unwrap() <= 1, "balanced: {sizes:?}");
                    assert_eq!(
                        moved(&live, &held, &t),
                        min_moves(n, &live, &held),
                        "minimal moves for n={n} live={live:?} held={held:?} -> {t:?}"
                    );
                    // A balanced held assignment over the same members stays put.
                    assert_eq!(assign(n, &live, &t), t, "stable once balanced");
                }
            }
        }
    }

    #[test]
    fn deterministic() {
        let held: BTreeMap<u32, u64> = [(0, 1), (1, 1), (2, 1), (3, 2), (4, 2), (5, 2)].into();
        let a = assign(6, &[1, 2, 3], &held);
        assert_eq!(a, assign(6, &[1, 2, 3], &held));
        // Member 3 takes one from each: the highest of each holder.
        let want: BTreeMap<u32, u64> = [(0, 1), (1, 1), (2, 3), (3, 2), (4, 2), (5, 3)].into();
        assert_eq!(a, want);
        // From nothing: the largest deficit first, ties to the lower id.
        let fresh = assign(5, &[4, 9], &BTreeMap::new());
        assert_eq!(fresh, [(0, 4), (1, 4), (2, 9), (3, 4), (4, 9)].into());
    }
}
