"""Time and memory of differentiating `flow` with each adjoint.

Problem: N initializations (T = d = 8, softmax, logistic loss along b), horizon t1
in log-time; the statistic is the sum of the final entropies. Reverse mode
(checkpoint, backsolve) gives d/dV(0), d/da(0) and d/dtemperature in one pass;
forward mode gives one directional derivative per pass (here d/dtemperature).

Columns: compile seconds (lower + compile, apart), run seconds (median of
`--repeat` calls, `jax.block_until_ready`), XLA's temporary buffer size for the
compiled program (`memory_analysis().temp_size_in_bytes`), and the largest
relative deviation from the checkpointed gradient. Prints a Markdown table and
writes it between the `adjoints` markers of benchmarks/RESULTS.md (other sections kept).

    python benchmarks/adjoints.py            # N = 256, t1 = 1e6
    python benchmarks/adjoints.py --quick    # N = 8, t1 = 1e3, one repeat, prints only
"""

import argparse
import os
import platform
import statistics
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import polarize as pz  # noqa: E402
from benchmarks._common import record  # noqa: E402


def measure(fn, args, repeat: int):
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    out = jax.block_until_ready(compiled(*args))  # warm-up
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = jax.block_until_ready(compiled(*args))
        runs.append(time.perf_counter() - start)
    memory = compiled.memory_analysis()
    temp = getattr(memory, "temp_size_in_bytes", None) if memory is not None else None
    return out, compile_s, statistics.median(runs), temp


def run(n: int, t1: float, repeat: int) -> tuple[list[dict], dict]:
    model = pz.init_ensemble(0, n, tokens=8, dim=8, v_scale=0.5, a_scale=0.3)
    objective = pz.random_direction(1, 8)
    softmax = pz.Softmax()
    solve = dict(t1=t1, n_save=2, rtol=1e-8, atol=1e-10)

    def statistic(adjoint, max_steps=100_000):
        def fn(V, a, temperature):
            norm = eqx_temperature(softmax, temperature)
            traj = pz.flow(
                pz.ValueAttention(V, a, norm), objective, adjoint=adjoint, max_steps=max_steps, **solve
            )
            return jnp.sum(pz.final_entropy(traj))

        return fn

    args = (model.V, model.a, jnp.asarray(1.0))
    cases = [
        ("primal only (no gradient)", statistic(None), None),
        ("checkpoint (default), max_steps=1e5", jax.grad(statistic(None), argnums=(0, 1, 2)), "ref"),
        (
            "checkpoint, max_steps=1e3",
            jax.grad(statistic(None, max_steps=1000), argnums=(0, 1, 2)),
            "reverse",
        ),
        ("backsolve", jax.grad(statistic(pz.adjoint("backsolve")), argnums=(0, 1, 2)), "reverse"),
        (
            "forward (jvp, 1 direction: temperature)",
            lambda V, a, c: jax.jvp(
                lambda c: statistic(pz.adjoint("forward"))(V, a, c), (c,), (jnp.ones_like(c),)
            ),
            "forward",
        ),
    ]
    rows, ref = [], None
    for name, fn, kind in cases:
        out, compile_s, run_s, temp = measure(fn, args, repeat)
        if kind == "ref":
            ref = out
        if kind == "reverse":
            flat, flat_ref = (np.concatenate([np.ravel(x) for x in g]) for g in (out, ref))
            dev = float(np.max(np.abs(flat - flat_ref)) / np.max(np.abs(flat_ref)))
        elif kind == "forward":
            dev = float(abs(out[1] - ref[2]) / abs(ref[2]))
        else:
            dev = None
        rows.append(
            {"adjoint": name, "compile_s": compile_s, "run_s": run_s, "temp_bytes": temp, "rel_dev": dev}
        )
    setup = {
        "n": n,
        "t1": t1,
        "repeat": repeat,
        "machine": f"{platform.machine()}, {jax.devices()[0].platform}",
    }
    return rows, setup


def eqx_temperature(norm, temperature):
    import equinox as eqx

    return eqx.tree_at(lambda s: s.temperature, norm, temperature)


def table(rows: list[dict], setup: dict) -> str:
    lines = [
        f"N = {setup['n']} initializations, T = d = 8, softmax, logistic direction, t1 = {setup['t1']:g} "
        f"(log-time), rtol 1e-8; {setup['machine']}; run time = median of {setup['repeat']}. "
        f"Statistic: sum of final entropies; diffrax {diffrax.__version__}, jax {jax.__version__}.",
        "",
        "| adjoint | compile s | run s | XLA temp MiB | max rel. deviation from checkpoint |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        temp = "n/a" if r["temp_bytes"] is None else f"{r['temp_bytes'] / 2**20:.2f}"
        dev = (
            "reference"
            if r["rel_dev"] is None and "default" in r["adjoint"]
            else ("-" if r["rel_dev"] is None else f"{r['rel_dev']:.1e}")
        )
        lines.append(f"| {r['adjoint']} | {r['compile_s']:.2f} | {r['run_s']:.4f} | {temp} | {dev} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", "--small", action="store_true", help="tiny smoke run; does not write RESULTS.md"
    )
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--t1", type=float, default=None)
    parser.add_argument("--repeat", type=int, default=None)
    args = parser.parse_args(argv)
    n = args.n or (8 if args.quick else 256)
    t1 = args.t1 or (1e3 if args.quick else 1e6)
    rows, setup = run(n, t1, args.repeat or (1 if args.quick else 3))
    record("adjoints", "Adjoints", table(rows, setup), quick=args.quick)


if __name__ == "__main__":
    main()
