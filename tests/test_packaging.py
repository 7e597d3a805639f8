"""The distribution ships every package folder, and claims no generic top-level name."""

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
