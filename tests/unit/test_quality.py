"""Static checks run as tests: lint, types (mypy --strict), the pure-core import contract."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)


def _tool(name: str) -> str:
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    assert found, f"{name} is not installed: pip install -e '.[dev]'"
    return found


def test_ruff() -> None:
    out = _run(_tool("ruff"), "check", "schemas", "libs", "services", "corral", "tests", "bench")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict() -> None:
    out = _run(sys.executable, "-m", "mypy", "corral")
    assert out.returncode == 0, out.stdout + out.stderr


def test_core_stays_pure() -> None:
    out = _run(_tool("lint-imports"))
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_package_is_installed() -> None:
    """Each directory with an __init__.py must be listed in pyproject's packages (or a wheel misses it)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for top, package in (
        ("corral", "corral"),
        ("schemas", "corral.schemas"),
        ("libs", "corral.libs"),
        ("services", "corral.services"),
    ):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            found.add(".".join([package, *rel.parts]) if rel.parts else package)
    assert found <= listed, f"add to pyproject packages: {sorted(found - listed)}"
