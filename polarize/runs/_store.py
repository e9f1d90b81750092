"""A run folder's chunk store: one atomic `.npz` per finished chunk, plus a manifest.

Layout of a run folder:

    config.json            what was asked (and package versions)
    manifest.json          finished chunks with their SHA-256 (one manifest-p<k>.json
                           per process when several processes share the folder)
    chunks/chunk-000000.npz, ...
    summary.json, per_init.npz, series.npz, sample.npz, *.png   (assembled at the end)

A chunk is done when its file loads without pickle, holds the expected arrays
for its range of initializations, and matches the manifest's checksum when it is
listed. Anything else (missing, truncated, tampered) is recomputed on resume.
"""

import hashlib
from pathlib import Path

import jax
import numpy as np

from ._storage import read_json, read_npz, write_json, write_npz


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class ChunkStore:
    """Chunks [start, stop) of a run, stored under `root/chunks`."""

    def __init__(self, root, ranges: list[tuple[int, int]], required: tuple[str, ...]):
        self.root = Path(root)
        self.ranges = ranges
        self.required = required
        (self.root / "chunks").mkdir(parents=True, exist_ok=True)
        self._mine = self.root / (
            "manifest.json" if jax.process_count() == 1 else f"manifest-p{jax.process_index()}.json"
        )
        self._entries = self._read_manifests()

    def path(self, i: int) -> Path:
        return self.root / "chunks" / f"chunk-{i:06d}.npz"

    def _read_manifests(self) -> dict:
        entries = {}
        for p in sorted(self.root.glob("manifest*.json")):
            try:
                for e in read_json(p)["chunks"]:
                    entries[e["file"]] = e
            except (ValueError, KeyError, OSError):
                continue  # an unreadable manifest only costs recomputation
        return entries

    def read(self, i: int) -> dict | None:
        """Chunk i's arrays, or None when it is missing or not intact."""
        path = self.path(i)
        if not path.exists():
            return None
        entry = self._entries.get(path.name)
        if entry is not None and entry.get("sha256") != _sha256(path):
            return None
        try:
            arrays = read_npz(path)
        except ValueError:
            return None
        start, stop = self.ranges[i]
        if any(k not in arrays for k in self.required):
            return None
        if int(arrays["start"]) != start or int(arrays["stop"]) != stop:
            return None
        if any(arrays[k].shape[:1] != (stop - start,) for k in self.required if k not in ("start", "stop")):
            return None
        return arrays

    def done(self, i: int) -> bool:
        return self.read(i) is not None

    def write(self, i: int, arrays: dict) -> None:
        """Write chunk i atomically, then record it in this process's manifest."""
        start, stop = self.ranges[i]
        path = self.path(i)
        write_npz(path, {**arrays, "start": np.int64(start), "stop": np.int64(stop)})
        self._entries[path.name] = {"file": path.name, "start": start, "stop": stop, "sha256": _sha256(path)}
        mine = [e for e in self._entries.values() if self._owned(e)]
        write_json(
            self._mine, {"n_chunks": len(self.ranges), "chunks": sorted(mine, key=lambda e: e["file"])}
        )

    def _owned(self, entry) -> bool:
        index = int(entry["file"].split("-")[1].split(".")[0])
        return index % jax.process_count() == jax.process_index()
