"""A run folder: what started it (config.json, with package versions) and how it is (re)opened."""

import dataclasses
import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..core._errors import PolarizeError
from ._config import SweepConfig
from ._storage import read_json


def package_versions() -> dict:
    out = {}
    for name in ("polarize", "jax", "jaxlib", "equinox", "diffrax", "optax", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def prepare_out(out: Path, overwrite: bool) -> Path:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PolarizeError(f"`--out` {out} exists and is not a folder")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise PolarizeError(
            f"`--out` {out} is not empty; pass --resume {out} to continue it, "
            "--overwrite to replace it, or choose another folder"
        )
    if out.exists() and overwrite:
        for child in out.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return out


def stored_config(out) -> SweepConfig:
    """The config a run folder was started with (refuses a folder that is not a sweep)."""
    path = Path(out) / "config.json"
    if not path.exists():
        raise PolarizeError(f"`--resume` {out} has no config.json: not a polarize sweep folder")
    return SweepConfig.from_dict(read_json(path)["sweep"])


#: Settings that `SweepConfig.resolved` sets by backend where they are None.
SIZED = ("chunk_size", "block_size")


def resumed_config(config: SweepConfig, out) -> SweepConfig:
    """`config` with the sizes it leaves at None (`SIZED`) taken from the run in `out`,
    the rest resolved: a run resumed on another backend keeps its blocks."""
    stored = stored_config(out)
    return dataclasses.replace(
        config, **{k: getattr(config, k) or getattr(stored, k) for k in SIZED}
    ).resolved()


def check_same(stored: SweepConfig, requested: SweepConfig, out) -> None:
    """Refuse to resume `out` with a config other than the one it was started with."""
    a, b = stored.to_dict(), requested.to_dict()
    diff = [f"{k}={a[k]!r} (requested {b[k]!r})" for k in a if a[k] != b[k]]
    if diff:
        raise PolarizeError(
            f"`--resume` {out} was run with a different config: {', '.join(diff)}; "
            "resume with the stored settings or start a new --out"
        )


def folder_kind(folder) -> str:
    """ "study" or "sweep", by the file that marks the folder, or a `PolarizeError`."""
    folder = Path(folder)
    if (folder / "study.json").exists():
        return "study"
    if (folder / "config.json").exists():
        return "sweep"
    raise PolarizeError(f"`dir` {folder} is neither a sweep folder (config.json) nor a study (study.json)")
