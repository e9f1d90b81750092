"""Prompt attention f_i = v^T X_i^T sigma(X_i p): its closed-form field against jax.grad, its checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import polarize as pz
from polarize.core.fields import Prompt, choose_field, gradient


def task(samples=4, tokens=5, dim=6, seed=0):
    return pz.prompt_task(seed, samples, tokens, dim)


def one(norm="softmax", train="p", seed=1):
    X, y, v = task()
    m = pz.init_prompts(seed, 1, X, v, p_scale=0.8, v_scale=None if train == "p" else 0.7, train=train)
    return pz.PromptAttention(m.v[0], m.p[0], X, norm=norm, train=train), y


def test_output_is_the_definition():
    model, _ = one()
    X, v, p = (np.asarray(x) for x in (model.X, model.v, model.p))
    s = np.exp(X @ p)
    s /= s.sum(axis=-1, keepdims=True)
    f = np.array([v @ X[i].T @ s[i] for i in range(len(X))])
    np.testing.assert_allclose(model(), f, rtol=1e-13)
    assert model.weights().shape == (4, 5) and model.tokens == 5


@pytest.mark.parametrize("train", ["p", "vp"])
@pytest.mark.parametrize("objective", ["logistic", "square"])
@pytest.mark.parametrize("norm", list(pz.NORMALIZATIONS))
def test_closed_form_field_equals_autodiff(norm, objective, train):
    model, y = one(norm, train)
    obj = pz.LogisticLabels(y) if objective == "logistic" else pz.SquareLabels(y)
    field = Prompt()(tuple(getattr(model, n) for n in model.trainable), model, obj)
    reference = gradient(model, obj)
    assert len(field) == len(reference) == len(model.trainable)
    for got, want in zip(field, reference):
        np.testing.assert_allclose(got, -want, rtol=1e-11, atol=1e-13)


@pytest.mark.parametrize("objective", ["logistic", "square"])
def test_objectives_are_their_definitions(objective):
    _, y = one()
    f = jnp.array([0.3, -1.2, 2.0, 0.1])
    if objective == "logistic":
        obj, want = pz.LogisticLabels(y), np.mean(np.log1p(np.exp(-np.asarray(y) * f)))
    else:
        obj, want = pz.SquareLabels(y), np.mean((np.asarray(y) - f) ** 2)
    np.testing.assert_allclose(obj(f), want, rtol=1e-13)
    np.testing.assert_allclose(-obj.residual(f), jax.grad(obj)(f), rtol=1e-13)


def test_auto_path_is_the_closed_form_and_ensembles_batch():
    X, y, v = task()
    model = pz.init_prompts(0, 3, X, v)
    assert isinstance(choose_field(model, pz.LogisticLabels(y)), Prompt)
    assert model.batch_size == 3 and model.trainable == ("p",)
    assert pz.init_prompts(0, 3, X, v, v_scale=0.5, train="vp").trainable == ("v", "p")
    # initialization i depends on (seed, i) alone, counted from `start`
    np.testing.assert_array_equal(pz.init_prompts(0, 5, X, v).p[:3], model.p)
    later = pz.init_prompts(0, 2, X, v, v_scale=0.5, train="vp", start=3)
    whole = pz.init_prompts(0, 5, X, v, v_scale=0.5, train="vp")
    np.testing.assert_array_equal(later.p, whole.p[3:])
    np.testing.assert_array_equal(later.v, whole.v[3:])
    assert not np.array_equal(later.p, whole.p[:2])


def test_bad_input_is_refused():
    X, y, v = task()
    with pytest.raises(pz.PolarizeError, match="`X` must have shape"):
        pz.PromptAttention(v, v, X[0])
    with pytest.raises(pz.PolarizeError, match="`p` must have shape"):
        pz.PromptAttention(v[:3], v[:3], X)
    with pytest.raises(pz.PolarizeError, match="`v` must have the shape of `p`"):
        pz.PromptAttention(v[None], v, X)
    with pytest.raises(pz.PolarizeError, match="`train`"):
        pz.PromptAttention(v, v, X, train="v")
    with pytest.raises(pz.PolarizeError, match="labels -1 or \\+1"):
        pz.LogisticLabels(jnp.array([1.0, 0.5]))
    with pytest.raises(pz.PolarizeError, match="`y` must have shape"):
        pz.SquareLabels(jnp.ones((2, 2)))
    with pytest.raises(pz.PolarizeError, match="needs a PromptAttention model"):
        choose_field(pz.init_ensemble(0, 1, tokens=3, dim=2), pz.LogisticLabels(y), "prompt")
