"""pytest plugin entry point (chronq_replay): collects replay-scenario folders as tests.

A folder with an `in.yaml` becomes one test when it or an ancestor holds `replay.toml` naming the
component (`handler = "module:factory"`, or a service of a services file: `services = "services.yaml"`
with `service = "NAME"`, whose factory is called with the service's `config` as in production;
optional `pythonpath = "relative/dir"` added to sys.path, optional `interfaces = ["module:Protocol", ...]`
for a handler that does not declare the Protocols whose methods the scenarios may call).
`pytest --rpc-regenerate` rewrites each scenario's `out.yaml` from the actual outputs.

Loaded into every pytest run through the entry point, so it imports nothing heavy until it finds a
scenario.
"""

from __future__ import annotations

import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CONFIG = "replay.toml"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--rpc-regenerate",
        action="store_true",
        default=False,
        help="rewrite replay scenarios' out.yaml from the actual outputs",
    )


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.name != "in.yaml" or _config_file(file_path.parent) is None:
        return None
    return ScenarioFile.from_parent(parent, path=file_path)


def _config_file(folder: Path) -> Path | None:
    for d in (folder, *folder.parents):
        candidate = d / CONFIG
        if candidate.is_file():
            return candidate
    return None


def load_factory(config: Path) -> Callable[..., object]:
    """The handler factory named by a `replay.toml`: its `handler`, or its `service` of the services
    file `services` (relative to the toml) with that service's `config` bound."""
    settings = tomllib.loads(config.read_text())
    if "services" in settings:
        return _service_factory(config, settings)
    target = settings.get("handler")
    if not isinstance(target, str) or ":" not in target:
        raise ValueError(f"{config}: `handler = \"module:factory\"` (or `services` and `service`) "
                         "is required")
    _add_pythonpath(config, settings)
    from chronq.plugins import load_object  # (not at import: pytest loads this plugin in every run)

    factory: Callable[..., object] = load_object(target, f"{config}: handler")
    return factory


def _service_factory(config: Path, settings: dict[str, Any]) -> Callable[..., object]:
    import functools

    from rpc.services.config import load_services  # (not at import: pytest loads this plugin in every run)

    file, name = settings.get("services"), settings.get("service")
    if not isinstance(file, str) or not isinstance(name, str):
        raise ValueError(f"{config}: `services = \"services.yaml\"` needs `service = \"NAME\"`")
    _add_pythonpath(config, settings)
    services = load_services(config.parent / file)
    if name not in services.services:
        raise ValueError(f"{config}: service {name!r} is not in {services.file} "
                         f"({', '.join(services.services)})")
    spec = services.services[name]
    return functools.partial(spec.load_factory(), **spec.config)


def load_interfaces(config: Path) -> list[type]:
    """The Protocols a `replay.toml` names in `interfaces` (none: the handler's own)."""
    settings = tomllib.loads(config.read_text())
    names = settings.get("interfaces", [])
    if not isinstance(names, list) or not all(isinstance(n, str) and ":" in n for n in names):
        raise ValueError(f"{config}: `interfaces` is a list of \"module:Protocol\" names")
    _add_pythonpath(config, settings)
    from chronq.plugins import load_object

    return [load_object(n, f"{config}: interfaces") for n in names]


def _add_pythonpath(config: Path, settings: dict[str, Any]) -> None:
    extra = settings.get("pythonpath")
    if isinstance(extra, str):
        path = str((config.parent / extra).resolve())
        if path not in sys.path:
            sys.path.insert(0, path)


class ScenarioFile(pytest.File):
    def collect(self) -> list[pytest.Item]:
        return [ScenarioItem.from_parent(self, name=self.path.parent.name)]


class ScenarioItem(pytest.Item):
    def runtest(self) -> None:
        from rpc.testing import YamlTester

        config = _config_file(self.path.parent)
        assert config is not None
        tester = YamlTester(load_factory(config), interfaces=load_interfaces(config))
        regenerate = bool(self.config.getoption("--rpc-regenerate"))
        tester.check(self.path.parent, regenerate=regenerate)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, AssertionError):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, f"replay scenario {self.path.parent.name}"


__all__ = [
    "ScenarioFile",
    "ScenarioItem",
    "load_factory",
    "load_interfaces",
    "pytest_addoption",
    "pytest_collect_file",
]
