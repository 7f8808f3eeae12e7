"""The install: every folder of the import package is in pyproject.toml's package list, so a
wheel (`pip install .`, not only an editable install) carries it."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_subpackage_is_listed():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for package, folder in setup["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((package, *parts)))
    # A folder listed in package-dir is its own package, not a subpackage of another.
    assert found - set(setup["package-dir"]) <= set(setup["packages"]), (
        f"not in [tool.setuptools] packages: {sorted(found - set(setup['packages']))}")
    assert set(setup["packages"]) <= found
