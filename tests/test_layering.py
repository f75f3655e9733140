"""The import arrows point down the data path (sdk → collector → storage → attribution → API /
CLI): ingest never needs analysis, the CLI asks the API layer, and every subcommand is one module
of ``latscope/cmd/``, with the machinery it runs (the serve process, the collector's store, the
demo's traffic) in the package of that part.

Read from the source (every ``import`` statement, those inside functions too), so an import
added later in a function body counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from latscope.cli import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
#: Installed package name -> its folder in the repository (pyproject's package-dir).
FOLDERS = {
    "latscope.collector": ROOT / "collector",
    "latscope.attribution": ROOT / "attribution",
    "latscope.sdk": ROOT / "sdk",
    "latscope": ROOT / "latscope",
}


def _module_name(path: Path) -> str:
    for package, folder in FOLDERS.items():
        if path.is_relative_to(folder):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            return ".".join((package, *parts))
    raise AssertionError(path)


def imports(folder: Path) -> dict[str, set[str]]:
    """module -> every module it imports, for each ``.py`` file under ``folder``
    (``from x import y`` counts as ``x`` and ``x.y``: ``y`` may be a module)."""
    found: dict[str, set[str]] = {}
    for path in sorted(folder.rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        found[name] = targets
    return found


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def offending(folder: Path, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(
        f"{module} imports {target}"
        for module, targets in imports(folder).items()
        for target in targets
        if any(_under(target, f) for f in forbidden)
    )


def test_ingest_does_not_depend_on_analysis_or_the_surfaces() -> None:
    """The collector stores spans; what it shares with the attributor (the token figures) lives
    below both, in ``latscope.tokens``."""
    above = (
        "latscope.attribution", "latscope.api", "latscope.cmd", "latscope.cli",
        "latscope.serve", "latscope.demo", "latscope.mcp",
    )  # fmt: skip
    assert offending(FOLDERS["latscope.collector"], above) == []


def test_the_commands_ask_the_api_layer_not_the_answers() -> None:
    """A command reads answers through ``cmd/_source.py`` (the API or the API's query functions
    over a store); the figures it lays its output by (steps, burn windows) are in
    ``latscope.windows``, below both."""
    assert offending(ROOT / "latscope" / "cmd", ("latscope.attribution.answers",)) == []


def test_nothing_reaches_up_to_the_command_line() -> None:
    """``latscope.cli`` dispatches to the commands; nothing imports it back (the settings flags
    the process commands share are ``latscope.cmd._settings``)."""
    found = []
    for folder in FOLDERS.values():
        found += [
            line
            for line in offending(folder, ("latscope.cli",))
            if not line.startswith("latscope.cli ")
        ]
    assert found == []


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_is_a_module_of_latscope_cmd(command: str) -> None:
    module = COMMANDS[command]
    assert module.startswith("latscope.cmd."), module
    assert (ROOT / "latscope" / "cmd" / f"{module.rpartition('.')[2]}.py").is_file()


def test_no_command_outside_latscope_cmd() -> None:
    """The process parts (``latscope.serve``, ``latscope.collector``, ``latscope.demo``) hold
    no subcommand: no module outside ``latscope/cmd/`` defines ``add_arguments``."""
    found = []
    for folder in FOLDERS.values():
        for path in folder.rglob("*.py"):
            if path.is_relative_to(ROOT / "latscope" / "cmd"):
                continue
            tree = ast.parse(path.read_text(), str(path))
            if any(
                isinstance(node, ast.FunctionDef) and node.name == "add_arguments"
                for node in tree.body
            ):
                found.append(_module_name(path))
    assert sorted(found) == []
