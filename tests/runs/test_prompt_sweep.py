"""Sweeps of prompt attention (`--model prompt`): what they store, against an independent flow
of the same initializations built by hand; chunking and resume; hitting times against a
dense flow; the summary against numpy; the table, figures, studies and the CLI's refusals."""

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polarize as pz
from polarize.cli import main
from polarize.runs import report
from polarize.runs._folder import settings_hash

SAMPLES, TOKENS, DIM = 4, 5, 6
BASE = dict(model="prompt", objective="logistic-data", samples=SAMPLES, tokens=TOKENS, dim=DIM)
BASE.update(t1=1e4, n_save=16, snapshots=8, block_size=16, inits=40)
#: What a prompt sweep stores of `token_selection(...).final()`, by its name there.
SELECTION = {
    "all_best": "final_all_best",
    "share_best": "final_share_best",
    "feasible": "final_feasible",
    "svm_norm": "final_svm_norm",
    "cos_selected": "final_cos_selected",
    "cos_best": "final_cos_best",
    "norm": "final_p_norm",
    "log_slope": "final_log_slope",
    "cos_value": "final_cos_value",
}


def arrays(folder) -> dict:
    with np.load(Path(folder) / "per_init.npz") as a, np.load(Path(folder) / "series.npz") as b:
        return {**{k: a[k] for k in a.files}, **{k: b[k] for k in b.files if k.startswith("snap_")}}


def by_hand(config: pz.SweepConfig):
    """The sweep's task and initializations from `prompt_task`/`init_prompts` and its seed's
    keys (data from fold_in(key(seed), 2), init i from fold_in(fold_in(key(seed), 1), i)),
    and their flow by `pz.flow` in blocks of the same size."""
    key = jax.random.key(config.seed)
    X, y, v = pz.prompt_task(jax.random.fold_in(key, 2), SAMPLES, TOKENS, DIM)
    scale = None if config.train == "p" else config.v_scale
    model = pz.init_prompts(jax.random.fold_in(key, 1), config.inits, X, v, v_scale=scale, train=config.train)
    objective = pz.LogisticLabels(y)
    options = dict(t1=config.t1, n_save=config.n_save, block_size=config.block_size)
    return model, objective, pz.flow(model, objective, **options)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A prompt sweep of 40 initializations in three chunks (16, 16, 8), with its figures."""
    out = tmp_path_factory.mktemp("prompt") / "run"
    config = pz.SweepConfig(**BASE, chunk_size=16)
    pz.run_sweep(config, out)
    return out, pz.SweepConfig.from_dict(json.loads((out / "config.json").read_text())["sweep"])


def test_stored_statistics_are_those_of_an_independent_flow(sweep):
    out, config = sweep
    got = arrays(out)
    model, objective, traj = by_hand(config)
    assert bool(np.all(traj.ok)) and bool(np.all(got["ok"]))
    selection = pz.token_selection(traj, model, objective.y)
    final = selection.final()
    for name, stored in SELECTION.items():
        np.testing.assert_allclose(got[stored], final[name], rtol=1e-12, atol=0, err_msg=name)
    np.testing.assert_array_equal(got["final_selected"], selection.selected)
    np.testing.assert_array_equal(got["final_best"], selection.best)
    keep = config.snapshot_index()
    np.testing.assert_allclose(got["snap_cos_selected"], selection.cos_selected[:, keep].astype(np.float32))
    # max weight of the least polarized sample, entropy of the most uniform one (numpy)
    w = np.abs(np.asarray(traj.weights))
    p = w / w.sum(axis=-1, keepdims=True)  # (inits, times, samples, tokens)
    top = p.max(axis=-1).min(axis=-1)
    H = (-np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)).max(axis=-1)
    np.testing.assert_allclose(got["final_max_weight"], top[:, -1], rtol=1e-12)
    np.testing.assert_allclose(got["final_entropy"], H[:, -1], rtol=1e-12)
    np.testing.assert_allclose(got["final_loss"], np.asarray(traj.loss)[:, -1], rtol=1e-12)
    np.testing.assert_allclose(got["snap_max_weight"], top[:, keep].astype(np.float32), rtol=1e-6)
    np.testing.assert_array_equal(got["solver_steps"], traj.steps)
    assert np.isnan(got["final_cos_value"]).all()  # v is not trained
    assert got["final_selected"].dtype == np.int32 and got["final_selected"].shape == (40, SAMPLES)


def test_numbers_do_not_depend_on_chunks_and_survive_a_resume(sweep, tmp_path):
    out, _ = sweep
    whole = tmp_path / "whole"
    pz.run_sweep(pz.SweepConfig(**BASE, chunk_size=40), whole, figures=False)
    ref = arrays(out)
    for name, x in arrays(whole).items():
        np.testing.assert_array_equal(x, ref[name], err_msg=name)
    # an interrupted run: one chunk and the assembly lost, then resumed
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    (resumed / "chunks" / "chunk-000001.npz").unlink()
    for name in ("summary.json", "per_init.npz", "series.npz"):
        (resumed / name).unlink()
    pz.run_sweep(pz.SweepConfig(**BASE), resumed, resume=True, figures=False)
    for name, x in arrays(resumed).items():
        np.testing.assert_array_equal(x, ref[name], err_msg=name)


def crossing_times(ts, top, level):
    """Where `top` (times,) first reaches `level`, by linear interpolation in log t between
    the saved times around it, and that bracket; inf where never reached."""
    k = int(np.argmax(top >= level))
    if top[k] < level:
        return np.inf, (np.inf, np.inf)
    x = np.log(ts[k - 1 : k + 1])
    f = (level - top[k - 1]) / (top[k] - top[k - 1])
    return float(np.exp(x[0] + f * (x[1] - x[0]))), (ts[k - 1], ts[k])


def test_hitting_times_are_the_least_polarized_samples_crossings(sweep):
    """The stored `time_to_<level>` against a dense flow of the same inits (800 saves per
    decade from t = 0.01 to t1: spacing 0.3%), located on min_i max_t p_it by interpolation."""
    out, config = sweep
    got = arrays(out)
    model, objective, _ = by_hand(config)
    ts = np.geomspace(1e-2, config.t1, 800 * 6 + 1)
    first = pz.PromptAttention(model.v[:4], model.p[:4], model.X)
    dense = pz.flow(first, objective, t1=config.t1, ts=ts, rtol=1e-10, atol=1e-12)
    w = np.abs(np.asarray(dense.weights))
    top = (w / w.sum(axis=-1, keepdims=True)).max(axis=-1).min(axis=-1)  # (4, times)
    checked = 0
    for i in range(4):
        assert top[i, 0] < config.levels[0]  # not reached at the start
        for level in config.levels:
            stored = got[f"time_to_{level:g}"][i]
            want, (lo, hi) = crossing_times(ts, top[i], level)
            if not np.isfinite(want):
                assert stored == np.inf
                continue
            # within the bracket of the dense saves (to the sweep's tolerance), and close to
            # the interpolated crossing: within a tenth of the bracket
            assert lo * (1 - 1e-4) <= stored <= hi * (1 + 1e-4), (i, level, stored, lo, hi)
            assert abs(stored - want) <= 0.1 * (hi - lo) + 1e-4 * want, (i, level, stored, want)
            checked += 1
    assert checked >= 8


def test_square_label_hitting_times_restart_from_the_saved_states(tmp_path):
    """Square labels take the stiff default, outside the batched loop: their hitting times
    come from solves restarted at the saved states (`restarted_hitting_times`). Joint
    training (the loss reaches 1e-3 of L(0)), against a dense flow as above."""
    settings = dict(objective="square", inits=8, t1=1e3, train="vp", v_scale=0.5, levels=(0.3,))
    config = pz.SweepConfig(**{**BASE, **settings, "rtol": 1e-10, "atol": 1e-12})
    pz.run_sweep(config, tmp_path / "square", figures=False)
    got = arrays(tmp_path / "square")
    key = jax.random.key(0)
    X, y, _ = pz.prompt_task(jax.random.fold_in(key, 2), SAMPLES, TOKENS, DIM)
    model = pz.init_prompts(jax.random.fold_in(key, 1), 8, X, np.zeros(DIM), v_scale=0.5, train="vp")
    ts = np.concatenate([[0.0], np.geomspace(1e-3, config.t1, 400 * 6 + 1)])
    dense = pz.flow(model, pz.SquareLabels(y), t1=config.t1, ts=ts, rtol=1e-11, atol=1e-13)
    w = np.abs(np.asarray(dense.weights))
    top = (w / w.sum(axis=-1, keepdims=True)).max(axis=-1).min(axis=-1)
    loss = np.asarray(dense.loss)
    checked = 0
    for i in range(8):
        for name, series, level in (
            ("time_to_0.3", top[i], 0.3),
            ("time_to_loss_0.001", -loss[i], -1e-3 * loss[i, 0]),
        ):
            stored = got[name][i]
            if series[0] >= level:
                assert stored == 0.0, (i, name)
                continue
            want, (lo, hi) = crossing_times(ts, series, level)
            if not np.isfinite(want):
                assert stored == np.inf, (i, name)
                continue
            assert lo * (1 - 1e-6) <= stored <= hi * (1 + 1e-6), (i, name, stored, lo, hi)
            assert abs(stored - want) <= 0.1 * (hi - lo), (i, name, stored, want)
            checked += 1
    assert checked >= 10


def test_descent_hitting_times_are_the_first_steps_that_reach_a_level(tmp_path):
    """... and with gradient descent, the first step index whose iterate reaches it, x lr:
    against plain GD by `jax.grad` of the loss as defined, every iterate kept."""
    lr, steps = 1.0, 800
    config = pz.SweepConfig(**{**BASE, "inits": 8, "method": "gd", "lr": lr, "steps": steps})
    pz.run_sweep(dataclasses.replace(config, levels=(0.5, 0.9)), tmp_path / "gd", figures=False)
    got = arrays(tmp_path / "gd")
    model, objective, _ = by_hand(dataclasses.replace(config, t1=1.0, n_save=2))
    X, y, v = (np.asarray(x) for x in (model.X, objective.y, model.v[0]))

    def loss(p):
        f = jnp.sum((X @ v) * jax.nn.softmax(X @ p, axis=-1), axis=-1)
        return jnp.mean(jax.nn.softplus(-y * f))

    def step(p, _):
        p = p - lr * jax.vmap(jax.grad(loss))(p)
        return p, p

    _, path = jax.lax.scan(step, model.p, None, length=steps)
    path = jnp.concatenate([model.p[None], path])  # (steps + 1, inits, dim)
    top = np.asarray(jax.nn.softmax(jnp.einsum("ntd,kid->kint", X, path), axis=-1)).max(-1).min(-1)
    for level in (0.5, 0.9):
        hit = top >= level  # (steps + 1, inits)
        want = np.where(hit.any(axis=0), np.argmax(hit, axis=0) * lr, np.inf)
        np.testing.assert_array_equal(got[f"time_to_{level:g}"], want)
        assert np.isfinite(want).sum() >= 4


def test_the_summary_is_a_numpy_recomputation_of_per_init(sweep):
    out, _ = sweep
    a = arrays(out)
    summary = json.loads((out / "summary.json").read_text())
    ok = a["ok"]
    assert summary["n_inits"] == 40 and summary["n_failed"] == int((~ok).sum())
    assert summary["share_global_selection"] == pytest.approx(a["final_all_best"][ok].mean(), abs=0)
    assert summary["n_selections"] == len({tuple(s) for s in a["final_selected"][ok]})
    feasible = ok & a["final_feasible"]
    assert summary["n_infeasible"] == int((ok & ~feasible).sum())
    assert summary["median_one_minus_cos_selected"] == pytest.approx(
        np.median(1 - a["final_cos_selected"][feasible]), rel=1e-15
    )
    assert summary["median_one_minus_cos_best"] == pytest.approx(
        np.median(1 - a["final_cos_best"][ok]), rel=1e-15
    )
    slope = a["final_log_slope"][feasible] / a["final_svm_norm"][feasible]
    assert summary["median_slope_over_svm_norm"] == pytest.approx(np.median(slope), rel=1e-15)
    assert summary["median_cos_value"] is None  # v fixed
    assert summary["median_max_weight"] == pytest.approx(np.median(a["final_max_weight"][ok]), rel=1e-15)
    level = a["time_to_0.9"][ok]
    assert summary["fraction_reached_0.9"] == pytest.approx(np.isfinite(level).mean(), abs=0)
    assert summary["n_selections"] >= 2  # this task has several selections: the count is tested


def test_the_table_figures_and_report(sweep):
    out, _ = sweep
    run = pz.load(out)
    frame = run.frame()
    assert len(frame) == 40 and list(frame["init"]) == list(range(40))
    a = arrays(out)
    for name in ("final_cos_selected", "final_p_norm", "final_log_slope", "final_all_best", "time_to_0.9"):
        np.testing.assert_array_equal(frame[name].to_numpy(), a[name], err_msg=name)
    assert frame["model"].eq("prompt").all() and frame["train"].eq("p").all()
    assert list(frame["final_selected"]) == ["-".join(map(str, s)) for s in a["final_selected"]]
    assert frame["final_best"].nunique() == 1  # v fixed: one best-score selection
    series = run.series()
    assert len(series) == 40 * len(run.arrays["snap_ts"])
    np.testing.assert_array_equal(series["cos_selected"], a["snap_cos_selected"].reshape(-1))
    pngs = ["weights.png", "entropy_hist.png", "selections.png", "svm_alignment.png", "one_hot_fraction.png"]
    assert sorted(p.name for p in out.glob("*.png")) == sorted(pngs)
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.npz")}
    for name in pngs:
        (out / name).unlink()
    assert sorted(p.name for p in report(out)) == sorted(pngs)
    assert all((out / name).stat().st_size > 10_000 for name in pngs)
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.npz")} == before


def test_joint_training_stores_the_value_svm_cosine(tmp_path):
    config = pz.SweepConfig(**{**BASE, "inits": 16, "train": "vp", "v_scale": 0.5})
    summary = pz.run_sweep(config, tmp_path / "vp", figures=False)
    got = arrays(tmp_path / "vp")
    model, objective, traj = by_hand(pz.SweepConfig(**{**BASE, "inits": 16, "train": "vp", "v_scale": 0.5}))
    np.testing.assert_allclose(model.v, np.asarray(traj.v)[:, 0])  # v(0) ~ 0.5 N(0, I)
    want = pz.token_selection(traj, model, objective.y).final()["cos_value"]
    ok = got["ok"] & got["final_feasible"]
    assert ok.sum() >= 8 and np.all(np.isfinite(got["final_cos_value"][ok]))
    np.testing.assert_allclose(got["final_cos_value"], want, rtol=1e-12)
    assert summary["median_cos_value"] == pytest.approx(
        np.median(want[np.isfinite(want) & got["ok"]]), rel=1e-15
    )
    assert len({tuple(b) for b in got["final_best"]}) >= 1  # best tokens per init (v moves)


def test_a_study_over_the_init_scale(tmp_path, capsys):
    """A grid over p_scale of model prompt (the fixture's program: p_scale is data only)."""
    spec = tmp_path / "scale.toml"
    base = "".join(f"{k} = {json.dumps(v)}\n" for k, v in BASE.items() if k != "inits")
    spec.write_text(
        f'name = "prompt-scale"\n[base]\n{base}inits = 16\n[grid]\np_scale = [0.1, 1.0]\n'
        '[plot]\nx = "p_scale"\ny = ["cos_selected", "share_global_selection", "time_to_0.9"]\n'
    )
    assert main(["study", str(spec), "--out", str(tmp_path / "study"), "--no-progress"]) == 0
    result = pz.load(tmp_path / "study")
    assert list(result.table["p_scale"]) == [0.1, 1.0] and list(result.table["status"]) == ["ok", "ok"]
    for name, run in result.runs.items():
        assert run.arrays["final_selected"].shape == (16, SAMPLES), name
        row = result.table.set_index("cell").loc[name]
        assert row["n_selections"] == run.summary["n_selections"]
        assert row["share_global_selection"] == pytest.approx(run.arrays["final_all_best"].mean(), abs=0)
    small, large = (result.runs[f"p_scale={s}"].arrays["final_p_norm"] for s in ("0.1", "1.0"))
    assert not np.array_equal(small, large)  # the cells differ in their initializations
    frame = result.frame()
    assert len(frame) == 32 and set(frame["p_scale"]) == {0.1, 1.0}
    assert (tmp_path / "study" / "comparison.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    "args, says",
    [
        (
            ["--model", "prompt", "--objective", "logistic"],
            "`objective` logistic does not apply to model prompt; valid: logistic-data, square",
        ),
        (["--train", "vp"], "--train (only for model prompt)"),
        (["--p-scale", "1"], "--p-scale (only for model prompt)"),
        (["--model", "bogus"], "`model` must be one of value, prompt; got 'bogus'"),
        (
            ["--model", "prompt", "--objective", "square", "--kappa", "3"],
            "--kappa (only for objective square and model value)",
        ),
        (
            ["--model", "prompt", "--objective", "square", "--train", "pv"],
            "`train` must be one of p, vp; got 'pv'",
        ),
        (  # v stays the task's: a v_scale would only enter config.json
            ["--model", "prompt", "--objective", "square", "--v-scale", "0.5"],
            "--v-scale (only for model value, or model prompt and train vp)",
        ),
        (["--model", "prompt", "--objective", "square", "--p-scale", "-1"], "`p_scale` must be >= 0"),
    ],
)
def test_bad_prompt_settings_are_one_line(args, says, tmp_path, capsys):
    assert main(["sweep", *args, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("polarize: error: ") and says in err, err
    assert not (tmp_path / "x").exists()


def test_value_sweeps_keep_their_settings_hash(tmp_path):
    """The hash that a value sweep's chunks carry is the one of the settings as they were
    before `model`, `train` and `p_scale` existed, so a folder stored then still resumes."""
    for config in (pz.SweepConfig(), pz.SweepConfig(objective="square", kappa=3.0, method="gd")):
        before = {k: v for k, v in config.to_dict().items() if k not in ("model", "train", "p_scale")}
        old = {k: v for k, v in before.items() if k != "chunk_size"}
        assert settings_hash(config) == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()
    prompt = pz.SweepConfig(**BASE)
    assert settings_hash(prompt) != settings_hash(pz.SweepConfig(**{**BASE, "p_scale": 1.0}))
    assert settings_hash(prompt) != settings_hash(pz.SweepConfig(**{**BASE, "train": "vp"}))
    assert settings_hash(prompt) != settings_hash(pz.SweepConfig(**{**BASE, "model": "value"}))
    # a folder whose config.json predates the three settings: its chunks carry the hash of
    # the old settings, and it resumes without recomputing them
    out = tmp_path / "old"
    config = pz.SweepConfig(tokens=3, dim=3, method="gd", steps=20, n_save=4, inits=16)
    pz.run_sweep(config, out, figures=False)
    stored = json.loads((out / "config.json").read_text())
    for name in ("model", "train", "p_scale"):
        del stored["sweep"][name]
    (out / "config.json").write_text(json.dumps(stored))
    old = {k: v for k, v in stored["sweep"].items() if k != "chunk_size"}
    chunk = out / "chunks" / "chunk-000000.npz"
    with np.load(chunk) as z:
        assert str(z["settings"]) == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()
    mtime = chunk.stat().st_mtime_ns
    (out / "summary.json").unlink()
    summary = pz.run_sweep(config, out, resume=True, figures=False)
    assert summary["recomputed_chunks"] == {} and chunk.stat().st_mtime_ns == mtime
