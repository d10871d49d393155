"""The package's shape, checked against its documentation: the layer table of
docs/architecture.md (no import goes up a layer, no circle of imports), the mode registry
== the modes the docs list, no comparison with a mode, placement or consistency name outside
the catalogue (``pshybrid.registry``), size limits that keep modules readable (the package's
and bench/'s), and a product that cites nothing outside the repository."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "pshybrid"


def layer_table() -> dict[str, int]:
    """{module: layer} from the table in docs/architecture.md (``| N | `a`, `b` | ...``)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    layers = {}
    for m in re.finditer(r"^\| (\d+) \| ([^|]+) \|", text, re.M):
        for name in re.findall(r"`([a-z_]+)`", m.group(2)):
            layers[name] = int(m.group(1))
    return layers


def module_name(path: pathlib.Path, pkg: pathlib.Path = PKG) -> str:
    """pshybrid/modes/step.py -> 'modes.step'; pshybrid/train.py -> 'train'."""
    parts = [p for p in path.relative_to(pkg).with_suffix("").parts if p != "__init__"]
    return ".".join(parts) or "__init__"


def imports(path: pathlib.Path, pkg: pathlib.Path = PKG) -> set[str]:
    """The package's modules that ``path`` imports (anywhere in it, lazy imports too)."""
    here = module_name(path, pkg).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = [*base, *(node.module.split(".") if node.module else [])]
                if node.module is None:  # from . import x, y: modules, or names of the package
                    for a in node.names:
                        sub = pkg.joinpath(*target, a.name)
                        is_mod = sub.with_suffix(".py").exists() or sub.is_dir()
                        out.add(".".join([*target, a.name] if is_mod else target) or "__init__")
                else:
                    out.add(".".join(target))
            elif node.module and node.module.split(".")[0] == pkg.name:
                out.add(node.module.removeprefix(pkg.name).lstrip(".") or "__init__")
        elif isinstance(node, ast.Import):
            out.update(a.name.removeprefix(pkg.name + ".") for a in node.names
                       if a.name.split(".")[0] == pkg.name and a.name != pkg.name)
    return {m for m in out if m}


def layer_of(mod: str, layers: dict) -> int:
    top = mod.split(".")[0]
    assert top in layers, f"module {mod} is missing from the layer table of docs/architecture.md"
    return layers[top]


def upward_imports(pkg: pathlib.Path, layers: dict) -> list[str]:
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        mod = module_name(path, pkg)
        for dep in sorted(imports(path, pkg)):
            if layer_of(dep, layers) > layer_of(mod, layers):
                bad.append(f"{mod} (layer {layer_of(mod, layers)}) imports {dep} "
                           f"(layer {layer_of(dep, layers)})")
    return bad


def find_cycle(pkg: pathlib.Path) -> list[str] | None:
    """One import cycle among the package's modules, or None."""
    graph = {module_name(p, pkg): imports(p, pkg) for p in sorted(pkg.rglob("*.py"))}
    graph = {m: {d for d in deps if d in graph} for m, deps in graph.items()}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return path[path.index(d):] + [d]
            if d not in state and (cycle := visit(d)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


def test_every_module_is_in_the_layer_table_and_imports_go_down():
    layers = layer_table()
    assert len(layers) > 10, "no layer table found in docs/architecture.md"
    bad = upward_imports(PKG, layers)
    assert not bad, "\n".join(bad)


def torch_importers(pkg: pathlib.Path) -> list[str]:
    """Modules outside ``pkg/torch`` that import torch (the core must run without it)."""
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        if path.relative_to(pkg).parts[0] == "torch":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            if any(n.split(".")[0] == "torch" for n in names):
                bad.append(f"{module_name(path, pkg)}: line {node.lineno}")
    return bad


def test_only_the_torch_package_imports_torch(tmp_path):
    assert (PKG / "torch" / "__init__.py").exists()
    bad = torch_importers(PKG)
    assert not bad, "torch imported outside pshybrid.torch: " + ", ".join(bad)
    pkg = tmp_path / "toy"  # the check finds a planted import, lazy or not
    (pkg / "torch").mkdir(parents=True)
    (pkg / "torch" / "__init__.py").write_text("import torch\n")
    (pkg / "core.py").write_text("def f():\n    from torch import nn\n")
    assert torch_importers(pkg) == ["core: line 2"]


def test_no_import_cycles():
    cycle = find_cycle(PKG)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_find_a_planted_violation(tmp_path):
    pkg = tmp_path / "toy"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from .high import g\n")  # lazy, still counted
    (pkg / "high.py").write_text("from . import low\nfrom .sub import leaf\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "leaf.py").write_text("from ..low import f\n")
    layers = {"__init__": 0, "low": 0, "high": 1, "sub": 1}
    assert imports(pkg / "sub" / "leaf.py", pkg) == {"low"}
    assert upward_imports(pkg, layers) == ["low (layer 0) imports high (layer 1)"]
    assert find_cycle(pkg) in (["high", "low", "high"], ["low", "high", "low"])
    (pkg / "low.py").write_text("")
    assert upward_imports(pkg, layers) == [] and find_cycle(pkg) is None


def private_imports(pkg: pathlib.Path) -> list[str]:
    """``from M import _name`` of a module of ``pkg`` (relative or absolute): another
    module's private name (dunders such as ``__version__`` are public)."""
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if not node.level and (node.module or "").split(".")[0] != pkg.name:
                continue  # a third-party module's names are its own business
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    bad.append(f"{module_name(path, pkg)}: line {node.lineno} imports "
                               f"{a.name} from {'.' * node.level}{node.module or ''}")
    return bad


def test_no_module_imports_another_modules_private_name(tmp_path):
    bad = private_imports(PKG)
    assert not bad, "import of a private name (make it public where it is the interface):\n" \
        + "\n".join(bad)
    pkg = tmp_path / "toy"  # the check finds a planted one, relative or absolute, lazy or not
    pkg.mkdir()
    (pkg / "a.py").write_text("def _f():\n    pass\n")
    (pkg / "b.py").write_text("from . import __doc__\ndef g():\n    from .a import _f\n")
    (pkg / "c.py").write_text("from toy.a import _f as f\nfrom os import _exit\n")
    assert private_imports(pkg) == ["b: line 3 imports _f from .a", "c: line 1 imports _f from toy.a"]


# The catalogue's names: modes (not ``auto``, which is also --progress's, --shared-memory's
# and --cuda-aware's value), their strategies, placements and consistencies.
CATALOGUE_NAMES = {"hybrid", "ps", "allreduce", "servers", "replicated", "chosen", "dedicated",
                   "colocated", "bsp", "asp"}
CATALOGUE = "registry"  # the one module that may compare them (the catalogue itself)


def _names_in(node) -> list[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [n.value for n in items if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and (n.value in CATALOGUE_NAMES or n.value.startswith("ssp"))]


def name_comparisons(pkg: pathlib.Path, allowed=(CATALOGUE,)) -> list[str]:
    """Comparisons (``==``, ``!=``, ``in``, ``not in``) with a mode, strategy, placement or
    consistency name outside the catalogue: they go through its predicates instead. The
    options' definitions (``choices=``, defaults) are not comparisons and stay where they are."""
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        mod = module_name(path, pkg)
        if mod in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                names = [n for x in (node.left, *node.comparators) for n in _names_in(x)]
                if names:
                    bad.append(f"{mod}: line {node.lineno} compares with {', '.join(names)}")
    return bad


def test_no_comparison_with_a_catalogue_name_outside_the_catalogue(tmp_path):
    bad = name_comparisons(PKG)
    assert not bad, "ask pshybrid.registry's predicates instead:\n" + "\n".join(bad)
    pkg = tmp_path / "toy"  # the check finds planted ones, in any position
    pkg.mkdir()
    (pkg / "registry.py").write_text("def f(m):\n    return m == 'ps'\n")
    (pkg / "a.py").write_text("def f(cfg):\n    return cfg.placement != 'colocated'\n"
                              "x = lambda m: m in ('hybrid', 'ps') or 'bsp' == m\n"
                              "y = lambda c: c not in {'ssp:1'} and c == 'auto'\n")
    assert name_comparisons(pkg) == ["a: line 2 compares with colocated",
                                     "a: line 3 compares with hybrid, ps",
                                     "a: line 3 compares with bsp",
                                     "a: line 4 compares with ssp:1"]


def oversized(root: pathlib.Path) -> list[str]:
    """Modules of ``root`` over 500 lines and functions over 60, as ``path: N lines``."""
    big = []
    for path in sorted(root.rglob("*.py")):
        src, name = path.read_text(), path.relative_to(root.parent).as_posix()
        if len(src.splitlines()) > 500:
            big.append(f"{name}: {len(src.splitlines())} lines")
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 60:
                    big.append(f"{name} {node.name}: {n} lines")
    return big


@pytest.mark.parametrize("root", ["pshybrid", "bench"])
def test_size_limits(root):
    big = oversized(ROOT / root)
    assert not big, "over 500 lines per module / 60 per function:\n" + "\n".join(big)


def test_size_check_finds_a_planted_violation(tmp_path):
    root = tmp_path / "bench"
    root.mkdir()
    (root / "long.py").write_text("def f():\n" + "    x = 1\n" * 60 + "\n" * 440)
    assert oversized(root) == ["bench/long.py: 501 lines", "bench/long.py f: 61 lines"]


def test_docs_list_exactly_the_registered_modes():
    from pshybrid.registry import MODES

    text = (ROOT / "docs" / "training.md").read_text()
    table = re.search(r"## Modes(?s:.*?)\n((?:\|.*\n)+)", text).group(1)  # its first table
    listed = re.findall(r"^\| `([a-z]+)` \|", table, re.M)
    assert listed == list(MODES), (listed, list(MODES))


@pytest.mark.parametrize("pattern", [r"DESIGN[ .]", r"STYLE[ .]", r"shared/"])
def test_product_cites_nothing_outside_the_repo(pattern):
    try:
        out = subprocess.run(["git", "grep", "-n", "-E", pattern, "--", "pshybrid", "docs",
                              "README.md", "jobs", "bench", "kernels", "setup.cfg"],
                             cwd=ROOT, capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if out.returncode == 128:
        pytest.skip("not a git checkout")
    assert out.stdout == "", out.stdout
