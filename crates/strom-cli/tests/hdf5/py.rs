//! The Python the HDF5 tests use: python/.venv (make python-setup installs
//! numpy and h5py there), where h5py must import. A missing venv or h5py
//! fails the test with the command that fixes it: the round trips are the
//! point of these tests, so they never pass without them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `python/.venv/bin/python`, checked to import numpy and h5py.
pub fn python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/.venv/bin/python");
    let out = Command::new(&venv)
        .args(["-c", "import numpy, h5py; print(h5py.version.hdf5_version)"])
        .output();
    match out {
        Ok(o) if o.status.success() => venv,
        Ok(o) => panic!(
            "{} cannot import numpy and h5py ({}); run `make python-setup` (mk/python.mk \
             installs h5py), which make test does first",
            venv.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => panic!(
            "no Python venv at {} ({e}); run `make python-setup` (mk/python.mk installs numpy \
             and h5py), which make test does first",
            venv.display()
        ),
    }
}

/// Runs `script` with `args` (in `sys.argv[1:]`); its stdout, after
/// asserting it succeeded.
pub fn run(script: &str, args: &[&str]) -> String {
    let out = Command::new(python())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("running python");
    assert!(
        out.status.success(),
        "the h5py script failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes the source file of round trip 1: datasets of every dtype Strom
/// maps, chunked and not, compressed and not, big-endian, 0-d.
pub const WRITE_SOURCES: &str = r#"
import sys, h5py, numpy as np
rng = np.random.default_rng(7)
with h5py.File(sys.argv[1], "w") as f:
    g = f.create_group("grp")
    g.create_dataset("temps", data=rng.standard_normal((100, 3, 4)), chunks=(10, 3, 4),
                     compression="gzip")
    f.create_dataset("counts", data=np.arange(50, dtype=np.int32) * 7 - 100)
    f.create_dataset("flags", data=rng.integers(0, 2, (6, 2)).astype(bool))
    f.create_dataset("be", data=np.arange(35, dtype=">i2").reshape(7, 5))
    f.create_dataset("z", data=(rng.standard_normal(8) + 1j * rng.standard_normal(8)).astype(np.complex64))
    f.create_dataset("names", data=np.array([b"ab", b"cdefg", b""], dtype="S5"))
    f.create_dataset("half", data=rng.standard_normal((4, 2)).astype(np.float16))
    f.create_dataset("scalar", data=np.uint64(2**63 + 5))
"#;

/// Compares a stage-out's `events.h5` with the source dataset. argv:
/// stage-out file, source file, source dataset, layout, rows per event
/// (0: one row without the axis).
pub const CHECK_ROUND_TRIP: &str = r#"
import sys, json, os, h5py, numpy as np
out, src, name, layout, chunk = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
want = h5py.File(src, "r")[name][()]
src_abs = os.path.realpath(src)
f = h5py.File(out, "r")
assert f.attrs["strom_layout"] == layout, f.attrs["strom_layout"]
def check_meta(m, i, n):
    assert m["source_file"] == src_abs, (m, src_abs)
    assert m["source_dataset"] == name, m
    assert (m["source_start"], m["source_stop"]) == (i, i + n), (m, i, n)
if want.ndim == 0:
    rows = [(0, 1)]
else:
    step = chunk or 1
    rows = [(i, min(step, want.shape[0] - i)) for i in range(0, want.shape[0], step)]
if layout == "per-event":
    names = sorted(f["events"])
    assert len(names) == len(rows), (len(names), len(rows))
    for k, (i, n) in zip(names, rows):
        d = f["events"][k]
        part = want if want.ndim == 0 else (want[i:i + n] if chunk else want[i])
        got = d[()]
        assert got.dtype == want.dtype, (k, got.dtype, want.dtype)
        assert got.shape == part.shape, (k, got.shape, part.shape)
        assert got.tobytes() == np.ascontiguousarray(part).tobytes(), k
        assert d.attrs["strom_offset"] == int(k), (k, d.attrs["strom_offset"])
        check_meta({a: d.attrs[a] for a in ("source_file", "source_dataset", "source_start", "source_stop")}, i, n)
        check_meta(json.loads(d.attrs["strom_metadata"]), i, n)
        assert d.chunks is not None or part.ndim == 0 or 0 in part.shape, k
else:
    data, index = f["data"][()], f["index"][()]
    assert data.dtype == want.dtype, (data.dtype, want.dtype)
    assert data.shape == want.shape, (data.shape, want.shape)
    assert data.tobytes() == want.tobytes(), "values differ"
    assert len(index) == len(rows), (len(index), len(rows))
    for k, (r, (i, n)) in enumerate(zip(index, rows)):
        want_rows = (i, n) if layout == "concat" else (k, 1)
        assert (int(r["row_start"]), int(r["rows"])) == want_rows, (r, want_rows)
        assert not r["metadata_hex"]
        check_meta(json.loads(r["metadata"]), i, n)
    assert list(index["offset"]) == list(range(len(rows))), index["offset"]
    assert f["data"].chunks is not None
print("ok", want.dtype.str, want.shape)
"#;
