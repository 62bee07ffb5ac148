"""The build lists every package of the tree, constraints.txt pins every dependency, the protocol code is current."""

from __future__ import annotations

import filecmp
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_directory_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapping = config["package-dir"]
    found = set()
    for name, rel in mapping.items():
        base = ROOT / rel
        for init in base.rglob("__init__.py"):
            if ".venv" in init.parts:
                continue
            parts = init.parent.relative_to(base).parts
            found.add(".".join((name, *parts)) if parts else name)
    assert found <= listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_generated_protos_are_up_to_date(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "protos" / "generate.py"), str(tmp_path)], check=True)
    committed = ROOT / "protos" / "streamtx" / "v1"
    for generated in (tmp_path / "streamtx" / "v1").iterdir():
        assert filecmp.cmp(generated, committed / generated.name, shallow=False), (
            f"{generated.name} is stale: run python protos/generate.py"
        )


def test_constraints_pin_every_dependency_within_its_range():
    """The set-up command installs with constraints.txt: a dependency it does not pin would float."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    wanted += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[name.lower().replace("_", "-")] = version
    for req in wanted:
        version = pins.get(req.name.lower().replace("_", "-"))
        assert version is not None, f"constraints.txt does not pin {req.name}"
        assert req.specifier.contains(version), f"constraints.txt pins {req.name}=={version}, outside {req.specifier}"
