"""The judge_cost benchmark's grid window (the lever it measures against the contract's sliding one): its
start lies on a grid, so the cuts of a function share their prompt's start; it holds half to all of the
context, whole lines only."""

from __future__ import annotations

import itertools

from lanes_pipeline.bench.judge_cost import _speedup, grid_prompt
from lanes_pipeline.dataset.contract import completion_prompt


def test_the_grid_window_shares_its_start_between_neighbouring_cuts() -> None:
    prefix = "import os\n\ndef f():\n    a = 1\n"  # lines start at 0, 10, 11 and 20; 30 characters
    assert grid_prompt("m.py", prefix, 1000) == completion_prompt("m.py", prefix, 1000)
    assert grid_prompt("m.py", prefix, 20) == "# m.py\n\ndef f():\n    a = 1"  # from the grid point 10
    assert grid_prompt("m.py", prefix, 19) == "# m.py\n    a = 1"  # grid point 18: the next line starts at 20
    lines = [f"line_{i:03d} = {i:03d}\n" for i in range(400)]  # 15 characters a line
    grid = [grid_prompt("m.py", "".join(lines[:cut]), 600) for cut in range(100, 400)]
    slid = [completion_prompt("m.py", "".join(lines[:cut]), 600) for cut in range(100, 400)]
    assert all(300 - 15 < len(p.split("\n", 1)[1]) <= 600 for p in grid)
    assert sum(b.startswith(a) for a, b in itertools.pairwise(grid)) >= 0.9 * (len(grid) - 1)
    assert not any(b.startswith(a) for a, b in itertools.pairwise(slid))  # a sliding window shares nothing


def test_speedup_is_the_ratio_of_seconds() -> None:
    assert _speedup({"seconds": 92.0}, {"seconds": 30.0}) == 3.07
    assert _speedup({"seconds": 92.0}, {"seconds": 0}) is None
