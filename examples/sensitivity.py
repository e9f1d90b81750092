"""Where does the outcome of polarization depend on the initialization? On the basin boundaries.

Along a 2-D slice of initial logits a(0) = (x, y, 0, ...) (V(0) and the target b
fixed), integrate the softmax flow under the logistic loss to t1 for every point,
record which token wins, and differentiate the final entropy H(s(t1)) with respect
to a(0) and V(0) with `jax.grad` through the flow (one batched solve, gradient of the
sum over points). Sensitivity concentrates on the boundaries between basins of
different winners; the script quantifies it as the median |grad| on boundary
pixels against pixels at least `--far` pixels away from any boundary.

    python examples/sensitivity.py --small          # seconds, for the tests
    python examples/sensitivity.py                  # 64 x 64 grid, writes PNG + JSON
"""

import argparse
import json
import pathlib
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import polarize as pz  # noqa: E402
from polarize.runs._storage import write_json  # noqa: E402


def winner_boundary(winner: np.ndarray) -> np.ndarray:
    """Pixels with a 4-neighbour that has a different winner."""
    edge = np.zeros(winner.shape, bool)
    dx = winner[1:, :] != winner[:-1, :]
    dy = winner[:, 1:] != winner[:, :-1]
    edge[1:, :] |= dx
    edge[:-1, :] |= dx
    edge[:, 1:] |= dy
    edge[:, :-1] |= dy
    return edge


def distance_to(mask: np.ndarray) -> np.ndarray:
    """Euclidean distance (in pixels) from every pixel to the nearest True pixel of mask."""
    ii, jj = np.indices(mask.shape)
    points = np.argwhere(mask)
    if points.size == 0:
        return np.full(mask.shape, np.inf)
    d2 = (ii[..., None] - points[:, 0]) ** 2 + (jj[..., None] - points[:, 1]) ** 2
    return np.sqrt(d2.min(axis=-1))


def sensitivity(grid: int, extent: float, t1: float, tokens: int, dim: int, seed: int):
    """Winner, final entropy and |dH/da(0)|, |dH/dV(0)| on a grid x grid slice of a(0)."""
    axis = np.linspace(-extent, extent, grid)
    xs, ys = np.meshgrid(axis, axis, indexing="xy")
    n = grid * grid
    a0 = np.zeros((n, tokens))
    a0[:, 0], a0[:, 1] = xs.ravel(), ys.ravel()
    base = pz.init_ensemble(seed, 1, tokens=tokens, dim=dim, v_scale=0.5)
    V0 = jnp.broadcast_to(base.V, (n, dim, tokens))
    objective = pz.random_direction(seed + 1, dim)
    softmax = pz.Softmax()  # built outside the traced function (its checks need concrete values)

    def total_entropy(V, a):
        traj = pz.flow(pz.ValueAttention(V, a, softmax), objective, t1=t1, n_save=2, rtol=1e-8, atol=1e-10)
        H = pz.final_entropy(traj)
        winner = jnp.argmax(traj.weights[:, -1], axis=-1)
        return jnp.sum(H), (H, winner, traj.ok)

    grad_fn = jax.jit(jax.grad(total_entropy, argnums=(0, 1), has_aux=True))
    start = time.perf_counter()
    (gV, ga), (H, winner, ok) = jax.block_until_ready(grad_fn(V0, jnp.asarray(a0)))
    seconds = time.perf_counter() - start
    shape = (grid, grid)
    u0 = np.asarray(base.V[0]).T @ np.asarray(objective.b)
    return {
        "axis": axis,
        "u0": u0,
        "winner": np.asarray(winner).reshape(shape),
        "entropy": np.asarray(H).reshape(shape),
        "grad_a": np.linalg.norm(np.asarray(ga), axis=-1).reshape(shape),
        "grad_V": np.linalg.norm(np.asarray(gV).reshape(n, -1), axis=-1).reshape(shape),
        "ok": np.asarray(ok).reshape(shape),
        "seconds": seconds,
    }


def quantify(result: dict, far: float) -> dict:
    """Median |grad| on boundary pixels vs pixels >= far pixels from any boundary."""
    edge = winner_boundary(result["winner"])
    dist = distance_to(edge)
    near, away = edge & result["ok"], (dist >= far) & result["ok"]
    out = {"boundary_pixels": int(near.sum()), "far_pixels": int(away.sum()), "far_threshold_px": far}
    for name in ("grad_a", "grad_V"):
        g = result[name]
        med_near = float(np.median(g[near])) if near.any() else None
        med_far = float(np.median(g[away])) if away.any() else None
        out[f"median_{name}_boundary"] = med_near
        out[f"median_{name}_far"] = med_far
        out[f"ratio_{name}"] = med_near / med_far if med_near is not None and med_far else None
    return out


def plot(result: dict, numbers: dict, path: pathlib.Path, t1: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axis = result["axis"]
    ext = [axis[0], axis[-1], axis[0], axis[-1]]
    edge = np.ma.masked_where(~winner_boundary(result["winner"]), np.ones_like(result["entropy"]))
    fig, axes = plt.subplots(1, 3, figsize=(13, 4), constrained_layout=True)
    panels = [
        (result["winner"], "winning token at t1", "tab10", None),
        (np.log10(result["grad_a"] + 1e-300), "log10 |dH(t1) / da(0)|", "magma", None),
        (np.log10(result["grad_V"] + 1e-300), "log10 |dH(t1) / dV(0)|", "magma", None),
    ]
    for ax, (image, title, cmap, _) in zip(axes, panels, strict=True):
        im = ax.imshow(image, origin="lower", extent=ext, cmap=cmap, interpolation="nearest")
        if image is not result["winner"]:
            ax.imshow(edge, origin="lower", extent=ext, cmap="Greys", alpha=0.35, interpolation="nearest")
        fig.colorbar(im, ax=ax, shrink=0.8)
        ax.set_xlabel("a_0(0)")
        ax.set_ylabel("a_1(0)")
        ax.set_title(title)
    ratio = numbers["ratio_grad_a"]
    fig.suptitle(
        f"softmax flow, logistic loss, t1 = {t1:g}: median |dH/da(0)| is "
        f"{ratio:.3g}x larger on basin boundaries (grey) than far from them"
        if ratio
        else f"softmax flow, logistic loss, t1 = {t1:g}"
    )
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", action="store_true", help="a tiny grid, for the tests")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/examples/sensitivity"))
    parser.add_argument("--grid", type=int, default=None, help="points per axis (default 64, small 8)")
    parser.add_argument("--t1", type=float, default=1e4)
    parser.add_argument(
        "--extent", type=float, default=2.0, help="a_0(0), a_1(0) range over [-extent, extent]"
    )
    parser.add_argument("--tokens", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    grid = args.grid or (8 if args.small else 64)
    far = 1.5 if args.small else 4.0
    result = sensitivity(grid, args.extent, args.t1, args.tokens, args.tokens, args.seed)
    numbers = quantify(result, far)
    numbers |= {
        "grid": grid,
        "t1": args.t1,
        "u0": result["u0"].tolist(),
        "winners": sorted(int(w) for w in np.unique(result["winner"])),
        "n_failed": int((~result["ok"]).sum()),
        "solve_and_grad_seconds_incl_compile": round(result["seconds"], 2),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "sensitivity.json", numbers)
    plot(result, numbers, args.out / "sensitivity.png", args.t1)
    print(json.dumps(numbers, indent=1))
    print(f"wrote {args.out / 'sensitivity.png'}")
    return numbers


if __name__ == "__main__":
    main()
