"""tfaccel.bench.results: the stamped JSON and the first row of a curve to reach a score."""

import doctest
import json

from tfaccel.bench import results


def test_first_at_least_skips_missing_scores_and_returns_the_first_index():
    assert results.first_at_least([None, float("nan"), 3.0, 2.0, 5.0], 3.0) == 2
    assert results.first_at_least([None, -21.0, 17.9], 18.0) is None
    assert results.first_at_least([], 0.0) is None


def test_docstring_examples():
    assert doctest.testmod(results).failed == 0


def test_write_json_keeps_the_document_and_adds_command_revision_and_date(tmp_path):
    path = tmp_path / "run.json"
    results.write_json(str(path), {"final_score": 18.5})
    document = json.loads(path.read_text())
    assert document["final_score"] == 18.5
    assert set(document) == {"final_score", "command", "git_revision", "date"}
    assert document["date"].endswith("Z")
