"""Without tf-agents (it installs on Python < 3.12 only), the adapter names the extra to install."""

import subprocess
import sys


def test_missing_tf_agents_names_the_extra_to_install():
    code = "import sys; sys.modules['tf_agents'] = None\nimport tfaccel.envs.tf_agents_adapter\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "ImportError" in out.stderr and "pip install 'tfaccel[tf_agents]'" in out.stderr
