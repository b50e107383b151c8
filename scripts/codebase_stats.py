"""Size and shape of the tree: what issue 29 measures before and after a clean-up.

    python scripts/codebase_stats.py [--repo DIR] [--json]

Prints README lines; `Any` per top-level package of `loraplex/` (the name as a word in code);
Python lines and files under `benchmarks/`; import cycles among `loraplex/` and `benchmarks/`
modules (imports under `TYPE_CHECKING` count: they are a dependency all the same); modules over
450 lines; functions over 40 lines (from `def` to the function's last line, docstring included).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import sys
import tokenize
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

MODULE_LIMIT = 450
FUNCTION_LIMIT = 40


def python_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "results" not in p.parts)


def module_name(repo: Path, path: Path) -> str:
    parts = path.relative_to(repo).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def any_count(source: str) -> int:
    """`Any` as a name token (not in strings or comments)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return sum(1 for tok in tokens if tok.type == tokenize.NAME and tok.string == "Any")


def imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def long_functions(tree: ast.AST) -> list[tuple[str, int]]:
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno
            and node.end_lineno - node.lineno + 1 > FUNCTION_LIMIT]


def stats(repo: Path) -> dict[str, Any]:
    any_per_package: Counter[str] = Counter()
    graph: dict[str, set[str]] = defaultdict(set)
    big_modules: dict[str, int] = {}
    functions: dict[str, list[tuple[str, int]]] = {}
    parsed = {}
    for top in ("loraplex", "benchmarks"):
        for path in python_files(repo / top):
            source = path.read_text()
            parsed[module_name(repo, path)] = (path, source, ast.parse(source))
    for module, (path, source, tree) in parsed.items():
        rel = str(path.relative_to(repo))
        lines = source.count("\n")
        if module.startswith("loraplex"):
            parts = path.relative_to(repo / "loraplex").parts
            any_per_package[parts[0] if len(parts) > 1 else "(top)"] += any_count(source)
            if lines > MODULE_LIMIT:
                big_modules[rel] = lines
            if long := long_functions(tree):
                functions[rel] = long
        targets = imports(tree, module, path.name == "__init__.py")
        graph[module] |= {t for t in targets if t in parsed and t != module}
    bench = python_files(repo / "benchmarks")
    readme = repo / "README.md"
    return {
        "readme_lines": readme.read_text().count("\n") if readme.exists() else 0,
        "any_per_package": dict(sorted(any_per_package.items())),
        "any_total": sum(any_per_package.values()),
        "benchmarks_lines": sum(p.read_text().count("\n") for p in bench),
        "benchmarks_files": len(bench),
        "import_cycles": cycles(graph),
        "modules_over_450": big_modules,
        "functions_over_40": sum(len(v) for v in functions.values()),
        "functions_over_40_by_file": functions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--json", action="store_true", help="print everything as JSON")
    args = parser.parse_args()
    result = stats(args.repo)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for key, value in result.items():
        if key != "functions_over_40_by_file":
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
