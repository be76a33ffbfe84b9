"""tfaccel's shared-memory files told apart by the process that made them.

The suite runs on two pytest-xdist workers, so another test may hold a pool segment or a
parameter store at any moment: a test checks what its own processes left, by the pid in each
name (`tfaccel_<pid>_...` for an env pool's segment, `tfaccel-ps-<pid>-...` for a store).
"""

import os
import re

from tfaccel.envs.worker import SHM_DIR

_OWNER = re.compile(r"tfaccel(?:_|-ps-)(\d+)[_-]")


def owner(path):
    """The pid that made the shared-memory file `path` (a name or a path), or None if not ours."""
    match = _OWNER.match(os.path.basename(path))
    return int(match.group(1)) if match else None


def left_by(*pids):
    """The names of tfaccel's shared-memory files that any of `pids` made and nobody removed."""
    owners = {int(pid) for pid in pids}
    return sorted(name for name in os.listdir(SHM_DIR) if owner(name) in owners)
