"""strom.mpi: channels over mpi4py, run as a real MPI job (mpirun -n 4)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

JOB = Path(__file__).parent / "mpi" / "channel_job.py"


def test_channels_over_mpi4py_share_broadcast_operate_and_agree_on_errors(tmp_path: Path) -> None:
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun is needed (scripts/setup.sh installs Open MPI)"
    env = dict(os.environ, TMPDIR=str(tmp_path))
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-n", "4", sys.executable, str(JOB)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    # Each rank's verdict, wherever mpirun's forwarding put it in the output.
    assert sorted(re.findall(r"CHECKS OK (\d+)", r.stdout)) == ["0", "1", "2", "3"], r.stdout
    assert list(tmp_path.iterdir()) == [], "the servers' directories were not removed"
