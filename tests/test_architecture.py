"""The import rules of docs/architecture.md, checked.

Statically: every import statement of every module (lazy ones inside functions
too) against what its package must not import. Dynamically: importing the whole of
`specq.queue` in a fresh interpreter must not load numba or the model, so that
`specq status` and friends start fast on a machine that decodes nothing.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specq

ROOT = Path(specq.__file__).parent

# package -> the top-level modules and specq packages it must never import.
FORBIDDEN = {
    "specq.specdec": {
        "redis",
        "rq",
        "click",
        "prometheus_client",
        "specq.requests",
        "specq.queue",
        "specq.worker",
        "specq.cli",
        "specq.training",
        "specq.testing",
        "specq.bench",
        "specq.quality",
    },
    "specq.requests": {
        "redis",
        "rq",
        "click",
        "prometheus_client",
        "specq.queue",
        "specq.worker",
        "specq.cli",
        "specq.training",
        "specq.testing",
    },
    "specq.queue": {
        "numba",
        "click",
        "specq.worker",
        "specq.cli",
        "specq.training",
        "specq.testing",
        "specq.specdec.model",
        "specq.specdec.engine",
        "specq.specdec.loader",
    },
    "specq.worker": {"click", "specq.cli", "specq.training", "specq.testing"},
    "specq.server": {
        "numba",
        "click",
        "specq.worker",
        "specq.cli",
        "specq.training",
        "specq.testing",
        "specq.specdec.model",
        "specq.specdec.engine",
    },
    "specq.training": {"redis", "rq", "click", "specq.queue", "specq.worker", "specq.cli", "specq.testing"},
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            # `from specq.queue import keys` imports specq.queue.keys
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _breaks(imported: str, rule: str) -> bool:
    return imported == rule or imported.startswith(rule + ".")


def _violations() -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        module = _module_name(path)
        for package, forbidden in FORBIDDEN.items():
            if not _breaks(module, package):
                continue
            for line, imported in _imports(path):
                for rule in forbidden:
                    if _breaks(imported, rule):
                        out.append(f"{path.relative_to(ROOT.parent)}:{line}: {package} must not import {rule}")
    return out


def test_every_package_keeps_its_import_rules():
    violations = _violations()
    assert not violations, "\n".join(violations)


def test_the_check_sees_a_violation(tmp_path, monkeypatch):
    """The walk above must be able to fail: a forbidden import planted in a copy of
    a package is found."""
    fake_root = tmp_path / "specq"
    (fake_root / "specdec").mkdir(parents=True)
    (fake_root / "specdec" / "bad.py").write_text("def f():\n    import redis\n    from specq.queue import keys\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", fake_root)
    found = _violations()
    assert any("must not import redis" in v for v in found)
    assert any("must not import specq.queue" in v for v in found)


def _heavy_modules_after(imports: str, heavy: tuple[str, ...]) -> str:
    """What of numba and `heavy` a fresh interpreter has loaded after running
    `imports` (numba named once, not with its hundreds of submodules)."""
    code = (
        f"import sys\n{imports}\n"
        f"bad = sorted(m for m in sys.modules if m == 'numba' or m in {heavy!r})\n"
        "print(' '.join(bad))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_the_queue_loads_no_numba_and_no_model():
    imports = (
        "import pkgutil, importlib, specq.queue\n"
        "for m in pkgutil.walk_packages(specq.queue.__path__, 'specq.queue.'):\n"
        "    importlib.import_module(m.name)"
    )
    loaded = _heavy_modules_after(imports, ("specq.specdec.model", "specq.specdec.engine", "specq.worker"))
    assert loaded == "", f"importing specq.queue loaded: {loaded}"


def test_the_command_line_loads_no_numba_until_a_command_decodes():
    """`specq status`, `submit`, `run`'s parent and the rest start without the model's
    kernels (importing them costs about a second); the commands that decode import
    the engine themselves."""
    loaded = _heavy_modules_after(
        "import specq.cli", ("specq.specdec.model", "specq.specdec.engine", "specq.worker.batch_runner")
    )
    assert loaded == "", f"importing specq.cli loaded: {loaded}"


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_every_package_is_documented(package):
    doc = (ROOT.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert f"`{package.replace('.', '/')}/`" in doc
