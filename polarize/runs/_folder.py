"""A run folder: what it is, who writes it, what started it, and how it is (re)opened.

A run folder is a sweep (config.json with a "sweep" key), a study (study.json) or a
transformer-lab run (config.json with a "task" key); `folder_kind` tells which. While a
process writes one it holds an exclusive lock on the folder's `.lock` file (`.lock-p<k>`
for process k of several), so a second writer stops with one line naming the holder.
`--overwrite` deletes only the files polarize writes in a folder of the same kind, and
refuses a folder that holds anything else. The chunks of a sweep carry the hash of the
settings that determine their numbers (`settings_hash`): a resumed run refuses chunks
computed with other settings.

No JAX here: the CLI checks folders before JAX is loaded.
"""

import dataclasses
import fcntl
import fnmatch
import hashlib
import json
import os
import shutil
import socket
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..core._errors import PolarizeError
from ._config import LATER_SETTINGS, SweepConfig
from ._storage import read_json

#: What polarize writes in a folder of each kind (glob patterns of top-level names).
OWN_FILES = {
    "sweep": (
        "config.json",
        "summary.json",
        "manifest.json",
        "manifest-p*.json",
        "chunks",
        "per_init.npz",
        "series.npz",
        "sample.npz",
        "*.png",
        ".assemble-*",
    ),
    "study": ("study.json", "study.csv", "summary.json", "comparison.png", "cells"),
    "lab": ("config.json", "summary.json", "units", "*.png"),
}
#: Written in every kind of folder: the lock and interrupted atomic writes.
ANY_KIND = (".lock", ".lock-p*", ".*.tmp")


def package_versions() -> dict:
    out = {}
    for name in ("polarize", "jax", "jaxlib", "equinox", "diffrax", "optax", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def folder_kind(folder) -> str | None:
    """ "sweep", "study" or "lab" by the file that marks `folder`; None for anything else."""
    folder = Path(folder)
    if (folder / "study.json").is_file():
        return "study"
    config = folder / "config.json"
    if config.is_file():
        try:
            stored = read_json(config)
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        if isinstance(stored, dict) and "sweep" in stored:
            return "sweep"
        if isinstance(stored, dict) and "task" in stored:
            return "lab"
    return None


def require_kind(folder, kinds=("sweep", "study"), argument: str = "dir") -> str:
    """The kind of `folder`, or a `PolarizeError` when it is not one of `kinds`."""
    folder = Path(folder)
    kind = folder_kind(folder)
    if kind not in kinds:
        marks = {"sweep": "a sweep folder (config.json)", "study": "a study (study.json)", "lab": "a lab run"}
        want = " nor ".join(marks[k] for k in kinds)
        what = "does not exist" if not folder.exists() else f"is neither {want}"
        raise PolarizeError(f"`{argument}` {folder} {what}")
    return kind


def _own(name: str, kind: str) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in OWN_FILES[kind] + ANY_KIND)


def _contents(folder: Path) -> list[str]:
    """The names in `folder`, the lock files left out."""
    try:
        return sorted(p.name for p in folder.iterdir() if not fnmatch.fnmatch(p.name, ".lock*"))
    except OSError as e:
        raise PolarizeError(f"`--out` {folder} cannot be read: {e.strerror}") from None


def make_folder(out: Path, argument: str = "--out") -> Path:
    """`out`, created with its parents, or one line saying why it cannot be."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PolarizeError(f"`{argument}` {out} exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PolarizeError(f"`{argument}` {out} cannot be created: {e.strerror}") from None
    return out


def check_out(out: Path, overwrite: bool, kind: str = "sweep") -> list[str]:
    """The names `prepare_out` would delete in `out` (none if it is new or empty), or a
    `PolarizeError` saying why `out` cannot take a new run of `kind`; changes nothing.

    A non-empty `out` is refused, except with `overwrite` when it is a polarize folder
    of the same kind holding only polarize's own files.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PolarizeError(f"`--out` {out} exists and is not a folder")
    names = _contents(out) if out.exists() else []
    if not names:
        return []
    if not overwrite:
        resume = f"pass --resume {out} to continue it, " if kind == "sweep" else ""
        raise PolarizeError(
            f"`--out` {out} is not empty; {resume}--overwrite to replace it, or choose another folder"
        )
    found = folder_kind(out)
    if found != kind:
        what = f"a polarize {found} folder" if found else "not a polarize run folder"
        raise PolarizeError(
            f"`--out` {out} is {what}: --overwrite replaces only a {kind} folder; choose another folder"
        )
    foreign = [n for n in names if not _own(n, kind)]
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise PolarizeError(
            f"`--out` {out} holds files polarize did not write ({shown}); --overwrite deletes only "
            "a run's own files: move them or choose another folder"
        )
    return names


def prepare_out(out: Path, overwrite: bool, kind: str = "sweep") -> Path:
    """An empty folder `out` for a new run of `kind` (the caller holds its lock): see
    `check_out`; with `overwrite` the previous run's own files are deleted."""
    names = check_out(out, overwrite, kind)
    out = make_folder(out)
    for name in names:
        path = out / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    return out


def check_study_out(out: Path) -> None:
    """Refuse an `out` for a study that is a file, or a non-empty folder other than a study."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise PolarizeError(f"`--out` {out} exists and is not a folder")
    if out.is_dir() and folder_kind(out) != "study" and _contents(out):
        kind = folder_kind(out)
        what = f"a polarize {kind} folder" if kind else "not empty and not a study folder"
        raise PolarizeError(f"`--out` {out} is {what}; choose another folder for the study")


def remove_interrupted_writes(folder: Path) -> list[str]:
    """Delete what a killed process left of atomic writes (`.<name>.<random>.tmp`) in
    `folder` and its chunks; the caller holds the folder's lock. Returns their names."""
    stale = [p for d in (folder, folder / "chunks") if d.is_dir() for p in d.glob(".*.tmp")]
    for p in stale:
        p.unlink(missing_ok=True)
    return [p.name for p in stale]


class FolderLock:
    """An exclusive lock on a run folder, held while this process writes it.

    `fcntl.flock` on `folder/.lock` (`.lock-p<k>` for process k of `processes` > 1:
    with `--distributed` every process locks its own chunks). The kernel releases it
    when the process ends, killed or not; the file, which names the holder, stays.
    """

    def __init__(self, folder, process: int = 0, processes: int = 1):
        self.folder = Path(folder)
        self.path = self.folder / (".lock" if processes == 1 else f".lock-p{process}")
        self._fd = None

    def __enter__(self) -> "FolderLock":
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise PolarizeError(f"`--out` {self.folder} cannot be written: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise PolarizeError(
                f"`--out` {self.folder} is being written by {holder}; wait for it to finish "
                "or choose another folder"
            ) from None
        os.ftruncate(fd, 0)
        command = " ".join(["polarize", *sys.argv[1:]]) if sys.argv else "python"
        since = time.strftime("%Y-%m-%d %H:%M:%S")
        os.write(fd, f"process {os.getpid()} on {socket.gethostname()} since {since} ({command})\n".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def settings_hash(config: SweepConfig) -> str:
    """SHA-256 of the settings that determine a sweep's numbers: all but `chunk_size`
    (a chunk's own range is stored with it), and but the `LATER_SETTINGS` where they
    hold the value every sweep had before they existed (a folder stored then resumes)."""
    settings = {
        k: v
        for k, v in config.to_dict().items()
        if k != "chunk_size" and not (k in LATER_SETTINGS and v == LATER_SETTINGS[k])
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def stored_config(out, argument: str = "--resume") -> SweepConfig:
    """The config a run folder was started with, or one line saying why it cannot be read."""
    path = Path(out) / "config.json"
    if not path.exists():
        raise PolarizeError(f"`{argument}` {out} has no config.json: not a polarize sweep folder")
    try:
        stored = read_json(path)
    except OSError as e:
        raise PolarizeError(f"`{argument}` {out}: config.json cannot be read: {e.strerror}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise PolarizeError(f"`{argument}` {out}: config.json is not valid JSON ({e})") from None
    if not isinstance(stored, dict) or not isinstance(stored.get("sweep"), dict):
        raise PolarizeError(f'`{argument}` {out}: config.json has no "sweep" settings: not a sweep folder')
    try:
        return SweepConfig.from_dict(stored["sweep"])
    except PolarizeError as e:
        raise PolarizeError(f"`{argument}` {out}: config.json holds a bad setting: {e}") from None


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
