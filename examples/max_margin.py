"""Prompt attention f_i = v^T X_i^T softmax(X_i p) converges in direction to an attention SVM.

Tarzanagh, Li, Thrampoulidis and Oymak (NeurIPS 2023) prove, for p trained with v fixed:
|p| -> infinity, p / |p| -> the hard-margin SVM of the tokens it selects (locally optimal
ones: every support token scores below the selected one, score = y_i v^T x_{i,t}), and the
global SVM of the best-score tokens only from suitable starts. Here the exact flow (log
clock, to t = 1e12) checks each over an ensemble of initializations p(0) ~ scale N(0, I):
1 - cos(p, p_mm) against t, |p| against log t (slope -> |p_mm|), the share of
initializations whose selection is the best-score one against the init scale and the
number of samples n, whether every selection reached is locally optimal, the paper's
winner and order statistics applied to the scores X_i p, and for joint training of (v, p)
the alignment of v with the value SVM.

    python examples/max_margin.py [--small] [--out DIR] [--seed S]
"""

import sys

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import band, finish, parse, plt, save, table  # noqa: E402

import polarize as pz  # noqa: E402

TOKENS, DIM = 5, 6


def locally_optimal(X, y, v, selected, direction) -> bool:
    """Tarzanagh et al.'s definition: every support token t of the selection's SVM (an
    active constraint (x_{i,sel} - x_{i,t})^T p_mm = 1) scores below the selected one."""
    scores = y[:, None] * (X @ v)
    for i, s in enumerate(selected):
        gaps = (X[i, s] - X[i]) @ direction
        support = [t for t in range(X.shape[1]) if t != s and gaps[t] < 1 + 1e-6]
        if any(scores[i, t] >= scores[i, s] for t in support):
            return False
    return True


def order_kept(scores) -> np.ndarray:
    """(inits,) share of samples whose token order by score X_i p(t) never changes over the saved times."""
    ranks = np.argsort(np.argsort(scores, axis=-1), axis=-1)  # (inits, times, samples, tokens)
    return np.mean(np.all(ranks == ranks[:, :1], axis=(1, 3)), axis=-1)


def ensemble(args, X, y, v, n_inits, t1, n_save):
    """The p-flow (v fixed) of n_inits initializations, p(0) ~ 0.3 N(0, I), and its statistics."""
    model = pz.init_prompts(args.seed, n_inits, X, v, p_scale=0.3)
    objective = pz.LogisticLabels(y)
    traj = pz.flow(model, objective, t1=t1, n_save=n_save)
    return model, traj, pz.token_selection(traj, model, objective)


def share_study(args, scales, sample_counts, n_tasks, n_inits, t1):
    """Per n: the share of initializations selecting the best-score tokens at each init
    scale, over the first n_tasks random tasks whose best-score tokens are separable (all
    scales of one task in one flow); the others are counted, not flowed."""
    out = {}
    for n in sample_counts:
        shares, infeasible, task = [], 0, 0
        while len(shares) < n_tasks and task < 50 * n_tasks:
            X, y, v = pz.prompt_task(1000 * n + task + args.seed, n, TOKENS, DIM)
            task += 1
            best = pz.best_tokens(X, y, v)
            if not pz.attention_svm(X, best[None]).feasible[0]:
                infeasible += 1  # no direction selects the best tokens: the share is 0 by force
                continue
            models = [pz.init_prompts(args.seed + 1, n_inits, X, v, p_scale=s) for s in scales]
            model = pz.PromptAttention(
                np.concatenate([m.v for m in models]), np.concatenate([m.p for m in models]), X
            )
            traj = pz.flow(model, pz.LogisticLabels(y), t1=t1, n_save=3)
            ok = np.asarray(traj.ok).reshape(len(scales), n_inits)
            selected = np.argmax(np.asarray(traj.weights)[:, -1], axis=-1).reshape(len(scales), n_inits, n)
            hit = np.all(selected == np.asarray(best), axis=-1)
            shares.append([float(np.mean(hit[k][ok[k]])) for k in range(len(scales))])
        shares = np.array(shares)
        out[n] = {
            "tasks_with_feasible_best": len(shares),
            "tasks_best_infeasible": infeasible,
            "fraction_tasks_best_infeasible": infeasible / task,
            "mean_share_best": {f"{s:g}": float(np.mean(shares[:, k])) for k, s in enumerate(scales)},
            "tasks_share_best_ge_half": {
                f"{s:g}": float(np.mean(shares[:, k] >= 0.5)) for k, s in enumerate(scales)
            },
        }
    return out


def joint(args, X, y, v, n_inits, t1):
    """(v, p) trained jointly from v(0) ~ 0.1 N(0, I): cos(v, value SVM) and cos(p, attention SVM)."""
    model = pz.init_prompts(args.seed, n_inits, X, v, p_scale=0.3, v_scale=0.1, train="vp")
    objective = pz.LogisticLabels(y)
    traj = pz.flow(model, objective, t1=t1, n_save=9)
    return pz.token_selection(traj, model, objective), traj


def main(argv=None) -> dict:
    args = parse("max_margin", __doc__.splitlines()[0], argv)
    if args.small:
        scales = (0.1, 1.0)
        n_inits, n_save, counts, n_tasks, n_share = 32, 13, (4,), 2, 16
    else:
        scales = (0.03, 0.1, 0.3, 1.0, 3.0)
        n_inits, n_save, counts, n_tasks, n_share = 1000, 49, (2, 4, 8), 24, 64
    t1 = 1e12
    X, y, v = pz.prompt_task(args.seed + 1, 4, TOKENS, DIM)  # the task of issue 29's probe: n = 4
    Xn, yn, vn = (np.asarray(a) for a in (X, y, v))
    model, traj, sel = ensemble(args, X, y, v, n_inits, t1, n_save)
    ok = np.asarray(traj.ok)
    ts = np.asarray(traj.ts)
    kinds, which, counts_sel = np.unique(sel.selected[ok], axis=0, return_inverse=True, return_counts=True)
    which = which.reshape(-1)
    best = sel.best[0]
    local = [locally_optimal(Xn, yn, vn, k, pz.attention_svm(Xn, k).direction) for k in kinds]
    scores = np.einsum("ntd,ksd->ksnt", Xn, np.asarray(traj.p)[ok])  # (inits, times, samples, tokens)
    first_argmax = np.argmax(scores[:, 0], axis=-1) == sel.selected[ok]  # (inits, samples)
    kept = order_kept(scores)
    joint_sel, joint_traj = joint(args, X, y, v, max(16, n_inits // 4), t1)
    study = share_study(args, scales, counts, n_tasks, n_share, 1e10)

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), constrained_layout=True)
    keep = ts >= 1.0
    for k, kind in enumerate(kinds):
        mine = which == k
        tag = ", best-score" if np.all(kind == best) else ""
        label = f"selection {kind.tolist()} ({mine.sum()} inits{tag})"
        band(axes[0], ts[keep], np.maximum(1 - sel.cos_selected[ok][mine][:, keep], 1e-16), label=label)
    axes[0].set(xscale="log", yscale="log", xlabel="t", ylabel="1 - cos(p, p_mm of its selection)")
    axes[0].set_title("directional convergence (median, 10-90%)")
    norm = sel.norm[ok]
    for k, kind in enumerate(kinds):
        mine = which == k
        line = band(axes[1], ts[keep], norm[mine][:, keep], label=f"|p(t)|, {kind.tolist()}")
        p_mm, end = float(sel.svm_norm[ok][mine][0]), float(np.median(norm[mine][:, -1]))
        slope = end + p_mm * (np.log(ts[keep]) - np.log(t1))
        axes[1].plot(ts[keep], slope, ls=":", color=line.get_color(), label=f"slope |p_mm| = {p_mm:.3f}")
    axes[1].set(xscale="log", xlabel="t", ylabel="|p|", title="|p| grows like |p_mm| log t (median, 10-90%)")
    for n, row in study.items():
        shares = list(row["mean_share_best"].values())
        axes[2].plot(scales, shares, marker="o", label=f"n = {n} ({row['tasks_with_feasible_best']} tasks)")
    axes[2].set(xscale="log", xlabel="init scale of p(0)", ylabel="share selecting the best-score tokens")
    axes[2].set(ylim=(-0.02, 1.02), title="global max-margin: share of inits (t = 1e10)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save(fig, args, "max_margin.png")

    rows = []
    for t in (1e2, 1e4, 1e6, 1e8, 1e10, 1e12):
        k = int(np.argmin(np.abs(np.log(ts[keep]) - np.log(t))))
        k = np.nonzero(keep)[0][k]
        rows.append(
            [
                f"{ts[k]:.3g}",
                float(np.median(norm[:, k])),
                float(np.median(1 - sel.cos_selected[ok][:, k])),
                float(np.max(1 - sel.cos_selected[ok][:, k])),
            ]
        )
    table(["t", "median |p|", "median 1 - cos", "max 1 - cos"], rows)
    print(
        f"selections: {[(kind.tolist(), int(c)) for kind, c in zip(kinds, counts_sel, strict=True)]}; "
        f"best-score {best.tolist()}; locally optimal: {local}; failed: {int((~ok).sum())}"
    )
    print(f"log-t slope / |p_mm|: median {np.median(sel.log_slope[ok] / sel.svm_norm[ok]):.4f}")
    print(
        f"selected = argmax of the scores at t = 0: {np.mean(first_argmax):.3f} of samples; "
        f"score order kept over time: {np.mean(kept):.3f} of samples"
    )
    jv, jp = joint_sel.cos_value[:, -1], joint_sel.cos_selected[:, -1]
    print(f"joint (v, p): median cos(v, value SVM) {np.median(jv):.4f}, cos(p, its SVM) {np.median(jp):.4f}")
    for n, row in study.items():
        print(f"n = {n}: share selecting the best-score tokens by init scale {row['mean_share_best']}")
    return finish(
        args,
        {
            "n_inits": n_inits,
            "t1": t1,
            "n_failed": int((~ok).sum()),
            "selections": {str(kind.tolist()): int(c) for kind, c in zip(kinds, counts_sel, strict=True)},
            "best_score_selection": best.tolist(),
            "share_best": float(np.mean(sel.all_best[ok])),
            "all_selections_locally_optimal": bool(all(local)),
            "min_cos_selected_t1": float(np.min(sel.cos_selected[ok][:, -1])),
            "median_one_minus_cos": {f"{r[0]}": r[2] for r in rows},
            "median_norm": {f"{r[0]}": r[1] for r in rows},
            "median_slope_over_svm_norm": float(np.median(sel.log_slope[ok] / sel.svm_norm[ok])),
            "winner_is_initial_argmax_fraction": float(np.mean(first_argmax)),
            "score_order_kept_fraction": float(np.mean(kept)),
            "joint_median_cos_value": float(np.median(jv)),
            "joint_median_cos_p": float(np.median(jp)),
            "joint_failed": int((~np.asarray(joint_traj.ok)).sum()),
            "share_study": {str(n): row for n, row in study.items()},
        },
    )


if __name__ == "__main__":
    main(sys.argv[1:])
