"""Run the cluster fault cases (tests/cluster/ and the whole-run preemption tests) one at a
time and print a JSON table: case, outcome (passed/failed), seconds.

    KT_DATA_DIR=/path/to/data python benchmarks/cluster_faults.py [-k EXPRESSION]

Each case is a pytest test with its own time bound; this script only runs and times them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITES = ["tests/cluster/", "tests/training/test_preemption.py"]
# `-m ""`: every test (pyproject's addopts deselect the `cluster` ones)
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-q", "-m", ""]


def cases(expression: str | None) -> list[str]:
    """The test ids of the suites (slow ones included), filtered by `-k`."""
    command = [*PYTEST, "--collect-only", *SUITES]
    if expression:
        command += ["-k", expression]
    out = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    return [line.strip() for line in out.stdout.splitlines() if "::" in line]


def run(case: str) -> dict:
    start = time.monotonic()
    out = subprocess.run(
        [*PYTEST, case],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    outcome = "passed" if out.returncode == 0 else "failed"
    return {"case": case, "outcome": outcome, "seconds": round(time.monotonic() - start, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", dest="expression", help="pytest -k expression selecting cases")
    args = parser.parse_args(argv)
    table = [run(case) for case in cases(args.expression)]
    print(json.dumps(table, indent=1))
    return 0 if all(row["outcome"] == "passed" for row in table) else 1


if __name__ == "__main__":
    sys.exit(main())
