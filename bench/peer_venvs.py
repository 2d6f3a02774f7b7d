"""The peers' virtual environments: each peer (mosec, LitServe, infinity-emb)
runs from a venv of its own, made on first use under a cache folder
(``bench/.venvs/<peer>-<version>``, git-ignored; ``--venvs DIR`` elsewhere),
with pinned versions, and torch pinned to the CPU build this machine holds
(a looser pin makes pip fetch gigabytes of CUDA wheels).

    .venv/bin/python -m bench.peer_venvs                    # make every peer's venv now (minutes each)
    .venv/bin/python -m bench.peer_venvs mosec litserve     # some of them
    .venv/bin/python -m bench.peer_venvs --list             # where each is, and whether it is made

mosec and LitServe load the model through sentence-transformers, at the
version the examples run (so ``--stub-forward`` patches the same code in
every server); infinity-emb brings its own.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import venv
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, TextIO

from bench import harness

TORCH = "torch==2.13.0"
#: What the examples run (pyproject's "example" extra resolves to these here).
SENTENCE_TRANSFORMERS = ["sentence-transformers==6.2.0", "transformers==5.24.0"]
DEFAULT_ROOT = os.path.join(harness.REPO_ROOT, "bench", ".venvs")
#: Written last into a venv once its packages are in: what was installed.
MARKER = "bench-requirements.txt"


@dataclass(frozen=True)
class Peer:
    name: str
    version: str
    requirements: List[str]

    def folder(self, root: str) -> str:
        return os.path.join(root, f"{self.name}-{self.version}")


PEERS: Dict[str, Peer] = {
    # orjson: the server writes its answers as the examples do (see bench/peers/mosec_server.py).
    "mosec": Peer("mosec", "0.9.8", ["mosec==0.9.8", "orjson==3.13.0", TORCH, *SENTENCE_TRANSFORMERS]),
    "litserve": Peer("litserve", "0.2.19", ["litserve==0.2.19", TORCH, *SENTENCE_TRANSFORMERS]),
    "infinity": Peer("infinity", "0.0.78", ["infinity-emb[server,torch]==0.0.78", TORCH]),
}


def is_made(folder: str, peer: Peer) -> bool:
    """Whether ``folder`` holds ``peer``'s venv with its pinned packages."""
    try:
        with open(os.path.join(folder, MARKER)) as handle:
            return handle.read().split() == peer.requirements
    except OSError:
        return False


def python_of(folder: str) -> str:
    return os.path.join(folder, "bin", "python")


def ensure(name: str, root: str = DEFAULT_ROOT, override: Optional[str] = None, log: TextIO = sys.stderr) -> str:
    """The folder of peer ``name``'s venv, made first if it is not there.
    ``override``: a venv made elsewhere, used as it is (not checked)."""
    if override:
        return override
    peer = PEERS[name]
    folder = peer.folder(root)
    if is_made(folder, peer):
        return folder
    print(f"peer_venvs: making {folder} ({' '.join(peer.requirements)}): minutes", file=log, flush=True)
    if not os.path.exists(python_of(folder)):  # else the pins changed: pip brings it to them
        venv.EnvBuilder(with_pip=True, clear=True).create(folder)
    subprocess.run(
        [python_of(folder), "-m", "pip", "install", "--quiet", *peer.requirements],
        check=True, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    with open(os.path.join(folder, MARKER), "w") as handle:
        handle.write("\n".join(peer.requirements) + "\n")
    return folder


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_venvs", description=__doc__.split("\n\n")[0])
    parser.add_argument("peers", nargs="*", help=f"of {', '.join(PEERS)} (default: all)")
    parser.add_argument("--venvs", default=DEFAULT_ROOT, help=f"the cache folder (default {DEFAULT_ROOT})")
    parser.add_argument("--list", action="store_true", help="say where each is, and whether it is made")
    args = parser.parse_args(argv)
    unknown = set(args.peers) - set(PEERS)
    if unknown:
        parser.error(f"unknown peers {sorted(unknown)}; known: {', '.join(PEERS)}")
    for name in args.peers or list(PEERS):
        peer = PEERS[name]
        if args.list:
            made = "made" if is_made(peer.folder(args.venvs), peer) else "not made"
            print(f"{name} {peer.version}: {peer.folder(args.venvs)} ({made})")
        else:
            print(ensure(name, args.venvs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
