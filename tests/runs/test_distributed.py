"""Two JAX processes on this machine (CPU, a free local port) sharing one sweep folder.

`polarize sweep --distributed` with JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
JAX_PROCESS_ID: process p computes the chunks i with i mod 2 = p and process 0
assembles. The result must equal a single-process run bit for bit, and when one
process is killed, `--resume` must finish its chunks.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ARGS = [
    "--tokens",
    "3",
    "--dim",
    "3",
    "--t1",
    "1e3",
    "--n-save",
    "8",
    "--inits",
    "512",
    "--chunk-size",
    "128",
]
ROOT = Path(__file__).parents[2]


def _env(cache: Path, **extra) -> dict:
    # a shared persistent compilation cache: the processes reuse one compile
    env = {**os.environ, "PYTHONPATH": str(ROOT), "POLARIZE_NO_CACHE": "", "POLARIZE_CACHE_DIR": str(cache)}
    for name in ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "XLA_FLAGS"):
        env.pop(name, None)
    return {**env, **extra}


def _sweep(args, env, **kw):
    cmd = [sys.executable, "-m", "polarize.cli", "sweep", *args, "--no-progress"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(out: Path, cache: Path):
    port = _free_port()
    return [
        _sweep(
            [*ARGS, "--distributed", "--out", str(out)],
            _env(
                cache,
                JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                JAX_NUM_PROCESSES="2",
                JAX_PROCESS_ID=str(p),
            ),
        )
        for p in (0, 1)
    ]


def _same(a: Path, b: Path):
    x, y = np.load(a / "per_init.npz"), np.load(b / "per_init.npz")
    assert sorted(x.files) == sorted(y.files)
    for k in x.files:
        np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    proc = _sweep([*ARGS, "--out", str(root / "single")], _env(root / "cache"))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return root


def test_two_processes_equal_one_bit_for_bit(reference):
    out = reference / "two"
    procs = _two_processes(out, reference / "cache")
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [r[1][-2000:] for r in results]
    assert "512 inits, 0 failed" in results[0][0] and "inits" not in results[1][0]  # process 0 reports
    # each process wrote its own chunks and manifest
    assert (out / "manifest-p0.json").exists() and (out / "manifest-p1.json").exists()
    _same(out, reference / "single")


@pytest.mark.slow
def test_a_killed_process_is_finished_by_resume(reference):
    out = reference / "killed"
    procs = _two_processes(out, reference / "cache")
    deadline = time.time() + 300
    while not (out / "chunks" / "chunk-000001.npz").exists():  # process 1's first chunk
        assert all(p.poll() is None for p in procs), procs[1].communicate()[1][-2000:]
        assert time.time() < deadline, "process 1 wrote no chunk in time"
        time.sleep(0.005)
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait()
    # process 0 finishes its own chunks, then waits for process 1 at the barrier: stop it
    while not (out / "chunks" / "chunk-000002.npz").exists() and procs[0].poll() is None:
        assert time.time() < deadline
        time.sleep(0.01)
    procs[0].send_signal(signal.SIGKILL)
    procs[0].wait()
    assert not (out / "summary.json").exists()
    assert not (out / "chunks" / "chunk-000003.npz").exists()  # process 1's second chunk is missing
    proc = _sweep(["--resume", str(out)], _env(reference / "cache"))
    stdout, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "512 inits, 0 failed" in stdout
    _same(out, reference / "single")
