"""Gradient-descent ensemble: polarize `descend` against Python and numpy loops.

The logistic toy of flow_ensemble.py (T = dim = 8, V(0) ~ 0.1 N(0, 1), a(0) = 0),
plain GD at lr 0.1, N = 1e4 initializations x 1e5 steps, float64. Baselines:
  1. a Python loop over steps calling a jitted, vmapped step on the whole batch;
  2. the notebook loop: Python loops over initializations and steps, jitted step;
  3. a vectorized numpy batch loop.
Baselines are timed on fewer steps and extrapolated linearly (said in the table).
Each baseline's final state is checked against polarize after the same steps.

    python benchmarks/descent_ensemble.py            # full (a few minutes)
    python benchmarks/descent_ensemble.py --quick    # smoke test
"""

import argparse
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import polarize as pz  # noqa: E402
from benchmarks._common import fmt, record, table, timed, wall  # noqa: E402
from benchmarks.flow_ensemble import D, T, problem  # noqa: E402

LR = 0.1


def jax_step(b):
    def loss(p):
        V, a = p
        return jax.nn.softplus(-b @ (V @ jax.nn.softmax(a)))

    def step(p):
        return jax.tree.map(lambda x, g: x - LR * g, p, jax.grad(loss)(p))

    return step


def python_loop(step, V, a, steps):
    p = (V, a)
    for _ in range(steps):
        p = step(p)
    return jax.block_until_ready(p)


def numpy_batch(V, a, b, steps):
    V, a = V.copy(), a.copy()
    for _ in range(steps):
        s = np.exp(a - a.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        g = 1.0 / (1.0 + np.exp(np.einsum("d,ndt,nt->n", b, V, s)))
        f = g[:, None] * np.einsum("ndt,d->nt", V, b)
        da = s * (f - np.sum(s * f, -1, keepdims=True))
        V += LR * g[:, None, None] * b[None, :, None] * s[:, None, :]
        a += LR * da
    return V, a


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run; does not write RESULTS.md")
    args = parser.parse_args(argv)
    n, steps = (256, 2_000) if args.quick else (10_000, 100_000)
    timed_steps = 200 if args.quick else 1_000
    model, obj = problem(n)
    b = np.asarray(obj.b)

    def polarize(path, k=steps, m=model):
        tr = pz.descend(m, obj, LR, steps=k, save_at=[0, k], path=path)
        return tr.V[:, -1], tr.a[:, -1]

    rows, speed = [], {}
    check_V = np.asarray(polarize("auto", timed_steps)[0])  # what every method must reach
    for name, path in (
        ("polarize descend (auto: reduced)", "auto"),
        ("polarize descend, path=autodiff", "autodiff"),
    ):
        first, best, (V, _) = timed(lambda path=path: polarize(path), repeats=1 if not args.quick else 3)
        speed[name] = n * steps / best
        rows.append(
            [name, fmt(speed[name]), fmt(best), "measured, compile %.2g s apart" % (first - best), "-"]
        )

    step = jax.jit(jax.vmap(jax_step(obj.b)))
    python_loop(step, model.V, model.a, 2)  # compile
    sec, (V, _) = wall(python_loop, step, model.V, model.a, timed_steps)
    speed["loop"] = n * timed_steps / sec
    err = float(np.max(np.abs(np.asarray(V) - check_V)))
    rows.append(
        [
            "Python loop over steps, jitted vmapped step",
            fmt(speed["loop"]),
            fmt(n * steps / speed["loop"]),
            f"timed on {timed_steps} steps, extrapolated",
            fmt(err),
        ]
    )

    one = jax.jit(jax_step(obj.b))
    n_one, one_steps = 2, timed_steps // 4
    python_loop(one, model.V[0], model.a[0], 2)
    sec, _ = wall(lambda: [python_loop(one, model.V[i], model.a[i], one_steps) for i in range(n_one)])
    speed["notebook"] = n_one * one_steps / sec
    rows.append(
        [
            "notebook: Python loops over inits and steps, jitted step",
            fmt(speed["notebook"]),
            fmt(n * steps / speed["notebook"]),
            f"timed on {n_one} inits x {one_steps} steps, extrapolated",
            "-",
        ]
    )

    np_steps = timed_steps // 5
    sec, (V, _) = wall(numpy_batch, np.asarray(model.V), np.asarray(model.a), b, np_steps)
    speed["numpy"] = n * np_steps / sec
    err = float(np.max(np.abs(V - np.asarray(polarize("auto", np_steps)[0]))))
    rows.append(
        [
            "numpy vectorized batch loop",
            fmt(speed["numpy"]),
            fmt(n * steps / speed["numpy"]),
            f"timed on {np_steps} steps, extrapolated",
            fmt(err),
        ]
    )

    pol = speed["polarize descend (auto: reduced)"]
    ratios = [
        ["polarize path=autodiff", fmt(pol / speed["polarize descend, path=autodiff"])],
        ["Python loop, jitted vmapped step", fmt(pol / speed["loop"])],
        ["notebook loop, jitted step", fmt(pol / speed["notebook"])],
        ["numpy vectorized batch loop", fmt(pol / speed["numpy"])],
    ]
    body = (
        f"N = {n} initializations x {steps} GD steps at lr {LR} (T = dim = {T}, {D}), float64. "
        "Throughput in initialization-steps per second; 'seconds' is for the whole job "
        "(extrapolated where the baseline ran fewer steps). Last column: largest |V| difference "
        "from polarize after the same number of steps (the same iteration, so rounding only).\n\n"
        + table(["method", "init-steps/s", "seconds for the job", "timing", "max abs diff V"], rows)
        + "\n\nSpeed-up of polarize (same run):\n\n"
        + table(["baseline", "polarize / baseline"], ratios)
    )
    record("descent-ensemble", "(b) GD ensemble, 1e4 initializations x 1e5 steps", body, quick=args.quick)


if __name__ == "__main__":
    main()
