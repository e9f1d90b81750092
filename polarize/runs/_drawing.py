"""A finished sweep's figures, drawn from its folder: in this process, or in a second
Python that loaded matplotlib while this one started JAX and solved.

Plain Python and numpy, no JAX (a figure process imports only this, the figures and the
folder's config). The `polarize sweep` command starts a `FigureProcess` before it
imports JAX: on a machine with a second core, matplotlib's import (about 0.25 s) and
its first figure's fonts then cost a warm default sweep nothing, and the main process
never loads matplotlib. The figures are the same either way: the same functions read
the same stored arrays (per_init.npz, series.npz). Where the figure process cannot
draw (it failed to start, or died), the figures are drawn here instead, so a figure
that cannot be drawn fails here, with its own error.
"""

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..core._choices import cpu_threads
from ..figures._pyplot import pyplot
from ..figures._sweep import figure_list, sweep_figures
from ._folder import stored_config


class FigureArrays(Mapping):
    """A finished sweep's arrays (the keys of `load_arrays`) for the figures, each read
    from per_init.npz or series.npz at access and not kept: only the arrays a figure
    is drawing are in memory."""

    def __init__(self, out: Path):
        self._per_init, self._series = Path(out) / "per_init.npz", Path(out) / "series.npz"
        with np.load(self._per_init, allow_pickle=False) as a, np.load(self._series, allow_pickle=False) as b:
            self._where = {k: (self._per_init, k) for k in a.files}
            self._where["snap_ts"] = (self._series, "ts")
            self._where.update({"series_" + k.removeprefix("snap_"): (self._series, k) for k in b.files})

    def __getitem__(self, key):
        path, name = self._where[key]
        with np.load(path, allow_pickle=False) as z:
            return z[name]

    def __iter__(self):
        return iter(self._where)

    def __len__(self):
        return len(self._where)


def draw_here(config, out: Path, only=None) -> list[Path]:
    """Every figure of the finished sweep in `out` (or those named in `only`), drawn in
    this process."""
    return sweep_figures(FigureArrays(out), config, Path(out), only)


def draw_in_two(config, out: Path) -> list[Path]:
    """`draw_here`, every other figure drawn by a fork of this process on another core
    (where there is one, and `os.fork`): a default sweep's four figures in 0.18 s instead
    of 0.3 s. The fork's figures that are not drawn when it ends (it failed) are drawn
    here, so a figure that cannot be drawn fails here with its own error."""
    names = [name for _, name in figure_list(config)]
    if not hasattr(os, "fork") or cpu_threads() < 2 or len(names) < 2:
        return draw_here(config, out)
    theirs = names[0::2]
    pid = os.fork()  # this process runs no other thread: nothing is held across the fork
    if pid == 0:
        try:
            draw_here(config, out, theirs)
            code = 0
        except BaseException:  # noqa: BLE001 - the parent draws them again, with the error
            code = 1
        os._exit(code)
    try:
        draw_here(config, out, names[1::2])
    finally:
        _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        draw_here(config, out, theirs)
    return [Path(out) / name for name in names]


class FigureProcess:
    """A second Python, started now, that loads matplotlib and then waits to draw one
    sweep folder's figures (`draw`). If it is never asked (an error, an interrupt), it
    ends when this process closes it or ends itself (its input reaches end of file)."""

    def __init__(self):
        root = str(Path(__file__).resolve().parents[2])  # this polarize, whatever sys.path says
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        except OSError:
            self._proc = None

    def draw(self, config, out: Path) -> list[Path]:
        """The figures of the finished sweep in `out` (whose config is `config`), drawn by
        the figure process; by this one where that process cannot draw them."""
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                stdout, _ = proc.communicate(json.dumps({"sweep": str(out)}) + "\n")
                if proc.returncode == 0:
                    return [Path(p) for p in json.loads(stdout.splitlines()[-1])["paths"]]
            except (OSError, ValueError, KeyError, IndexError):
                pass
        return draw_here(config, out)

    def close(self) -> None:
        """Ends the figure process if it was not asked to draw."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.communicate("", timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def _serve() -> int:
    """The figure process: matplotlib and a first figure's fonts loaded while the sweep
    runs, then the figures of the folder named on stdin (nothing if stdin just ends)."""
    plt = pyplot()
    fig = plt.figure(figsize=(1, 1))
    fig.text(0.5, 0.5, "10\u207b\u00b3")
    fig.canvas.draw()
    plt.close(fig)
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    out = Path(json.loads(line)["sweep"])
    paths = draw_in_two(stored_config(out), out)
    print(json.dumps({"paths": [str(p) for p in paths]}))
    return 0


if __name__ == "__main__":
    try:
        code = _serve()
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - said on stderr; the sweep's process draws instead
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # without Python's teardown of matplotlib (the sweep waits for this exit)
