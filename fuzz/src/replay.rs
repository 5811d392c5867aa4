//! The stable-toolchain half of fuzzing: replays the committed corpus and a
//! fixed number of deterministically mutated inputs through the same target
//! bodies the cargo-fuzz targets use, under an allocation-counting global
//! allocator, and keeps the committed seed corpus in sync with the seeds.
//!
//! Included with `#[path]` by `crates/strom-proto/tests/hostile_input.rs`
//! and `crates/strom-policy/tests/hostile_input.rs` (each registers
//! [`Counting`] as its `#[global_allocator]`), and by the fuzz crate, whose
//! targets run each input through [`run_one`] too.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// A target: its corpus directory name and its body.
pub type Target = (&'static str, fn(&[u8]));

/// A seed: `(target, file name, bytes)`.
pub type Seed = (&'static str, String, Vec<u8>);

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

/// Global allocator that, on a thread inside [`measure`], tracks the peak of
/// bytes allocated and not yet freed. Everything else goes straight to
/// [`System`].
pub struct Counting;

fn grew(n: usize) {
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            let live = LIVE.with(|l| {
                l.set(l.get() + n);
                l.get()
            });
            PEAK.with(|p| p.set(p.get().max(live)));
        }
    });
}

fn shrank(n: usize) {
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            LIVE.with(|l| l.set(l.get().saturating_sub(n)));
        }
    });
}

// SAFETY: every call is forwarded unchanged to `System`; the bookkeeping
// touches only const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shrank(layout.size());
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Count the new block before the old one is released: realloc may
        // need both at once.
        grew(new_size);
        shrank(layout.size());
        System.realloc(ptr, layout, new_size)
    }
}

/// Runs `f` and returns the most bytes it held allocated at once
/// (allocations it freed before returning included).
pub fn measure(f: impl FnOnce()) -> usize {
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    ARMED.with(|a| a.set(true));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    ARMED.with(|a| a.set(false));
    if let Err(e) = result {
        panic::resume_unwind(e);
    }
    PEAK.with(Cell::get)
}

/// SplitMix64: a tiny seeded generator, so every run mutates the same way.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Values a length or count field is overwritten with: the extremes, the
/// sign boundary, and "just more than there is".
fn huge(rng: &mut Rng, len: usize) -> u64 {
    match rng.below(7) {
        0 => u64::from(u32::MAX),
        1 => 0x8000_0000,
        2 => 0x7FFF_FFFF,
        3 => len as u64 + 1,
        4 => len as u64 * 2 + 7,
        5 => u64::MAX,
        _ => 0x0001_0000,
    }
}

/// One mutant of `base`: one to four of bit flips, byte overwrites,
/// truncations, length-field overwrites with huge values (as `u32` and as
/// `u64`, and as the 10-byte varint the policy codec uses), insertions,
/// duplications, and splices with another input of `pool`.
pub fn mutate(rng: &mut Rng, base: &[u8], pool: &[&[u8]]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = v.len();
        match rng.below(9) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = [0, 1, 0x7F, 0x80, 0xFF, rng.next_u64() as u8][rng.below(6)];
            }
            2 if len > 0 => v.truncate(rng.below(len)),
            3 if len >= 4 => {
                let i = rng.below(len - 3);
                let h = huge(rng, len) as u32;
                v[i..i + 4].copy_from_slice(&h.to_le_bytes());
            }
            4 if len >= 8 => {
                let i = rng.below(len - 7);
                let h = huge(rng, len);
                v[i..i + 8].copy_from_slice(&h.to_le_bytes());
            }
            5 => {
                let i = rng.below(len + 1);
                let mut varint = Vec::new();
                let mut h = huge(rng, len);
                while h >= 0x80 {
                    varint.push(h as u8 | 0x80);
                    h >>= 7;
                }
                varint.push(h as u8);
                v.splice(i..i, varint);
            }
            6 => {
                let i = rng.below(len + 1);
                let n = rng.below(9);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                v.splice(i..i, bytes);
            }
            7 if len > 0 => {
                let a = rng.below(len);
                let b = a + rng.below(len - a + 1).min(64);
                let dup = v[a..b].to_vec();
                let at = rng.below(len + 1);
                v.splice(at..at, dup);
            }
            _ if !pool.is_empty() => {
                let other = pool[rng.below(pool.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            _ => {}
        }
    }
    v
}

fn hex(b: &[u8]) -> String {
    let shown: String = b.iter().take(256).map(|x| format!("{x:02x}")).collect();
    if b.len() > 256 {
        format!("{shown}… ({} bytes)", b.len())
    } else {
        shown
    }
}

/// Runs one input through `body`, reporting the input if it panics or holds
/// more than `bound(len)` bytes at once.
pub fn run_one(name: &str, body: fn(&[u8]), input: &[u8], bound: fn(usize) -> usize, what: &str) {
    let peak = panic::catch_unwind(|| measure(|| body(input))).unwrap_or_else(|e| {
        eprintln!("target {name} panicked on {what}: {}", hex(input));
        panic::resume_unwind(e)
    });
    let limit = bound(input.len());
    assert!(
        peak <= limit,
        "target {name} held {peak} bytes at once (limit {limit}) for a {}-byte {what}: {}",
        input.len(),
        hex(input)
    );
}

fn corpus_dir(root: &Path, target: &str) -> PathBuf {
    root.join("corpus").join(target)
}

/// Every file of `fuzz/corpus/<target>/` (seeds, and anything a fuzzing run
/// found worth committing).
pub fn corpus(root: &Path, target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = corpus_dir(root, target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
        .map(|entry| entry.expect("corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, bytes)
        })
        .collect()
}

/// Replays the corpus of every target, then `mutations` mutants spread over
/// the targets, each mutated from that target's corpus.
pub fn replay_and_mutate(
    root: &Path,
    targets: &[Target],
    mutations: usize,
    seed: u64,
    bound: fn(usize) -> usize,
) {
    let mut rng = Rng::new(seed);
    for &(name, body) in targets {
        let files = corpus(root, name);
        assert!(!files.is_empty(), "corpus of {name} is empty");
        for (path, bytes) in &files {
            run_one(
                name,
                body,
                bytes,
                bound,
                &format!("corpus file {}", path.display()),
            );
        }
        let pool: Vec<&[u8]> = files.iter().map(|(_, b)| b.as_slice()).collect();
        let share = mutations / targets.len();
        for i in 0..share {
            let base = pool[rng.below(pool.len())];
            let input = mutate(&mut rng, base, &pool);
            run_one(name, body, &input, bound, &format!("mutant {i}"));
        }
    }
}

/// Checks that every seed is committed under `fuzz/corpus/<target>/<name>`
/// with exactly its bytes; with `STROM_BLESS_CORPUS=1` writes them instead.
pub fn check_seed_corpus(root: &Path, seeds: &[Seed]) {
    let bless = std::env::var_os("STROM_BLESS_CORPUS").is_some_and(|v| v == "1");
    for (target, name, bytes) in seeds {
        let dir = corpus_dir(root, target);
        let path = dir.join(name);
        if bless {
            std::fs::create_dir_all(&dir).expect("create corpus directory");
            std::fs::write(&path, bytes).expect("write seed");
            continue;
        }
        let committed = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "seed {} is missing ({e}); run STROM_BLESS_CORPUS=1 cargo test --test hostile_input",
                path.display()
            )
        });
        assert!(
            committed == *bytes,
            "seed {} is stale; run STROM_BLESS_CORPUS=1 cargo test --test hostile_input",
            path.display()
        );
    }
}

/// The stable-toolchain harness of one fuzz target module, `targets`
/// (its `seeds`, `TARGETS` and `bound`): the committed seed corpus is
/// current, and the corpus plus 100,000 inputs mutated from `seed` decode
/// without panic or unbounded allocation. Expands in a test file that
/// includes this module as `replay` (with `#[macro_use]`) and sets
/// `replay::Counting` as its global allocator.
#[allow(unused_macros)]
macro_rules! replay_tests {
    ($seed:expr) => {
        fn fuzz_root() -> std::path::PathBuf {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
        }

        #[test]
        fn seed_corpus_is_committed_and_current() {
            replay::check_seed_corpus(&fuzz_root(), &targets::seeds());
        }

        #[test]
        fn corpus_and_100k_mutants_decode_without_panic_or_unbounded_allocation() {
            replay::replay_and_mutate(
                &fuzz_root(),
                targets::TARGETS,
                100_000,
                $seed,
                targets::bound,
            );
        }
    };
}
