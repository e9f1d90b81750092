"""The README and docs/ show what runs: every code example in them is executed here.

Each page's fenced blocks run in order, in one fresh namespace and one temporary working
directory per page: ```python blocks are executed (later blocks may use the names of
earlier ones), every line of a ```sh block that starts with `polarize ` goes through the
CLI's `main` and must exit with status 0, and a ```toml block whose first line is
`# file: NAME` is written to NAME first (a study file for the commands after it).
```console blocks are shown, not run. The page list also checks that docs/api.md names
every public name of `polarize`, and that the README stays a short manual.
"""

import re
import shlex
from pathlib import Path

import jax
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
QUICKSTART = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/polarize sweep",
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest -q",
)


def blocks(page: Path) -> list[tuple[str, str]]:
    """(language, code) of every fenced block of `page`, in order."""
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(page.read_text())]


def public_names() -> list[str]:
    """Every name `polarize` exports (its `__all__`, which `dir(polarize)` lists)."""
    import polarize

    return sorted(polarize.__all__)


def test_pages_exist():
    assert len(PAGES) >= 6, [p.name for p in PAGES]
    for name in ("concepts", "api", "cli", "results", "transformer", "performance"):
        assert ROOT / "docs" / f"{name}.md" in PAGES


#: JAX's process-wide settings that `pz.enable_compilation_cache` changes
CACHE_SETTINGS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


@pytest.fixture
def no_cache_after():
    """A page may turn on the compilation cache (docs/performance.md does), which is
    process-wide: put JAX's settings back after it, so that the worker's later tests run
    without one, as the whole suite does."""
    from jax.experimental.compilation_cache import compilation_cache

    before = {name: getattr(jax.config, name) for name in CACHE_SETTINGS}
    yield
    if any(getattr(jax.config, name) != value for name, value in before.items()):
        for name, value in before.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
@pytest.mark.usefixtures("no_cache_after")
def test_page_runs(page: Path, tmp_path, monkeypatch):
    from polarize.cli import main

    jax.config.update("jax_enable_x64", True)
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs_{page.stem}"}
    for i, (language, code) in enumerate(blocks(page)):
        where = f"{page.name}, block {i + 1}"
        if language == "python":
            exec(compile(code, where, "exec"), namespace)
        elif language == "sh":
            for line in code.splitlines():
                if line.startswith("polarize "):
                    assert main(shlex.split(line, comments=True)[1:]) == 0, f"{where}: {line}"
        elif language == "toml":
            first = code.splitlines()[0]
            if first.startswith("# file: "):
                (tmp_path / first.removeprefix("# file: ").strip()).write_text(code)


def test_api_names_every_public_name():
    text = (ROOT / "docs" / "api.md").read_text()
    names = public_names()
    assert "flow" in names and "SweepConfig" in names
    missing = [n for n in names if not re.search(rf"`(pz\.)?{re.escape(n)}\b", text)]
    assert not missing, f"docs/api.md does not name {missing}"


def test_readme_is_a_short_manual():
    text = README.read_text()
    assert len(text.splitlines()) <= 220
    quickstart = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    for command in QUICKSTART:
        assert f"\n    {command}\n" in quickstart, command
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in text, f"README.md does not point to docs/{page.name}"


def test_cli_examples_stay_few():
    lines = [
        line
        for page in PAGES
        for language, code in blocks(page)
        if language == "sh"
        for line in code.splitlines()
        if line.startswith("polarize ")
    ]
    assert 0 < len(lines) <= 6, lines
