"""The distribution ships every package folder, and claims no generic top-level name."""

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _declared() -> tuple[list[str], dict[str, str]]:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return conf["packages"], conf["package-dir"]


def test_every_package_folder_is_declared():
    packages, _ = _declared()
    on_disk = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "twodg_pyro").rglob("__init__.py")
    }
    on_disk.add("twodg_pyro.models")  # models/ is installed under twodg_pyro
    assert set(packages) == on_disk


def test_only_twodg_pyro_is_a_top_level_name():
    packages, package_dir = _declared()
    assert {p.split(".")[0] for p in packages} == {"twodg_pyro"}
    assert package_dir["twodg_pyro.models"] == "models"
    assert (ROOT / "models" / "__init__.py").exists()


def test_the_version_has_one_home():
    """``twodg_pyro/_version.py`` (a leaf: no import) holds the version; the package
    re-exports it and pyproject.toml reads it from there."""
    import twodg_pyro
    from twodg_pyro import _version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "twodg_pyro._version.__version__"
    assert twodg_pyro.__version__ == _version.__version__
    tree = ast.parse(Path(_version.__file__).read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
