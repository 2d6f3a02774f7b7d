"""The shape of the code itself: an engine whose modules import one another
without circles, none too long to read in one sitting, and a core that
imports no web framework, torch or redis at its top."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("streamer_core", "flask_streamer", "django_streamer")
#: The most lines a module may have: read in one sitting.
MOST_LINES = 600


def modules() -> Dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports_of(name: str, path: Path, known: Dict[str, Path]) -> Set[str]:
    """The project modules ``name`` imports, anywhere in it (inside functions too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            # "from . import x" and "from package import x" name the submodule x;
            # "from .m import x" the module m.
            names = [f"{base}.{alias.name}" for alias in node.names]
            targets = names + ([base] if node.module and not all(n in known for n in names) else [])
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def circles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Every group of modules that import one another, round (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                group.append(other)
                if other == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_round_a_circle():
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    assert graph["streamer_core.batching.scheduler"] >= {
        "streamer_core.options.config",
        "streamer_core.batching.former",
    }, "the graph is read"
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_is_too_long_to_read_in_one_sitting():
    lengths = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    assert {name: n for name, n in lengths.items() if n > MOST_LINES} == {}


def test_every_package_opens_with_a_docstring_saying_what_it_holds():
    for name, path in modules().items():
        if path.name == "__init__.py" and "management" not in name:
            assert ast.get_docstring(ast.parse(path.read_text())), f"{name} has no docstring"


def test_the_engine_starts_its_threads_through_one_helper():
    """Every thread streamer_core starts leaves the process's signals to its
    main thread (streamer_core.threads.background): none is made elsewhere.
    demo.py's threads are the demo's callers, not the engine's."""
    makers = {}
    for name, path in modules().items():
        if name.startswith("streamer_core") and name not in ("streamer_core.threads", "streamer_core.demo"):
            text = path.read_text()
            if "threading.Thread(" in text or "start_new_thread(target" in text:
                makers[name] = path
    assert makers == {}


#: The most lines a class may have, from its ``class`` line to its last.
MOST_CLASS_LINES = 300
#: The most modules directly in streamer_core: more and a newcomer cannot
#: tell from the tree where a batch is formed or a metric kept (rooms instead).
MOST_TOP_MODULES = 15
#: The most lines of the two web layers' entry modules together.
MOST_ENTRY_LINES = 850


def package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def test_no_class_is_too_long_to_read_in_one_sitting():
    long = {}
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MOST_CLASS_LINES:
                long[f"{name}.{node.name}"] = node.end_lineno - node.lineno + 1
    assert long == {}


def test_the_engine_keeps_its_modules_in_rooms():
    top = sorted(path.name for path in (ROOT / "streamer_core").glob("*.py"))
    assert "streamer.py" in top, "the tree is read"
    assert len(top) <= MOST_TOP_MODULES, f"{len(top)} modules directly in streamer_core: {top}"
    for room in ("batching", "telemetry", "options", "backends", "web"):
        assert (ROOT / "streamer_core" / room / "__init__.py").is_file(), room


def test_the_web_layers_entry_modules_stay_short():
    lines = sum(
        len((ROOT / path).read_text().splitlines())
        for path in ("flask_streamer/extension.py", "django_streamer/views.py")
    )
    assert lines <= MOST_ENTRY_LINES


def private_reaches(known: Dict[str, Path]) -> List[str]:
    """Each place a module uses a private name (one leading underscore) of a
    project module in another package: imported by name, or read as an
    attribute of a module it imported."""
    found = []
    for name, path in known.items():
        package = package_of(name, path)
        tree = ast.parse(path.read_text())
        modules_bound: Dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in known:  # "from package import module"
                        modules_bound[alias.asname or alias.name] = full
                    elif base in known and _private(alias.name) and package_of(base, known[base]) != package:
                        found.append(f"{name} imports {base}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in known and alias.asname:
                        modules_bound[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in modules_bound
                and _private(node.attr)
            ):
                target = modules_bound[node.value.id]
                if package_of(target, known[target]) != package:
                    found.append(f"{name} reads {target}.{node.attr}")
    return sorted(set(found))


def _private(attribute: str) -> bool:
    return attribute.startswith("_") and not attribute.startswith("__")


def test_no_module_reaches_another_packages_private_names():
    assert private_reaches(modules()) == []


def test_the_private_name_finder_finds_one(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "m.py").write_text("_hidden = 1\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "n.py").write_text("from a.m import _hidden\nfrom a import m\nprint(m._hidden)\n")
    (tmp_path / "a" / "k.py").write_text("from a.m import _hidden\n")  # the same package may
    known = {"a.m": tmp_path / "a" / "m.py", "b.n": tmp_path / "b" / "n.py", "a.k": tmp_path / "a" / "k.py"}
    assert private_reaches(known) == ["b.n imports a.m._hidden", "b.n reads a.m._hidden"]
