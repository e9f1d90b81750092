"""The vector fields of `polarize.core.fields`: replicator form, exact forms agreeing, modified field."""

import re

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polarize as pz
from polarize.core._models import with_params
from polarize.core.fields import (
    FIELDS,
    Analytic,
    Autodiff,
    Modified,
    Reduced,
    gradient,
    modified_loss,
)


def objectives(dim, key=3):
    k1, k2, k3, k4 = jax.random.split(jax.random.key(key), 4)
    return {
        "logistic": pz.random_direction(k1, dim),
        "logistic-data": pz.random_labels(k2, 12, dim),
        "square": pz.conditioned_regression(k3, 7, dim, 3.0),
        "cross-entropy": pz.peaked_distribution(k4, dim),
    }


def one_model(norm="softmax", tokens=6, dim=5, seed=0):
    m = pz.init_ensemble(seed, 1, tokens=tokens, dim=dim, v_scale=0.7, a_scale=0.8, norm=norm)
    return pz.ValueAttention(m.V[0], m.a[0], m.norm)


@pytest.mark.parametrize("objective", ["logistic", "logistic-data", "square", "cross-entropy"])
def test_replicator_form_equals_autodiff(objective):
    """da_j/dt = s_j (f_j - <s, f>) with fitness f = -V^T grad L(beta), and dV/dt = r s^T."""
    model = one_model(dim=5)
    obj = objectives(5)[objective]
    gV, ga = gradient(model, obj)
    s = jax.nn.softmax(model.a)
    beta = model.V @ s
    r = -jax.grad(obj)(beta)
    f = model.V.T @ r
    np.testing.assert_allclose(-ga, s * (f - s @ f), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(-gV, np.outer(r, s), rtol=1e-12, atol=1e-14)


def test_sigmoid_field_has_no_centering_term():
    model = one_model("sigmoid")
    obj = objectives(5)["logistic"]
    _, ga = gradient(model, obj)
    s = jax.nn.sigmoid(model.a)
    f = model.V.T @ (-jax.grad(obj)(model.V @ s))
    np.testing.assert_allclose(-ga, s * (1 - s) * f, rtol=1e-12)


@pytest.mark.parametrize("norm", list(pz.NORMALIZATIONS))
@pytest.mark.parametrize("objective", ["logistic", "logistic-data", "square", "cross-entropy"])
def test_analytic_field_equals_autodiff(norm, objective):
    model = one_model(norm)
    obj = objectives(5)[objective]
    y = (model.V, model.a)
    fast = Analytic().field(y, model, obj)
    ref = Autodiff().field(y, model, obj)
    for x, r in zip(fast, ref, strict=True):
        np.testing.assert_allclose(x, r, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("norm", list(pz.NORMALIZATIONS))
def test_reduced_field_equals_projected_autodiff(norm):
    """du/dt = b^T dV/dt and da/dt from the (u, a) system equal the full field's."""
    model = one_model(norm)
    obj = objectives(5)["logistic"]
    dV, da = Autodiff().field((model.V, model.a), model, obj)
    du_red, da_red = Reduced().field((model.V.T @ obj.b, model.a), model, obj)
    np.testing.assert_allclose(du_red, dV.T @ obj.b, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(da_red, da, rtol=1e-10, atol=1e-14)
    # and dV/dt is exactly b (du/dt)^T: V moves only along b
    np.testing.assert_allclose(dV, np.outer(obj.b, du_red), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize(
    "norm, objective",
    [
        ("softmax", "logistic"),
        ("sparsemax", "logistic"),
        ("softmax1", "square"),
        ("sigmoid", "cross-entropy"),
    ],
)
def test_flow_paths_agree(norm, objective):
    """Fast and generic paths integrate the same ODE: trajectories agree to 1e-8.

    (Every normalization x objective pair is checked at the vector-field level above.)
    """
    model = pz.init_ensemble(1, 4, tokens=6, dim=5, v_scale=0.5, a_scale=0.5, norm=norm)
    obj = objectives(5)[objective]
    paths = ["autodiff", "analytic"] + (["reduced"] if objective == "logistic" else [])
    # One explicit high-order solver for every path: the paths are compared, not the solvers
    # (the stiff default is order 3, and slow at rtol 1e-12; tests/solve/test_stiff.py covers it).
    tight = dict(rtol=1e-12, atol=1e-14, solver=diffrax.Tsit5())
    trajs = [pz.flow(model, obj, t1=50.0, n_save=8, path=p, **tight) for p in paths]
    for tr in trajs[1:]:
        assert bool(np.all(tr.ok))
        np.testing.assert_allclose(tr.weights, trajs[0].weights, rtol=0, atol=1e-8)
        np.testing.assert_allclose(tr.V, trajs[0].V, rtol=0, atol=1e-8)
        np.testing.assert_allclose(tr.a, trajs[0].a, rtol=0, atol=1e-8)


def test_forced_path_that_does_not_apply_is_refused():
    model = one_model()
    with pytest.raises(pz.PolarizeError, match="path='reduced'.*LogisticDirection"):
        pz.flow(model, objectives(5)["square"], t1=1.0, path="reduced")
    tied = pz.TiedValueAttention(jnp.eye(3), jnp.ones(3))
    with pytest.raises(pz.PolarizeError, match="path='analytic'.*ValueAttention"):
        pz.flow(tied, pz.random_direction(0, 3), t1=1.0, path="analytic")
    with pytest.raises(pz.PolarizeError, match="`path` must be one of auto, autodiff"):
        pz.flow(model, objectives(5)["square"], t1=1.0, path="fast")


@pytest.mark.parametrize("base", ["autodiff", "analytic", "reduced", "span"])
def test_modified_field_is_minus_the_gradient_of_the_modified_loss(base):
    """Modified(lr, base) = f - (lr/2) f'f equals -grad(L + lr/4 |grad L|^2), in every coordinate form."""
    model, lr = one_model(), 0.3
    obj = objectives(5)["square" if base == "span" else "logistic"]
    ref = jax.grad(lambda p: modified_loss(with_params(model, p), obj, lr))((model.V, model.a))
    dV, da = (-g for g in ref)
    field = Modified(lr, FIELDS[base]())
    dy, dz = field.field(field.initial(model, obj), model, obj)
    if base == "reduced":  # V moves along b only, u = V^T b
        dy = np.outer(obj.b, dy)
    if base == "span":  # V = V(0) + X^T W
        dy = obj.X.T @ dy
    np.testing.assert_allclose(dy, dV, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(dz, da, rtol=1e-10, atol=1e-13)


def test_modified_flow_takes_every_option_of_flow():
    """Reduced coordinates, linear clock, another solver and block size: the same modified flow."""
    model = pz.init_ensemble(1, 3, tokens=4, dim=3, v_scale=0.5, a_scale=0.5)
    obj = pz.random_direction(2, 3)
    kw = dict(t1=20.0, n_save=3, rtol=1e-11, atol=1e-13)
    ref = pz.modified_flow(model, obj, 0.2, path="autodiff", **kw)
    fast = pz.modified_flow(
        model, obj, 0.2, path="reduced", clock="linear", solver=diffrax.Dopri8(), block_size=2, **kw
    )
    assert bool(np.all(ref.ok)) and bool(np.all(fast.ok))
    np.testing.assert_allclose(fast.V, ref.V, rtol=0, atol=1e-8)
    np.testing.assert_allclose(fast.a, ref.a, rtol=0, atol=1e-8)
    assert not np.allclose(ref.a, pz.flow(model, obj, **kw).a, atol=1e-4)  # lr = 0.2 is not the flow


@pytest.mark.parametrize(
    "case, says",
    [
        ("no inits", "`model` ValueAttention holds an empty array (shape (0, 2, 3))"),
        ("no samples", "`objective` LogisticData holds an empty array (shape (0, 2))"),
        ("int model", "`model`'s arrays must be float32 or float64; got int64"),
        ("labels of a value model", "`model` gives 2 outputs but `objective` LogisticLabels holds 3 labels"),
        ("labels of another task", "`model` gives 4 outputs but `objective` LogisticLabels holds 3 labels"),
    ],
)
def test_inputs_that_crashed_deep_in_jax_are_one_clear_error(case, says):
    # they gave a TypeError from a slice size, a ZeroDivisionError, a `precision` message
    # for an argument never passed, and a shape mismatch inside the field
    X, y, v = pz.prompt_task(0, 4, 5, 6)
    m = pz.init_ensemble(0, 2, tokens=3, dim=2)
    model, objective = {
        "no inits": (pz.ValueAttention(np.ones((0, 2, 3)), np.zeros((0, 3))), pz.random_direction(1, 2)),
        "no samples": (m, pz.LogisticData(np.ones((0, 2)), np.ones(0))),
        "int model": (pz.ValueAttention(np.ones((2, 3), int), np.arange(3)), pz.random_direction(1, 2)),
        "labels of a value model": (m, pz.LogisticLabels(np.ones(3))),
        "labels of another task": (pz.init_prompts(1, 2, X, v), pz.LogisticLabels(y[:3])),
    }[case]
    with pytest.raises(pz.PolarizeError, match=re.escape(says)):
        pz.flow(model, objective, t1=10.0)
    with pytest.raises(pz.PolarizeError, match=re.escape(says)):
        pz.descend(model, objective, 0.1, steps=5)
