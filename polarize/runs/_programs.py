"""A sweep's traced programs kept across processes (`jax.export`), in the CLI's cache folder.

XLA's persistent compilation cache skips the compile of a program a process has seen
before, not its tracing: without this, every `polarize sweep` traced its solve again
(about 2.5 s of a warm default sweep on a 2-core CPU, whose solve takes 0.2 s). Here
the program that measures a run of blocks (`_numerics.measure` of a config, for arrays of
given shapes) is exported once and stored; a later process deserializes it (a few ms)
and calls it, and XLA's cache supplies the compiled code.

An entry is keyed by everything the traced program depends on: the sweep's program
settings (`SweepConfig.program`), the shapes, dtypes and tree structure of the inputs,
their non-array parts, the backend, float64, the versions of jax and jaxlib, and a hash
of polarize's own source files (so an edited checkout never reuses a program of the
old code). Each entry is a `.json` file (that key material and the blob's sha256) and
a `.bin` file (the serialized program). One that does not match its key (stale), or
whose blob does not match its checksum or does not deserialize (corrupt), is rebuilt
and overwritten, never used.

Programs are stored only where the CLI's cache is on (`programs/` beside XLA's `jax/`
in `solve._devices.cache_dir()`; `POLARIZE_NO_CACHE` turns both off) and a run of
blocks is on one device. A program that `jax.export` cannot serialize (host callbacks:
the restarted solves of the stiff default) runs as before, traced in each process; its
entry records that, so later processes do not try again.
"""

import functools
import hashlib
import json
import threading
from pathlib import Path

import equinox as eqx
import jax

from ._storage import _atomic_write

#: Bumped when the entry format changes.
FORMAT = 1
#: The in-process stand-in of a program that cannot be exported.
_NOT_EXPORTABLE = object()


@functools.cache
def source_hash() -> str:
    """sha256 of polarize's source files (their paths and bytes)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def stored_value(folder: Path, name: str, settings: dict, compute):
    """`compute()` (a JSON value) stored in `folder` under `name` and `settings`, with the
    key material of a program (backend, float64, jax and polarize versions): a later process
    reads it back instead of computing it. A stale or unreadable entry is computed again
    and overwritten, never used."""
    material = json.loads(json.dumps(_environment(name, settings), sort_keys=True))
    key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]
    path = Path(folder) / f"{key}.value.json"
    try:
        entry = json.loads(path.read_text())
        if entry["material"] == material:
            return entry["value"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # missing or unreadable: computed again
    value = compute()
    entry = json.dumps({"material": material, "value": value}, sort_keys=True).encode()
    _atomic_write(path, lambda f: f.write(entry))
    return value


def _environment(name: str, settings: dict) -> dict:
    """What a stored entry depends on besides its arguments."""
    return {
        "format": FORMAT,
        "name": name,
        "settings": settings,
        "backend": jax.default_backend(),
        "x64": bool(jax.config.jax_enable_x64),
        "jax": jax.__version__,
        "jaxlib": jax.lib.__version__,
        "polarize": source_hash(),
    }


class StoredProgram:
    """fn(*args) -> a tree of arrays (a sweep's `measure(model, objective)`, the draws of
    its initializations), run as a stored exported program.

    `make(*args)` returns `fn`, given the concrete arguments of a first call:
    it is called only where no stored entry serves (to export `fn`, or to run it where it
    cannot be exported), so a process that loads the program never builds it. `name`
    and `settings` (JSON-able) name what `fn` computes besides its arguments; the key adds
    the arguments' structure, shapes and dtypes (see the module doc).
    """

    def __init__(self, make, name: str, settings: dict, folder: Path):
        self.make, self.name, self.settings, self.folder = make, name, settings, Path(folder)
        self._programs: dict = {}
        self._compiled: dict = {}  # key -> its program compiled (`jax.stages.Compiled`)
        self._made = None  # `make`'s fn, once made
        self._lock = threading.Lock()
        #: what the last calls did: "loaded", "exported" or "rebuilt (reason)", for tests
        self.events: list[str] = []

    def __call__(self, *args):
        program, leaves = self._ready(args)
        if program is _NOT_EXPORTABLE:
            return self._fn(*args)(*args)
        return program(leaves)

    def prepare(self, *args) -> None:
        """Load (or trace and store) and compile the program for inputs of the structure,
        shapes and dtypes of `args`, without running it: a later call on such inputs only
        runs it. `args` may be a stand-in (zeros): their values are not read."""
        self._ready(args)

    def _ready(self, args):
        """(the compiled program for inputs `args`, or `_NOT_EXPORTABLE`; their array leaves)."""
        dyn, static = eqx.partition(args, eqx.is_array)
        leaves, treedef = jax.tree.flatten(dyn)
        material = self._material(leaves, treedef, static)
        key = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]
        with self._lock:
            compiled = self._compiled.get(key)
            if compiled is None:
                program = self._programs.get(key)
                if program is None:
                    program = self._load_or_export(key, material, treedef, static, leaves, args)
                    self._programs[key] = program
                if program is _NOT_EXPORTABLE:
                    return program, leaves
                compiled = self._compiled[key] = jax.jit(program.call).lower(leaves).compile()
        return compiled, leaves

    def _fn(self, *args):
        if self._made is None:
            self._made = self.make(*args)
        return self._made

    def _material(self, leaves, treedef, static) -> dict:
        """The key material, as JSON reads it back (what a stored entry is compared with)."""
        return json.loads(json.dumps(self._key_parts(leaves, treedef, static), sort_keys=True))

    def _key_parts(self, leaves, treedef, static) -> dict:
        return {
            **_environment(self.name, self.settings),
            "inputs": str(treedef),
            "static": repr(jax.tree.leaves(static)),
            "shapes": [[list(x.shape), str(x.dtype)] for x in leaves],
        }

    def _load_or_export(self, key, material, treedef, static, leaves, concrete):
        meta, blob = self.folder / f"{key}.json", self.folder / f"{key}.bin"
        reason = self._check(meta, blob, material)
        if reason == "not exportable":
            self.events.append("not exportable")
            return _NOT_EXPORTABLE
        if reason is None:
            try:
                program = jax.export.deserialize(bytearray(blob.read_bytes()))
            except Exception as e:  # noqa: BLE001 - any failure to read it is a corrupt entry
                reason = f"does not deserialize: {type(e).__name__}"
            else:
                self.events.append("loaded")
                return program

        traced = self._fn(*concrete)

        def fn(leaves):
            return traced(*eqx.combine(jax.tree.unflatten(treedef, leaves), static))

        try:
            program = jax.export.export(jax.jit(fn))(leaves)
        except NotImplementedError as e:  # e.g. "serialization of host_callbacks is not yet implemented"
            entry = {"material": material, "not_exportable": str(e)}
            _atomic_write(meta, lambda f: f.write(json.dumps(entry, sort_keys=True).encode()))
            self.events.append("not exportable")
            return _NOT_EXPORTABLE
        data = program.serialize()
        _atomic_write(blob, lambda f: f.write(data))
        entry = {"material": material, "sha256": hashlib.sha256(data).hexdigest()}
        _atomic_write(meta, lambda f: f.write(json.dumps(entry, sort_keys=True).encode()))
        self.events.append("exported" if reason == "missing" else f"rebuilt ({reason})")
        return program

    @staticmethod
    def _check(meta: Path, blob: Path, material: dict) -> str | None:
        """None where the stored entry is this program's, else why not."""
        if not meta.exists():
            return "missing"
        try:
            entry = json.loads(meta.read_text())
            stored = entry["material"]
        except (ValueError, KeyError, TypeError):
            return "unreadable key"
        if stored != material:
            return "stale"
        if entry.get("not_exportable"):
            return "not exportable"
        if not blob.exists():
            return "missing"
        if hashlib.sha256(blob.read_bytes()).hexdigest() != entry.get("sha256"):
            return "checksum"
        return None
