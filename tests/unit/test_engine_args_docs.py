"""The operator guide lists the engine arguments the contract allows (tunecache.contract.engine_args),
with what each takes and why, in step with the table: a test, since the table is the contract's."""

from __future__ import annotations

import re
from pathlib import Path

from tunecache.contract.engine_args import ALLOWED, ALLOWED_COMPILATION, Allowed

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "operator-guide.md"
BLOCK = re.compile(r"<!-- engine-args-table [^>]*-->\n(?P<body>.*?)<!-- /engine-args-table -->", re.S)


def _row(name: str, spec: Allowed) -> str:
    since = f" (vLLM {'.'.join(map(str, spec.since))} on)" if spec.since else ""
    return f"| `{name}` | {spec.describe()}{since} | {spec.reason} |"


def rendered() -> str:
    """The table as the operator guide has it."""
    lines = ["| argument | takes | why |", "| --- | --- | --- |"]
    lines += [_row(name, spec) for name, spec in ALLOWED.items()]
    lines += [_row(f"compilation_config.{name}", spec) for name, spec in ALLOWED_COMPILATION.items()]
    return "\n".join(lines) + "\n"


def test_the_operator_guide_lists_every_allowed_engine_argument_as_the_contract_has_it():
    [found] = BLOCK.findall(GUIDE.read_text())
    assert found == rendered(), "docs/operator-guide.md's engine arguments table is out of date; it is:\n" + rendered()
