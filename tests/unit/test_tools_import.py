"""Every tool module under tests/ imports: the benchmarks, the reliability checkers, the
demo and the harness run as `python -m …`, outside pytest's collection, so a stale import
there (left by a package move) would otherwise surface only when someone next runs one."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

TOOLS = ("tests.benchmarks", "tests.reliability", "tests.e2e", "tests.support")


def tool_modules() -> list[str]:
    names = []
    for package in TOOLS:
        module = importlib.import_module(package)
        for info in pkgutil.walk_packages(module.__path__, package + "."):
            if not info.name.rsplit(".", 1)[-1].startswith(("test_", "conftest")):
                names.append(info.name)
    return sorted(names)


def test_the_tool_packages_hold_modules() -> None:
    assert "tests.benchmarks.plain_client" in tool_modules()


@pytest.mark.parametrize("name", tool_modules())
def test_a_tool_module_imports(name: str) -> None:
    importlib.import_module(name)
