"""The package keeps its shape: no import circle, reporting never needs the engine, every option in help()."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from dspy_agentgrad import AgentGrad
from dspy_agentgrad.config import AgentGradConfig

PACKAGE = Path(__file__).resolve().parent.parent / "dspy_agentgrad"


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (every import statement, TYPE_CHECKING ones included)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                found |= {f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {m for m in found if m in modules and m != name and not name.startswith(m + ".")}
    return graph


def test_no_module_imports_itself_back():
    graph = import_graph()
    state: dict[str, str] = {}
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for dep in sorted(graph[name]):
            if state.get(dep) == "open":
                cycles.append(path[path.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_the_core_never_imports_reporting_and_reporting_never_imports_the_engine():
    graph = import_graph()
    core = {n: deps for n, deps in graph.items() if n.startswith("dspy_agentgrad.core.")}
    assert core and not any(d.startswith("dspy_agentgrad.reporting") for deps in core.values() for d in deps)
    reporting = {n: deps for n, deps in graph.items() if n.startswith("dspy_agentgrad.reporting.")}
    assert reporting and not any("dspy_agentgrad.core.engine" in deps for deps in reporting.values())


def test_agentgrad_takes_few_keywords_and_its_help_names_every_option():
    params = inspect.signature(AgentGrad).parameters
    assert list(params)[0] == "metric" and len(params) <= 22
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in list(params.values())[1:])
    for name in AgentGradConfig().options():
        assert re.search(rf"\b{name}\b", AgentGrad.__doc__), name
