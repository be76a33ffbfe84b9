"""Without tf-agents (it installs on Python < 3.12 only), the adapter names the extra to install."""

import importlib.util
import os
import subprocess
import sys

import pytest


def test_missing_tf_agents_names_the_extra_to_install():
    code = "import sys; sys.modules['tf_agents'] = None\nimport tfaccel.envs.tf_agents_adapter\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "ImportError" in out.stderr and "pip install 'tfaccel[tf_agents]'" in out.stderr


@pytest.mark.skipif(importlib.util.find_spec("tf_agents") is None, reason="no tf-agents")
def test_tf_agents_imports_after_tfaccel_whatever_else_came_first():
    """`import tf_agents` failed inside tensorflow-probability unless the adapter came first."""
    code = (
        "import tensorflow, keras, tfaccel, tf_agents\n"
        "from tf_agents.environments import py_environment\n"
        "from tfaccel.networks import PolicyValueNetwork\n"  # our networks stay on Keras 3
        "print('ok', keras.__version__[0])\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "TF_USE_LEGACY_KERAS"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.stdout.strip() == "ok 3", out.stderr[-2000:]
