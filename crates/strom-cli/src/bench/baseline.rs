//! `strom bench baseline memcpy`: the machine's own ceilings, measured by
//! the same binary the suite runs, so a Strom figure can be read against
//! them. `memcpy` copies `--size` bytes between two buffers that were
//! written first (every page faulted in and warm), repeatedly for about
//! 100 ms per sample, and prints GB/s as min / median / max of the samples.

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde_json::json;

/// Samples taken; the figure is their median.
const SAMPLES: usize = 7;
/// Copying time per sample (at least one copy is always made).
const SAMPLE_TIME: Duration = Duration::from_millis(100);

/// Parses a byte count: `8388608`, `8MiB`, `64KiB`, `1GiB`, `4k`, `8M`, `1G`
/// (the single letters and `KB`/`MB`/`GB` are binary too, like `dd`'s).
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| anyhow::anyhow!("bad size '{s}': expected a number like 8MiB"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        u => anyhow::bail!("bad size '{s}': unknown unit '{u}' (use B, KiB, MiB or GiB)"),
    };
    n.checked_mul(mult)
        .filter(|&b| b > 0)
        .ok_or_else(|| anyhow::anyhow!("bad size '{s}': must be between 1 byte and 2^64"))
}

/// GB/s (10^9 bytes per second) of one sample of copies of `src` into `dst`.
fn sample(src: &[u8], dst: &mut [u8]) -> f64 {
    let start = Instant::now();
    let mut copies = 0u64;
    loop {
        dst.copy_from_slice(black_box(src));
        black_box(&mut *dst);
        copies += 1;
        let t = start.elapsed();
        if t >= SAMPLE_TIME {
            return (copies * src.len() as u64) as f64 / t.as_secs_f64() / 1e9;
        }
    }
}

/// GB/s of memcpy of `len` bytes between warm buffers: every sample,
/// sorted (the median is the figure).
pub fn memcpy_samples(len: usize) -> Vec<f64> {
    // Both buffers written before timing: no page faults in the samples.
    let src = vec![0x5Au8; len];
    let mut dst = vec![0xA5u8; len];
    sample(&src, &mut dst);
    let mut gbs: Vec<f64> = (0..SAMPLES).map(|_| sample(&src, &mut dst)).collect();
    gbs.sort_by(f64::total_cmp);
    gbs
}

/// Runs the memcpy baseline and prints one line (JSON with `json`).
pub fn memcpy(size: &str, json: bool) -> anyhow::Result<()> {
    let bytes = parse_size(size)?;
    let gbs = memcpy_samples(usize::try_from(bytes)?);
    let (min, median, max) = (gbs[0], gbs[SAMPLES / 2], gbs[SAMPLES - 1]);
    if json {
        println!(
            "{}",
            json!({
                "mode": "baseline", "baseline": "memcpy", "size": bytes, "samples": gbs,
                "gb_per_s": median, "min_gb_per_s": min, "max_gb_per_s": max,
                "mb_per_s": median * 1e3,
            })
        );
    } else {
        println!(
            "memcpy of {bytes} bytes between warm buffers: {median:.2} GB/s median \
             (min {min:.2}, max {max:.2}, {SAMPLES} samples of ~{} ms)",
            SAMPLE_TIME.as_millis()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("8MiB").unwrap(), 8 << 20);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert!(parse_size("0").is_err());
        assert!(parse_size("8 furlongs").is_err());
        assert!(parse_size("MiB").is_err());
    }
}
