"""A study file: the TOML grid of sweeps, read and validated without JAX.

`polarize study FILE` checks the file (sections, settings, plot keys, statistics) before JAX is
imported; a cell's invalid value fails that cell only, when the study runs (`_study`).
"""

import dataclasses
import itertools
import re
import tomllib
from pathlib import Path

from ..core._choices import FRACTIONS, PER_INIT, PROMPT_FRACTIONS, PROMPT_PER_INIT
from ..core._errors import PolarizeError
from ._config import SweepConfig


@dataclasses.dataclass(frozen=True)
class Study:
    name: str
    base: dict
    grid: dict
    x: str | None = None
    y: tuple[str, ...] = ("max_weight",)

    def settings(self) -> list[tuple[str, dict]]:
        """(cell name, its settings) for every combination of the grid, in file order."""
        keys = list(self.grid)
        out = []
        for values in itertools.product(*(self.grid[k] for k in keys)):
            setting = dict(zip(keys, values, strict=True))
            name = "__".join(f"{k}={v}" for k, v in setting.items()) or "base"
            out.append((re.sub(r"[^A-Za-z0-9_.=+-]", "_", name), {**self.base, **setting}))
        return out

    def cells(self) -> list[tuple[str, SweepConfig | PolarizeError]]:
        """(cell name, config) per cell; the error instead where a cell's settings are invalid."""
        out = []
        for name, setting in self.settings():
            try:
                out.append((name, SweepConfig(**setting)))
            except PolarizeError as e:
                out.append((name, e))
        return out

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "y": list(self.y)}

    @classmethod
    def from_dict(cls, spec: dict) -> "Study":
        """The study of `to_dict` (a study folder's study.json)."""
        return cls(**{**spec, "y": tuple(spec.get("y", ("max_weight",)))})


def statistic_names(config: SweepConfig) -> list[str]:
    """The statistics a study can plot for cells with this config."""
    times = config.time_names()
    reached = [f"fraction_reached_{n.removeprefix('time_to_')}" for n in times]
    if config.model == "prompt":
        return [*PROMPT_PER_INIT, *times, *PROMPT_FRACTIONS, *reached]
    return [*PER_INIT, *times, *FRACTIONS, *reached]


def _check_base(path: Path, base: dict) -> None:
    """A bad [base] value fails every cell: refused with the file, before anything runs."""
    try:
        SweepConfig(**base)
    except PolarizeError as e:
        raise PolarizeError(f"study file {path}: [base] {e}") from None


def load_study(path) -> Study:
    """Read and validate a study file (a cell's invalid value fails that cell only, at run time)."""
    path = Path(path)
    if not path.exists():
        raise PolarizeError(f"study file {path} does not exist")
    if path.is_dir():
        raise PolarizeError(f"study file {path} is a folder; give a .toml file")
    try:
        spec = tomllib.loads(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise PolarizeError(f"study file {path} cannot be read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise PolarizeError(f"study file {path} is not UTF-8 text; give a TOML file") from None
    except tomllib.TOMLDecodeError as e:
        raise PolarizeError(f"study file {path} is not valid TOML: {e}") from None
    if not spec.get("base") and not spec.get("grid"):
        raise PolarizeError(f"study file {path} has no [base] or [grid] settings: nothing to run")
    unknown = sorted(set(spec) - {"name", "base", "grid", "plot"})
    if unknown:
        raise PolarizeError(f"study file {path}: unknown section(s) {unknown}; valid: name, base, grid, plot")
    valid = {f.name for f in dataclasses.fields(SweepConfig)}
    base, grid, plot = spec.get("base", {}), spec.get("grid", {}), spec.get("plot", {})
    for section, keys in (("base", base), ("grid", grid), ("plot", plot)):
        if not isinstance(keys, dict):
            raise PolarizeError(f"study file {path}: [{section}] must be a table of settings")
    for section, keys in (("base", base), ("grid", grid)):
        bad = sorted(set(keys) - valid)
        if bad:
            raise PolarizeError(
                f"study file {path}: unknown setting(s) {bad} in [{section}]; valid: {sorted(valid)}"
            )
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise PolarizeError(f"study file {path}: [grid] {key} must be a non-empty list")
    bad = sorted(set(plot) - {"x", "y"})
    if bad:
        raise PolarizeError(f"study file {path}: unknown [plot] key(s) {bad}; valid: x, y")
    x = plot.get("x")
    if x is not None and x not in grid:
        raise PolarizeError(f"study file {path}: [plot] x = {x!r} must be one of the grid keys {list(grid)}")
    y = plot.get("y", "max_weight")
    y = tuple([y] if isinstance(y, str) else y)
    name = spec.get("name", path.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+= -]*", name):
        raise PolarizeError(
            f"study file {path}: name = {name!r} must be a plain folder name "
            "(letters, digits, spaces, _ . + = -; no / and no leading dot)"
        )
    _check_base(path, base)
    study = Study(name, base, grid, x, y)
    configs = [c for _, c in study.cells() if isinstance(c, SweepConfig)]
    if configs:
        names = statistic_names(configs[0])
        for stat in y:
            if stat not in names and stat.removeprefix("median_") not in names:
                raise PolarizeError(
                    f"study file {path}: [plot] y = {stat!r} is not a statistic; valid: {', '.join(names)}"
                )
    return study
