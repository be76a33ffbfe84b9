"""tfaccel.bench.results (the stamped JSON, a curve's first row to reach a score, its value
after some frames) and the reference curves in benchmarks/reference."""

import doctest
import json
import os
import sys

from tfaccel.bench import results


def test_first_at_least_skips_missing_scores_and_returns_the_first_index():
    assert results.first_at_least([None, float("nan"), 3.0, 2.0, 5.0], 3.0) == 2
    assert results.first_at_least([None, -21.0, 17.9], 18.0) is None
    assert results.first_at_least([], 0.0) is None


def test_docstring_examples():
    assert doctest.testmod(results).failed == 0


def test_write_json_keeps_the_document_and_adds_command_revision_machine_and_date(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(sys, "argv", ["bench.py", "--gin_bindings=RunConfig.seed = 1"])
    path = tmp_path / "run.json"
    results.write_json(str(path), {"final_score": 18.5})
    document = json.loads(path.read_text())
    assert document["final_score"] == 18.5
    assert set(document) == {"final_score", "command", "git_revision", "machine", "date"}
    assert document["machine"]["cpu"] and 1 <= document["machine"]["cores"] <= os.cpu_count()
    assert (
        document["command"] == "bench.py '--gin_bindings=RunConfig.seed = 1'"
    )  # pastes into a shell
    assert document["date"].endswith("Z")


def test_value_at_takes_the_last_row_up_to_the_frames_and_none_past_the_end():
    frames, scores = [100, 200, 300], [None, -20.0, -15.0]
    assert results.value_at(frames, scores, 250) == -20.0
    assert results.value_at(frames, scores, 300) == -15.0
    assert results.value_at(frames, scores, 150) is None  # no game finished yet
    assert results.value_at(frames, scores, 50) is None  # before the first row
    assert results.value_at(frames, scores, 301) is None  # the run stopped earlier
    assert results.value_at([], [], 0) is None


def test_dopamine_reference_curves_hold_five_runs_per_agent_as_published():
    path = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "reference")
    with open(os.path.join(path, "dopamine_pong.json")) as handle:
        reference = json.load(handle)
    assert set(reference["runs"]) == {"DQN", "C51", "Rainbow"} == set(reference["settings"])
    for runs in reference["runs"].values():
        assert len(runs) == 5 and all(len(run) == 40 for run in runs)
        assert all(-21 <= score <= 21 for run in runs for score in run)
        assert all(run[0] < -19 for run in runs)  # the first 1M frames: a random policy
    # Spot values read off google/dopamine baselines/atari/data/pong.json: C51's third run after
    # 5M and 10M frames (iterations 4 and 9), Rainbow's first after 10M.
    assert reference["runs"]["C51"][2][4] == -18.91 and reference["runs"]["C51"][2][9] == -2.88
    assert reference["runs"]["Rainbow"][0][9] == 17.21


def test_frames_to_reach_names_the_frames_of_the_first_row_at_the_score():
    curve = {"env_frames": [100, 200, 300], "score": [None, -3.0, -2.0]}
    assert results.frames_to_reach(curve, -3.0) == 200
    assert results.frames_to_reach(curve, -2.5) == 300
    assert results.frames_to_reach(curve, 0.0) is None
