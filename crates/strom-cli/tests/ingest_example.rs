//! `examples/ingest/run.sh` end to end at a small size: two generators, a
//! real Strom server, the PostgreSQL sink into a throw-away cluster, and the
//! verifier. The script itself checks that the table holds every produced
//! event exactly once and that verify passes; this test checks that it
//! says so, with counts that agree.

mod common;

#[test]
fn the_ingest_example_lands_every_event_once_and_verifies() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let script = format!("{root}/examples/ingest/run.sh");
    let args = [
        script.as_str(),
        "--rate",
        "2000",
        "--devices",
        "200",
        "--generators",
        "2",
        "--duration",
        "3",
        "--partitions",
        "2",
        "--batch",
        "500",
    ];
    // Bounded: a hung stage fails the test instead of stalling it.
    let mut cmd = std::process::Command::new("timeout");
    cmd.args(["180", "bash"])
        .args(args)
        .env("STROM", common::strom_bin())
        .env_remove("STROM_GROUP_FILE")
        .env_remove("STROM_ADDRESS")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = cmd.output().expect("running examples/ingest/run.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "run.sh failed:\n{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("ingest: produced="))
        .unwrap_or_else(|| panic!("no summary line:\n{stdout}\n{stderr}"));
    let field = |k: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {line}"))
    };
    let produced = field("produced");
    assert!(produced >= 3000, "two generators at 1000/s for 3 s: {line}");
    assert_eq!(field("rows"), produced, "{line}");
    assert_eq!(field("distinct"), produced, "{line}");
    assert!(stdout.contains("ingest: OK"), "{stdout}");
}
