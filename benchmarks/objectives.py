"""Every objective against naive diffrax, side by side in one process (issue 10's targets).

Naive baseline: `jax.jit(jax.vmap(diffeqsolve))`, Tsit5, PID at the same rtol/atol,
a `jax.grad` field on the full (V, a), linear time, saving only t1. polarize: `flow`
with its defaults (batched engine, log clock, auto field) with the default 64 saved
times, and with ends only (`n_save=2`) for the paper toy. Accuracy: the largest
deviation of the final weights s from each other and from a reference solve at
rtol 1e-12, atol 1e-14 (polarize, first `n_ref` initializations).

Timings: steady state (compile excluded), best of 3, both wall clock and process
CPU time (the machine is shared; the load average is printed with every case).

    python benchmarks/objectives.py            # full (a few minutes)
    python benchmarks/objectives.py --quick    # smoke test
"""

import argparse
import os
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import polarize as pz  # noqa: E402
from benchmarks._common import fmt, peak_rss_mb, record, table  # noqa: E402

RTOL, ATOL = 1e-6, 1e-8


def cases(quick: bool):
    """(name, model, objective, t1, n_save list) for every path of the issue."""
    n_toy, n = (256, 256) if quick else (10_000, 4096)
    toy = pz.init_ensemble(0, n_toy, tokens=8, dim=8, v_scale=0.1)
    yield "paper toy (T = d = 8, t1 = 1e5)", toy, pz.random_direction(1, 8), 1e5, (64, 2)
    sq = pz.init_ensemble(0, n, tokens=16, dim=16, v_scale=0.1)
    yield (
        "square, conditioning (n = d = T = 16, kappa 3, t1 = 300)",
        sq,
        pz.conditioned_regression(2, 16, 16, 3.0),
        300.0,
        (64,),
    )
    lg = pz.init_ensemble(0, n, tokens=8, dim=8, v_scale=0.1, norm="sigmoid")
    yield "logistic data, sigmoid (n = 16, d = T = 8, t1 = 1e3)", lg, pz.random_labels(3, 16, 8), 1e3, (64,)
    ce = pz.init_ensemble(0, n, tokens=8, dim=10, v_scale=0.1)
    yield "cross-entropy (d = 10, T = 8, t1 = 1e3)", ce, pz.peaked_distribution(4, 10), 1e3, (64,)


def naive(objective, norm, t1):
    """What a competent JAX user writes: vmap(diffeqsolve) on the full (V, a)."""

    def field(t, y, args):
        V, a = y
        return jax.tree.map(jnp.negative, jax.grad(lambda p: objective(p[0] @ norm(p[1])))((V, a)))

    def solve(V, a):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(field),
            diffrax.Tsit5(),
            t0=0.0,
            t1=t1,
            dt0=None,
            y0=(V, a),
            saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL),
            max_steps=100_000,
        )
        return norm(sol.ys[1][0])

    return jax.jit(jax.vmap(solve))


def machine_peak():
    """(flop/s, exp/s) of this core on a fused elementwise float64 kernel in cache-sized
    blocks: the rate a perfectly fused solve could reach. Each kernel runs ~0.2 s, well
    above the granularity of the process CPU clock on this machine (a 1 ms kernel read
    7.3 G exp/s in one run, 0.99 in another)."""
    x = jnp.linspace(0.1, 1.0, 1 << 12)

    def fmas(x):
        for _ in range(64):
            x = x * 0.999 + 1e-3
        return x

    fma_rounds, exp_rounds = 8192, 65536
    many_fma = jax.jit(lambda x: jax.lax.fori_loop(0, fma_rounds, lambda i, x: fmas(x), x))
    many_exp = jax.jit(lambda x: jax.lax.fori_loop(0, exp_rounds, lambda i, x: jnp.exp(-x), x))
    _, cpu, _ = clocked(lambda: many_fma(x))
    flops = 2 * 64 * fma_rounds * x.size / cpu
    _, cpu, _ = clocked(lambda: many_exp(x))
    return flops, exp_rounds * x.size / cpu


def output_cost(shapes, n: int) -> float:
    """CPU seconds per init of a jitted program that only writes arrays of the given
    per-init `shapes` (float64) for `n` inits in one call, no arithmetic to speak of. Each
    call gets new output buffers; glibc hands back freed memory for arrays up to 32 MB and
    maps fresh pages for larger ones, so the cost jumps with the array size."""
    write = jax.jit(lambda x: [x.reshape((n,) + (1,) * len(s)) * jnp.ones(s) for s in shapes])
    _, cpu, _ = clocked(lambda: write(jnp.arange(n, dtype=jnp.float64)))
    return cpu / n


def per_init_shapes(traj) -> list[tuple[int, ...]]:
    """The per-init shapes of a trajectory's floating leaves that carry the inits axis."""
    n = traj.ok.shape[0]
    leaves = jax.tree.leaves(traj)
    floating = lambda x: jnp.issubdtype(x.dtype, jnp.floating)
    return [x.shape[1:] for x in leaves if x.ndim and x.shape[0] == n and floating(x)]


def save_breakdown(model, objective, t1):
    """Rows of what the saved times cost on the paper toy: the same solve with ends only,
    with t0 and t1 given as explicit save times (the save machinery for two times), and
    with 16 and 64 saved times; with the CPU cost of writing each output alone."""
    variants = [
        ("ends only (n_save=2)", dict(n_save=2)),
        ("ts = (0, t1): the save loop, 2 times", dict(ts=jnp.array([0.0, t1]))),
        ("16 saves", dict(n_save=16)),
        ("64 saves (default)", dict(n_save=64)),
    ]
    n = model.V.shape[0]
    rows, base = [], None
    for label, kw in variants:
        run = lambda kw=kw: pz.flow(model, objective, t1=t1, rtol=RTOL, atol=ATOL, **kw)
        _, cpu, traj = clocked(run)
        shapes = per_init_shapes(traj)
        size = sum(int(np.prod(s)) for s in shapes)
        write = output_cost(shapes, n)
        base = cpu / n if base is None else base
        rows.append([label, f"{cpu / n * 1e6:.3g}", fmt(cpu / n / base), f"{size:,}", f"{write * 1e6:.3g}"])
    return rows


def handwritten_floor(model, objective, t1, block=128):
    """The paper toy solved by the least code that runs the same algorithm in JAX: Tsit5's
    tableau and an integral controller (diffrax's PID defaults: safety 0.9, step factors
    1 to 10 after an accepted step and 0.2 to 10 after a rejected one, RMS error norm)
    written out by hand on the reduced state (u, a) in log time, inits
    last in blocks of `block`, ends only; no diffrax, no status, no checks, no saves. Its
    CPU time per init (one core) is XLA's floor for this algorithm on this machine.

    Returns (cpu s per init, mean accepted steps, loop iterations per block, final a)."""
    T = model.a.shape[-1]
    b = np.asarray(objective.direction())
    bb = float(b @ b)
    u0 = np.einsum("ndt,d->nt", np.asarray(model.V), b)
    tab = diffrax.Tsit5.tableau
    lower = [np.asarray(r) for r in tab.a_lower]
    b_sol, b_err, c = np.asarray(tab.b_sol), np.asarray(tab.b_error), np.asarray(tab.c)
    s1 = float(np.log1p(t1))

    def field(t, y):  # d(u, a)/dtau, tau = log(1 + t), for L = log(1 + exp(-<u, s>)); t: (1, inits)
        u, a = y[:T], y[T:]
        x = jnp.exp(a - jnp.max(a, axis=0, keepdims=True))
        s = x / jnp.sum(x, axis=0, keepdims=True)
        su = jnp.sum(s * u, axis=0, keepdims=True)
        e = jax.nn.sigmoid(-su)
        return jnp.exp(t) * jnp.concatenate([bb * e * s, e * s * (u - su)], axis=0)

    def step(t, h, y, f0):  # t, h: (1, inits)
        ks = [h * f0]
        for i in range(6):
            ks.append(h * field(t + c[i] * h, y + sum(lower[i][j] * ks[j] for j in range(i + 1))))
        combine = lambda w: sum(w[j] * ks[j] for j in range(7))
        return y + combine(b_sol), combine(b_err), ks[-1] / h

    def one_block(y):
        def body(carry):
            t, h, y, f, steps, its = carry
            go = t < s1
            h = jnp.minimum(h, s1 - t)
            y1, err, f1 = step(t, h, y, f)
            scale = ATOL + RTOL * jnp.maximum(jnp.abs(y), jnp.abs(y1))
            ratio = jnp.sqrt(jnp.mean((err / scale) ** 2, axis=0, keepdims=True))
            keep = (ratio <= 1) & go
            # diffrax: an accepted step never shrinks the next one; a rejected one by 0.2 at most
            factor = jnp.clip(0.9 * ratio ** (-1 / 5), jnp.where(keep, 1.0, 0.2), 10.0)
            t, y, f = jnp.where(keep, t + h, t), jnp.where(keep, y1, y), jnp.where(keep, f1, f)
            return t, jnp.where(go, h * factor, h), y, f, steps + keep, its + 1

        t = jnp.zeros((1, y.shape[1]))
        start = (t, jnp.full_like(t, 0.01), y, field(t, y), jnp.zeros(t.shape, jnp.int32), 0)
        out = jax.lax.while_loop(lambda carry: jnp.any(carry[0] < s1), body, start)
        return out[2][T:], out[4][0], out[5]

    blocks = u0.shape[0] // block
    y0 = np.concatenate([u0, np.asarray(model.a)], axis=1)[: blocks * block]
    y0 = jnp.asarray(y0.reshape(blocks, block, 2 * T).transpose(0, 2, 1))
    solve = jax.jit(lambda y: jax.lax.map(one_block, y))
    _, cpu, (a, steps, its) = clocked(lambda: solve(y0))
    a = np.asarray(a).transpose(0, 2, 1).reshape(-1, T)
    return cpu / (blocks * block), float(np.mean(steps)), float(np.mean(its)), a


def floor_comparison(model, objective, t1):
    """Rows: the hand-written loop against polarize's flow on one thread (same inits)."""
    cpu, steps, its, a = handwritten_floor(model, objective, t1)
    n = a.shape[0]
    head = pz.ValueAttention(model.V[:n], model.a[:n], model.norm)
    rows = [["hand-written Tsit5 loop, ends only (the floor)", f"{cpu * 1e6:.3g}", "1", fmt(steps), "-"]]
    previous = os.environ.get("POLARIZE_THREADS")
    os.environ["POLARIZE_THREADS"] = "1"  # one core, like the hand-written program
    try:
        for label, n_save in (("polarize flow, ends only", 2), ("polarize flow, 64 saves", 64)):
            run = lambda n_save=n_save: pz.flow(head, objective, t1=t1, n_save=n_save, rtol=RTOL, atol=ATOL)
            _, c, traj = clocked(run)
            diff = float(np.max(np.abs(np.asarray(traj.a[:, -1]) - a)))
            if not diff < 1e-4:  # the "equal accuracy": otherwise no floor of this solve
                raise SystemExit(f"the hand-written loop's final logits differ from polarize's by {diff:.3g}")
            steps_p = float(np.mean(np.asarray(traj.steps)))
            rows.append([label, f"{c / n * 1e6:.3g}", fmt(c / n / cpu), fmt(steps_p), f"{diff:.2g}"])
    finally:
        if previous is None:
            del os.environ["POLARIZE_THREADS"]
        else:
            os.environ["POLARIZE_THREADS"] = previous
    return rows, its


def field_cost(model, objective):
    """(flops, transcendentals) of one evaluation of polarize's vector field for one init (XLA's count)."""
    from polarize.core.fields import choose_field

    one = pz.ValueAttention(model.V[0], model.a[0], model.norm)
    system = choose_field(one, objective)
    y0, consts = system.initial(one, objective), system.constants(one, objective)
    fn = jax.jit(lambda s, y: jax.tree.map(lambda d: jnp.exp(s) * d, system.field(y, one, objective, consts)))
    cost = fn.lower(jnp.asarray(1.0), y0).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    size = sum(x.size for x in jax.tree.leaves(y0))
    return float(cost.get("flops", 0.0)), float(cost.get("transcendentals", 0.0)), size


def floor_row(name, model, objective, steps, cpu_per_init, peak):
    """The floor of a Tsit5 solve: 6 field evaluations and the tableau's arithmetic per step."""
    flops, transc, size = field_cost(model, objective)
    tableau = diffrax.Tsit5.tableau
    coeffs = sum(int(np.count_nonzero(a)) for a in tableau.a_lower) + int(np.count_nonzero(tableau.b_error))
    rk = 2 * size * coeffs + 8 * size  # stage sums, error estimate, error norm and controller
    per_init_flops = steps * (6 * flops + rk)
    per_init_transc = steps * 6 * transc
    floor_s = per_init_flops / peak[0] + per_init_transc / peak[1]
    return [
        name,
        fmt(flops),
        fmt(transc),
        fmt(steps),
        fmt(per_init_flops),
        fmt(floor_s * 1e6),
        fmt(cpu_per_init * 1e6),
        fmt(cpu_per_init / floor_s),
    ]


def clocked(fn, repeats=3):
    """(wall s, cpu s, output): best of `repeats` steady calls after a first (compile) call."""
    out = jax.block_until_ready(fn())
    wall = cpu = float("inf")
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        out = jax.block_until_ready(fn())
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu, out


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny smoke run; does not write RESULTS.md")
    args = parser.parse_args(argv)
    n_ref = 32 if args.quick else 256
    rows, speed_rows, floor_rows = [], [], []
    peak = machine_peak()
    for name, model, objective, t1, saves in cases(args.quick):
        n = model.V.shape[0]
        head = pz.ValueAttention(model.V[:n_ref], model.a[:n_ref], model.norm)
        ref = np.asarray(pz.flow(head, objective, t1=t1, n_save=2, rtol=1e-12, atol=1e-14).weights[:, -1])
        base = naive(objective, model.norm, t1)
        w0, c0, s0 = clocked(lambda base=base, model=model: base(model.V, model.a))
        s0 = np.asarray(s0)
        rows.append(
            [
                name,
                "naive diffrax jit(vmap)",
                n,
                fmt(w0),
                fmt(c0),
                "-",
                "-",
                fmt(np.abs(s0[:n_ref] - ref).max()),
                load(),
            ]
        )
        for n_save in saves:
            label = f"polarize flow, {n_save} saves" + (" (ends only)" if n_save == 2 else " (default)")
            run = lambda model=model, objective=objective, t1=t1, n_save=n_save: pz.flow(
                model, objective, t1=t1, n_save=n_save, rtol=RTOL, atol=ATOL
            ).weights[:, -1]
            w, c, s = clocked(run)
            s = np.asarray(s)
            rows.append(
                [
                    name,
                    label,
                    n,
                    fmt(w),
                    fmt(c),
                    fmt(w0 / w),
                    fmt(c0 / c),
                    fmt(np.abs(s[:n_ref] - ref).max()),
                    load(),
                ]
            )
            speed_rows.append([name, label, fmt(w0 / w), fmt(c0 / c), fmt(np.abs(s - s0).max())])
            steps = float(np.mean(np.asarray(pz.flow(head, objective, t1=t1, n_save=n_save).steps)))
            floor_rows.append(floor_row(f"{name}, {n_save} saves", model, objective, steps, c / n, peak))
    body = (
        f"rtol {RTOL}, atol {ATOL}, float64, Tsit5 for both. Wall and process-CPU seconds of one steady "
        "solve (best of 3, compile excluded); speed-up = naive / polarize in the same process. "
        f"'err vs ref': largest |s(t1) - s_ref(t1)| over the first {n_ref} inits, reference = polarize at "
        "rtol 1e-12, atol 1e-14.\n\n"
        + table(
            [
                "case",
                "method",
                "N",
                "wall s",
                "cpu s",
                "speed-up (wall)",
                "speed-up (cpu)",
                "err vs ref",
                "load",
            ],
            rows,
        )
        + "\n\nSummary (|s - s_naive|: largest difference of the final weights from the naive solve):\n\n"
        + table(["case", "polarize", "x naive (wall)", "x naive (cpu)", "max abs s - s_naive"], speed_rows)
    )
    body += (
        f"\n\nThe floor. This core reaches {peak[0] / 1e9:.2g} GFLOP/s on a fused float64 multiply-add "
        f"kernel and {peak[1] / 1e9:.2g} G exp/s (cache-resident, measured in this run). A Tsit5 solve "
        "needs at least 6 field evaluations per accepted step plus the tableau's arithmetic; the "
        "floor below counts those flops (XLA's cost analysis of polarize's field for one init, "
        "rejected steps not counted) at that peak rate. 'x floor' = measured CPU time per init / "
        "floor.\n\n"
        + table(
            [
                "path",
                "field flops",
                "field exps",
                "mean steps",
                "flops / init",
                "floor us / init",
                "measured cpu us / init",
                "x floor",
            ],
            floor_rows,
        )
    )
    _, toy, toy_objective, toy_t1, _ = next(cases(args.quick))
    body += (
        "\n\nWhere the saved times' cost goes, on the paper toy (N = "
        f"{toy.V.shape[0]}, process CPU per init, best of 3): the same solve with ends only; with t0 and t1 "
        "passed as explicit save times, which runs the save machinery (each step's stage "
        "increments kept for the dense interpolation, the check for a due save time, the "
        "interpolation and the write) for two times; and with 16 and 64 saved times. The last "
        "column is one jitted program that only writes arrays of the trajectory's shapes for all "
        "N inits (an array over glibc's 32 MB limit for reusing freed memory, as each 64-save "
        "array is at N = 1e4, gets fresh pages on every call): the part of a row that no solver "
        "change removes.\n\n"
        + table(
            [
                "variant",
                "cpu us / init",
                "x ends only",
                "output float64 / init",
                "writing it alone, us / init",
            ],
            save_breakdown(toy, toy_objective, toy_t1),
        )
        + "\n"
    )
    floor_rows, iterations = floor_comparison(toy, toy_objective, toy_t1)
    body += (
        "\nThe floor measured instead of counted: the paper toy solved by the least JAX code that "
        "runs the same algorithm (Tsit5's tableau and an integral controller with diffrax's PID "
        "defaults written out by hand on the reduced state, log time, inits last in blocks of 128, "
        "ends only; no diffrax, no status, no checks, no saves; "
        f"{iterations:.1f} loop iterations per block), against polarize on the same inits, both "
        "on one core (`POLARIZE_THREADS=1`; process CPU per init, best of 3). Last column: the "
        "largest difference of the final logits a from the hand-written loop's (the controllers "
        "differ in details such as diffrax's rounding of the last step to t1).\n\n"
        + table(
            ["program", "cpu us / init", "x hand-written", "mean accepted steps", "max abs a - a_hand"],
            floor_rows,
        )
        + "\n"
    )
    if not args.quick:  # what `polarize sweep --inits 1000000` integrates, without the sweep's I/O
        # In chunks of 2e4 like a sweep: the full trajectory of 1e6 inits at 64 times is 13 GB.
        chunk, ok = 20_000, True
        wall, cpu = time.perf_counter(), time.process_time()
        for start in range(0, 1_000_000, chunk):
            part = pz.init_ensemble(0, chunk, tokens=8, dim=8, v_scale=0.1, start=start)
            traj = pz.flow(part, pz.random_direction(1, 8), t1=1e5)
            ok &= bool(np.all(np.asarray(traj.ok)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        body += (
            f"\n\n1e6 initializations of the paper toy, `flow` with its defaults (64 saves), in 50 chunks "
            f"of 2e4 (the first compiles): {wall:.1f} s wall / {cpu:.1f} s CPU; all ok: {ok}; peak RSS of "
            f"this process {peak_rss_mb():.0f} MiB; load {load()}."
        )
    record("objectives", "(e) Every objective against naive diffrax", body, quick=args.quick)


if __name__ == "__main__":
    main()
