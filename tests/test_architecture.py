"""The package's shape: its modules import each other without cycles, none is too long,
and every package imports first in a fresh interpreter.

**The import graph.**  Every module of ``twodg_pyro`` (a package's ``__init__`` is the
node named after the package) is read with :mod:`ast`; an edge ``a -> b`` is an import of
``b`` by ``a`` -- at the top of the module **or inside a function** (a lazy import is
still a dependency: it runs on the first call, and a cycle through it only moves the
failure from import time to call time).  ``from p import n`` is an edge to the module
``p.n`` when ``n`` is one, else to ``p``.  Imports under ``if TYPE_CHECKING:`` are not
edges (they never run; they name types for annotations).  Importing ``p.m`` is an edge
to ``p.m``, not to the package ``p``: a package ``__init__`` that re-exports its
modules is a facade, and the dependency is on the module named -- whether the package
facades themselves import in any order is what :func:`test_every_package_imports_first`
checks, by running it.  The package's lazy public names (``twodg_pyro._EXPORTS``,
loaded on first use by its ``__getattr__``) are edges of the node ``twodg_pyro``.

**The package graph.**  Collapsing every module to its sub-package (its first two dotted
parts: ``twodg_pyro.guides.rank1`` is ``twodg_pyro.guides``; a root-level module such as
``twodg_pyro.bnn`` is its own node, and the facade ``twodg_pyro`` is the top, which no
package may import) gives the layers; they import only downwards, so that graph has no
cycle either (:func:`test_the_package_graph_has_no_cycles`).  Roughly, bottom to top:
``models`` < ``files`` (atomic I/O, checksums, the payload container, the checkpoint
file) < the root-level core (``rng``, ``nn``, ``priors``, ``likelihoods``, ``model``,
``guide``, ``prediction``) < ``infer`` < ``sharing`` < ``guides`` < ``io`` <
``diagnostics`` < ``pipeline`` < ``cli``.  Type-only imports are no edges there, but no
two modules may import each other even so (:func:`test_no_circle_of_any_kind`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import twodg_pyro

PACKAGE = Path(twodg_pyro.__file__).parent
ROOT = "twodg_pyro"
MODELS = "twodg_pyro.models"

MAX_LINES = 450


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_package)
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    """``{module: {modules it imports}}`` within ``twodg_pyro`` (see the module docstring);
    ``type_only=True`` counts the imports under ``if TYPE_CHECKING:`` too."""
    modules = _modules()

    def known(name: str) -> str | None:
        if name == MODELS or name.startswith(MODELS + "."):
            return MODELS  # the repository's models/ folder, installed as a sub-package
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    graph[MODELS] = set()  # imports nothing of the library (test_models_is_a_leaf)
    for mod, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        skip = set() if type_only else _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == ROOT]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = mod.split(".") if is_package else mod.split(".")[:-1]
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                    if base.split(".")[0] != ROOT:
                        continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for t in targets:
                t = known(t)
                if t is not None and t != mod:
                    graph[mod].add(t)
    # the package's lazy public names (PEP 562) import their modules on first use
    graph[ROOT] |= {known(m) for m in twodg_pyro._EXPORTS.values()}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    limit = sys.getrecursionlimit()  # restored: a raised limit outlives the test in its
    sys.setrecursionlimit(max(10_000, limit))  # worker (a deep YAML test then took 11 s)
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def test_the_import_graph_has_no_cycles():
    graph = import_graph()
    assert len(graph) > 60  # every module was read
    # the graph sees lazy imports: model_file imports compact inside a function
    assert "twodg_pyro.io.compact" in graph["twodg_pyro.io.model_file"]
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(
        " <-> ".join(c) + " (" + ", ".join(f"{a} -> {sorted(graph[a] & set(c))}" for a in c) + ")"
        for c in found
    )


def test_models_is_a_leaf():
    """``models/`` (installed as ``twodg_pyro.models``) imports nothing of the library: the
    architectures are plain torch modules that any layer may build."""
    folder = PACKAGE.parent / "models"
    for path in folder.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert (node.module or "").split(".")[0] != ROOT, (path.name, node.module)
            if isinstance(node, ast.ImportFrom) and node.level > 1:
                raise AssertionError(f"{path.name} imports above models/: {ast.unparse(node)}")


def test_the_public_names_resolve():
    """``import twodg_pyro as tp`` gives the working surface (PEP 562 lazy names)."""
    names = set(twodg_pyro.__all__)
    assert names == set(twodg_pyro._EXPORTS)
    assert {"BNNModel", "MeanFieldGuide", "SharedGMMGuide", "fit", "predict"} <= names
    assert 15 <= len(names) <= 24
    for name in sorted(names):
        value = getattr(twodg_pyro, name)
        assert value.__name__ == name and value.__module__ == twodg_pyro._EXPORTS[name], name
    assert names <= set(dir(twodg_pyro))
    try:
        twodg_pyro.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


#: Package edges ``(module, imported module)`` allowed for now, each with the reason;
#: the test fails once one is gone, so that the exception is dropped with it.
ALLOWED_PACKAGE_EDGES: dict[tuple[str, str], str] = {}
#: Cycles through type-only imports allowed for now (sorted modules), with the reason.
TYPE_ONLY_CYCLES: dict[tuple[str, ...], str] = {}


def package_of(module: str) -> str:
    """A module's node in the package graph: its first two dotted parts (the sub-package,
    or the root-level module itself; the facade is ``twodg_pyro``)."""
    return ".".join(module.split(".")[:2])


def package_graph(
    graph: dict[str, set[str]],
) -> tuple[dict[str, set[str]], dict[tuple[str, str], list[tuple[str, str]]]]:
    """The module graph collapsed to packages: ``({package: {packages}}, {(package,
    package): [(module, module), ...]})``, the second naming the imports behind each edge."""
    packages: dict[str, set[str]] = {package_of(m): set() for m in graph}
    edges: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for a, deps in graph.items():
        for b in deps:
            pa, pb = package_of(a), package_of(b)
            if pa != pb:
                packages[pa].add(pb)
                edges.setdefault((pa, pb), []).append((a, b))
    return packages, edges


def package_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each package-level loop of the module ``graph``, as its packages and the imports
    that close it (empty: the packages form layers)."""
    packages, edges = package_graph(graph)
    out = []
    for loop in cycles(packages):
        inside = [
            f"{pa} -> {pb} ({', '.join(f'{a} -> {b}' for a, b in sorted(edges[pa, pb]))})"
            for pa in loop
            for pb in sorted(packages[pa] & set(loop))
        ]
        out.append(" <-> ".join(loop) + ": " + "; ".join(inside))
    return out


def test_the_package_graph_has_no_cycles():
    """The packages are layers: collapsed to packages, the import graph (function-local
    imports included, type-only ones not) has no cycle."""
    graph = import_graph()
    for (a, b), why in ALLOWED_PACKAGE_EDGES.items():
        assert b in graph[a], f"{a} -> {b} is gone: drop it from ALLOWED_PACKAGE_EDGES ({why})"
        graph[a].discard(b)
    found = package_cycles(graph)
    assert not found, "package import loops: " + " | ".join(found)
    # the layers the module docstring names
    packages, _ = package_graph(graph)
    assert packages["twodg_pyro.files"] <= {MODELS}, packages["twodg_pyro.files"]
    assert ROOT not in set().union(*packages.values())  # the facade is the top


def test_the_package_check_finds_loops():
    """A loop between packages whose modules form no cycle is found, naming its imports."""
    graph = {
        "r.a.x": {"r.b.y"},
        "r.b.y": set(),
        "r.b.z": {"r.a.w"},
        "r.a.w": set(),
        "r.c": {"r.a.x"},  # a root-level module: its own node, importing down only
    }
    assert cycles(graph) == []
    assert package_cycles(graph) == [
        "r.a <-> r.b: r.a -> r.b (r.a.x -> r.b.y); r.b -> r.a (r.b.z -> r.a.w)"
    ]
    assert package_cycles({"r.a.x": {"r.b.y"}, "r.b.y": {"r.c"}, "r.c": set()}) == []


def test_no_circle_of_any_kind():
    """Type-only imports (``if TYPE_CHECKING:``) close no circle between modules either."""
    graph = import_graph(type_only=True)
    found = {tuple(c): c for c in cycles(graph)}
    for known, why in TYPE_ONLY_CYCLES.items():
        assert known in found, f"{known} is gone: drop it from TYPE_ONLY_CYCLES ({why})"
    new = [c for k, c in found.items() if k not in TYPE_ONLY_CYCLES]
    assert not new, "import circles (type-only imports counted): " + "; ".join(
        " <-> ".join(c) + " (" + ", ".join(f"{a} -> {sorted(graph[a] & set(c))}" for a in c) + ")"
        for c in new
    )


def test_lower_layers_do_not_import_higher_ones():
    """``distributed``, ``infer`` and ``io`` never import the pipeline; inference sees the
    guides only through their protocol (``twodg_pyro.guide``), not the families."""
    graph = import_graph()

    def imports(prefix: str, target: str) -> list[tuple[str, str]]:
        return [
            (m, d)
            for m, deps in graph.items()
            if m.startswith(prefix)
            for d in deps
            if d == target or d.startswith(target + ".")
        ]

    for lower in ("twodg_pyro.distributed", "twodg_pyro.infer", "twodg_pyro.io"):
        assert not imports(lower, "twodg_pyro.pipeline"), lower
    assert not imports("twodg_pyro.infer", "twodg_pyro.guides")
    assert not imports("twodg_pyro.infer", "twodg_pyro.sharing")
    assert not imports("twodg_pyro.files.checkpoint", "twodg_pyro.infer")
    # the 2DG method's settings live with the method (issue 33), not in the application
    assert not imports("twodg_pyro.sharing", "twodg_pyro.pipeline")
    assert not imports("twodg_pyro.settings", "twodg_pyro")


def test_the_2dg_settings_are_the_methods_and_the_pipeline_reuses_them():
    import twodg_pyro.pipeline as pipeline
    import twodg_pyro.sharing as sharing
    from twodg_pyro.pipeline.settings.config import RunConfig
    from twodg_pyro.settings import ConfigError

    assert twodg_pyro.SharingConfig is sharing.SharingConfig is pipeline.SharingConfig
    assert sharing.SharingConfig.__module__ == "twodg_pyro.sharing.config"
    assert type(RunConfig().sharing) is sharing.SharingConfig
    assert pipeline.ConfigError is ConfigError


def test_no_module_is_too_long():
    long = {}
    for mod, (path, _) in _modules().items():
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            long[mod] = n
    assert not long, f"modules above {MAX_LINES} lines: {long}"


def test_every_package_imports_first():
    """Each package (and the modules that are entry points) imported first, in a fresh
    interpreter: the facades' import order holds whatever is imported first."""
    firsts = sorted(m for m, (_, is_package) in _modules().items() if is_package and m != ROOT) + [
        "twodg_pyro.guide",
        "twodg_pyro.cli",
        "twodg_pyro.sharing.hooks",
    ]
    code = (
        "import importlib, sys\n"
        f"for name in {firsts!r}:\n"
        "    for m in [m for m in sys.modules if m.split('.')[0] == 'twodg_pyro']:\n"
        "        del sys.modules[m]\n"
        "    importlib.import_module(name)\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_library_size_counts_docstrings_and_blank_lines(tmp_path):
    """``benchmarks/library_size.py`` (the figures of issue 22's size limit): a module's,
    a class's and a function's docstrings are counted whole, blank lines apart, and the
    package total is the sum of its files' lines."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "library_size", PACKAGE.parent / "benchmarks" / "library_size.py"
    )
    size = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(size)
    f = tmp_path / "m.py"
    f.write_text(
        '"""Two\nlines."""\n\n\nclass A:\n    """One."""\n\n    def f(self):\n'
        '        x = "not a docstring"\n        return x\n'
    )
    assert size.count(f) == {"lines": 10, "docstrings": 3, "blank": 3}
    rows = size.library_size()
    lines = sum(len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py"))
    assert rows["total"]["lines"] == lines
    assert sum(r["lines"] for k, r in rows.items() if k != "total") == lines


#: the pipeline's layers, bottom to top: a layer imports only the layers below it
PIPELINE_LAYERS = ("settings", "outputs", "methods", "runtime")


def test_the_pipeline_is_in_layers_its_folders_show():
    """``twodg_pyro.pipeline``'s folders are its layers: the settings (imported by every
    other layer, importing none), what a run writes and measures of its trained methods,
    the methods (one module each), and the run around them; a layer imports only those
    below it (type-only imports aside), and every module of the pipeline is in one."""
    graph = import_graph()
    prefix = "twodg_pyro.pipeline."
    modules = [m for m in graph if m.startswith(prefix)]
    layer = {m: m[len(prefix) :].split(".")[0] for m in modules}
    assert set(layer.values()) == set(PIPELINE_LAYERS), sorted(set(layer.values()))
    upward = [
        (a, b)
        for a in modules
        for b in graph[a]
        if b in layer and PIPELINE_LAYERS.index(layer[b]) > PIPELINE_LAYERS.index(layer[a])
    ]
    assert upward == []
