"""Results on disk: JSON for configs and summaries, `.npz` for arrays, never pickle.

Every write goes to a temporary file in the same folder and is renamed into place,
so a reader (or a resumed run) sees either the old file or the complete new one.
"""

import json
import math
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np


def _atomic_write(path: Path, write) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None  # NaN and inf have no JSON spelling; null: undefined, or never reached
    if isinstance(x, Path):
        return str(x)
    return x


def write_json(path, obj) -> None:
    """Write `obj` as indented JSON, atomically; NaN and inf become null."""
    text = json.dumps(_jsonable(obj), indent=2, sort_keys=False) + "\n"
    _atomic_write(Path(path), lambda f: f.write(text.encode()))


def read_json(path):
    with open(path) as f:
        return json.load(f)


def write_npz(path, arrays: dict) -> None:
    """Write a dict of arrays as an uncompressed `.npz`, atomically."""
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    for k, v in arrays.items():
        if v.dtype == object:
            raise TypeError(f"array {k!r} has dtype object, which would need pickle")
    _atomic_write(Path(path), lambda f: np.savez(f, **arrays))


def write_npz_streamed(path, arrays: dict, raw: dict) -> None:
    """Write an uncompressed `.npz` whose large members are copied from raw files.

    `raw`: name -> (file of C-order bytes, shape, dtype), streamed into the archive in
    blocks, so an array of any size never has to be in memory; `arrays` are written as
    `write_npz` would. Readable by `np.load` like any `.npz`; written atomically.
    """
    import shutil

    def write(f):
        with zipfile.ZipFile(f, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
            for name, (source, shape, dtype) in raw.items():
                dtype = np.dtype(dtype)
                expected = int(np.prod(shape)) * dtype.itemsize
                if os.path.getsize(source) != expected:
                    raise ValueError(f"{source} holds {os.path.getsize(source)} bytes, not {expected}")
                header = {
                    "descr": np.lib.format.dtype_to_descr(dtype),
                    "fortran_order": False,
                    "shape": shape,
                }
                with z.open(f"{name}.npy", "w", force_zip64=True) as member, open(source, "rb") as src:
                    np.lib.format.write_array_header_1_0(member, header)
                    shutil.copyfileobj(src, member, 16 << 20)
            for name, value in arrays.items():
                value = np.asarray(value)
                if value.dtype == object:
                    raise TypeError(f"array {name!r} has dtype object, which would need pickle")
                with z.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, value, allow_pickle=False)

    _atomic_write(Path(path), write)


def read_npz(path) -> dict:
    """Read every array of an `.npz` (no pickle); raise `ValueError` if it is corrupt."""
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a plain .npy array, not an archive
            raise ValueError("a single array (.npy), not an .npz archive of named arrays")
        with loaded as z:
            return {k: z[k] for k in z.files}
    except (zipfile.BadZipFile, OSError, EOFError, KeyError, ValueError) as e:
        raise ValueError(f"corrupt or unreadable array file {path}: {e}") from e


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
