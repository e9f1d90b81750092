"""Stiff long horizons with default options: cross-entropy to t = 1e7, square loss to t = 1e6.

Every `pz.flow` call below passes only the model, the objective and t1: default solver
(the stiff default, `polarize.solve._stiff.default_method`), clock, tolerances (rtol 1e-6,
atol 1e-8), max_steps and 64 save times. Reported per horizon: first call (compile
included) and steady seconds (`jax.block_until_ready`), median and max accepted
steps per init, failed inits, and the load average when the timing ended (the
machine is shared). Same-run reference: the previous default (Tsit5 on the log clock,
`solver=diffrax.Tsit5(), clock="log"`) on the same problem to the horizons it reaches.

    python benchmarks/stiff.py            # full: N = 1,000 cross-entropy, 128 per kappa
    python benchmarks/stiff.py --quick    # smoke test (RESULTS.md untouched)
"""

import argparse
import os
import sys

import jax

jax.config.update("jax_enable_x64", True)

import diffrax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import polarize as pz  # noqa: E402
from benchmarks._common import fmt, record, table, timed  # noqa: E402

CLASSES = 10  # cross-entropy: d = T = 10
SIZE = 20  # square loss: n = d = T = 20


def load() -> str:
    return f"{os.getloadavg()[0]:.1f}"


def cross_entropy(n):
    return pz.init_ensemble(0, n, tokens=CLASSES, dim=CLASSES), pz.peaked_distribution(1, CLASSES)


def square(n, kappa):
    keys = pz.init_keys(1, n)
    obj = jax.vmap(lambda k: pz.conditioned_regression(k, SIZE, SIZE, kappa))(keys)
    return pz.init_ensemble(0, n, tokens=SIZE, dim=SIZE, v_scale=1e-5, a_scale=1e-3), obj


def measure(label, model, obj, t1, **options):
    first, steady, traj = timed(lambda: pz.flow(model, obj, t1=t1, **options), repeats=1)
    steps = np.asarray(traj.steps)
    failed = int((~np.asarray(traj.ok)).sum())
    ok = np.asarray(traj.ok)
    max_w = float(np.median(np.asarray(traj.weights)[ok, -1].max(-1))) if ok.any() else float("nan")
    row = [label, f"{t1:.0e}", len(steps), fmt(first), fmt(steady), int(np.median(steps)), int(steps.max())]
    row += [failed, fmt(max_w, 4), load()]
    print(row, flush=True)
    return row, steady


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, RESULTS.md untouched")
    args = parser.parse_args(argv)
    n_ce, n_sq, n_ref = (16, 8, 16) if args.quick else (1000, 128, 128)
    kappas = (1.0, 100.0) if args.quick else (1.0, 10.0, 100.0)
    header = ["problem", "t1", "inits", "first s", "steady s", "median steps", "max steps", "failed"]
    header += ["median max weight", "load"]
    rows, notes = [], []

    model, obj = cross_entropy(n_ce)
    (row4, s4), (row7, s7) = (measure("cross-entropy, default", model, obj, t1) for t1 in (1e4, 1e7))
    rows += [row4, row7]
    notes.append(f"cross-entropy: steady time to 1e7 / to 1e4 = {s7 / s4:.2f}")
    ref_model, _ = cross_entropy(n_ref)
    old = dict(solver=diffrax.Tsit5(), clock="log")
    ref_t1 = 1e3 if args.quick else 1e4
    row, s_old = measure("cross-entropy, Tsit5 + log clock (old default)", ref_model, obj, ref_t1, **old)
    rows.append(row)
    row, s_new = measure("cross-entropy, default", ref_model, obj, ref_t1)
    rows.append(row)
    notes.append(f"same {n_ref} inits to {ref_t1:.0e}: old default / new default time = {s_old / s_new:.2f}")

    for kappa in kappas:
        model, obj = square(n_sq, kappa)
        (row3, s3), (row6, s6) = (measure(f"square, kappa {kappa:g}", model, obj, t1) for t1 in (3e2, 1e6))
        rows += [row3, row6]
        notes.append(f"square kappa {kappa:g}: steady time to 1e6 / to 3e2 = {s6 / s3:.2f}")

    body = table(header, rows) + "\n\n" + "\n".join(f"- {n}" for n in notes)
    body += (
        "\n\nDefault options throughout (64 save times, rtol 1e-6, atol 1e-8). Cross-entropy: "
        "`peaked_distribution`, V(0) = 0.1 N(0, 1), a(0) = 0; square: `conditioned_regression`, "
        "V(0) = 1e-5 N, a(0) = 1e-3 N, init i paired with dataset i. 'load' is the 1-minute load "
        "average when the timing ended (2 cores, shared)."
    )
    record("stiff", "Stiff long horizons (default options)", body, quick=args.quick)


if __name__ == "__main__":
    main()
