"""Flow ensemble on the paper's logistic toy: polarize against the baselines people use.

T = dim = 8, V(0) ~ 0.1 N(0, 1), a(0) = 0, unit direction b, exact flow to t1 = 1e5 at
rtol 1e-6, atol 1e-8, float64. Baselines, all on the full (V, a) state:
  1. naive diffrax: jax.jit(jax.vmap(solve)), `jax.grad` field, Tsit5, PID, linear time;
  2. scipy solve_ivp RK45 looped over initializations (timed on a few, extrapolated);
  3. numpy gradient descent at lr 0.1 for 1e6 steps per initialization (how the paper's
     figures were made), vectorized over initializations (the headline baseline) and the
     paper's per-initialization loop; both timed on fewer steps and extrapolated.
Accuracy: largest deviation of the final weights s and values V from a reference
solve at rtol 1e-12, atol 1e-14 (on the first initializations).

    python benchmarks/flow_ensemble.py            # full: N = 1e3, 1e4, 1e5 (a few minutes)
    python benchmarks/flow_ensemble.py --quick    # smoke test
"""

import argparse
import os
import subprocess
import sys

import jax

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from scipy.integrate import solve_ivp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import polarize as pz  # noqa: E402
from benchmarks._common import fmt, record, table, timed, wall  # noqa: E402

T = D = 8
T1, RTOL, ATOL, LR, GD_STEPS = 1e5, 1e-6, 1e-8, 0.1, 1_000_000


def problem(n):
    return pz.init_ensemble(0, n, tokens=T, dim=D, v_scale=0.1), pz.random_direction(1, D)


def take(model, sl):
    return pz.ValueAttention(model.V[sl], model.a[sl], model.norm)


def run_polarize(model, obj, rtol=RTOL, atol=ATOL):
    tr = pz.flow(model, obj, t1=T1, n_save=2, rtol=rtol, atol=atol)
    return tr.V[:, -1], tr.weights[:, -1]


def naive_diffrax(b):
    """What a competent JAX user writes in twenty lines."""

    def loss(p):
        V, a = p
        return jax.nn.softplus(-b @ (V @ jax.nn.softmax(a)))

    def field(t, y, args):
        return jax.tree.map(jnp.negative, jax.grad(loss)(y))

    def solve(V, a):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(field),
            diffrax.Tsit5(),
            t0=0.0,
            t1=T1,
            dt0=None,
            y0=(V, a),
            saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
            max_steps=100_000,
        )
        V1, a1 = sol.ys
        return V1[0], jax.nn.softmax(a1[0])

    return jax.jit(jax.vmap(solve))


def numpy_field(b):
    def grad_step(V, a):
        s = np.exp(a - a.max())
        s /= s.sum()
        g = 1.0 / (1.0 + np.exp(b @ (V @ s)))
        f = g * (V.T @ b)
        return g * np.outer(b, s), s * (f - s @ f)

    return grad_step


def scipy_loop(V0, a0, b):
    """solve_ivp RK45 on the full state, one initialization after another."""
    step = numpy_field(b)

    def rhs(t, y):
        dV, da = step(y[: D * T].reshape(D, T), y[D * T :])
        return np.concatenate([dV.ravel(), da])

    Vs, ss = [], []
    for V, a in zip(V0, a0, strict=True):
        sol = solve_ivp(rhs, (0.0, T1), np.concatenate([V.ravel(), a]), method="RK45", rtol=RTOL, atol=ATOL)
        V1, a1 = sol.y[: D * T, -1].reshape(D, T), sol.y[D * T :, -1]
        Vs.append(V1)
        ss.append(np.exp(a1 - a1.max()) / np.exp(a1 - a1.max()).sum())
    return np.array(Vs), np.array(ss)


def numpy_gd(V, a, b, steps):
    """The paper's loop: plain GD at lr 0.1 on one initialization."""
    step = numpy_field(b)
    V, a = V.copy(), a.copy()
    for _ in range(steps):
        dV, da = step(V, a)
        V += LR * dV
        a += LR * da
    s = np.exp(a - a.max())
    return V, s / s.sum()


def numpy_gd_batch(V, a, b, steps):
    """Plain GD at lr 0.1 on every initialization at once, vectorized over inits in numpy."""
    V, a = V.copy(), a.copy()
    for _ in range(steps):
        s = np.exp(a - a.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        g = 1.0 / (1.0 + np.exp(np.einsum("d,ndt,nt->n", b, V, s)))
        f = g[:, None] * np.einsum("ndt,d->nt", V, b)
        a += LR * s * (f - np.sum(s * f, -1, keepdims=True))
        V += LR * g[:, None, None] * b[None, :, None] * s[:, None, :]
    return V, a


def errors(V, s, ref_V, ref_s):
    k = min(len(V), len(ref_V))
    return float(np.max(np.abs(np.asarray(s[:k]) - ref_s[:k]))), float(
        np.max(np.abs(np.asarray(V[:k]) - ref_V[:k]))
    )


def two_devices(n):
    """polarize on 2 XLA host devices (one block stream per core), run in a subprocess."""
    code = f"""
import jax, time, sys
sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
jax.config.update("jax_enable_x64", True)
import polarize as pz
from benchmarks.flow_ensemble import problem, run_polarize, take
model, obj = problem({n})
devs = jax.devices()
half = {n} // 2
parts = [jax.device_put(take(model, sl), d)
         for sl, d in ((slice(0, half), devs[0]), (slice(half, None), devs[1]))]
objs = [jax.device_put(obj, d) for d in devs]
def go():
    return [run_polarize(p, o) for p, o in zip(parts, objs)]  # async dispatch: both run at once
jax.block_until_ready(go())
best = 1e9
for _ in range(3):
    t = time.perf_counter(); jax.block_until_ready(go()); best = min(best, time.perf_counter() - t)
print(best)
"""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run; does not write RESULTS.md")
    args = parser.parse_args(argv)
    sizes = [256] if args.quick else [1_000, 10_000, 100_000]
    n_scipy, gd_timed = (2, 200) if args.quick else (20, 10_000)
    n_ref = 256 if args.quick else 1024

    model, obj = problem(max(sizes))
    b = np.asarray(obj.b)
    ref_V, ref_s = (np.asarray(x) for x in run_polarize(problem(n_ref)[0], obj, 1e-12, 1e-14))
    naive = naive_diffrax(obj.b)
    rows, compile_rows, speed = [], [], {}
    for n in sizes:
        m = take(model, slice(0, n))
        for name, fn in (
            ("polarize (auto path, log time)", lambda m=m: run_polarize(m, obj)),
            ("polarize, rtol 1e-7 atol 1e-9", lambda m=m: run_polarize(m, obj, 1e-7, 1e-9)),
            ("naive diffrax jit(vmap)", lambda m=m: naive(m.V, m.a)),
        ):
            first, best, (V, s) = timed(fn, repeats=1 if n >= 100_000 else 3)
            speed[n, name] = n / best
            rows.append([n, name, fmt(n / best), *map(fmt, errors(V, s, ref_V, ref_s)), "measured"])
            compile_rows.append([n, name, fmt(first - best), fmt(best)])
    # Python/numpy baselines: per-initialization cost does not depend on N.
    sec, (V, s) = wall(scipy_loop, np.asarray(model.V[:n_scipy]), np.asarray(model.a[:n_scipy]), b)
    scipy_rate = n_scipy / sec
    scipy_err = errors(V, s, ref_V, ref_s)
    sec, _ = wall(numpy_gd, np.asarray(model.V[0]), np.asarray(model.a[0]), b, gd_timed)
    gd_rate = 1.0 / (sec * GD_STEPS / gd_timed)
    n_vec, vec_steps = (256, 20) if args.quick else (1000, 200)
    sec, _ = wall(numpy_gd_batch, np.asarray(model.V[:n_vec]), np.asarray(model.a[:n_vec]), b, vec_steps)
    vec_rate = n_vec / (sec * GD_STEPS / vec_steps)
    if args.quick:
        gd_err = (None, None)
    else:  # the full 1e6 steps once, for its distance to the flow at t = 1e5
        V, s = numpy_gd(np.asarray(model.V[0]), np.asarray(model.a[0]), b, GD_STEPS)
        gd_err = errors(V[None], s[None], ref_V, ref_s)
    for n in sizes:
        rows.append(
            [
                n,
                f"scipy RK45 loop (timed on {n_scipy})",
                fmt(scipy_rate),
                *map(fmt, scipy_err),
                "extrapolated",
            ]
        )
        rows.append(
            [
                n,
                f"numpy GD lr 0.1 x 1e6, vectorized over inits (timed on {n_vec} x {vec_steps} steps)",
                fmt(vec_rate),
                *map(fmt, gd_err),
                "extrapolated",
            ]
        )
        rows.append(
            [
                n,
                f"numpy GD lr 0.1 x 1e6, per-init loop (timed on {gd_timed} steps)",
                fmt(gd_rate),
                *map(fmt, gd_err),
                "extrapolated",
            ]
        )
    mid = sizes[len(sizes) // 2]
    pol = speed[mid, "polarize (auto path, log time)"]
    ratio_rows = [
        ["naive diffrax jit(vmap)", fmt(pol / speed[mid, "naive diffrax jit(vmap)"])],
        [
            "naive diffrax, polarize at rtol 1e-7",
            fmt(speed[mid, "polarize, rtol 1e-7 atol 1e-9"] / speed[mid, "naive diffrax jit(vmap)"]),
        ],
        ["scipy RK45 loop", fmt(pol / scipy_rate)],
        ["numpy GD, vectorized over inits (headline)", fmt(pol / vec_rate)],
        ["numpy GD, per-init loop (the paper's)", fmt(pol / gd_rate)],
    ]
    body = (
        "Initializations per second (steady state, compile excluded) and the largest deviation of "
        "the final weights s and values V from a reference solve at rtol 1e-12, atol 1e-14 "
        f"(first {n_ref} initializations; scipy on its {n_scipy}; GD on one, after its full 1e6 steps).\n\n"
        + table(["N", "method", "inits/s", "max abs err s", "max abs err V", "timing"], rows)
        + f"\n\nSpeed-up of polarize at N = {mid} (same run, same machine):\n\n"
        + table(["baseline", "polarize / baseline"], ratio_rows)
    )
    if not args.quick:
        two = two_devices(mid)
        body += (
            f"\n\nEvery core: polarize at N = {mid} split over 2 XLA host devices "
            f"(`XLA_FLAGS=--xla_force_host_platform_device_count=2`, subprocess): {fmt(mid / two)} inits/s, "
            f"{fmt(mid / two / pol)}x the single-device run."
        )
    body += "\n\nFirst call (compile) apart from steady state:\n\n" + table(
        ["N", "method", "compile s (first - steady)", "steady s"], compile_rows
    )
    record("flow-ensemble", "(a) Flow ensemble, logistic toy to t = 1e5", body, quick=args.quick)


if __name__ == "__main__":
    main()
