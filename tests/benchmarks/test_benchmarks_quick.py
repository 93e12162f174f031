"""Every script in benchmarks/ runs in its ``--quick`` mode, so none can rot unnoticed.

The scripts are found by globbing the folder: a new benchmark without a ``--quick`` mode (or
without a way to send its JSON elsewhere) fails here. Each runs in a subprocess with one
OpenMP thread, from a temporary working directory, with its output sent to that directory; the
test checks the exit status, that the JSON parses, that a table was printed, and that nothing
was written to the default ``benchmarks/results/`` (relative to the working directory).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py"))

# Scripts that write figures next to their JSON take a directory (``--out-dir``) and name the
# JSON themselves; every other script takes the JSON's path (``--out``).
OUT_DIR_JSON = {"tee_offload.py": "tee_offload.json"}

# Optional extras a script needs; without them the script is skipped, saying which.
NEEDS = {"ray_scaling.py": "ray", "he_hts.py": "tenseal", "flower_overhead.py": "flwr"}


def run_quick(script: str, tmp: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run ``benchmarks/<script> --quick`` with its output under ``tmp``; return it and the JSON path."""
    out = tmp / "out"
    if script in OUT_DIR_JSON:
        args, json_path = ["--out-dir", str(out)], out / OUT_DIR_JSON[script]
    else:
        json_path = out / f"{Path(script).stem}.json"
        args = ["--out", str(json_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick", *args],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=300,  # a hang guard, not a timing
    )
    return proc, json_path


def test_the_folder_holds_the_known_benchmarks() -> None:
    # The glob is what keeps new scripts covered; make sure it sees the folder at all.
    assert {"aggregators.py", "engine_vs_reference.py", "flower_overhead.py", "he_hts.py", "ray_scaling.py",
            "secagg.py", "tee_offload.py", "zo_forward.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_quick_mode_runs_and_writes_json(script: str, tmp_path: Path) -> None:
    need = NEEDS.get(script)
    if need and importlib.util.find_spec(need) is None:
        pytest.skip(f"{script} needs the optional package {need!r}, not installed")
    proc, json_path = run_quick(script, tmp_path)
    assert proc.returncode == 0, f"{script} --quick failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert json_path.is_file(), f"{script} --quick wrote no {json_path.name}; stdout:\n{proc.stdout[-2000:]}"
    result = json.loads(json_path.read_text())
    assert isinstance(result, dict) and result, f"{script}: the JSON is not a non-empty object"
    assert proc.stdout.strip(), f"{script} --quick printed no table"
    assert not (tmp_path / "benchmarks").exists(), f"{script} wrote under benchmarks/ despite the output option"
