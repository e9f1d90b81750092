"""Durable runs: SIGKILL and resume, damaged chunks, config mismatch, chunk sizes and devices."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import polarize as pz
from polarize.cli import main

ARGS = ["--tokens", "4", "--dim", "3", "--t1", "1e3", "--n-save", "8", "--no-progress"]
ENV = {**os.environ, "POLARIZE_NO_CACHE": "1", "PYTHONPATH": str(Path(__file__).parents[2])}


def per_init(folder) -> dict:
    return dict(np.load(Path(folder) / "per_init.npz", allow_pickle=False))


def assert_same_results(a, b):
    x, y = per_init(a), per_init(b)
    assert sorted(x) == sorted(y)
    for k in x:
        np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run of 5120 initializations in 40 chunks."""
    out = tmp_path_factory.mktemp("ref") / "run"
    assert main(["sweep", *ARGS, "--inits", "5120", "--chunk-size", "128", "--out", str(out)]) == 0
    return out


def test_sigkill_then_resume_is_bit_identical(reference, tmp_path, capsys):
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "polarize.cli", "sweep", *ARGS, "--inits", "5120", "--chunk-size", "128"]
    proc = subprocess.Popen(
        [*cmd, "--out", str(out)], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.time() + 240
    while not (out / "chunks" / "chunk-000001.npz").exists():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.time() < deadline, "no chunk appeared in time"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(list((out / "chunks").glob("chunk-*.npz")))
    assert not (out / "summary.json").exists() and 2 <= done < 40  # killed mid-run
    assert main(["sweep", "--resume", str(out), "--no-progress"]) == 0
    assert "5120 inits, 0 failed" in capsys.readouterr().out
    assert_same_results(out, reference)


def test_damaged_chunk_is_detected_and_recomputed(reference, tmp_path):
    out = tmp_path / "copy"
    import shutil

    shutil.copytree(reference, out)
    chunk = out / "chunks" / "chunk-000003.npz"
    chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])  # truncated
    (out / "chunks" / "chunk-000007.npz").unlink()  # missing
    (out / "summary.json").unlink()
    (out / "per_init.npz").unlink()
    store_before = {p.name: p.stat().st_mtime_ns for p in (out / "chunks").glob("*.npz")}
    assert main(["sweep", "--resume", str(out), "--no-progress"]) == 0
    after = {p.name: p.stat().st_mtime_ns for p in (out / "chunks").glob("*.npz")}
    rewritten = sorted(n for n in after if after[n] != store_before.get(n))
    assert rewritten == ["chunk-000003.npz", "chunk-000007.npz"]  # only those were recomputed
    assert_same_results(out, reference)


def test_resume_with_a_different_config_is_refused(reference, capsys):
    assert main(["sweep", "--resume", str(reference), "--tokens", "5", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("polarize: error: `--resume`") and "tokens=4 (requested 5)" in err
    assert main(["sweep", "--resume", str(reference.parent / "nothing"), "--no-progress"]) == 2
    assert "has no config.json" in capsys.readouterr().err


def test_results_do_not_depend_on_chunk_size_or_backend_piece(reference, tmp_path, monkeypatch):
    # chunks of 2560: pieces of 2048 (the second mostly padding), run two at a time in
    # threads, against chunks of 128 run one piece at a time
    monkeypatch.setenv("POLARIZE_THREADS", "2")
    out = tmp_path / "big-chunks"
    assert main(["sweep", *ARGS, "--inits", "5120", "--chunk-size", "2560", "--out", str(out)]) == 0
    assert_same_results(out, reference)
    stored = json.loads((out / "config.json").read_text())["sweep"]
    assert (stored["chunk_size"], stored["block_size"]) == (2560, 128)  # stored resolved

    # On a GPU or TPU (faked: only the sizing reads the backend) the sizes default wide
    # and a piece is ONE block (per device); with the CPU's blocks, numbers are the CPU's
    import jax

    from polarize.runs import _numerics, _sweep as sweep
    from polarize.runs._config import SweepConfig

    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    wide = SweepConfig().resolved()
    assert (wide.chunk_size, wide.block_size) == (131_072, 16_384)
    pieces = []
    measure = _numerics.measure
    monkeypatch.setattr(
        _numerics, "measure", lambda c, m, o, **k: pieces.append(m.batch_size) or measure(c, m, o, **k)
    )
    config = SweepConfig(tokens=4, dim=3, t1=1e3, n_save=8, inits=5120, chunk_size=2048, block_size=128)
    monkeypatch.setattr(sweep, "AT_ONCE_CPU", 1024)  # CPU runs of blocks: the chunk would run as two
    got = sweep.run_chunk(config, 2048, 4096)
    assert pieces == [128] * 16
    series = np.load(reference / "series.npz")
    one = per_init(reference) | {k: series[k] for k in series.files if k.startswith("snap_")}
    for k in got:
        np.testing.assert_array_equal(got[k], one[k][2048:4096], err_msg=k)


def test_a_chunk_that_is_not_whole_blocks_keeps_each_inits_row():
    # chunks of 6 inits in blocks of 4: a chunk starting at init 6 ran its blocks from
    # there, so init 7 sat at row 1 of its block instead of row 3, and its numbers (5
    # tokens, dim 8) rounded otherwise; runs now start on the sweep's whole blocks
    from polarize.runs._config import SweepConfig
    from polarize.runs._sweep import run_chunk

    config = SweepConfig(
        tokens=5, dim=8, t1=1e4, n_save=16, snapshots=8, inits=20, chunk_size=6, block_size=4
    )
    whole = run_chunk(config, 0, 20)
    for start, stop in ((6, 12), (18, 20), (1, 7)):
        part = run_chunk(config, start, stop)
        for k in whole:
            np.testing.assert_array_equal(part[k], whole[k][start:stop], err_msg=f"{k} {start}")


def test_results_do_not_depend_on_device_count(reference, tmp_path):
    """Two forced host devices give the same numbers, bit for bit, as one.

    The one-device numbers are the reference run's (this process, chunks of 128 inits);
    the two-device run (300 inits: per device two blocks, the second one's padded) is
    a subprocess, as the device count is fixed when JAX starts. Also three blocks of 4
    at 5 tokens and dim 5: split over two devices as 6 inits each, inits 6 and 7 sat
    at other rows of their blocks, which rounded their numbers otherwise on an AVX-512
    CPU; each device now takes whole blocks. And two stiff flows (below).
    """
    import jax

    from polarize.runs._config import SweepConfig
    from polarize.runs._sweep import run_chunk

    assert jax.local_device_count() == 1, jax.devices()
    odd = dict(tokens=5, dim=5, t1=1e3, n_save=8, inits=12, block_size=4, v_scale=1.0, a_scale=1.0)
    # the stiff default (Rosenbrock) rounded otherwise inside the devices' program; and
    # at curvature x t1 = 200 the default is Tsit5, but traced inside that program the
    # objective's curvature was unknown and two devices took Rosenbrock (with the cache
    # on, the square's data, left on device 0 by the program that made it, was refused there)
    small = dict(tokens=5, dim=8, n_save=16, snapshots=8, inits=12, block_size=4)
    stiff = dict(small, objective="cross-entropy", t1=1e5)
    square = dict(small, objective="square", kappa=3.0, t1=100.0)
    script = (
        "import jax, numpy as np, sys; jax.config.update('jax_enable_x64', True)\n"
        "from polarize.runs._config import SweepConfig\n"
        "from polarize.runs._sweep import run_chunk\n"
        "c = SweepConfig(tokens=4, dim=3, t1=1e3, n_save=8, inits=300)\n"
        "assert jax.local_device_count() == 2, jax.devices()\n"
        "np.savez(sys.argv[1], **run_chunk(c, 0, 300))\n"
        "from polarize.solve._devices import _sharded\n"
        "run_chunk(c, 300, 600)  # the next chunk reuses the compiled sharded program\n"
        "info = _sharded.cache_info()\n"
        "assert info.misses == 1 and info.hits >= 1, info\n"
        f"np.savez(sys.argv[1] + '.odd.npz', **run_chunk(SweepConfig(**{odd!r}), 0, 12))\n"
        f"np.savez(sys.argv[1] + '.ce.npz', **run_chunk(SweepConfig(**{stiff!r}), 0, 12))\n"
        "import os; os.environ.pop('POLARIZE_NO_CACHE'); os.environ['POLARIZE_CACHE_DIR'] = sys.argv[2]\n"
        "from polarize.solve._devices import enable_compilation_cache; enable_compilation_cache()\n"
        f"np.savez(sys.argv[1] + '.sq.npz', **run_chunk(SweepConfig(**{square!r}), 0, 12))\n"
    )
    env = {**ENV, "XLA_FLAGS": f"{ENV.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2".strip()}
    subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "d2.npz"), str(tmp_path / "cache")], env=env, check=True
    )
    two = np.load(tmp_path / "d2.npz")
    series = np.load(reference / "series.npz")  # the snapshots (snap_*) are stored apart
    one = per_init(reference) | {k: series[k] for k in series.files if k.startswith("snap_")}
    assert sorted(two.files) == sorted(one)
    for k in two.files:
        np.testing.assert_array_equal(two[k], one[k][:300], err_msg=k)
    for name, settings in (("odd", odd), ("ce", stiff), ("sq", square)):
        two = np.load(tmp_path / f"d2.npz.{name}.npz")
        one = run_chunk(SweepConfig(**settings), 0, 12)
        assert sorted(two.files) == sorted(one)
        for k in two.files:
            np.testing.assert_array_equal(two[k], one[k], err_msg=f"{name} {k}")


def test_load_returns_a_run_with_tables(reference):
    run = pz.load(reference)
    assert run.config.inits == 5120 and run.summary["n_inits"] == 5120
    assert run.arrays["final_max_weight"].shape == (5120,)
    assert run.arrays["series_max_weight"].shape[0] == 5120
    frame = run.frame()
    assert len(frame) == 5120 and list(frame["init"]) == list(range(5120))
    for name in ("final_max_weight", "final_entropy", "time_to_0.9", "time_to_loss_0.001", "rate_C", "ok"):
        np.testing.assert_array_equal(frame[name].to_numpy(), run.arrays[name], err_msg=name)
    assert set(frame["status_name"]) == {"ok"} and (frame["tokens"] == 4).all() and (frame["t1"] == 1e3).all()
    assert frame["levels"].iloc[0] == "0.5,0.9,0.99"
    # the summary's numbers are the table's numbers
    ok = frame[frame["ok"]]
    assert run.summary["median_max_weight"] == ok["final_max_weight"].median()
    assert run.summary["fraction_reached_0.5"] == np.isfinite(ok["time_to_0.5"]).mean()
    series = run.series()
    k = len(run.arrays["snap_ts"])
    assert len(series) == 5120 * k and list(series.columns[:4]) == ["init", "time", "max_weight", "entropy"]
    one = series[series["init"] == 7]
    np.testing.assert_array_equal(one["time"], run.arrays["snap_ts"])
    np.testing.assert_array_equal(one["max_weight"], run.arrays["series_max_weight"][7])


def test_streamed_npz_reads_back_like_savez(tmp_path):
    """series.npz is written from raw files: np.load must see exactly the arrays."""
    from polarize.runs._storage import write_npz_streamed

    rng = np.random.default_rng(0)
    big = rng.standard_normal((1000, 7)).astype(np.float32)
    ints = rng.integers(0, 9, (1000, 3))
    raw = {}
    for name, x in (("big", big), ("ints", ints)):
        with open(tmp_path / name, "wb") as f:  # appended in pieces, as assemble does
            for lo in range(0, 1000, 300):
                f.write(x[lo : lo + 300].tobytes())
        raw[name] = (tmp_path / name, x.shape, x.dtype)
    small = {"ts": np.linspace(0, 1, 7), "ok": rng.random(1000) > 0.1}
    write_npz_streamed(tmp_path / "s.npz", small, raw)
    with np.load(tmp_path / "s.npz", allow_pickle=False) as z:
        assert sorted(z.files) == ["big", "ints", "ok", "ts"]
        for name, x in {"big": big, "ints": ints, **small}.items():
            assert z[name].dtype == x.dtype
            np.testing.assert_array_equal(z[name], x)
    with pytest.raises(ValueError, match="bytes, not"):
        write_npz_streamed(tmp_path / "t.npz", {}, {"big": (tmp_path / "big", (999, 7), np.float32)})
    assert not (tmp_path / "t.npz").exists()


def test_a_run_resumed_on_another_backend_keeps_its_sizes(tmp_path, monkeypatch, capsys):
    import jax

    from polarize.runs._config import SweepConfig
    from polarize.runs._folder import resumed_config
    from polarize.runs._storage import write_json

    cpu = SweepConfig(tokens=4).resolved()
    write_json(tmp_path / "config.json", {"sweep": cpu.to_dict()})
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert resumed_config(SweepConfig(tokens=4), tmp_path) == cpu  # not the TPU's sizes
    assert resumed_config(SweepConfig(tokens=4, block_size=64), tmp_path).block_size == 64
    assert main(["sweep", "--resume", str(tmp_path), "--block-size", "64", "--no-progress"]) == 2
    assert "block_size=128 (requested 64)" in capsys.readouterr().err


def test_an_interrupt_keeps_the_chunk_being_written_and_a_failed_write_stops_the_run(
    reference, tmp_path, monkeypatch, capsys
):
    # chunk i is written in a thread while chunk i + 1 computes: Ctrl-C during chunk 2
    # must still leave chunks 0 and 1 on disk, and the resumed run must match
    from polarize.runs import _sweep as sweep

    real = sweep.run_chunk

    def interrupted(config, start, stop, **kw):
        if start >= 256:
            raise KeyboardInterrupt
        return real(config, start, stop, **kw)

    def slow_write(self, i, part, write=sweep.ChunkStore.write):
        time.sleep(0.5)  # still writing chunk 1 when chunk 2 is interrupted
        return write(self, i, part)

    monkeypatch.setattr(sweep, "run_chunk", interrupted)
    monkeypatch.setattr(sweep.ChunkStore, "write", slow_write)
    out = tmp_path / "ctrl-c"
    code = main(["sweep", *ARGS, "--inits", "5120", "--chunk-size", "128", "--out", str(out)])
    assert code == 130 and "finished work is on disk" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "chunks").glob("chunk-*.npz")) == [
        "chunk-000000.npz",
        "chunk-000001.npz",
    ]
    monkeypatch.undo()
    assert main(["sweep", "--resume", str(out), "--no-progress"]) == 0
    assert_same_results(out, reference)

    def full_disk(self, i, part, write=sweep.ChunkStore.write, failed=[]):
        if i == 1 and not failed:  # once: recomputing the chunk later would hide it
            failed.append(i)
            raise OSError(28, "No space left on device")
        return write(self, i, part)

    monkeypatch.setattr(sweep.ChunkStore, "write", full_disk)
    with pytest.raises(OSError, match="No space left"):
        sweep.run_sweep(
            pz.SweepConfig(tokens=4, dim=3, t1=1e3, n_save=8, inits=512, chunk_size=128), tmp_path / "full"
        )


def test_the_assembly_reads_back_no_chunk_this_process_wrote(reference, tmp_path, monkeypatch):
    # each chunk is gathered as it is finished: the assembly reads only the chunks of a
    # previous process (a resume), and removes what a killed run's gathering left behind
    from polarize.runs import _sweep as sweep

    out = tmp_path / "fresh"
    read = sweep.ChunkStore.read
    reads = []

    def counted(self, i):
        if self.path(i).exists():
            reads.append(i)
        return read(self, i)

    complete, in_assembly = sweep._complete, []

    def watched(*args, **kwargs):  # the chunk reads made to complete the assembly's gather
        before = len(reads)
        complete(*args, **kwargs)
        in_assembly.extend(reads[before:])

    monkeypatch.setattr(sweep.ChunkStore, "read", counted)
    monkeypatch.setattr(sweep, "_complete", watched)
    assert main(["sweep", *ARGS, "--inits", "5120", "--chunk-size", "128", "--out", str(out)]) == 0
    assert reads == [] and not list(out.glob(".assemble-*"))
    assert_same_results(out, reference)
    (out / "summary.json").unlink()
    (out / "chunks" / "chunk-000005.npz").unlink()
    (out / ".assemble-left-by-a-killed-run").mkdir()
    (out / ".assemble-left-by-a-killed-run" / "snap_entropy").write_bytes(b"partial")
    assert main(["sweep", "--resume", str(out), "--no-progress"]) == 0
    assert sorted(set(reads)) == [i for i in range(40) if i != 5]  # the others, from disk
    assert sorted(in_assembly) == [i for i in range(40) if i != 5]  # chunk 5 was gathered
    assert not list(out.glob(".assemble-*"))
    assert_same_results(out, reference)
