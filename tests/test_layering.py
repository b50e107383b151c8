"""The import layering of ../shared/STYLE.md §2, enforced by parsing every module's imports.

api → scheduler → (executor protocol) ← engine; store, cost → domain; domain → stdlib.
Inside `engine`, sub-packages point down too: `sampling` → `lora` → `model` → `kernels`.
`errors` and `config` are leaves every layer may use. torch stays inside `engine` (and `cli`,
the composition root).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "loraplex"

LEAVES = {"errors", "config"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "config": {"errors"},
    "domain": {"errors"},
    "cost": {"domain", "errors", "config"},
    "store": {"domain", "errors", "config"},
    "engine": {"domain", "errors", "config"},
    "scheduler": {"store", "cost", "domain", "errors", "config"},
    "api": {"scheduler", "store", "cost", "domain", "errors", "config"},
    "cluster": {"engine", "scheduler", "domain", "errors", "config"},
    "demo": set(),
    "cli": {"api", "scheduler", "store", "cost", "engine", "cluster", "demo", "domain", "errors",
            "config"},
    "__init__": set(),
    "__main__": {"cli"},
}
#: Inside `engine`: which of its sub-packages each may import (its own always). Modules directly
#: in `engine/` (the engine facade, trainer, checkpoint IO) compose them and are unrestricted.
ENGINE_ALLOWED: dict[str, set[str]] = {
    "kernels": set(),  # native kernels: the bottom of the engine
    "model": {"kernels"},  # the base model takes a `LoraBatch` as data; it never imports `lora`
    "builtin": {"model"},
    "gguf": {"model", "builtin"},
    "lora": {"model"},
    "losses": set(),
    "optim": set(),
    "sampling": {"model", "lora"},
    "paging": {"lora", "optim"},  # reaches the trainer's AdamW states through a Protocol
}
TORCH_FREE = {"errors", "config", "domain", "cost", "store", "scheduler", "api", "demo"}
HEAVY = ("torch", "transformers", "peft", "safetensors")


def _layer_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            raise AssertionError(f"{path}:{node.lineno}: relative import; use absolute imports")
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_imports_point_down_only(path: Path) -> None:
    layer = _layer_of(path)
    assert layer in ALLOWED, f"{path}: new top-level layer {layer!r}; add it to ALLOWED"
    for lineno, module in _imports(path):
        parts = module.split(".")
        if parts[0] == "loraplex" and len(parts) > 1:
            target = parts[1]
            if target != layer:
                assert target in ALLOWED[layer], (
                    f"{path}:{lineno}: {layer} must not import loraplex.{target}"
                )
        if layer in TORCH_FREE:
            assert parts[0] not in HEAVY, f"{path}:{lineno}: {layer} must not import {module}"


ENGINE = PACKAGE / "engine"
ENGINE_MODULES = sorted(p for p in ENGINE.rglob("*.py") if len(p.relative_to(ENGINE).parts) > 1)


@pytest.mark.parametrize("path", ENGINE_MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_engine_subpackage_imports_point_down_only(path: Path) -> None:
    subpackage = path.relative_to(ENGINE).parts[0]
    assert subpackage in ENGINE_ALLOWED, (
        f"{path}: new engine sub-package {subpackage!r}; add it to ENGINE_ALLOWED")
    for lineno, module in _imports(path):
        parts = module.split(".")
        if parts[:2] == ["loraplex", "engine"] and len(parts) > 2 and parts[2] != subpackage:
            assert parts[2] in ENGINE_ALLOWED[subpackage], (
                f"{path}:{lineno}: engine.{subpackage} must not import loraplex.engine.{parts[2]}"
            )


def test_every_layer_has_a_package_docstring() -> None:
    for init in PACKAGE.glob("*/__init__.py"):
        tree = ast.parse(init.read_text())
        assert ast.get_docstring(tree), f"{init} needs a docstring saying what the layer owns"
