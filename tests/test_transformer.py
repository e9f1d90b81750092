"""Transformer lab: normalizations against NumPy loops, masking, data invariants, learning, CLI."""

import argparse
import json
import math
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from polarize import storage
from polarize.errors import PolarizeError
from polarize.transformer import tasks, train
from polarize.transformer.attention import NORMALIZATIONS, make_normalization
from polarize.transformer.model import Transformer


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def _elu1(x):
    return x + 1.0 if x > 0 else math.exp(x)


def _sparsemax_row(z):
    """Simplex projection by bisection on tau: sum_j max(z_j - tau, 0) = 1."""
    lo, hi = min(z) - 1.0, max(z)
    for _ in range(200):
        tau = 0.5 * (lo + hi)
        lo, hi = (tau, hi) if sum(max(x - tau, 0.0) for x in z) > 1.0 else (lo, tau)
    return [max(x - tau, 0.0) for x in z]


def reference(name, q, k, mask, logit):
    """Attention weights by explicit loops over heads, queries and allowed keys."""
    h_, n, d = q.shape
    out = np.zeros((h_, n, k.shape[1]))
    for h in range(h_):
        for i in range(n):
            keys = [j for j in range(k.shape[1]) if mask[i, j]]
            dot = lambda a, b: sum(float(a[t]) * float(b[t]) for t in range(d))
            s = {j: dot(q[h, i], k[h, j]) / math.sqrt(d) for j in keys}
            if name in ("softmax", "gated-softmax"):
                z = sum(math.exp(v) for v in s.values())
                w = {j: math.exp(s[j]) / z for j in keys}
            elif name in ("softmax1", "softmax-sink"):
                z = math.exp(logit[h]) + sum(math.exp(v) for v in s.values())
                w = {j: math.exp(s[j]) / z for j in keys}
            elif name.startswith("sigmoid"):
                b = -math.log(k.shape[1]) if name.endswith("bias") else 0.0
                w = {j: _sigmoid(s[j] + b) for j in keys}
                if "norm" in name:
                    z = sum(w.values())
                    w = {j: v / z for j, v in w.items()}
            elif name.startswith("elu"):
                w = {
                    j: sum(_elu1(q[h, i, t]) * _elu1(k[h, j, t]) for t in range(d)) / math.sqrt(d)
                    for j in keys
                }
                if name == "elu-norm":
                    z = sum(w.values())
                    w = {j: v / z for j, v in w.items()}
            elif name.startswith("linear"):
                w = dict(s)
                if name == "linear-norm":
                    z = max(abs(sum(w.values())), 1.0)
                    w = {j: v / z for j, v in w.items()}
            elif name == "sparsemax":
                w = dict(zip(keys, _sparsemax_row([s[j] for j in keys])))
            for j, v in w.items():
                out[h, i, j] = v
    return out


def test_registry_is_covered_by_the_reference():
    assert set(NORMALIZATIONS) == {
        "softmax",
        "softmax1",
        "softmax-sink",
        "gated-softmax",
        "sparsemax",
        "sigmoid",
        "sigmoid-bias",
        "sigmoid-norm",
        "sigmoid-norm-bias",
        "elu",
        "elu-norm",
        "linear",
        "linear-norm",
    }


@pytest.mark.parametrize("name", sorted(NORMALIZATIONS))
@pytest.mark.parametrize("causal", [True, False])
def test_normalization_matches_loops(name, causal):
    kq, kk, kb = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(kq, (2, 5, 4), jnp.float64)
    k = 2.0 * jax.random.normal(kk, (2, 5, 4), jnp.float64)
    mask = np.tril(np.ones((5, 5), bool)) if causal else np.ones((5, 5), bool)
    norm = make_normalization(name, 2)
    logit = np.zeros(2)
    if name == "softmax-sink":
        logit = np.asarray(jax.random.normal(kb, (2,)))
        norm = eqx.tree_at(lambda m: m.logit, norm, jnp.asarray(logit))
    got = np.asarray(norm(q, k, jnp.asarray(mask)))
    want = reference(name, np.asarray(q), np.asarray(k), mask, logit)
    assert np.allclose(got, want, atol=1e-6), np.abs(got - want).max()
    if name == "linear-norm":  # divided by max(|row sum|, 1): |row sum| <= 1
        assert norm.normalized and np.all(np.abs(got.sum(-1)) <= 1 + 1e-9)
    else:
        assert norm.normalized == np.allclose(got.sum(-1), 1.0)


@pytest.mark.parametrize("name", sorted(NORMALIZATIONS))
def test_causal_masking_masks(name):
    model = Transformer(20, 20, width=16, heads=2, norm=name, key=jax.random.key(1))
    x = jnp.arange(8, dtype=jnp.int32)
    y = x.at[5:].set(jnp.asarray([19, 18, 17], jnp.int32))  # change the future only
    (lx, ax), (ly, _) = model.forward(x), model.forward(y)
    assert np.allclose(lx[:5], ly[:5], atol=1e-5) and not np.allclose(lx[5:], ly[5:])
    assert np.all(np.triu(np.asarray(ax), k=1) == 0)
    both = Transformer(20, 20, width=16, heads=2, norm=name, causal=False, key=jax.random.key(1))
    assert not np.allclose(both(x)[:5], both(y)[:5])


@pytest.mark.parametrize("positions", ["none", "learned", "rope"])
def test_positions(positions):
    model = Transformer(20, 20, width=16, heads=2, positions=positions, causal=False, key=jax.random.key(2))
    x = jnp.asarray([3, 1, 4, 9], jnp.int32)
    perm = jnp.asarray([2, 0, 3, 1])
    # without positions a bidirectional transformer is permutation-equivariant
    same = np.allclose(model(x)[perm], model(x[perm]), atol=1e-5)
    assert same == (positions == "none")


def test_induction_data_invariants():
    for shift in (False, True):
        x, y = tasks.induction(jax.random.key(3), 200, shift_query=shift)
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape == (200, 12) and x.dtype == np.int32
        assert np.all(x[:, 0] == 50) and np.all(y[:, :-1] == x[:, 1:])
        body = x[:, 1:11]
        assert all(len(set(r)) == 10 for r in body) and body.max() < 50
        query = x[:, -1] - (51 if shift else 0)
        for r, qt, ans in zip(body, query, y[:, -1]):
            pos = list(r).index(qt)
            assert pos < 9 and r[pos + 1] == ans
        assert x.max() < tasks.induction_vocab(50, shift)
    a, b = tasks.induction(jax.random.key(3), 5), tasks.induction(jax.random.key(3), 5)
    assert np.array_equal(a[0], b[0])


def test_classification_data_and_attack_invariants():
    xa, la = tasks.classification(jax.random.key(4), 100)
    xb, lb = tasks.classification(jax.random.key(5), 100)
    xa, la = np.asarray(xa), np.asarray(la)
    assert xa.shape == (100, 11) and np.all(xa[:, -1] == 40)
    assert np.all(xa[:, :-1] // 10 == la[:, None])
    assert all(len(set(r)) == 10 for r in xa[:, :-1])
    att = np.asarray(jax.random.uniform(jax.random.key(6), (100, 11)))
    hit = np.asarray(tasks.single_token_attack(jax.random.key(7), jnp.asarray(xa), xb, att))
    top = xa[np.arange(100), att[:, :-1].argmax(1)]
    changed = hit != np.asarray(xb)
    assert np.all(hit[:, -1] == 40) and np.all(changed.sum(1) <= 1)
    assert np.all(changed.sum(1)[la != np.asarray(lb)] == 1)  # a foreign token always lands
    assert np.all((hit == top[:, None]).any(1))
    xc, lc = tasks.classification(jax.random.key(5), 100, labels=(la + 1) % 4)
    lc = np.asarray(lc)
    assert np.all(lc == (la + 1) % 4) and np.all(np.asarray(xc)[:, :-1] // 10 == lc[:, None])


def test_tiny_model_learns_induction():
    keys = jax.random.split(jax.random.key(8), 1)
    models = train.stack_models(lambda k: Transformer(51, 51, width=64, heads=4, key=k), keys)
    data = jax.vmap(lambda k: tasks.induction(k, 256 * 70))(keys)
    models, hist = train.fit(models, train.induction_loss, data, keys, lr=3e-3, epochs=3, batch=256)
    x, y = tasks.induction(jax.random.key(9), 500)
    acc = eqx.filter_vmap(lambda m: jnp.mean(jnp.argmax(jax.vmap(m)(x)[:, -1], -1) == y[:, -1]))(models)
    assert hist.shape == (1, 3) and np.all(hist[:, -1] < hist[:, 0])
    assert np.all(np.asarray(acc) > 0.9), acc  # chance is 1/50; guessing from context 1/10


def test_bad_model_input_messages():
    with pytest.raises(PolarizeError, match="`norm` must be one of softmax.*got 'soft'"):
        make_normalization("soft", 1)
    with pytest.raises(PolarizeError, match="`positions` must be one of none, learned, rope"):
        Transformer(5, 5, positions="abs", key=jax.random.key(0))
    with pytest.raises(PolarizeError, match="`width` must be divisible by `heads`.*width=10"):
        Transformer(5, 5, width=10, heads=3, key=jax.random.key(0))


def polarize_main(argv: list[str]) -> int:
    """Stand-in for the package's `main`: argparse + add_subcommands + one-line errors."""
    from polarize.transformer.cli import add_subcommands

    parser = argparse.ArgumentParser(prog="polarize")
    add_subcommands(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except PolarizeError as e:
        print(f"polarize: error: {e}")
        return 2


def test_induction_cli_resumes_and_refuses(tmp_path, capsys):
    out = tmp_path / "ind"
    argv = ["induction", "--small", "--norms", "softmax", "--seeds", "2", "--out", str(out)]
    assert polarize_main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["units"] == summary["expected_units"] == 2
    assert {"softmax"} == set(summary["by_norm"])
    assert (out / "induction.png").stat().st_size > 0 and (out / "attention_maps.png").exists()
    config = json.loads((out / "config.json").read_text())
    assert config["versions"]["jax"] == jax.__version__ and config["norms"] == ["softmax"]
    first, second = (out / "units" / f"softmax_L2_H2_lr0.003_s{s}.npz" for s in (0, 1))
    before, trained_beside = first.stat().st_mtime_ns, storage.read_npz(second)
    second.unlink()  # as if interrupted: the rerun trains seed 1 alone
    assert polarize_main(argv) == 0
    assert first.stat().st_mtime_ns == before
    trained_alone = storage.read_npz(second)  # a seed does not depend on its neighbours
    assert np.allclose(trained_alone["loss"], trained_beside["loss"], rtol=1e-4)
    assert np.allclose(trained_alone["sink_score"], trained_beside["sink_score"], atol=1e-4)
    capsys.readouterr()
    assert polarize_main(argv[:-3] + ["1", "--out", str(out)]) == 2
    assert re.search("`--out` .* holds a different config.*--overwrite", capsys.readouterr().out)
    argv[3], argv[5] = "sigmoid", "1"
    assert polarize_main(argv + ["--overwrite"]) == 0
    assert json.loads((out / "summary.json").read_text())["units"] == 1
    assert not first.exists()  # the old config's units are gone


def test_classify_cli(tmp_path):
    out = tmp_path / "cls"
    assert (
        polarize_main(["classify", "--small", "--norms", "softmax", "--seeds", "1", "--out", str(out)]) == 0
    )
    entry = json.loads((out / "summary.json").read_text())["by_norm"]["softmax"]
    assert 0 <= entry["flip_rate"] <= 1 and entry["pairs"] == 64 and entry["runs"] == 1
    assert (out / "classify.png").exists()


def test_sinks_cli(tmp_path, capsys):
    a = np.zeros((2, 3, 5, 5))
    a[0, :, :, 0] = 1.0
    a[1] = np.tril(np.ones((5, 5)))  # unnormalized
    storage.write_npz(tmp_path / "maps.npz", {"attention": a, "other": np.ones(3)})
    png = tmp_path / "m.png"
    assert polarize_main(["sinks", str(tmp_path / "maps.npz"), "--out", str(png)]) == 0
    text = capsys.readouterr().out
    assert "Sink_0^0.3 = 1.000" in text and png.stat().st_size > 0
    assert len([line for line in text.splitlines() if line[:5].strip().isdigit()]) == 6


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["induction", "--norms", "softmax,soft", "--out", "x"],
            "`norms` must be one of softmax, softmax1,.*got 'soft'",
        ),
        (["classify", "--seeds", "0", "--out", "x"], "`seeds` must be a positive integer; got 0"),
        (
            ["induction", "--heads", "two", "--out", "x"],
            "`--heads` must be a comma-separated list of int; got 'two'",
        ),
        (["induction", "--heads", "3", "--out", "x"], "`heads` must divide `width`=64; got 3"),
        (
            ["induction", "--preset", "huge", "--out", "x"],
            "`preset` must be one of default, small, paper; got 'huge'",
        ),
        (["sinks", "missing.npz"], "`FILE` must be an existing .npz file; got 'missing.npz'"),
        (["sinks", "MAPS", "--key", "nope"], "`--key` must be one of attention, flat; got 'nope'"),
        (["sinks", "MAPS", "--key", "flat"], "`--key` 'flat' must hold numbers shaped"),
    ],
)
def test_bad_cli_input_messages(argv, message, tmp_path, capsys):
    storage.write_npz(tmp_path / "maps.npz", {"attention": np.ones((2, 3, 3)), "flat": np.ones(3)})
    argv = [str(tmp_path / "maps.npz") if a == "MAPS" else a for a in argv]
    assert polarize_main(argv) == 2
    assert re.search(message, capsys.readouterr().out)


def test_non_empty_out_without_config_is_refused(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert polarize_main(["induction", "--small", "--out", str(tmp_path)]) == 2
    assert "is not empty and holds a different config" in capsys.readouterr().out
    assert (tmp_path / "notes.txt").exists()
