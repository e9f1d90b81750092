"""A finished sweep's figures, drawn from its folder: in this process, or in a second
Python that loaded matplotlib while this one started JAX and solved.

Plain Python and numpy, no JAX (a figure process imports only this, the figures and the
folder's config). The `polarize sweep` command starts a `FigureProcess` before it
imports JAX: on a machine with a second core, matplotlib's import (about 0.25 s) and
its first figure's fonts then cost a warm default sweep nothing, and the main process
never loads matplotlib. The figures are the same either way: the same functions read
the same stored arrays (per_init.npz, series.npz). Where the figure process cannot
draw (it failed to start, or died), the figures are drawn here instead, so a figure
that cannot be drawn fails here, with its own error. `polarize study` starts one too:
it writes the study's table and comparison figure (`_study_output`) once the cells are
done, with pandas loaded while they ran.
"""

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

from ..core._choices import cpu_threads
from ..figures._pyplot import pyplot
from ..figures._sweep import figure_list, sweep_figures
from ._folder import stored_config
from ._storage import FigureArrays, read_json
from ._study_file import Study
from ._study_output import finish_study


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
    sweep folder's figures (`draw`), or to write one study's table and figure
    (`finish_study`; `study=True` loads pandas for its table too). If it is never asked
    (an error, an interrupt), it ends when this process closes it or ends itself (its
    input reaches end of file)."""

    def __init__(self, *, study: bool = False):
        root = str(Path(__file__).resolve().parents[2])  # this polarize, whatever sys.path says
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, *(["--study"] if study else [])],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        except OSError:
            self._proc = None

    def _ask(self, request: dict) -> list[Path] | None:
        """The paths the figure process wrote for `request`, or None where it could not."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        try:
            stdout, _ = proc.communicate(json.dumps(request) + "\n")
            if proc.returncode == 0:
                return [Path(p) for p in json.loads(stdout.splitlines()[-1])["paths"]]
        except (OSError, ValueError, KeyError, IndexError):
            pass
        return None

    def draw(self, config, out: Path) -> list[Path]:
        """The figures of the finished sweep in `out` (whose config is `config`), drawn by
        the figure process; by this one where that process cannot draw them."""
        paths = self._ask({"sweep": str(out)})
        return draw_here(config, out) if paths is None else paths

    def finish_study(self, study: Study, out: Path, failed: dict) -> list[Path]:
        """study.csv and comparison.png of the study in `out` (`_study_output.finish_study`),
        written by the figure process; by this one where that process cannot."""
        paths = self._ask({"study": str(out), "failed": failed})
        return finish_study(study, out, failed) if paths is None else paths

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


def _serve(study: bool) -> int:
    """The figure process: matplotlib and a first figure's fonts loaded while the sweep
    runs (and pandas, for a study's table), then the figures of the folder named on
    stdin (nothing if stdin just ends)."""
    plt = pyplot()
    fig = plt.figure(figsize=(1, 1))
    fig.text(0.5, 0.5, "10\u207b\u00b3")
    fig.canvas.draw()
    plt.close(fig)
    if study:
        import pandas  # noqa: F401 - loaded now, while the study's cells run

    line = sys.stdin.readline()
    if not line.strip():
        return 0
    request = json.loads(line)
    if "study" in request:
        out = Path(request["study"])
        paths = finish_study(Study.from_dict(read_json(out / "study.json")), out, request["failed"])
    else:
        out = Path(request["sweep"])
        paths = draw_in_two(stored_config(out), out)
    print(json.dumps({"paths": [str(p) for p in paths]}))
    return 0


if __name__ == "__main__":
    try:
        code = _serve(study="--study" in sys.argv[1:])
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - said on stderr; the sweep's process draws instead
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # without Python's teardown of matplotlib (the sweep waits for this exit)
