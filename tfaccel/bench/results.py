"""Where benchmark figures go: JSON with the command, the git revision and the date (BENCHMARKS.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def git_revision() -> str:
    """The short hash of the checked-out commit, or "unknown" outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def write_json(path: str, document: dict) -> None:
    """Writes `document` plus `command`, `git_revision` and `date` (UTC) to `path`."""
    stamped = dict(
        document,
        command=" ".join(sys.argv),
        git_revision=git_revision(),
        date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    with open(path, "w") as handle:
        json.dump(stamped, handle, indent=2)
