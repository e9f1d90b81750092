"""Shared helpers for the benchmark scripts: timing, machine description, RESULTS.md sections."""

import os
import platform
import resource
import sys
import time
from pathlib import Path

import jax

RESULTS = Path(__file__).with_name("RESULTS.md")


def timed(fn, *args, repeats: int = 3):
    """(first-call seconds, steady seconds, output): the first call includes compilation,
    steady is the best of `repeats` further calls; every call is waited for with
    `jax.block_until_ready`."""
    start = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    first = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - start)
    return first, best, out


def wall(fn, *args):
    """Seconds of one call (for Python/numpy baselines, nothing to compile)."""
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB.

    Read from VmHWM in /proc/self/status: ru_maxrss would be wrong in a subprocess,
    since Linux carries the parent's high-water mark over fork and exec.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine() -> str:
    """One paragraph: CPU, cores, load, Python and library versions."""
    import diffrax
    import equinox
    import numpy
    import optax
    import scipy

    cpu = platform.processor() or platform.machine()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    info = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in lines)}
    if info.get("model name"):
        # the name alone does not tell this project's AMD machines apart (Zen 3, 4 and 5)
        isa = "AVX-512" if "avx512f" in info.get("flags", "").split() else "no AVX-512"
        family, model = info.get("cpu family", "?"), info.get("model", "?")
        cpu = f"{info['model name']} (family {family}, model {model}, {isa})"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    versions = (
        f"python {platform.python_version()}, jax {jax.__version__}, diffrax {diffrax.__version__}, "
        f"equinox {equinox.__version__}, optax {optax.__version__}, numpy {numpy.__version__}, "
        f"scipy {scipy.__version__}"
    )
    return (
        f"{cpu}, {os.cpu_count()} cores visible, load average {load} at start; "
        f"backend {jax.default_backend()}; {versions}"
    )


def table(header: list[str], rows: list[list]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(x: float, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def record(section: str, title: str, body: str, *, quick: bool) -> None:
    """Print `body` and (full runs only) replace section `section` of RESULTS.md with it."""
    command = "python " + " ".join(["benchmarks/" + Path(sys.argv[0]).name] + sys.argv[1:])
    text = (
        f"<!-- begin {section} -->\n## {title}\n\nCommand: `{command}`\n\nMachine: {machine()}\n\n"
        f"{body}\n<!-- end {section} -->\n"
    )
    print(text)
    if quick:
        return  # smoke runs never overwrite measured results
    old = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n\nWritten by the scripts.\n\n"
    begin, end = f"<!-- begin {section} -->", f"<!-- end {section} -->"
    if begin in old:
        head, rest = old.split(begin, 1)
        new = head + text.rstrip("\n") + rest.split(end, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text
    RESULTS.write_text(new)
