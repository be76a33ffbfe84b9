"""Processes of one cluster on 127.0.0.1: bin/train started once per TF_CONFIG task."""

import json
import os
import socket
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def start_cluster(root_dir, files, bindings, size=2):
    """Starts `size` bin/train processes of gin `files` and `bindings`, worker i with TF_CONFIG
    task index i, on free ports of 127.0.0.1; returns the Popen objects (text pipes)."""
    sockets = [socket.socket() for _ in range(size)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    cluster = {"worker": [f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]}
    for sock in sockets:
        sock.close()
    processes = []
    for index in range(size):
        tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
        processes.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "bin/train",
                    f"--root_dir={root_dir}",
                    *[f"--gin_file={name}" for name in files],
                    *[f"--gin_bindings={binding}" for binding in bindings],
                ],
                cwd=ROOT,
                env=dict(os.environ, TF_CONFIG=json.dumps(tf_config)),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    return processes
