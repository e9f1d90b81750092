"""Transformer lab: normalizations against NumPy loops, masking, data invariants, learning, CLI."""

import argparse
import dataclasses
import inspect
import json
import math
import re
import shutil
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from polarize.core._errors import PolarizeError
from polarize.measure import sinks
from polarize.runs import _storage as storage
from polarize.transformer import experiments, tasks, train
from polarize.transformer.attention import ATTENTIONS, ScoreAttention, make_attention
from polarize.transformer.experiments import PAPER_NORMS, Config, make_config
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


def _gelu(x):
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def _mlp(weights, x):
    """The MLP feature map, written out: W2 gelu(W1 x + b1) + b2."""
    (w1, b1), (w2, b2) = weights
    hidden = [_gelu(sum(w1[r, c] * x[c] for c in range(len(x))) + b1[r]) for r in range(len(b1))]
    return [sum(w2[r, c] * hidden[c] for c in range(len(hidden))) + b2[r] for r in range(len(b2))]


def reference(name, q, k, mask, logit, mlp=None):
    """Attention weights by explicit loops over heads, queries and allowed keys, written from
    the formulas of the paper's code (tml-epfl/softmax src/attention.py) and of the extras."""
    h_, n, d = q.shape
    out = np.zeros((h_, n, k.shape[1]))
    dot = lambda a, b: sum(float(a[t]) * float(b[t]) for t in range(len(a)))
    for h in range(h_):
        for i in range(n):
            keys = [j for j in range(k.shape[1]) if mask[i, j]]
            s = {j: dot(q[h, i], k[h, j]) / math.sqrt(d) for j in keys}
            base = name.removesuffix("-norm").removesuffix("-bias").removesuffix("-norm")
            if name in ("softmax", "gated-softmax"):
                z = sum(math.exp(v) for v in s.values())
                w = {j: math.exp(s[j]) / z for j in keys}
            elif name in ("softmax1", "softmax-sink"):
                z = math.exp(logit[h]) + sum(math.exp(v) for v in s.values())
                w = {j: math.exp(s[j]) / z for j in keys}
            elif name == "uniform":
                w = {j: 1.0 / len(keys) for j in keys}
            elif base == "sigmoid":
                b = -math.log(k.shape[1]) if name.endswith("bias") else 0.0
                w = {j: _sigmoid(s[j] + b) for j in keys}
            elif base == "elu":  # "coupled": elu(q.k / sqrt(d)) + 1
                w = {j: _elu1(s[j]) for j in keys}
            elif base == "elu-kernel":  # phi(q).phi(k), phi = elu + 1, no 1/sqrt(d)
                w = {j: sum(_elu1(q[h, i, t]) * _elu1(k[h, j, t]) for t in range(d)) for j in keys}
            elif base == "linear":
                w = dict(s)
            elif base == "mlp":
                fq = _mlp(mlp, q[h, i])
                w = {j: dot(fq, _mlp(mlp, k[h, j])) / math.sqrt(d) for j in keys}
            elif name == "sparsemax":
                w = dict(zip(keys, _sparsemax_row([s[j] for j in keys])))
            if "-norm" in name and base in ("sigmoid", "elu", "elu-kernel"):
                z = sum(w.values())
                w = {j: v / z for j, v in w.items()}
            elif "-norm" in name:  # linear, mlp: divided by max(|row sum|, 1)
                z = max(abs(sum(w.values())), 1.0)
                w = {j: v / z for j, v in w.items()}
            for j, v in w.items():
                out[h, i, j] = v
    return out


def test_registry_is_covered_by_the_reference():
    assert set(ATTENTIONS) == {
        "softmax",
        "softmax1",
        "softmax-sink",
        "gated-softmax",
        "sparsemax",
        "uniform",
        "sigmoid",
        "sigmoid-bias",
        "sigmoid-norm",
        "sigmoid-norm-bias",
        "elu",
        "elu-norm",
        "elu-kernel",
        "elu-kernel-norm",
        "linear",
        "linear-norm",
        "mlp",
        "mlp-norm",
    }
    assert len(PAPER_NORMS) == 12 and set(PAPER_NORMS) <= set(ATTENTIONS)


def test_one_normalization_family():
    """The lab adds attention maps, not a second family: no public name is defined twice,
    and score maps apply the core's normalizations."""
    import polarize
    import polarize.transformer as lab

    # Submodules (both packages have a `cli`) are not public names of the API.
    public = lambda m: {n for n in dir(m) if not n.startswith("_") and not inspect.ismodule(getattr(m, n))}
    assert not hasattr(lab, "NORMALIZATIONS") and not public(lab) & public(polarize) - {"transformer"}
    same = {"softmax": "softmax", "softmax1": "softmax1", "sigmoid": "sigmoid", "linear": "linear"}
    same.update({"sigmoid-norm": "sigmoid-norm", "sparsemax": "sparsemax", "softmax-sink": "softmax1"})
    for name in ATTENTIONS:
        m = make_attention(name, heads=2, head_dim=4, key=jax.random.key(0))
        if isinstance(m, ScoreAttention):
            assert isinstance(m.sigma, polarize.AbstractNormalization)
        if name in same:
            assert type(m.sigma) is polarize.NORMALIZATIONS[same[name]]


@pytest.mark.parametrize("name", sorted(ATTENTIONS))
@pytest.mark.parametrize("causal", [True, False])
def test_attention_matches_loops(name, causal):
    kq, kk, kb, km = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(kq, (2, 5, 4), jnp.float64)
    k = 2.0 * jax.random.normal(kk, (2, 5, 4), jnp.float64)
    mask = np.tril(np.ones((5, 5), bool)) if causal else np.ones((5, 5), bool)
    attend = make_attention(name, heads=2, head_dim=4, key=km)
    logit = np.zeros(2)
    if name == "softmax-sink":
        logit = np.asarray(jax.random.normal(kb, (2,)))
        attend = eqx.tree_at(lambda m: m.sigma.sink, attend, jnp.asarray(logit)[:, None, None])
    mlp = None
    if name.startswith("mlp"):
        layers = attend.phi.mlp.layers
        mlp = [(np.asarray(la.weight, float), np.asarray(la.bias, float)) for la in layers]
        attend = jax.tree.map(lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a, attend)
    got = np.asarray(attend(q, k, jnp.asarray(mask)))
    want = reference(name, np.asarray(q), np.asarray(k), mask, logit, mlp)
    assert np.allclose(got, want, atol=1e-9, rtol=1e-9), np.abs(got - want).max()
    if name.endswith("linear-norm") or name == "mlp-norm":  # divided by max(|row sum|, 1)
        assert attend.normalized and np.all(np.abs(got.sum(-1)) <= 1 + 1e-9)
    else:
        assert attend.normalized == np.allclose(got.sum(-1), 1.0)


@pytest.mark.parametrize("name", sorted(ATTENTIONS))
def test_causal_masking_masks(name):
    model = Transformer(20, 20, width=16, heads=2, norm=name, key=jax.random.key(1))
    x = jnp.arange(8, dtype=jnp.int32)
    y = x.at[5:].set(jnp.asarray([19, 18, 17], jnp.int32))  # change the future only
    (lx, ax), (ly, _) = model.forward(x), model.forward(y)
    assert np.allclose(lx[:5], ly[:5], atol=1e-5) and not np.allclose(lx[5:], ly[5:])
    assert np.all(np.triu(np.asarray(ax), k=1) == 0)
    both = Transformer(20, 20, width=16, heads=2, norm=name, causal=False, key=jax.random.key(1))
    if name != "uniform":  # uniform attention ignores every token's content
        assert not np.allclose(both(x)[:5], both(y)[:5])


@pytest.mark.parametrize("positions", ["add", "concat", "none", "rope"])
def test_positions(positions):
    model = Transformer(20, 20, width=16, heads=2, positions=positions, causal=False, key=jax.random.key(2))
    x = jnp.asarray([3, 1, 4, 9], jnp.int32)
    perm = jnp.asarray([2, 0, 3, 1])
    # without positions a bidirectional transformer is permutation-equivariant
    same = np.allclose(model(x)[perm], model(x[perm]), atol=1e-5)
    assert same == (positions == "none")
    if positions in ("add", "concat"):
        # the blocks see [token; position] (concat, width/2 each) or token + position (add)
        e, p = model.embed.weight[x], model.position[:4]
        assert e.shape[-1] == p.shape[-1] == (8 if positions == "concat" else 16)
        h = jnp.concatenate([e, p], -1) if positions == "concat" else e + p
        mask = jnp.ones((4, 4), bool)
        for block in model.blocks:
            h, _ = block(h, mask)
        logits = jax.vmap(model.unembed)(jax.vmap(model.ln)(h))
        assert np.allclose(logits, model(x), atol=1e-6)


@train.filter_jit
def _logits_and_loss(task):
    """One compiled program for every `aux_weight` (an array in `task`)."""
    model = Transformer(task.vocab, task.vocab, width=8, heads=2, key=jax.random.key(3))
    x, y = task.data(jax.random.key(4), 3)
    return y, jax.vmap(model)(x), task.loss(model, x, y)


@pytest.mark.parametrize("aux", [0.0, 0.2, 1.5])
def test_induction_loss_weights_the_other_positions(aux):
    y, logits, loss = _logits_and_loss(train.Induction(aux_weight=jnp.asarray(aux, jnp.float32)))
    logits, y = np.asarray(logits, float), np.asarray(y)
    ce = np.zeros(y.shape)
    for b in range(y.shape[0]):
        for t in range(y.shape[1]):
            row = logits[b, t]
            ce[b, t] = math.log(sum(math.exp(v - row.max()) for v in row)) + row.max() - row[y[b, t]]
    want = ce[:, -1].mean() + aux * ce[:, :-1].mean()
    assert np.isclose(float(loss), want, rtol=1e-5)


def test_induction_data_invariants():
    """The paper's data: BOS = 0, 10 distinct tokens in 1..49, query shifted by +50."""
    seen_last = False
    for shift in (False, True):
        x, y = tasks.induction(jax.random.key(3), 400, shift_query=shift)
        x, y = np.asarray(x), np.asarray(y)
        assert x.shape == y.shape == (400, 12) and x.dtype == np.int32
        assert np.all(x[:, 0] == 0) and np.all(y[:, :-1] == x[:, 1:])
        body = x[:, 1:11]
        assert all(len(set(r)) == 10 for r in body) and body.min() >= 1 and body.max() <= 49
        query = x[:, -1] - (50 if shift else 0)
        for r, qt, q_raw, ans in zip(body, query, x[:, -1], y[:, -1]):
            pos = list(r).index(qt)
            assert ans == (r[pos + 1] if pos < 9 else q_raw)  # after the last token: q itself
            seen_last |= pos == 9
        assert x.max() < tasks.induction_vocab(50, shift) and y.max() < tasks.induction_vocab(50, shift)
    assert seen_last
    # the key decides the data: the same key the same sequences, another key others
    a, b = tasks.induction(jax.random.key(3), 5), tasks.induction(jax.random.key(3), 5)
    assert np.array_equal(a[0], b[0])
    assert not np.array_equal(a[0], tasks.induction(jax.random.key(4), 5)[0])


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


def test_tiny_model_learns_induction_and_records_probes():
    # induction over 20 tokens with 5 per sequence: learned in 210 steps at width 32
    keys = jax.random.split(jax.random.key(8), 1)
    task = train.Induction(vocab_size=20, length=5, shift_query=False)

    @train.filter_jit
    def setup(keys):
        models = train.stack_models(
            lambda k: Transformer(task.vocab, task.vocab, width=32, heads=4, key=k), keys
        )
        data = jax.vmap(lambda k: task.data(k, 128 * 70))(keys)
        probe = jax.vmap(lambda k: task.data(k, 32))(keys)
        return models, data, probe

    @train.filter_jit
    def accuracy_and_maps(models, px):
        x, y = task.data(jax.random.key(9), 500)
        correct = lambda m: jnp.mean(jnp.argmax(jax.vmap(m)(x)[:, -1], -1) == y[:, -1])
        maps = lambda m: jax.vmap(m.forward)(px)[1]
        return eqx.filter_vmap(correct)(models), eqx.filter_vmap(maps)(models)

    models, data, probe = setup(keys)
    models, hist = train.fit(
        models, task, data, keys, lr=3e-3, epochs=3, batch=128, record_every=50, probe_data=probe
    )
    acc, maps = accuracy_and_maps(models, probe[0][0])
    assert list(hist["step"]) == [0, 50, 100, 150, 200, 210]
    assert hist["loss"].shape == (1, 6) and np.isnan(hist["loss"][0, 0])
    assert hist["loss"][0, -1] < hist["loss"][0, 1]
    assert hist["bos_score"].shape == (1, 6, 2, 4) and hist["accuracy"].shape == (1, 6)
    assert np.all(np.asarray(acc) > 0.8), acc  # chance is 1/20; guessing from context 1/5
    # the last probe is the trained model's score on the probe set
    assert np.allclose(hist["bos_score"][0, -1], np.mean(sinks.bos_score(maps[0]), 0), atol=1e-6)


def test_models_of_maps_without_parameters_share_the_initialization():
    """`init_models` gives every map what its own initialization gives, whether the
    arrays are softmax's (sigmoid: no parameters) or its own (softmax-sink: a sink logit)."""
    task = train.Induction()
    keys = jax.random.split(jax.random.key(4), 2)
    for norm in ("sigmoid", "softmax-sink"):
        shared = experiments.init_models(keys, task, 4, 1, 1, norm, "add")
        own = experiments._make_models_jit(keys, task, 4, 1, 1, norm, "add")
        assert jax.tree.structure(shared) == jax.tree.structure(own)
        assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(shared), jax.tree.leaves(own)))
    assert isinstance(shared.blocks[0].attention.attend.sigma.sink, jax.Array)


def test_bad_model_input_messages():
    with pytest.raises(PolarizeError, match="`norm` must be one of softmax.*got 'soft'"):
        make_attention("soft", heads=1, head_dim=2, key=jax.random.key(0))
    with pytest.raises(PolarizeError, match="`positions` must be one of add, concat, none, rope"):
        Transformer(5, 5, positions="abs", key=jax.random.key(0))
    with pytest.raises(PolarizeError, match="`width` must be even with positions 'concat'; got 9"):
        Transformer(5, 5, width=9, heads=1, positions="concat", key=jax.random.key(0))
    with pytest.raises(PolarizeError, match="`width` must be divisible by `heads`.*width=10"):
        Transformer(5, 5, width=10, heads=3, key=jax.random.key(0))


def polarize_main(argv: list[str]) -> int:
    """Stand-in for the package's `main`: argparse + add_subcommands + one-line errors
    (a command validates its arguments, returns its job, and the job runs)."""
    from polarize.transformer.cli import add_subcommands

    parser = argparse.ArgumentParser(prog="polarize")
    add_subcommands(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)()
    except PolarizeError as e:
        print(f"polarize: error: {e}")
        return 2


SMALL_SOFTMAX = ["induction", "--small", "--norms", "softmax", "--seeds", "2"]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """One `polarize induction --small` run (softmax, 2 seeds) for the tests that read or
    resume a result directory; a test that changes it works on a copy."""
    out = tmp_path_factory.mktemp("small") / "ind"
    assert polarize_main(SMALL_SOFTMAX + ["--out", str(out)]) == 0
    return out


def test_induction_cli_resumes_and_refuses(small_run, tmp_path, capsys):
    summary = json.loads((small_run / "summary.json").read_text())
    assert summary["units"] == summary["expected_units"] == 2
    assert {"softmax"} == set(summary["by_norm"])
    assert (small_run / "induction.png").stat().st_size > 0 and (small_run / "attention_maps.png").exists()
    assert (small_run / "emergence.png").stat().st_size > 0
    config = json.loads((small_run / "config.json").read_text())
    assert config["versions"]["jax"] == jax.__version__ and config["norms"] == ["softmax"]
    assert Config.from_json(config) == make_config("induction", "small", norms=["softmax"], seeds=2)
    out = tmp_path / "ind"
    shutil.copytree(small_run, out)
    argv = SMALL_SOFTMAX + ["--out", str(out)]
    first, second = (out / "units" / f"softmax_L2_H2_lr0.003_s{s}.npz" for s in (0, 1))
    before, trained_beside = first.stat().st_mtime_ns, storage.read_npz(second)
    second.unlink()  # as if interrupted: the rerun trains seed 1 alone
    assert polarize_main(argv) == 0
    assert first.stat().st_mtime_ns == before
    trained_alone = storage.read_npz(second)  # a seed does not depend on its neighbours
    assert np.allclose(
        trained_alone["history_loss"], trained_beside["history_loss"], rtol=1e-4, equal_nan=True
    )
    assert np.allclose(trained_alone["sink_score"], trained_beside["sink_score"], atol=1e-4)
    capsys.readouterr()
    assert polarize_main(SMALL_SOFTMAX[:-1] + ["1", "--out", str(out)]) == 2
    assert re.search("`--out` .* holds a different config.*--overwrite", capsys.readouterr().out)
    assert polarize_main(SMALL_SOFTMAX[:-1] + ["1", "--lr", "0.01", "--out", str(out), "--overwrite"]) == 0
    assert json.loads((out / "summary.json").read_text())["units"] == 1
    assert (out / "units" / "softmax_L2_H2_lr0.01_s0.npz").exists()
    assert not first.exists()  # the old config's units are gone


def test_a_diverged_run_is_reported_failed_and_overwrite_keeps_foreign_files(small_run, tmp_path, capsys):
    out = tmp_path / "diverged"
    assert polarize_main(SMALL_SOFTMAX[:-1] + ["1", "--lr", "1e6", "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "1 of 1 runs failed" in printed and "training loss not finite from step" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["failed_runs"]) == ["softmax_L2_H2_lr1e+06_s0"] and summary["by_norm"] == {}
    # --overwrite replaces a lab run's own files only
    (out / "notes.txt").write_text("mine")
    assert polarize_main(SMALL_SOFTMAX[:-1] + ["1", "--out", str(out), "--overwrite"]) == 2
    assert "did not write (notes.txt)" in capsys.readouterr().out
    assert (out / "notes.txt").read_text() == "mine" and (out / "summary.json").exists()


def test_sinks_cli_on_the_experiments_own_maps(small_run, tmp_path, capsys):
    """`polarize sinks` on a unit's stored example map prints the same alpha_0 as the lab's
    `sinks.importance`; the summary counts layer `sink_layer` only."""
    unit = small_run / "units" / "softmax_L2_H2_lr0.003_s0.npz"
    capsys.readouterr()
    assert polarize_main(["sinks", str(unit), "--key", "example", "--out", str(tmp_path / "u.png")]) == 0
    text = capsys.readouterr().out
    example = storage.read_npz(unit)["example"]
    alpha = sinks.importance(example)[..., 0]
    rows = [line.split() for line in text.splitlines() if line[:5].strip().isdigit()]
    assert len(rows) == 4 and "convention: causal" in text
    for layer, head, *values, flag in rows:
        assert float(values[-1]) == pytest.approx(alpha[int(layer), int(head)], abs=5e-4)
        assert (flag == "sink") == (alpha[int(layer), int(head)] > 0.3)
    config = Config.from_json(json.loads((small_run / "config.json").read_text()))
    units = experiments.load_units(config, small_run)
    shares = experiments.run_sink_shares(config, units)
    assert len(units) == 2 and np.allclose(shares, [np.mean(u["sink_score"][1] > 0.9) for u in units])


def test_summary_counts_one_layer_and_qualified_runs():
    config = make_config("induction", "small", seeds=4)
    units = []
    for s, (acc, layer0, layer1) in enumerate(
        [
            (1.0, [0.95, 0.99], [0.95, 0.5]),
            (0.99, [0.1, 0.2], [0.91, 0.92]),
            (0.5, [1, 1], [1, 1]),
            (0.96, [0, 0], [0, 0.9]),
        ]
    ):
        units.append(
            dict(
                norm="softmax",
                seed=s,
                accuracy=np.asarray(acc),
                sink_score=np.asarray([layer0, layer1]),
                bos_share=np.zeros((2, 2)),
                alpha0=np.zeros((2, 2)),
                history_step=np.asarray([0, 10]),
                history_bos_score=np.asarray([[layer0, layer0], [layer0, layer1]]),
                history_accuracy=np.asarray([0.0, acc]),
            )
        )
    entry = experiments._induction_entry(config, units)
    # the third run is below accuracy 0.95; layer 0 never counts; 0.9 is not above 0.9
    assert entry["qualified"] == 3 and entry["run_sink_shares"] == [0.5, 1.0, 0.0]
    assert entry["sink_share"] == pytest.approx(0.5) and entry["sink_heads"] == 3
    assert entry["sink_share_by_layer"] == pytest.approx([1 / 3, 0.5]) and entry["sink_share_all_rows"] == 0
    lo, hi = entry["sink_share_90"]
    assert 0.0 <= lo < 0.5 < hi <= 1.0
    # emergence: mean over all runs of the layer-1 share at each recorded step
    assert entry["emergence_steps"] == [0, 10]
    assert entry["emergence_sink_share"] == pytest.approx([np.mean([1, 0, 1, 0]), np.mean([0.5, 1, 1, 0])])


def test_bootstrap_interval_matches_the_exact_resampling_distribution():
    # two runs 0 and 1: resampled means are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4
    assert experiments.bootstrap_interval([0.0, 1.0]) == [0.0, 1.0]
    assert experiments.bootstrap_interval([0.0, 1.0], level=0.4) == [0.5, 0.5]
    assert experiments.bootstrap_interval([0.3, 0.3, 0.3]) == pytest.approx([0.3, 0.3])


def test_config_is_typed_frozen_and_validated():
    cpu = make_config("induction")
    assert isinstance(cpu, Config) and cpu.preset == "cpu" and cpu.steps == 3900
    assert cpu.positions == "add" and cpu.shift_query and cpu.aux_weight == 0.2 and cpu.sink_layer == 1
    paper = make_config("induction", "paper")
    assert paper.width == 128 and paper.heads == (1, 2, 4, 8) and len(paper.norms) == 12 and paper.seeds == 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        cpu.width = 8
    assert Config.from_json(json.loads(json.dumps(cpu.to_json()))) == cpu
    with pytest.raises(PolarizeError, match="`sink-layer` must be a layer index below every `layers`"):
        make_config("induction", layers=[1])
    with pytest.raises(PolarizeError, match="`aux-weight` must be >= 0; got -1"):
        make_config("induction", aux_weight=-1)
    with pytest.raises(PolarizeError, match="`positions` must be one of add, concat, none, rope"):
        make_config("induction", positions="learned")


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
    assert "layer 0: Sink_0^0.3 = 100.0%" in text and png.stat().st_size > 0
    assert len([line for line in text.splitlines() if line[:5].strip().isdigit()]) == 6
    assert "convention: causal map, alpha_k averaged over queries i >= k" in text


def test_sinks_cli_overall_share_bidirectional_and_k(tmp_path, capsys):
    a = np.tile(np.eye(6), (3, 4, 1, 1))  # alpha_0 = 1/6: no sink
    for layer, h in [(0, 0), (0, 3), (1, 1), (2, 0), (2, 2)]:
        a[layer, h] = 0.0
        a[layer, h, :, 0] = 1.0
    storage.write_npz(tmp_path / "maps.npz", {"attention": a})
    assert polarize_main(["sinks", str(tmp_path / "maps.npz")]) == 0
    assert "all 3 layers x 4 heads: Sink_0^0.3 = 41.7% (5 of 12 heads)" in capsys.readouterr().out
    b = np.full((1, 2, 4, 4), 0.25)  # bidirectional: every key gets 1/4 from every query
    b[0, 1, :, 2] = 0.7
    storage.write_npz(tmp_path / "bi.npz", {"attention": b})
    assert polarize_main(["sinks", str(tmp_path / "bi.npz"), "--k", "2"]) == 0
    text = capsys.readouterr().out
    assert "convention: bidirectional map, alpha_k averaged over all queries" in text
    assert "Sink_2^0.3 = 50.0% (1 of 2 heads)" in text
    # causal convention would see only rows 2, 3 for k = 2: same here, but k = 0 differs
    assert polarize_main(["sinks", str(tmp_path / "bi.npz"), "--eps", "0.25"]) == 0
    assert "Sink_0^0.25 = 0.0% (0 of 2 heads)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["induction", "--norms", "softmax,soft", "--out", "x"],
            "`norms` must be one of softmax, softmax1,.*uniform.*mlp-norm; got 'soft'",
        ),
        (["classify", "--seeds", "0", "--out", "x"], "`seeds` must be a positive integer; got 0"),
        (
            ["induction", "--heads", "two", "--out", "x"],
            "`--heads` must be a comma-separated list of int; got 'two'",
        ),
        (["induction", "--heads", "3", "--out", "x"], "`heads` must divide `width`=32; got 3"),
        (
            ["induction", "--preset", "huge", "--out", "x"],
            "`preset` must be one of cpu, small, paper; got 'huge'",
        ),
        (["induction", "--aux-weight", "-0.5", "--out", "x"], "`aux-weight` must be >= 0; got -0.5"),
        (["sinks", "MAPS", "--k", "3"], "`--k` must be a key position in 0..2; got 3"),
        (["sinks", "MAPS", "--eps", "1.5"], r"`--eps` must be in \[0, 1\); got 1.5"),
        (["sinks", "missing.npz"], "`FILE` must be an existing .npz file; got 'missing.npz'"),
        (["sinks", "MAPS", "--key", "nope"], "`--key` must be one of attention, flat; got 'nope'"),
        (["sinks", "MAPS", "--key", "flat"], "`--key` 'flat' must hold numbers shaped"),
        (
            ["sinks", "MAPS", "--out", "x.txt"],
            r"`--out` must end in one of \.png, \.pdf, \.svg, .*\(or no suffix: \.png\); got 'x.txt'$",
        ),
        (["sinks", "MAPS", "--out", "DIR"], "`--out` '.*' is a folder; name a file$"),
        (["sinks", "MAPS", "--out", "DIR/sub"], "`--out` '.*sub' would write '.*sub.png', which is a folder"),
        (["sinks", "MAPS", "--json", "DIR"], "`--json` '.*' is a folder; name a file$"),
        (["sinks", "--model", "m", "--text", "t", "--token-ids", "i.npy"], "not both$"),
        (
            ["induction", "--small", "--preset", "paper", "--out", "RUN"],
            r"`--small` is `--preset small`; give one of them, not both \(got `--preset paper`\)",
        ),
        (["classify", "--preset", "cpu", "--small", "--out", "RUN"], "not both"),
    ],
)
def test_bad_cli_input_messages(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("polarize.transformer._pretrained.missing_packages", lambda: [])
    storage.write_npz(tmp_path / "maps.npz", {"attention": np.ones((2, 3, 3)), "flat": np.ones(3)})
    (tmp_path / "sub.png").mkdir()
    swap = {"MAPS": str(tmp_path / "maps.npz"), "DIR": str(tmp_path), "DIR/sub": str(tmp_path / "sub")}
    swap["RUN"] = str(tmp_path / "run")  # a refusal runs nothing: nothing there afterwards
    assert polarize_main([swap.get(a, a) for a in argv]) == 2
    out = capsys.readouterr().out
    assert out.startswith("polarize: error: ") and out.count("\n") == 1
    assert re.search(message, out.strip()), out
    assert not (tmp_path / "maps.png").exists() and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "arrays, message",
    [
        (
            {"attention": np.zeros((2, 2, 0, 0))},
            "holds maps with no queries and no keys: 'attention' is shaped",
        ),
        ({"maps": np.zeros((0, 3, 3))}, "holds maps with no heads: 'maps' is shaped"),
        ({"a": np.ones((1, 3, 3)), "b": np.ones(3)}, "holds several arrays (a, b); name one with `--key`"),
        ({}, "holds no arrays"),
    ],
)
def test_sinks_cli_names_the_file_it_cannot_read_maps_from(arrays, message, tmp_path, capsys):
    storage.write_npz(tmp_path / "maps.npz", arrays)
    assert polarize_main(["sinks", str(tmp_path / "maps.npz")]) == 2
    out = capsys.readouterr().out
    assert out.startswith(f"polarize: error: `FILE` {str(tmp_path / 'maps.npz')!r} {message}")
    assert out.count("\n") == 1


def test_sinks_cli_prints_the_figure_file_it_wrote(tmp_path, capsys):
    from matplotlib.backend_bases import FigureCanvasBase

    from polarize.transformer.cli import FIGURE_FORMATS

    assert set(FIGURE_FORMATS) <= set(FigureCanvasBase.get_supported_filetypes())
    storage.write_npz(tmp_path / "maps.npz", {"attention": np.tile(np.eye(3), (2, 1, 1))})
    for out, written in [("fig", "fig.png"), ("fig.", "fig.png"), ("fig.PDF", "fig.PDF")]:
        assert polarize_main(["sinks", str(tmp_path / "maps.npz"), "--out", str(tmp_path / out)]) == 0
        assert f"figure: {tmp_path / written}\n" in capsys.readouterr().out
        assert (tmp_path / written).stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.PDF", "fig.png", "maps.npz"]


def test_sinks_cli_reports_inf_maps_without_a_numpy_warning(tmp_path, capsys):
    a = np.zeros((2, 3, 4, 4))
    a[..., 0] = 1.0
    a[0, 1, 2, 1] = np.inf  # row 2 of head (0, 1): inf / inf
    storage.write_npz(tmp_path / "maps.npz", {"attention": a})
    for mass in ("abs", "positive"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert polarize_main(["sinks", str(tmp_path / "maps.npz"), "--mass", mass]) == 0
        assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
        text = capsys.readouterr().out
        assert re.search(r"^    0    1 +nan +nan +nan +nan nonfinite$", text, re.M), text
        assert "Sink_0^0.3 = 100.0% (5 of 5 finite heads; 1 nonfinite)" in text


@pytest.mark.parametrize("command", ["induction", "classify"])
def test_grid_help_shows_the_defaults(command, capsys):
    with pytest.raises(SystemExit):
        polarize_main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "paper (the paper's grid, a GPU job) (default cpu)" in text
    assert "--seeds SEEDS number of seeds per variant (default: the preset's)" in text


def test_non_empty_out_without_config_is_refused(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert polarize_main(["induction", "--small", "--out", str(tmp_path)]) == 2
    assert "is not empty and holds a different config" in capsys.readouterr().out
    assert (tmp_path / "notes.txt").exists()
