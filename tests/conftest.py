"""What every test shares: gin and Keras's precision start and end clean, and the two tiers.

`make test` runs the fast tier: the unit tests (tests/*.py, algorithms/, envs/) and one smoke
run per family from the integration tests (those marked `fast`), in a few minutes. `make
test-all` (CI) runs everything: the other integration tests, the docs' examples and the
notebooks (marked `full` here, by where they are) and the packaging check.
"""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FULL_ONLY = ("tests/integration/", "tests/test_docs.py", "tests/test_notebooks.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        where = os.path.relpath(str(item.path), ROOT)
        if where.startswith(FULL_ONLY) and item.get_closest_marker("fast") is None:
            item.add_marker(pytest.mark.full)


@pytest.fixture(autouse=True, scope="session")
def session_cache(tmp_path_factory):
    """tfaccel's per-machine cache (the bfloat16 timing of `set_precision`'s 'auto') in a folder
    of the test session, for the tests and every process they start: the tests neither read
    the user's cache nor leave a figure timed under their load in it."""
    previous = os.environ.get("TFACCEL_CACHE_DIR")
    os.environ["TFACCEL_CACHE_DIR"] = str(tmp_path_factory.mktemp("tfaccel_cache"))
    yield
    if previous is None:
        del os.environ["TFACCEL_CACHE_DIR"]
    else:
        os.environ["TFACCEL_CACHE_DIR"] = previous


@pytest.fixture(autouse=True)
def clean_gin_and_precision():
    """Each test starts with an empty, unlocked gin config and float32 networks, and leaves
    them so (a test that parses configs or sets a precision cannot leak into the next)."""
    import gin

    gin.clear_config()  # unlocks it too (`unlock_config` would lock it again on leaving)
    yield
    gin.clear_config()
    if "keras" in __import__("sys").modules:
        import keras

        keras.mixed_precision.set_global_policy("float32")
