"""A run folder's chunk store: one atomic `.npz` per finished chunk, plus a manifest.

Layout of a run folder:

    config.json            what was asked (and package versions)
    manifest.json          finished chunks with their SHA-256 (one manifest-p<k>.json
                           per process when several processes share the folder)
    chunks/chunk-000000.npz, ...
    summary.json, per_init.npz, series.npz, sample.npz, *.png   (assembled at the end)

A chunk is done when its file loads without pickle, holds the expected arrays
for its range of initializations, carries the hash of the run's settings, and matches
the manifest's checksum when it is listed. A damaged one (truncated, tampered, from
an older polarize with no settings hash) is recomputed on resume and listed in
`problems`; one computed with other settings (its config.json edited since) is
refused with a `PolarizeError`, as is a chunk that cannot be read at all.
"""

import hashlib
from pathlib import Path

import jax
import numpy as np

from ..core._errors import PolarizeError
from ._storage import read_json, read_npz, write_json, write_npz


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class ChunkStore:
    """Chunks [start, stop) of a run, stored under `root/chunks`."""

    def __init__(self, root, ranges: list[tuple[int, int]], required: tuple[str, ...], settings: str):
        self.root = Path(root)
        self.ranges = ranges
        self.required = required
        self.settings = settings  # `_folder.settings_hash` of the run's config
        #: chunk index -> why its file was not used (recomputed)
        self.problems: dict[int, str] = {}
        self._unlisted = False  # intact chunks missing from the manifest (rebuilt on `save`)
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
        """Chunk i's arrays, or None when it is missing or damaged (recorded in `problems`)."""
        path = self.path(i)
        if not path.exists():
            return None
        try:
            arrays, problem = self._check(i, path)
        except OSError as e:
            raise PolarizeError(f"chunk {path} cannot be read: {e.strerror}; fix its permissions") from None
        if problem is not None:
            self.problems[i] = problem
            return None
        self.problems.pop(i, None)
        if path.name not in self._entries:  # intact, but its manifest entry was lost
            self._entries[path.name] = self._entry(i, path)
            self._unlisted = True
        return arrays

    def _check(self, i: int, path: Path) -> tuple[dict | None, str | None]:
        entry = self._entries.get(path.name)
        if entry is not None and entry.get("sha256") != _sha256(path):
            return None, "checksum differs from the manifest"
        try:
            arrays = read_npz(path)
        except ValueError:
            return None, "unreadable archive"
        start, stop = self.ranges[i]
        if any(k not in arrays for k in self.required):
            return None, "arrays missing"
        if int(arrays["start"]) != start or int(arrays["stop"]) != stop:
            return None, "range differs"
        if any(arrays[k].shape[:1] != (stop - start,) for k in self.required if k not in ("start", "stop")):
            return None, "wrong shape"
        if "settings" not in arrays:
            return None, "no settings hash (written by an older polarize)"
        if str(arrays.pop("settings")) != self.settings:
            raise PolarizeError(
                f"chunk {path} was computed with other settings than {self.root / 'config.json'} "
                "(was config.json edited?); start a new --out, or --overwrite this run"
            )
        return arrays, None

    def done(self, i: int) -> bool:
        return self.read(i) is not None

    def write(self, i: int, arrays: dict) -> None:
        """Write chunk i atomically, then record it in this process's manifest."""
        start, stop = self.ranges[i]
        path = self.path(i)
        extra = {"start": np.int64(start), "stop": np.int64(stop), "settings": np.asarray(self.settings)}
        write_npz(path, {**arrays, **extra})
        self._entries[path.name] = self._entry(i, path)
        self.save()

    def _entry(self, i: int, path: Path) -> dict:
        start, stop = self.ranges[i]
        return {"file": path.name, "start": start, "stop": stop, "sha256": _sha256(path)}

    def save(self) -> None:
        """This process's manifest: every intact chunk it owns, with its checksum."""
        mine = sorted((e for e in self._entries.values() if self._owned(e)), key=lambda e: e["file"])
        manifest = {"n_chunks": len(self.ranges), "settings": self.settings, "chunks": mine}
        write_json(self._mine, manifest)
        self._unlisted = False

    def save_if_rebuilt(self) -> None:
        """Rewrite the manifest where `read` found intact chunks it did not list."""
        if self._unlisted:
            self.save()

    def _owned(self, entry) -> bool:
        index = int(entry["file"].split("-")[1].split(".")[0])
        return index % jax.process_count() == jax.process_index()
