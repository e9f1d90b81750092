"""The attention and value SVMs (Lawson-Hanson NNLS) against SLSQP and linprog, and the token
selection of prompt-attention flows against them."""

import itertools

import jax
import numpy as np
import pytest
from scipy.optimize import linprog, minimize

import polarize as pz


def constraints(X, sel):
    """G, h of (x_{i,sel_i} - x_{i,t})^T p >= 1, written out again."""
    rows = [X[i, sel[i]] - X[i, t] for i in range(len(X)) for t in range(X.shape[1]) if t != sel[i]]
    return np.array(rows), np.ones(len(rows))


def slsqp(G, h):
    """min |x|^2 s.t. G x >= h by scipy's SLSQP: an independent solver."""
    res = minimize(
        lambda x: x @ x,
        np.zeros(G.shape[1]),
        jac=lambda x: 2 * x,
        constraints=[{"type": "ineq", "fun": lambda x: G @ x - h, "jac": lambda x: G}],
        method="SLSQP",
        options={"ftol": 1e-12, "maxiter": 1000},
    )
    assert res.success, res.message
    return res.x


def feasible_lp(G, h) -> bool:
    """Whether G x >= h has a solution, by linprog."""
    return linprog(np.zeros(G.shape[1]), A_ub=-G, b_ub=-h, bounds=[(None, None)] * G.shape[1]).status == 0


X = np.asarray(pz.prompt_task(0, 4, 5, 6)[0])
ALL = np.array(list(itertools.product(range(5), repeat=4)))  # every selection of 4 samples, 5 tokens


def test_batch_of_selections_agrees_with_linprog_and_slsqp():
    out = pz.attention_svm(X, ALL)
    assert out.direction.shape == (len(ALL), 6) and out.feasible.shape == (len(ALL),)
    assert 0 < out.feasible.sum() < len(ALL)  # some of each
    rng = np.random.default_rng(0)
    for k in rng.choice(len(ALL), 40, replace=False):
        G, h = constraints(X, ALL[k])
        assert bool(out.feasible[k]) == feasible_lp(G, h), ALL[k]
        if out.feasible[k]:
            np.testing.assert_allclose(out.direction[k], slsqp(G, h), rtol=1e-7, atol=1e-9)
            np.testing.assert_allclose(out.norm[k], np.linalg.norm(out.direction[k]), rtol=1e-14)
            assert np.min(G @ out.direction[k]) > 1 - 1e-10  # the margin constraints hold
        else:
            assert np.all(np.isnan(out.direction[k])) and out.norm[k] == np.inf


def test_value_svm_agrees_with_slsqp_and_batches_like_a_loop():
    _, y, _ = (np.asarray(a) for a in pz.prompt_task(0, 4, 5, 6))
    sels = ALL[::37]
    batch = pz.value_svm(X, y, sels)
    for k, sel in enumerate(sels):
        G = y[:, None] * X[np.arange(4), sel]
        np.testing.assert_allclose(batch.direction[k], slsqp(G, np.ones(4)), rtol=1e-7, atol=1e-9)
        np.testing.assert_array_equal(batch.direction[k], pz.value_svm(X, y, sel).direction)


def test_infeasible_single_selection_raises_and_bad_input_is_refused():
    infeasible = ALL[~pz.attention_svm(X, ALL).feasible][0]
    with pytest.raises(pz.PolarizeError, match="is infeasible"):
        pz.attention_svm(X, infeasible)
    with pytest.raises(pz.PolarizeError, match="one token index per sample"):
        pz.attention_svm(X, np.zeros(3, int))
    with pytest.raises(pz.PolarizeError, match="token indices in"):
        pz.attention_svm(X, np.full(4, 5))
    with pytest.raises(pz.PolarizeError, match="`X` must have shape"):
        pz.attention_svm(X[0], np.zeros(5, int))
    # a token repeated at the selected one's place can never be separated from it
    twin = X.copy()
    twin[:, 1] = twin[:, 0]
    assert not pz.attention_svm(twin, np.zeros((1, 4), int)).feasible[0]


@pytest.fixture(scope="module")
def flows():
    """Softmax and sigmoid p-flows to t = 1e12 on a task whose inits split between three
    selections (one of them the best-score one)."""
    jax.config.update("jax_enable_x64", True)
    Xs, y, v = pz.prompt_task(1, 4, 5, 6)
    obj = pz.LogisticLabels(y)
    out = {}
    for norm in ("softmax", "sigmoid"):
        model = pz.init_prompts(1, 16, Xs, v, norm=norm)
        traj = pz.flow(model, obj, t1=1e12, n_save=7)
        assert bool(np.all(traj.ok))
        out[norm] = pz.token_selection(traj, model, obj)
    return out


def test_softmax_aligns_with_the_svm_of_its_selection_and_sigmoid_does_not(flows):
    soft, sig = flows["softmax"], flows["sigmoid"]
    assert soft.feasible.all() and sig.feasible.all()
    assert np.min(soft.cos_selected[:, -1]) > 0.999
    assert np.all(np.diff(1 - soft.cos_selected[:, 3:], axis=-1) < 0)  # 1 - cos falls from t = 1e6
    assert np.max(sig.cos_selected[:, -1]) < 0.95  # sigmoid scores do not select by margin
    # |p| ~ |p_mm| log t: the slope is the SVM's norm for softmax, not for sigmoid
    np.testing.assert_allclose(soft.log_slope, soft.svm_norm, rtol=0.01)
    assert np.min(sig.log_slope / sig.svm_norm) > 1.05


def test_the_best_score_svm_is_wrong_where_another_selection_won(flows):
    soft = flows["softmax"]
    assert 0 < soft.all_best.sum() < len(soft.all_best) and len(np.unique(soft.selected, axis=0)) == 3
    won = soft.all_best
    np.testing.assert_allclose(soft.cos_best[won, -1], soft.cos_selected[won, -1])
    assert np.max(soft.cos_best[~won, -1]) < np.min(soft.cos_selected[~won, -1]) - 0.1
    final = soft.final()
    assert set(final) >= {"cos_selected", "cos_best", "log_slope", "all_best"}
    assert np.all(np.isnan(final["cos_value"]))  # train="p": no value SVM


def test_joint_training_aligns_v_with_the_value_svm():
    Xs, y, v = pz.prompt_task(1, 4, 5, 6)
    obj = pz.LogisticLabels(y)
    model = pz.init_prompts(1, 6, Xs, v, v_scale=0.1, train="vp")
    traj = pz.flow(model, obj, t1=1e12, n_save=7)
    stats = pz.token_selection(traj, model, obj)
    assert np.min(stats.cos_value[:, -1]) > 0.97 and np.min(stats.cos_selected[:, -1]) > 0.93
    one = pz.token_selection(traj.at(0), pz.PromptAttention(model.v[0], model.p[0], Xs, train="vp"), y)
    np.testing.assert_array_equal(one.cos_value, stats.cos_value[0])
    with pytest.raises(pz.PolarizeError, match="needs a PromptAttention model"):
        pz.token_selection(traj, pz.init_ensemble(0, 1, tokens=3, dim=2), y)
    # summarize reads the weights sigma(X_i p) per sample: (inits, samples) statistics
    summary = pz.summarize(traj, obj)
    assert summary.final["max_weight"].shape == (6, 4)
    np.testing.assert_array_equal(summary.final["winner"], stats.selected)


def test_failed_initializations_are_masked():
    Xs, y, v = pz.prompt_task(1, 4, 5, 6)
    model = pz.init_prompts(1, 2, Xs, v)
    traj = pz.flow(model, pz.LogisticLabels(y), t1=1e12, n_save=4, max_steps=4)
    assert not bool(np.any(traj.ok))
    stats = pz.token_selection(traj, model, y)
    assert np.all(stats.selected == -1) and not np.any(stats.feasible | stats.all_best)
    assert np.all(np.isnan(stats.cos_selected)) and np.all(np.isnan(stats.log_slope))
