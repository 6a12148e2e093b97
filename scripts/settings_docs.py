#!/usr/bin/env python3
"""Write the docs' settings tables from the settings' own declarations; ``--check`` only checks.

Every ``TUNECACHE_*`` variable is described once, where it is declared: a field of the
service's ``Settings`` or the pods' ``ClientSettings`` (pydantic-settings, ``Field(description=...)``),
or an entry of a declared table of variables read outside those classes (``NODE_VARIABLES``,
``POD_VARIABLES``, the hand-off tables, ``tests.support.environment.DEVELOPMENT_VARIABLES``),
each a pydantic ``FieldInfo`` too. This script renders them as Markdown tables between marker
comments in the docs::

    <!-- settings-table NAME (made by scripts/settings_docs.py from the declarations: edit those) -->
    ...
    <!-- /settings-table -->

    python scripts/settings_docs.py          # rewrite the tables
    python scripts/settings_docs.py --check  # exit 1 naming each file whose tables are out of date

A default the table cannot print from the declaration (a default factory, "unset" meaning
something) is the field's ``json_schema_extra["shown_default"]``; the values a variable takes
come from its type and constraints (``gt``, ``le``, ...), or ``json_schema_extra["accepted"]``
for a declared entry that has no type.
"""

from __future__ import annotations

import argparse
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path

from annotated_types import Ge, Gt, Le, Lt, MaxLen
from pydantic import SecretStr
from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tests.support.environment, run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from tests.support.environment import DEVELOPMENT_VARIABLES  # noqa: E402
from tunecache.client.settings import POD_HANDOFF_VARIABLES, POD_VARIABLES, ClientSettings  # noqa: E402
from tunecache.service.settings import (  # noqa: E402
    NODE_VARIABLES,
    RENAMED_VARIABLES,
    RETIRED_VARIABLES,
    TUNER_HANDOFF_VARIABLES,
    Settings,
)

MARKER = re.compile(r"(<!-- settings-table (?P<name>[a-z-]+) [^>]*-->\n)(?P<body>.*?)(<!-- /settings-table -->)", re.S)
#: Booleans as pydantic reads them, said once above each table that has any.
BOOLEANS = "`1`/`0`, `true`/`false`, `on`/`off`, `yes`/`no`"


@dataclass(frozen=True)
class Table:
    """One table: its variables (name -> declaration) and its column headings."""

    variables: dict[str, FieldInfo]
    headings: tuple[str, ...] = ("variable", "default", "accepted", "meaning")


def _fields(model) -> dict[str, FieldInfo]:
    return {f"TUNECACHE_{name.upper()}": field for name, field in model.model_fields.items()}


def _old_names() -> dict[str, str]:
    """New variable -> its old name, still read (the service's renamed settings)."""
    return {f"TUNECACHE_{field.upper()}": old for field, old in RENAMED_VARIABLES.items()}


#: Each table by the name its markers give it.
TABLES: dict[str, Table] = {
    "service": Table({**_fields(Settings), **NODE_VARIABLES}),
    "tuner-handoff": Table(TUNER_HANDOFF_VARIABLES, ("variable", "set to", "read by")),
    "pod": Table({**_fields(ClientSettings), **POD_VARIABLES}),
    "pod-handoff": Table(POD_HANDOFF_VARIABLES, ("variable", "set to", "read by")),
    "development": Table(DEVELOPMENT_VARIABLES, ("variable", "default", "meaning")),
}
#: The files that hold the tables (each table in exactly one).
DOCUMENTS = ("README.md", "docs/operator-guide.md", "docs/pods.md")


def declared_variables() -> set[str]:
    """Every declared variable, old names of renamed ones and retired ones included."""
    return ({name for table in TABLES.values() for name in table.variables} | set(_old_names().values())
            | set(RETIRED_VARIABLES))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _number(value: float) -> str:
    value = int(value) if float(value).is_integer() else value
    return f"{value:,}" if isinstance(value, int) and abs(value) >= 100_000 else str(value)


def _shown_default(name: str, field: FieldInfo) -> str:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "shown_default" in extra:
        return str(extra["shown_default"])
    if field.default_factory is not None:
        raise ValueError(f"{name}: a default factory needs json_schema_extra['shown_default']")
    value = field.default
    if value is None:
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, (int, float)):
        shown = f"`{int(value) if float(value).is_integer() else value}`"
        if name.endswith("_BYTES") and isinstance(value, int):
            for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
                if value >= size and value % size == 0:
                    return f"{shown} ({value // size} {unit})"
        return shown
    return f"`{value}`"


def _kind(field: FieldInfo) -> str:
    """What sort of value a variable takes, from its annotation (or, without one, its default)."""
    annotation = field.annotation
    if annotation is None:
        return {bool: "boolean", int: "integer", float: "number"}.get(type(field.default), "")
    arguments = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(arguments) == 1:
        annotation = arguments[0]
    if typing.get_origin(annotation) is typing.Literal:
        return ", ".join(f"`{value}`" for value in typing.get_args(annotation))
    return {bool: "boolean", int: "integer", float: "number", Path: "path", str: "text", SecretStr: "text"}.get(
        annotation, str(annotation))


def _accepted(field: FieldInfo) -> str:
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "accepted" in extra:
        return str(extra["accepted"])
    bounds = []
    for constraint in field.metadata:
        if isinstance(constraint, Gt):
            bounds.append(f"> {_number(constraint.gt)}")
        elif isinstance(constraint, Ge):
            bounds.append(f"≥ {_number(constraint.ge)}")
        elif isinstance(constraint, Lt):
            bounds.append(f"< {_number(constraint.lt)}")
        elif isinstance(constraint, Le):
            bounds.append(f"≤ {_number(constraint.le)}")
        elif isinstance(constraint, MaxLen):
            bounds.append(f"at most {_number(constraint.max_length)} characters")
    return ", ".join(part for part in (_kind(field), ", ".join(bounds)) if part) or "—"


def render(table: Table) -> str:
    """``table`` as Markdown: a row per variable, in declaration order."""
    old_names = _old_names()
    lines = [f"| {' | '.join(table.headings)} |", "|" + " --- |" * len(table.headings)]
    for name, field in table.variables.items():
        if not field.description:
            raise ValueError(f"{name}: declared without a description")
        shown = f"`{name}`" + (f" (old name `{old_names[name]}`, still read)" if name in old_names else "")
        cells = [shown, _shown_default(name, field)]
        if len(table.headings) == 4:
            cells.append(_accepted(field))
        cells.append(field.description)
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    if len(table.headings) == 4 and any(_kind(field) == "boolean" for field in table.variables.values()):
        lines[:0] = [f"Booleans: {BOOLEANS}.", ""]
    return "\n" + "\n".join(lines) + "\n\n"


def updated(text: str, where: str = "") -> str:
    """``text`` with every marked table rewritten.

    Raises:
        ValueError: a marker names no table.
    """
    def table(match: re.Match) -> str:
        name = match["name"]
        if name not in TABLES:
            raise ValueError(f"{where}: no settings table called {name!r} (there are: {', '.join(TABLES)})")
        return match.group(1) + render(TABLES[name]) + match.group(4)

    return MARKER.sub(table, text)


def stale(root: Path = ROOT) -> list[str]:
    """The documents whose tables differ from the declarations, and any table no document holds."""
    problems, placed = [], []
    for document in DOCUMENTS:
        text = (root / document).read_text(encoding="utf-8")
        placed += [match["name"] for match in MARKER.finditer(text)]
        if updated(text, document) != text:
            problems.append(f"{document}: settings tables out of date (run scripts/settings_docs.py)")
    for name in TABLES:
        if placed.count(name) != 1:
            problems.append(f"settings table {name!r} is in {placed.count(name)} documents, not 1")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table is out of date")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale()
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    for document in DOCUMENTS:
        path = ROOT / document
        text = path.read_text(encoding="utf-8")
        new = updated(text, document)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(f"wrote {document}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
