"""The `polarize sweep` main job end to end, and every bad-input message it can give."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import polarize as pz
from polarize.cli import main
from polarize.core import distribution, status
from polarize.measure import logistic_rate
from polarize.measure._statistics import final_statistics, quantile

SMALL = ["--inits", "40", "--tokens", "5", "--dim", "4", "--t1", "1e4", "--n-save", "12"]


def test_sweep_writes_the_four_outputs(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["sweep", *SMALL, "--out", str(out)]) == 0
    line = capsys.readouterr().out.splitlines()
    assert line[0].startswith("softmax/logistic flow to t=1e+04: 40 inits, 0 failed | median t(0.9) ")
    assert line[1] == f"results: {out}"
    config = json.loads((out / "config.json").read_text())
    assert config["sweep"]["inits"] == 40 and config["versions"]["jax"]
    summary = json.loads((out / "summary.json").read_text())
    for key in [
        "n_inits",
        "n_failed",
        "one_hot_threshold",
        "one_hot_fraction",
        "median_max_weight",
        "median_entropy",
        "order_preserved_fraction",
        "winner_is_argmax_u0_fraction",
    ]:
        assert key in summary
    assert summary["n_inits"] == 40 and summary["order_preserved_fraction"] == 1.0
    arrays = np.load(out / "per_init.npz", allow_pickle=False)
    assert arrays["final_max_weight"].shape == (40,) and arrays["ok"].all()
    assert (out / "weights.png").stat().st_size > 10_000
    for name in ("time_to_0.5", "time_to_0.9", "time_to_0.99", "time_to_loss_0.001", "rate_C"):
        assert arrays[name].shape == (40,) and f"median_{name}" in summary
    # the stored numbers are the API's numbers
    run = pz.load(out)
    model = run.config.build_model(0, 128)  # the sweep's piece of 128: its compiled programs
    obj = run.config.build_objective()
    traj, times = pz.flow_with_hitting_times(model, obj, t1=1e4, n_save=12)
    final = pz.summarize(traj, obj).final["max_weight"][:40]
    np.testing.assert_array_equal(final, arrays["final_max_weight"])
    # the sweep reduces each solved block in place and never stores trajectories: every
    # stored number is still the stored-trajectory path's (`final_statistics`, the rate)
    expected = final_statistics(traj, obj, keep=run.config.snapshot_index())
    expected.update(logistic_rate(run.config.times(), np.max(distribution(traj.weights), axis=-1), t1=1e4))
    expected.update(solver_steps=traj.steps, ok=traj.ok, status=traj.status)
    series = np.load(out / "series.npz", allow_pickle=False)
    assert set(arrays.files) | {"snap_max_weight", "snap_entropy"} == set(expected) | set(times)
    for name, value in expected.items():
        stored = series[name] if name.startswith("snap_") else arrays[name]
        np.testing.assert_array_equal(np.asarray(value)[:40], stored, err_msg=name)
    restarted = pz.hitting_times(traj, model, obj)  # an independent location: within tolerance
    for name, value in times.items():
        np.testing.assert_array_equal(value[:40], arrays[name], err_msg=name)
        np.testing.assert_allclose(restarted[name][:40], arrays[name], rtol=1e-4, err_msg=name)
    reached = np.isfinite(arrays["time_to_0.9"])
    assert summary["fraction_reached_0.9"] == reached.mean()
    assert summary["median_time_to_0.9"] == quantile(arrays["time_to_0.9"], 0.5)


def test_sweep_square_gd_and_null_order_statistics(tmp_path, capsys):
    out = tmp_path / "sq"
    args = [
        "sweep",
        "--objective",
        "square",
        "--method",
        "gd",
        "--lr",
        "0.05",
        "--steps",
        "200",
        "--kappa",
        "3",
        "--inits",
        "8",
        "--tokens",
        "4",
        "--dim",
        "4",
        "--out",
        str(out),
    ]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["order_preserved_fraction"] is None  # undefined without a direction
    assert summary["winner_is_argmax_u0_fraction"] is None
    assert "order preserved n/a" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--norm", "softmaxx"], "`norm` must be one of softmax, sigmoid, relu, linear, relu-norm"),
        (
            ["--objective", "hinge"],
            "`objective` must be one of logistic, logistic-data, square, cross-entropy",
        ),
        (["--method", "newton"], "`method` must be one of flow, gd"),
        (["--solver", "euler"], "`solver` must be one of auto, tsit5, dopri5, kvaerno5"),
        (["--inits", "0"], "`inits` must be a positive integer; got 0"),
        (["--tokens", "-3"], "`tokens` must be a positive integer; got -3"),
        (["--t1", "0"], "`t1` must be a positive finite number; got 0.0"),
        (["--t1", "nan"], "`t1` must be a positive finite number; got nan"),
        (["--kappa", "0.5"], "`kappa` must be >= 1; got 0.5"),
        (["--v-scale", "inf"], "`v_scale` must be finite; got inf"),
        (["--v-scale", "-1"], r"`v_scale` must be >= 0 \(a standard deviation\); got -1.0"),
        (["--a-scale", "-0.1"], r"`a_scale` must be >= 0 \(a standard deviation\); got -0.1"),
        (["--threshold", "1.5"], r"`threshold` must be in \(0, 1\]; got 1.5"),
        (["--levels", "0.5", "1.5"], r"`levels` must be numbers in \(0, 1\]; got \[0.5, 1.5\]"),
        (["--levels", "0"], r"`levels` must be numbers in \(0, 1\]; got \[0.0\]"),
        (["--max-steps", "0"], "`max_steps` must be a positive integer; got 0"),
    ],
)
def test_bad_input_one_line_and_exit_2(args, message, tmp_path, capsys):
    assert main(["sweep", *args, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("polarize: error: ")
    assert __import__("re").search(message, err), err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("value", ["two", "0"])
def test_bad_thread_count_is_refused_before_anything_is_written(value, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("POLARIZE_THREADS", value)
    assert main(["sweep", *SMALL, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err == f"polarize: error: POLARIZE_THREADS must be a whole number >= 1; got {value!r}\n"
    assert not (tmp_path / "x").exists()


def test_non_empty_out_is_refused_without_overwrite(tmp_path, capsys):
    out = tmp_path / "full"
    out.mkdir()
    (out / "something").write_text("x")
    assert main(["sweep", *SMALL, "--out", str(out)]) == 2
    assert "is not empty; pass --resume" in capsys.readouterr().err
    # --overwrite replaces a sweep's own files only: a folder that is no run is kept whole
    assert main(["sweep", *SMALL, "--out", str(out), "--overwrite"]) == 2
    assert "not a polarize run folder" in capsys.readouterr().err
    assert (out / "something").read_text() == "x"


#: the `polarize` command as pyproject.toml declares it (`polarize.cli:run`)
COMMAND = "import sys; sys.argv[0] = 'polarize'; from polarize.cli import run; run()"


@pytest.mark.parametrize("entry", [["-m", "polarize.cli"], ["-c", COMMAND]], ids=["module", "command"])
def test_entry_point_exits_nonzero_without_traceback(tmp_path, entry):
    proc = subprocess.run(
        [sys.executable, *entry, "sweep", "--norm", "nope", "--out", str(tmp_path / "y")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("polarize: error: `norm` must be one of")


@pytest.mark.parametrize("flush", [False, True], ids=["buffered", "flushed"])
@pytest.mark.parametrize("entry", ["sys.exit(cli.main([]))", "cli.run()"], ids=["module", "command"])
def test_output_into_a_closed_pipe_ends_quietly_with_status_141(entry, flush):
    # `polarize sweep | head -1`: the reader is gone when the command writes its result line
    # (a job that prints as `_run_sweep` does; a real sweep takes seconds to get there)
    job = f"lambda argv: print('results: out', flush={flush}) or 0"
    code = f"import sys; import polarize.cli as cli; cli._main = {job}; {entry}"
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-c", code], stdout=write, stderr=subprocess.PIPE)
    finally:
        os.close(write)
    assert proc.stderr == b""  # no traceback, no "Exception ignored" at exit
    assert proc.returncode == 141


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("size", [20, 100_000], ids=["at the end", "mid-job"])
@pytest.mark.parametrize("entry", ["sys.exit(cli.main([]))", "cli.run()"], ids=["module", "command"])
def test_output_onto_a_full_device_is_one_line_and_status_74_after_the_work(tmp_path, entry, size):
    # `polarize sweep > /dev/full`: the job's files are written, then its output fails (at
    # the last flush, or at a write in the middle of the job when it overflows the buffer)
    done = tmp_path / "done"
    job = f"lambda argv: print('x' * {size}) or open({str(done)!r}, 'w').write('ok') and 0"
    code = f"import sys; import polarize.cli as cli; cli._main = {job}; {entry}"
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-c", code], stdout=full, stderr=subprocess.PIPE, text=True)
    assert proc.returncode == 74
    assert proc.stderr == (
        "polarize: error: the output could not be written (No space left on device); what the "
        "command wrote to disk is complete\n"
    )
    assert done.read_text() == "ok"  # the job ran to its end


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_real_sweep_onto_a_full_device_keeps_its_results(tmp_path):
    out = tmp_path / "run"
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-c", COMMAND, "sweep", *SMALL, "--out", str(out), "--no-progress"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert proc.returncode == 74 and "Traceback" not in proc.stderr, proc.stderr
    assert pz.load(out).summary["n_inits"] == 40


def test_the_command_ends_with_every_file_written_and_its_exit_status(tmp_path):
    # `run` ends the process as Python does (its exit handlers run), with main's status
    import tomllib

    scripts = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["polarize"] == "polarize.cli:run"
    out = tmp_path / "run"
    args = ["sweep", "--tokens", "3", "--dim", "2", "--inits", "8", "--t1", "100", "--out", str(out)]
    # at exit the command says that its exit handlers ran, and it drew its figures itself
    seen = "import atexit, sys; atexit.register(lambda: print('exit', 'matplotlib' in sys.modules)); "
    proc = subprocess.run([sys.executable, "-c", seen + COMMAND, *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(f"results: {out}\nexit True")
    run = pz.load(out)  # complete: every array, the summary and the figures
    assert run.summary["n_inits"] == 8 and len(run.arrays["ok"]) == 8
    assert {p.name for p in out.glob("*.png")} == {
        "weights.png",
        "entropy_hist.png",
        "winners.png",
        "one_hot_fraction.png",
    }


def test_the_study_command_writes_its_table_and_figure_without_loading_optax(tmp_path):
    # pandas and matplotlib write the table and the figure in this process; a flow needs no optax
    spec = tmp_path / "two.toml"
    spec.write_text("[base]\ntokens = 3\ndim = 2\ninits = 8\nt1 = 100.0\n[grid]\nseed = [0, 1]\n")
    out = tmp_path / "study"
    seen = (
        "import atexit, sys; "
        "atexit.register(lambda: print(sorted({'matplotlib', 'optax', 'pandas'} & set(sys.modules)))); "
    )
    args = ["study", str(spec), "--out", str(out), "--no-progress"]
    proc = subprocess.run([sys.executable, "-c", seen + COMMAND, *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    loaded = "\n['matplotlib', 'pandas']"
    assert proc.stdout.strip().endswith("figure: " + str(out / "comparison.png") + loaded)
    result = pz.load(out)
    assert (
        list(result.table["cell"]) == ["seed=0", "seed=1"]
        and (out / "comparison.png").stat().st_size > 10_000
    )
    for cell, run in result.runs.items():  # the table's numbers are the cells' own
        row = result.table[result.table["cell"] == cell].iloc[0]
        assert row["median_max_weight"] == run.summary["median_max_weight"]


def test_a_failing_sweep_reports_counts_writes_everything_and_exits_nonzero(tmp_path, capfd):
    """Every init hits max_steps: one line by reason with a hint, all files, no LAPACK noise."""
    out = tmp_path / "fail"
    args = ["--objective", "cross-entropy", "--t1", "1e6", "--max-steps", "20", "--inits", "6"]
    assert main(["sweep", *args, "--tokens", "4", "--dim", "4", "--out", str(out), "--no-progress"]) == 1
    captured = capfd.readouterr()
    lines = captured.out.splitlines()
    assert "6 inits, 6 failed" in lines[0]
    assert lines[1] == ("failed 6 of 6 inits (max_steps_reached: 6); hint: " + status.HINTS[status.MAX_STEPS])
    assert "DLASCL" not in captured.err and "Traceback" not in captured.err
    for name in ("config.json", "summary.json", "per_init.npz", "series.npz", "weights.png", "winners.png"):
        assert (out / name).exists(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed_max_steps_reached"] == 6 and summary["median_max_weight"] is None
    arrays = np.load(out / "per_init.npz")
    assert np.isnan(arrays["final_top_share"]).all() and np.isnan(arrays["time_to_0.9"]).all()


def test_more_than_half_failed_is_the_exit_rule():
    from polarize.runs._results import failed_too_many, failure_line

    assert failed_too_many({"n_inits": 100, "n_failed": 51})
    assert not failed_too_many({"n_inits": 100, "n_failed": 50})
    assert failure_line({"n_inits": 4, "n_failed": 0}) is None


def test_distributed_without_a_coordinator_is_one_line(tmp_path, capsys, monkeypatch):
    from polarize.solve._devices import COORDINATOR_ENV

    for name in COORDINATOR_ENV:
        monkeypatch.delenv(name, raising=False)
    assert main(["sweep", *SMALL, "--distributed", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "`--distributed` needs a coordinator: set JAX_COORDINATOR_ADDRESS" in err


def test_load_refuses_a_folder_that_is_not_a_run(tmp_path):
    with pytest.raises(pz.PolarizeError, match="is not a polarize run"):
        pz.load(tmp_path)


def test_the_cli_cache_keeps_programs_however_quick_their_compile(tmp_path):
    # a fresh process (the cache settings are process-wide): one small eager check,
    # ~20 ms to compile, must land in the cache, as the ~40 of a sweep's start do
    code = (
        "from polarize.solve._devices import enable_compilation_cache\n"
        "enable_compilation_cache()\n"
        "import jax.numpy as jnp\n"
        "bool(jnp.any(~jnp.isfinite(jnp.arange(3.0))))\n"
    )
    env = {"POLARIZE_CACHE_DIR": str(tmp_path / "cache"), "POLARIZE_NO_CACHE": "", "JAX_PLATFORMS": "cpu"}
    subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, check=True)
    assert len(list((tmp_path / "cache" / "jax").rglob("*-cache"))) >= 2


def test_the_command_as_users_run_it_cold_and_warm_gives_the_in_process_numbers(tmp_path):
    # the `polarize` command with its compilation cache on (as users get it: the suite
    # runs without), on an empty cache and again on the cache it filled, gives the numbers
    # of the sweep run here without a cache, bit for bit
    env = {**os.environ, "POLARIZE_CACHE_DIR": str(tmp_path / "cache"), "POLARIZE_NO_CACHE": ""}
    env["PYTHONPATH"] = str(Path(__file__).parents[1])
    args = ["sweep", *SMALL, "--no-progress"]
    for run in ("cold", "warm"):
        command = [sys.executable, "-m", "polarize.cli", *args, "--out", str(tmp_path / run)]
        subprocess.run(command, env=env, check=True, capture_output=True)
    assert len(list((tmp_path / "cache" / "jax").rglob("*-cache"))) > 3
    assert main([*args, "--out", str(tmp_path / "here")]) == 0
    here = np.load(tmp_path / "here" / "per_init.npz")
    for run in ("cold", "warm"):
        there = np.load(tmp_path / run / "per_init.npz")
        assert sorted(there.files) == sorted(here.files)
        for k in here.files:
            np.testing.assert_array_equal(there[k], here[k], err_msg=f"{run} {k}")


def test_a_cache_folder_that_cannot_be_made_is_one_line(tmp_path, capsys, monkeypatch):
    taken = tmp_path / "a-file"
    taken.write_text("")
    monkeypatch.setenv("POLARIZE_NO_CACHE", "")
    monkeypatch.setenv("POLARIZE_CACHE_DIR", str(taken))
    assert main(["sweep", *SMALL, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("polarize: error: `POLARIZE_CACHE_DIR`")
    assert "a-file" in err and "POLARIZE_NO_CACHE=1 turns the cache off" in err
    assert not (tmp_path / "out").exists()


def test_the_cli_starts_without_the_transformer_labs_imports():
    # the lab (matplotlib, its training code) loads on first use, not at every start
    code = (
        "import sys\n"
        "import polarize as pz\n"
        "from polarize.cli import build_parser\n"
        "build_parser()\n"
        "assert 'matplotlib' not in sys.modules, 'matplotlib imported at start'\n"
        "assert 'polarize.transformer.experiments' not in sys.modules\n"
        "from polarize.transformer import Config, fit\n"
        "assert pz.transformer.Config is Config and callable(fit)\n"
        "assert 'matplotlib' in sys.modules\n"
        "try:\n"
        "    pz.transformer.no_such_name\n"
        "except AttributeError as e:\n"
        "    assert 'no_such_name' in str(e)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})


def test_help_and_bad_input_answer_before_jax_is_imported(tmp_path):
    # every command validates its arguments without JAX (the package's names load on first use)
    study = tmp_path / "bad.toml"
    study.write_text('[grid]\nkappa = [1.0]\n[plot]\ny = "no_such_statistic"\n')
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    cases = [
        (["--help"], 0, "COMMAND"),
        (["sweep", "--help"], 0, "--inits"),
        (["sweep", "--help"], 0, "one of value, prompt"),
        (["sweep", "--norm", "nope"], 2, "`norm` must be one of softmax"),
        (["sweep", "--levels", "2"], 2, "`levels` must be numbers in (0, 1]"),
        (["sweep", "--model", "prompt", "--objective", "logistic"], 2, "does not apply to model prompt"),
        (["sweep", "--train", "vp"], 2, "--train (only for model prompt)"),
        (["sweep", "--resume", str(tmp_path / "none")], 2, "polarize: error:"),
        (["study", str(study)], 2, "is not a statistic"),
        (["report", str(tmp_path)], 2, "is neither a sweep folder"),
        (["sinks", str(tmp_path / "none.npz")], 2, "must be an existing .npz file"),
        (["sinks", "--model", str(tmp_path / "none"), "--text", str(study)], 2, "`--model`"),
        (["sinks", "--model", str(tmp_path), "--text", str(empty)], 2, "`--text`"),
        (["induction", "--out", str(tmp_path / "i"), "--heads", "two"], 2, "`--heads` must be"),
    ]
    code = (
        "import sys, contextlib, io\n"
        "import polarize as pz\n"
        "from polarize.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
        "    try:\n"
        "        code = main(sys.argv[1:])\n"
        "    except SystemExit as e:\n"
        "        code = e.code\n"
        "heavy = ('jax', 'diffrax', 'equinox', 'optax', 'matplotlib', 'pandas', 'torch', 'transformers')\n"
        "loaded = [m for m in heavy if m in sys.modules]\n"
        "print(code, loaded, out.getvalue())\n"
    )
    for args, expected, text in cases:
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
        assert proc.stdout.startswith(f"{expected} [] "), (args, proc.stdout[:500])
        assert text in proc.stdout, (args, proc.stdout[:500])
    assert not (tmp_path / "i").exists()


def test_the_public_names_load_on_first_use():
    # `import polarize` is cheap; each name resolves to its module's object, and dir() lists them all
    code = (
        "import sys\n"
        "import polarize as pz\n"
        "assert 'jax' not in sys.modules\n"
        "from polarize.solve._flow import flow\n"
        "assert pz.flow is flow and pz.solve.flow is flow\n"
        "assert set(pz.__all__) <= set(dir(pz))\n"
        "missing = [n for n in pz.__all__ if getattr(pz, n, None) is None]\n"
        "assert not missing, missing\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
