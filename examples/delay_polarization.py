"""Designing against polarization with gradients through the flow.

1. Initialization: with optax (Adam, then projection), find V(0) on the sphere
   |V(0)|_F = r and a(0) in the ball |a(0)| <= r that keep the entropy of
   s(t*) highest at a given time t*, from several random starts at once (softmax,
   logistic loss along b). With a(0) = 0 the winner is argmax_j u_j(0), u = V^T b,
   and tying the u_j(0) would delay it; with a(0) free the optimizer may instead set
   a(0) against u(0) so that the logits meet near t*. The script reports the spread
   of u(0) and the correlation of a(0) with u(0) per start, to tell which it found.
2. Normalization: the smallest sink logit c of softmax1, and separately the smallest
   softmax temperature, for which the ensemble mean of max_{t <= t1, j} s_j(t) stays
   below a target. Newton's method on the scalar parameter, its derivative taken by
   `jax.grad` through the flow, safeguarded by bisection on a bracket found on a grid.

    python examples/delay_polarization.py --small   # seconds, for the tests
    python examples/delay_polarization.py           # writes PNG + JSON to --out
"""

import argparse
import json
import pathlib

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import polarize as pz  # noqa: E402
from polarize.runs._storage import write_json  # noqa: E402

SOLVE = dict(rtol=1e-8, atol=1e-10)


def project(V, a, radius_V, radius_a):
    """V onto the sphere |V|_F = radius_V, a into the ball |a| <= radius_a (per initialization)."""
    nV = jnp.linalg.norm(V.reshape(V.shape[0], -1), axis=-1)
    na = jnp.linalg.norm(a, axis=-1)
    V = V * (radius_V / nV)[:, None, None]
    a = a * jnp.minimum(1.0, radius_a / jnp.maximum(na, 1e-300))[:, None]
    return V, a


def design_initialization(args, tokens: int, starts: int, steps: int) -> dict:
    """Adam on -H(s(t*)) over (V(0), a(0)) for `starts` random starts at once."""
    objective = pz.random_direction(args.seed + 1, tokens)
    softmax = pz.Softmax()
    model = pz.init_ensemble(args.seed, starts, tokens=tokens, dim=tokens, v_scale=0.5, a_scale=0.5)
    V, a = project(model.V, model.a, args.radius, args.radius)

    def entropy_at(V, a, n_save=2):
        traj = pz.flow(pz.ValueAttention(V, a, softmax), objective, t1=args.t_star, n_save=n_save, **SOLVE)
        return pz.final_entropy(traj), traj

    def loss(params):
        H = entropy_at(*params)[0]
        return -jnp.sum(H), H  # each start depends on its own params only

    grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    optimizer = optax.adam(args.lr)
    params = (V, a)
    state = optimizer.init(params)
    history = []
    for _ in range(steps):
        (value, H), g = grad(params)
        history.append(-float(value) / starts)
        updates, state = optimizer.update(g, state, params)
        params = project(*optax.apply_updates(params, updates), args.radius, args.radius)
    H_start = np.asarray(grad((V, a))[0][1])
    H_end = np.asarray(grad(params)[0][1])
    # Start and end in one solve (one compiled program), for the figure.
    _, both = entropy_at(jnp.concatenate([V, params[0]]), jnp.concatenate([a, params[1]]), n_save=32)
    traj_start, traj = both.at(slice(0, starts)), both.at(slice(starts, 2 * starts))
    u0 = lambda V: np.einsum("ndk,d->nk", np.asarray(V), np.asarray(objective.b))
    spread = lambda V: np.std(u0(V), axis=-1)
    corr = lambda V, a: np.array([np.corrcoef(u, x)[0, 1] for u, x in zip(u0(V), np.asarray(a), strict=True)])
    return {
        "t_star": args.t_star,
        "starts": starts,
        "steps": steps,
        "uniform_entropy": float(np.log(tokens)),
        "entropy_start": H_start.tolist(),
        "entropy_end": np.asarray(H_end).tolist(),
        "u0_spread_start": spread(V).tolist(),
        "u0_spread_end": spread(params[0]).tolist(),
        "corr_a0_u0_start": corr(V, a).tolist(),
        "corr_a0_u0_end": corr(*params).tolist(),
        "n_failed": int((~np.asarray(traj.ok)).sum()),
        "_history": history,
        "_traj": (traj_start, traj),
    }


def max_weight_over_horizon(param_to_norm, t1: float, n: int, tokens: int, seed: int):
    """c -> mean over n inits of max_{t <= t1, j} s_j(t), jitted with its derivative."""
    model = pz.init_ensemble(seed, n, tokens=tokens, dim=tokens, v_scale=0.5)
    objective = pz.random_direction(seed + 1, tokens)

    def mean_max(c):
        traj = pz.flow(
            pz.ValueAttention(model.V, model.a, param_to_norm(c)), objective, t1=t1, n_save=16, **SOLVE
        )
        return jnp.mean(jnp.max(traj.weights, axis=(-2, -1))), jnp.all(traj.ok)

    return jax.jit(jax.value_and_grad(mean_max, has_aux=True))


def smallest_parameter(fn, grid: np.ndarray, target: float, tol: float = 1e-6, max_iter: int = 30) -> dict:
    """The smallest c with fn(c) <= target: first crossing on `grid`, refined by Newton + bisection.

    fn need not be monotone before the crossing (a sink logit barely matters until the
    learned logits stop outgrowing it); `monotone_on_grid` reports whether it was.
    """
    values = np.array([float(fn(jnp.asarray(c))[0][0]) for c in grid])
    below = np.nonzero(values <= target)[0]
    if below.size == 0 or below[0] == 0:
        return {"grid": grid.tolist(), "values": values.tolist(), "root": None, "iterations": 0}
    lo, hi = float(grid[below[0] - 1]), float(grid[below[0]])
    c = lo + (hi - lo) * (values[below[0] - 1] - target) / (values[below[0] - 1] - values[below[0]])
    for iteration in range(1, max_iter + 1):
        (value, ok), slope = fn(jnp.asarray(c))
        gap = float(value) - target
        if abs(gap) < tol:
            break
        lo, hi = (c, hi) if gap > 0 else (lo, c)
        step = c - gap / float(slope)
        c = step if lo < step < hi and float(slope) < 0 else 0.5 * (lo + hi)
    return {
        "grid": grid.tolist(),
        "values": values.tolist(),
        "root": float(c),
        "value_at_root": float(value),
        "slope_at_root": float(slope),
        "iterations": iteration,
        "ok": bool(ok),
        "monotone_on_grid": bool(np.all(np.diff(values) <= 0)),
    }


def plot(design: dict, sink: dict, temperature: dict, args, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4), constrained_layout=True)
    start, end = design["_traj"]
    for traj, color, label in ((start, "tab:gray", "random start"), (end, "tab:red", "optimized")):
        H = np.asarray(pz.summarize(traj, pz.random_direction(0, traj.V.shape[-2])).series["entropy"])
        for i, h in enumerate(H):
            axes[0].plot(
                np.asarray(traj.ts)[1:], h[1:], color=color, alpha=0.6, label=label if i == 0 else None
            )
    axes[0].axvline(args.t_star, color="k", ls=":", label="t*")
    axes[0].axhline(design["uniform_entropy"], color="k", ls="--", lw=0.8, label="log T")
    axes[0].set(
        xscale="log", xlabel="t", ylabel="entropy of s(t)", title="initialization that delays polarization"
    )
    axes[0].legend(fontsize=8)
    for ax, res, name in ((axes[1], sink, "sink logit c (softmax1)"), (axes[2], temperature, "temperature")):
        ax.plot(res["grid"], res["values"], "o-", ms=3, label="mean over inits")
        ax.axhline(args.target, color="k", ls="--", lw=0.8, label="target")
        if res["root"] is not None:
            ax.axvline(res["root"], color="tab:red", ls=":", label=f"smallest = {res['root']:.4g}")
        ax.set(xlabel=name, ylabel=f"max weight over t <= {args.horizon:g}", title=f"choosing the {name}")
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes, for the tests")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/examples/delay_polarization"))
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--t-star", type=float, default=100.0, help="time at which entropy is maximized")
    parser.add_argument("--radius", type=float, default=1.0, help="|V(0)|_F = radius, |a(0)| <= radius")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--target", type=float, default=0.6, help="bound on the max weight")
    parser.add_argument("--horizon", type=float, default=1e3, help="t1 for the normalization design")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    starts, steps, n, points = (2, 4, 4, 7) if args.small else (8, 150, 64, 25)

    design = design_initialization(args, args.tokens, starts, steps)
    sink_fn = max_weight_over_horizon(lambda c: pz.Softmax1(sink=c), args.horizon, n, args.tokens, args.seed)
    temp_fn = max_weight_over_horizon(
        lambda c: pz.Softmax(temperature=c), args.horizon, n, args.tokens, args.seed
    )
    sink = smallest_parameter(sink_fn, np.linspace(-2.0, 10.0, points), args.target)
    temperature = smallest_parameter(temp_fn, np.geomspace(0.5, 20.0, points), args.target)

    args.out.mkdir(parents=True, exist_ok=True)
    numbers = {
        "initialization": {k: v for k, v in design.items() if not k.startswith("_")},
        "objective_history": design["_history"],
        "target": args.target,
        "horizon": args.horizon,
        "n_inits": n,
        "sink": sink,
        "temperature": temperature,
    }
    write_json(args.out / "delay_polarization.json", numbers)
    plot(design, sink, temperature, args, args.out / "delay_polarization.png")
    short = {
        "entropy_start": design["entropy_start"],
        "entropy_end": design["entropy_end"],
        "u0_spread_start": design["u0_spread_start"],
        "u0_spread_end": design["u0_spread_end"],
        "corr_a0_u0_end": design["corr_a0_u0_end"],
        "smallest_sink": sink["root"],
        "smallest_temperature": temperature["root"],
        "max_weight_at_sink": sink.get("value_at_root"),
        "max_weight_at_temperature": temperature.get("value_at_root"),
        "newton_iterations": [sink["iterations"], temperature["iterations"]],
    }
    print(json.dumps(short, indent=1))
    print(f"wrote {args.out / 'delay_polarization.png'}")
    return numbers


if __name__ == "__main__":
    main()
