"""An installed distribution as pip leaves it, without pip: `<name>-<version>.dist-info` with
its METADATA and entry_points.txt in a folder that a test puts on sys.path, where
importlib.metadata (and so fedcare's entry points) finds it."""

from __future__ import annotations

from pathlib import Path


def fake_distribution(folder: Path, name: str, version: str, entry_points: dict[str, dict[str, str]]) -> Path:
    """Write distribution `name` `version` declaring `entry_points` ({group: {name: value}})
    into `folder`; returns `folder` (put it on sys.path)."""
    info = Path(folder) / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{key} = {value}\n" for key, value in points.items()) + "\n"
        for group, points in entry_points.items()))
    return Path(folder)


def write_package(folder: Path, name: str, modules: dict[str, str]) -> None:
    """Package `name` in `folder` with `modules` ({"__init__": source, "reader": source, ...})."""
    package = Path(folder) / name
    package.mkdir(parents=True, exist_ok=True)
    for module, source in modules.items():
        (package / f"{module}.py").write_text(source)
