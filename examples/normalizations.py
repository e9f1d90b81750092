"""The paper's comparison of normalizations: which ones go one-hot, over an ensemble.

T = d = 10, V(0) = 0.1 N(0, 1), a(0) = 1 + 0.1 N(0, 1). Logistic loss along b by plain GD
(lr 0.5, 1e5 steps, t = 5e4; discrete steps as in the paper, because the non-smooth maps
relu-norm, l1-norm and sparsemax make the exact flow stiff) and square loss |b - V s|^2
(GD lr 0.1, 5000 steps). Reports final max weight and entropy of p = |s| / sum |s|.

    python examples/normalizations.py [--small] [--out DIR] [--seed S]
"""

import sys

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import finish, parse, plt, save, table  # noqa: E402

import polarize as pz  # noqa: E402

NORMS = (
    "softmax", "relu-norm", "l1-norm", "square-norm", "sum-norm", "sigmoid",
    "softmax1", "sparsemax", "sigmoid-norm", "relu", "linear",
)  # fmt: skip
SMALL_NORMS = ("softmax", "sigmoid")  # each normalization compiles its own loop: keep --small quick
TOKENS = DIM = 10


def main(argv=None) -> dict:
    args = parse("normalizations", __doc__.splitlines()[0], argv)
    n_inits, steps_logistic, steps_square = (16, 2000, 500) if args.small else (256, 100_000, 5000)
    norms = SMALL_NORMS if args.small else NORMS
    logistic = pz.random_direction(args.seed + 1, DIM)
    square = pz.Square(None, logistic.b)
    setups = {"logistic": (logistic, 0.5, steps_logistic), "square": (square, 0.1, steps_square)}
    results = {}
    for loss, (objective, lr, steps) in setups.items():
        for norm in norms:
            model = pz.init_ensemble(
                args.seed, n_inits, tokens=TOKENS, dim=DIM, v_scale=0.1, a_scale=0.1, a_offset=1.0, norm=norm
            )
            summary = pz.summarize(pz.descend(model, objective, lr, steps=steps, n_save=2), objective)
            results[loss, norm] = summary

    rows, numbers = [], {}
    for (loss, norm), s in results.items():
        ok = s.final["ok"]
        mw, H = s.final["max_weight"][ok], s.final["entropy"][ok]
        q = lambda x, p: float(np.percentile(x, p)) if x.size else float("nan")
        rows.append(
            [
                loss,
                norm,
                int((~ok).sum()),
                q(mw, 50),
                q(mw, 10),
                q(mw, 90),
                float(np.mean(mw >= 0.9)) if mw.size else float("nan"),
                q(H, 50),
            ]
        )
        numbers[f"{loss}/{norm}"] = {
            "median_max_weight": q(mw, 50),
            "one_hot_fraction": float(np.mean(mw >= 0.9)) if mw.size else None,
            "median_entropy": q(H, 50),
            "n_failed": int((~ok).sum()),
        }
    print(
        f"{n_inits} inits each; logistic: GD lr 0.5, {steps_logistic} steps; "
        f"square: GD lr 0.1, {steps_square} steps"
    )
    table(["loss", "norm", "failed", "median max w", "10%", "90%", "share >= 0.9", "median H"], rows)

    fig, axes = plt.subplots(2, 2, figsize=(14, 7), constrained_layout=True, sharex=True)
    for col, loss in enumerate(setups):
        for row, (key, label, ref) in enumerate(
            (
                ("max_weight", "final max weight", 1 / TOKENS),
                ("entropy", "final entropy [nats]", np.log(TOKENS)),
            )
        ):
            ax = axes[row, col]
            data = [results[loss, n].final[key][results[loss, n].final["ok"]] for n in norms]
            data = [d if d.size else np.array([np.nan]) for d in data]
            ax.boxplot(data, whis=(10, 90), showfliers=False)
            ax.axhline(ref, color="gray", ls=":", label="uniform")
            ax.set(ylabel=label, title=f"{loss} loss" if row == 0 else None)
            ax.set_xticks(range(1, len(norms) + 1), norms, rotation=45, ha="right")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"final weights over {n_inits} initializations (boxes 25-75%, whiskers 10-90%)")
    save(fig, args, "normalizations.png")
    return finish(
        args,
        {
            "n_inits": n_inits,
            "steps_logistic": steps_logistic,
            "steps_square": steps_square,
            "results": numbers,
        },
    )


if __name__ == "__main__":
    main(sys.argv[1:])
