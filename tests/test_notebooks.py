"""The colab/ notebooks run top to bottom with TFACCEL_SMOKE=1 (their tiny settings).

Each notebook is executed by a Jupyter kernel of this interpreter (the venv's ipykernel; a last
cell added here checks that), with the kernel's working directory in `tmp_path`, so every run
directory, GIF, PNG and JSON a notebook writes lands there and not in the repository.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
import time

import nbformat
from nbclient import NotebookClient

COLAB = pathlib.Path(__file__).resolve().parents[1] / "colab"
LIMIT_SECONDS = 180  # per notebook, kernel start included (CI runs each in a minute or two)
PROBE = "import sys; print('kernel python:', sys.executable)"


def execute(name: str, tmp_path: pathlib.Path, monkeypatch) -> list:
    """Runs colab/<name>.ipynb in smoke mode; returns its code cells, with their outputs."""
    notebook = nbformat.read(COLAB / name, as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata.kernelspec.name == "python3"
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert not any(cell.outputs or cell.execution_count for cell in code), "commit it cleared"
    assert any('SMOKE = os.environ.get("TFACCEL_SMOKE") == "1"' in cell.source for cell in code)
    notebook.cells.append(nbformat.v4.new_code_cell(PROBE))
    monkeypatch.setenv("TFACCEL_SMOKE", "1")
    client = NotebookClient(
        notebook,
        kernel_name="python3",  # jupyter_client starts it with sys.executable
        timeout=LIMIT_SECONDS,  # per cell
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working directory
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError naming the cell if any cell fails
    seconds = time.perf_counter() - start
    print(f"{name}: {seconds:.1f} s")
    nbformat.write(notebook, tmp_path / name)  # executed, for a look after a failure
    probe = notebook.cells.pop()
    assert text(probe).strip() == f"kernel python: {sys.executable}"
    assert seconds < LIMIT_SECONDS, f"{name} took {seconds:.0f} s"
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    noise = [line for line in text(*cells).splitlines() if NOISE.search(line)]
    assert not noise, f"{name} shows TensorFlow's start-up or INFO lines: {noise[:4]}"
    return cells


# TensorFlow's C++ start-up lines (absl's `I0000 00:00:...`, oneDNN, the CUDA probe), which a
# notebook's kernel shows since it captures the process's stderr, and its Python INFO lines,
# which it logs in an interactive session (each export's "Assets written to").
NOISE = re.compile(r"^[IWE]\d{4} \d\d:\d\d:|absl::InitializeLog|oneDNN|cuInit|INFO:tensorflow")


def text(*cells) -> str:
    """Everything the cells printed."""
    parts = []
    for cell in cells:
        for output in cell.outputs:
            if output.output_type == "stream":
                parts.append(output.text)
            elif output.output_type in ("execute_result", "display_data"):
                parts.append(output.data.get("text/plain", ""))
    return "".join(parts)


def mime_types(cells) -> set[str]:
    return {
        mime
        for cell in cells
        for output in cell.outputs
        if output.output_type in ("execute_result", "display_data")
        for mime in output.data
    }


def test_quickstart(tmp_path, monkeypatch):
    cells = execute("quickstart.ipynb", tmp_path, monkeypatch)
    run_dir = tmp_path / "runs" / "quickstart_a2c_breakout"
    assert (run_dir / "policy" / "saved_model.pb").exists()
    assert (run_dir / "metrics.csv").read_text().count("\n") >= 3
    assert "game = 'breakout'" in (run_dir / "operative_config.gin").read_text()
    assert {"image/png", "image/gif"} <= mime_types(cells)  # the curve, the game
    printed = text(*cells)
    assert "Run('runs/quickstart_a2c_breakout', 2,0" in printed  # the API's Run
    assert re.search(r"action: int32 \(2,\)", printed)
    assert re.search(r"logits: float32 \(2, 4\)", printed)
    score = json.loads(printed[printed.index('{\n  "episodes"') : printed.index("\n}\n") + 2])
    assert score["episodes"] == 1 and score["game"] == "breakout"
    assert (tmp_path / "breakout_game.gif").stat().st_size > 1000


def test_sampler_speed(tmp_path, monkeypatch):
    cells = execute("sampler_speed.ipynb", tmp_path, monkeypatch)
    assert "image/png" in mime_types(cells)
    result = json.loads((tmp_path / "sampler_speed.json").read_text())
    kinds = {row["inference"] for row in result["results"]}
    assert kinds == {"none", "synchronous", "alternating"}
    assert all(row["sps"] > 0 for row in result["results"])
    assert result["raw_limit_sps"] > 0
    assert re.search(r"alternating\s+[\d,]+ steps/s", text(*cells))


def test_multi_device(tmp_path, monkeypatch):
    cells = execute("multi_device.ipynb", tmp_path, monkeypatch)
    printed = text(*cells)
    speeds = dict(re.findall(r"^(one device|mirrored)\b.*?([\d,]+) agent steps/s", printed, re.M))
    assert set(speeds) == {"one device", "mirrored"}, printed[-3000:]
    assert all(float(value.replace(",", "")) > 0 for value in speeds.values())
    for run in ("catch_one_device", "catch_mirrored"):
        assert (tmp_path / "runs" / run / "metrics.csv").exists()
    config = (tmp_path / "runs" / "catch_mirrored" / "operative_config.gin").read_text()
    assert "make_strategy.kind = 'mirrored'" in config
    assert "image/png" in mime_types(cells)
