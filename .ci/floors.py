"""Print pip constraints that pin each dependency the project declares for
its users to the lowest release its ``pyproject.toml`` allows, for CI's
floor run (``.ci/run``)::

    python .ci/floors.py > floors.txt
    pip install -c floors.txt -e '.[test]'

Read from every extra but ``test`` and ``bench`` (the project's own tools,
which CI runs at their newest); a package named in several extras is
pinned to the highest of its lower bounds there. A requirement pinned with
``==`` is pinned as it is. Written from the file, so a raised floor in
``pyproject.toml`` is the floor CI runs, with nothing else to keep in step.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Dict, Tuple

TOOLS = ("test", "bench")
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)$")
_LOWEST = re.compile(r"(>=|==)\s*([0-9][0-9A-Za-z.+!-]*)")


def _release(version: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0]))


def floors(pyproject: Path) -> Dict[str, str]:
    """``{package: its lowest allowed release}`` of the users' extras."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    found: Dict[str, str] = {}
    for extra, requirements in extras.items():
        if extra in TOOLS:
            continue
        for requirement in requirements:
            match = _REQUIREMENT.match(requirement.split(";")[0])
            if match is None:
                raise SystemExit(f"{pyproject}: cannot read the requirement {requirement!r} of the extra {extra!r}")
            name, spec = match.group(1).lower().replace("_", "-"), match.group(2)
            lowest = _LOWEST.search(spec)
            if lowest is None:
                raise SystemExit(
                    f"{pyproject}: {requirement!r} of the extra {extra!r} has no lower bound: give it one (>=), "
                    "which CI's floor run then tests"
                )
            version = lowest.group(2)
            if name not in found or _release(version) > _release(found[name]):
                found[name] = version
    return found


def main() -> None:
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    for name, version in sorted(floors(pyproject).items()):
        sys.stdout.write(f"{name}=={version}\n")


if __name__ == "__main__":
    main()
