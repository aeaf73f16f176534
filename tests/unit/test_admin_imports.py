"""The composition root is imported by nobody it imports: the admin package gets what it needs
from an AdminContext the service builds, and knows nothing of the service (no import cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module name -> the ``app`` modules it imports anywhere (function bodies and
    ``TYPE_CHECKING`` blocks included), with their parent packages."""
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [
                    f"{node.module}.{a.name}"
                    if f"{node.module}.{a.name}" in modules
                    else node.module
                    for a in node.names
                ]
            for target in targets:
                parts = target.split(".")
                found.update(
                    ".".join(parts[:i])
                    for i in range(1, len(parts) + 1)
                    if ".".join(parts[:i]) in modules
                )
        found.discard(name)
        graph[name] = found
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def test_nothing_the_service_imports_imports_the_service() -> None:
    graph = import_graph(APP)
    assert "app.service" in graph
    back = sorted(m for m in reachable(graph, "app.service") if "app.service" in graph[m])
    assert back == [], f"import cycles through app.service: {back}"


def test_the_admin_package_imports_nothing_of_the_service() -> None:
    graph = import_graph(APP)
    admin = [m for m in graph if m == "app.admin" or m.startswith("app.admin.")]
    assert "app.admin.context" in admin
    for module in admin:
        assert "app.service" not in reachable(graph, module), module
