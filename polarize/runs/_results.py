"""A sweep's results: assembled from its chunks, read back as a `Run`, shown as tables.

Files of a finished run folder (besides config.json and chunks/):

    summary.json   ensemble numbers (`polarize.measure.aggregate`); null = undefined
                   or never reached (see the `fraction_reached_*` next to it)
    per_init.npz   one value per initialization: final_*, time_to_*, rate_*, ok, status
                   (model prompt: also the token selection, final_selected (inits, samples), ...)
    series.npz     max weight and entropy (model prompt: and cos(p, p_mm)) at the snapshot
                   times (float32), with `ts`
    sample.npz     full trajectories of the first `--sample` initializations
    *.png          figures (`polarize.figures`)

`polarize.load(DIR)` returns a `Run` (or a `StudyResult` for a study folder);
`Run.frame()` is the pandas table with one row per initialization.
"""

import dataclasses
import shutil
import tempfile
from pathlib import Path

import numpy as np

from ..core import status
from ..core._errors import PolarizeError
from ..figures._sweep import sweep_figures
from ..measure._selection import aggregate_selection
from ..measure._statistics import aggregate
from ._config import SweepConfig
from ._folder import stored_config
from ._storage import FigureArrays, read_json, read_npz, write_json, write_npz, write_npz_streamed


def summary_of(config: SweepConfig, arrays: dict) -> dict:
    """summary.json content from the per-initialization arrays of a whole sweep."""
    final = {k.removeprefix("final_"): v for k, v in arrays.items() if k.startswith("final_")}
    final.update({k: v for k, v in arrays.items() if k.startswith(("time_to_", "rate_"))})
    final["ok"], final["status"] = arrays["ok"], arrays["status"]
    summary = aggregate(final, config.threshold)
    if config.model == "prompt":
        summary.update(aggregate_selection(final))
    return summary


class Gather:
    """A sweep's per-initialization arrays, gathered chunk by chunk as they are finished.

    Each array goes to a raw file in `folder` at its rows' offset, in any chunk order, so
    the sweep's memory does not grow with it and `assemble` does not read back (and
    re-hash) the chunks this process has just written. `done` holds the chunks gathered.
    """

    def __init__(self, inits: int, folder):
        self.inits, self.folder, self.done, self.layout = inits, Path(folder), set(), None

    def add(self, i: int, start: int, part: dict) -> None:
        if self.layout is None:  # every chunk has the same arrays: the first fixes the files
            names = [k for k in part if k not in ("start", "stop")]
            self.layout = {k: (part[k].shape[1:], part[k].dtype) for k in names}
            for k in names:
                with open(self.folder / k, "wb") as f:
                    f.truncate(self.inits * self._row(k))
        for k, (_, dtype) in self.layout.items():
            with open(self.folder / k, "r+b") as f:
                f.seek(start * self._row(k))
                f.write(np.ascontiguousarray(part[k], dtype=dtype).tobytes())
        self.done.add(i)

    def _row(self, k: str) -> int:
        shape, dtype = self.layout[k]
        return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize

    def raw(self, k: str) -> tuple:
        """(file, shape, dtype) of array `k` for `write_npz_streamed`."""
        shape, dtype = self.layout[k]
        return self.folder / k, (self.inits,) + shape, dtype

    def array(self, k: str) -> np.ndarray:
        shape, dtype = self.layout[k]
        return np.fromfile(self.folder / k, dtype=dtype).reshape((self.inits,) + shape)


def gathering(out: Path):
    """A temporary folder for a `Gather` inside `out` (removed on exit), after removing
    any left there by a run that was killed."""
    for stale in Path(out).glob(".assemble-*"):
        shutil.rmtree(stale, ignore_errors=True)
    return tempfile.TemporaryDirectory(dir=out, prefix=".assemble-")


def assemble(
    config: SweepConfig,
    out: Path,
    gather: Gather,
    *,
    wall: float,
    sample: dict | None,
    figures: bool = True,
    recomputed: dict | None = None,
) -> dict:
    """per_init.npz, series.npz, sample.npz and summary.json from a complete `gather`, then the figures.

    Nothing is computed here: `gather` holds every chunk of the sweep (the runner has
    read or computed those it did not gather itself), and `sample` the trajectories of
    sample.npz (None: none kept). The snapshot series (most of the bytes) are streamed
    from their raw files into series.npz, so they are never whole in memory; the figures
    then read one series at a time. Figures that cannot be drawn (no finished
    initialization) are drawn empty with a note, never a crash; `figures=False` draws
    none (a study's cells: `polarize report` draws them later). `recomputed` (chunk
    file -> why its stored copy was not used) goes to summary.json as it is.
    """
    n_chunks = -(-config.inits // config.chunk_size)
    if len(gather.done) != n_chunks:
        raise PolarizeError(f"cannot assemble {out}: {len(gather.done)} of {n_chunks} chunks were gathered")
    arrays = {k: gather.array(k) for k in gather.layout if not k.startswith("snap_")}
    summary = summary_of(config, arrays)
    summary["wall_seconds"] = round(wall, 3)
    summary["recomputed_chunks"] = dict(recomputed or {})
    write_npz(out / "per_init.npz", arrays)
    ts = config.times()[config.snapshot_index()]
    raw = {k: gather.raw(k) for k in gather.layout if k.startswith("snap_")}
    write_npz_streamed(out / "series.npz", {"ts": ts, "ok": arrays["ok"]}, raw)
    if sample is not None:
        write_npz(out / "sample.npz", sample)
    del arrays
    write_json(out / "summary.json", summary)
    if figures:  # drawn from the files just written, as `polarize report` draws them
        sweep_figures(FigureArrays(out), config, out)
    return summary


def load_arrays(out) -> dict:
    """Per-initialization arrays of a finished sweep folder (snapshots as `series_*`)."""
    out = Path(out)
    arrays, snaps = (_stored_arrays(out, name) for name in ("per_init.npz", "series.npz"))
    arrays["snap_ts"] = snaps["ts"]
    arrays.update({"series_" + k.removeprefix("snap_"): v for k, v in snaps.items() if k.startswith("snap_")})
    return arrays


def _stored_arrays(out: Path, name: str) -> dict:
    """A finished sweep's array file, or one line saying what is wrong with it."""
    if not (out / name).is_file():
        raise PolarizeError(f"`dir` {out} has no {name}: the sweep's assembly did not finish; resume it")
    try:
        return read_npz(out / name)
    except ValueError:
        raise PolarizeError(
            f"`dir` {out}: {name} is damaged; resume the sweep to assemble it again"
        ) from None


@dataclasses.dataclass(frozen=True)
class Run:
    """A finished sweep folder, read without recomputing anything.

    `config`: its `SweepConfig`. `summary`: summary.json. `arrays`: per-initialization
    arrays (`final_*`, `time_to_*`, `rate_*`, `ok`, `status`, `series_*` at `snap_ts`).
    `sample`: full trajectories of the first inits, when kept.
    """

    folder: Path
    config: SweepConfig
    summary: dict
    arrays: dict
    sample: dict | None = None

    def frame(self):
        """One row per initialization: `init`, every final statistic, hitting time and rate,
        `ok`, `status` and `status_name`, then the config's settings as columns. A prompt
        sweep's `final_selected` and `final_best` (one token per sample) are one column
        each of strings "2-0-4-1" (sample 0 first; None where the init failed), so that
        `frame.groupby("final_selected")` groups the initializations by selection."""
        import pandas as pd

        n = self.config.inits
        columns = {"init": np.arange(n)}
        columns.update({k: v for k, v in self.arrays.items() if np.shape(v)[:1] == (n,) and np.ndim(v) == 1})
        for k in ("final_selected", "final_best"):
            if k in self.arrays:
                columns[k] = [None if min(t) < 0 else "-".join(map(str, t)) for t in self.arrays[k].tolist()]
        columns["ok"] = np.asarray(columns["ok"], bool)
        frame = pd.DataFrame(columns)
        frame["status_name"] = pd.Categorical([status.name(c) for c in frame["status"]])
        for key, value in self.config.to_dict().items():
            frame[key] = ",".join(f"{x:g}" for x in value) if key == "levels" else value
        return frame

    def series(self):
        """Long format: one row per initialization and snapshot time (`init`, `time`,
        `max_weight`, `entropy`, for a prompt sweep `cos_selected`, then `ok`)."""
        import pandas as pd

        n, k = self.arrays["series_max_weight"].shape
        columns = {"init": np.repeat(np.arange(n), k), "time": np.tile(self.arrays["snap_ts"], n)}
        for name in ("max_weight", "entropy", "cos_selected"):
            if f"series_{name}" in self.arrays:
                columns[name] = self.arrays[f"series_{name}"].reshape(-1)
        columns["ok"] = np.repeat(np.asarray(self.arrays["ok"], bool), k)
        return pd.DataFrame(columns)


def load_run(out) -> "Run":
    """A finished sweep folder as a `Run`, read without recomputing anything."""
    out = Path(out)
    if not (out / "config.json").exists():
        raise PolarizeError(
            f"`dir` {out} is not a polarize run: it holds neither config.json (a sweep) "
            "nor study.json (a study)"
        )
    if not (out / "summary.json").exists():
        raise PolarizeError(f"`dir` {out} holds an unfinished sweep (no summary.json); resume it first")
    sample = read_npz(out / "sample.npz") if (out / "sample.npz").exists() else None
    config = stored_config(out, "dir")
    return Run(out, config, read_json(out / "summary.json"), load_arrays(out), sample)


def failed_too_many(summary: dict) -> bool:
    """More than half of the initializations failed."""
    return summary["n_failed"] * 2 > summary["n_inits"]


def failure_line(summary: dict) -> str | None:
    """One line with the failed initializations by reason, and the hint for the commonest."""
    failed = {k.removeprefix("failed_"): v for k, v in summary.items() if k.startswith("failed_") and v}
    if not failed:
        return None
    reasons = ", ".join(f"{name}: {k}" for name, k in failed.items())
    worst = max(failed, key=failed.get)
    codes = {v: k for k, v in status.NAMES.items()}
    hint = status.HINTS.get(codes.get(worst), "")
    total = summary["n_failed"]
    return f"failed {total} of {summary['n_inits']} inits ({reasons})" + (f"; hint: {hint}" if hint else "")


def result_line(config: SweepConfig, summary: dict) -> str:
    """The one line the CLI prints."""

    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    def num(x):
        return "n/a" if x is None else f"{x:.3g}"

    level = 0.9 if 0.9 in config.levels else config.levels[-1]
    unmeasured = summary.get("order_not_measurable") or 0
    # where no logit moved by more than atol, the order is not measured (`order_statistics`)
    unmeasured = f" ({unmeasured} with logits that never moved > atol: not measurable)" if unmeasured else ""
    horizon = f"t={config.t1:.3g}" if config.method == "flow" else f"{config.steps} steps lr={config.lr:g}"
    if config.model == "prompt":
        model = f"prompt ({config.train}) {config.norm}/{config.objective}"
        own = (
            f"global selection {pct(summary['share_global_selection'])}, "
            f"{summary['n_selections']} selections, "
            f"median 1-cos(p, p_mm) {num(summary['median_one_minus_cos_selected'])}"
        )
    else:
        model = f"{config.norm}/{config.objective}"
        own = (
            f"order preserved {pct(summary['order_preserved_fraction'])}, "
            f"winner=argmax u0 {pct(summary['winner_is_argmax_u0_fraction'])}{unmeasured}"
        )
    return (
        f"{model} {config.method} to {horizon}: "
        f"{summary['n_inits']} inits, {summary['n_failed']} failed | "
        f"median t({level:g}) {num(summary.get(f'median_time_to_{level:g}'))} "
        f"(reached {pct(summary.get(f'fraction_reached_{level:g}'))}), "
        f"one-hot(>={config.threshold:g}) {pct(summary['one_hot_fraction'])}, "
        f"median max weight {num(summary['median_max_weight'])}, "
        f"median entropy {num(summary['median_entropy'])}, {own} "
        f"[{summary.get('wall_seconds', float('nan')):.1f} s]"
    )
