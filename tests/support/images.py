"""The images the project builds, as each place that names them says: the ``Dockerfile``'s
targets (the base image each starts ``FROM``, its ``ARG`` defaults filled in) and the
``docker build`` lines of ``docs/kubernetes.md`` (the target each builds, the name it tags and
its build arguments). No Docker engine is needed: they are read as text."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from tests.support.paths import ROOT

DOCKERFILE = ROOT / "Dockerfile"
GUIDE = ROOT / "docs" / "kubernetes.md"


def dockerfile_args() -> dict[str, str]:
    """The ``ARG NAME=default`` lines of the Dockerfile (a later one of the same name wins)."""
    return dict(re.findall(r"^ARG (\w+)=(\S*)\s*$", DOCKERFILE.read_text(), re.M))


def resolved(text: str, values: dict[str, str]) -> str:
    """``text`` with each ``${NAME}`` (Dockerfile) or ``${NAME:-default}`` (compose) filled in
    from ``values``, else its default."""
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", lambda m: values.get(m[1], m[2] or ""), text)


def dockerfile_targets() -> dict[str, str]:
    """target -> the image its ``FROM ... AS target`` starts from, with the ``ARG`` defaults."""
    froms = re.findall(r"^FROM\s+(\S+)\s+AS\s+(\S+)\s*$", DOCKERFILE.read_text(), re.M | re.I)
    return {target: resolved(base, dockerfile_args()) for base, target in froms}


@dataclass(frozen=True)
class Build:
    """One ``docker build`` line of the guide."""

    target: str | None
    tag: str
    args: dict[str, str] = field(default_factory=dict)


def documented_builds() -> list[Build]:
    """Every ``docker build`` command line of ``docs/kubernetes.md``."""
    builds = []
    for line in GUIDE.read_text().splitlines():
        if "docker build " not in line:
            continue
        words = shlex.split(line[line.index("docker build "):].split("&&")[0])
        target, tag, args = None, None, {}
        for option, value in zip(words, words[1:]):
            if option == "--target":
                target = value
            elif option in ("-t", "--tag"):
                tag = value
            elif option == "--build-arg":
                name, _, arg = value.partition("=")
                args[name] = arg
        assert tag, f"docs/kubernetes.md: {line.strip()}: the build names no image (-t)"
        builds.append(Build(target, tag, args))
    return builds
