"""The judge_cost benchmark's baseline window: the prompt that slid with each cut (what the contract's grid
window is measured against) keeps exactly the whole lines right before the cut that fit."""

from __future__ import annotations

import itertools

from lanes_pipeline.bench.judge_cost import _speedup, sliding_prompt
from lanes_pipeline.dataset.contract import completion_prompt


def test_the_sliding_window_keeps_the_lines_right_before_the_cut_that_fit() -> None:
    prefix = "import os\n\ndef f():\n    a = 1\n"
    two = len("def f():\n    a = 1\n")
    assert sliding_prompt("m.py", prefix, two) == "# m.py\ndef f():\n    a = 1\n"
    assert sliding_prompt("m.py", prefix, two - 1) == "# m.py\n    a = 1\n"
    assert sliding_prompt("m.py", prefix, 1000) == completion_prompt("m.py", prefix, 1000)
    lines = [f"x_{i:03d} = {i:03d}\n" for i in range(200)]  # 12 characters a line
    slid = [sliding_prompt("m.py", "".join(lines[:cut]), 240) for cut in range(50, 60)]
    assert all(len(p) == len("# m.py\n") + 240 for p in slid)  # always full, never sharing its start
    assert not any(later.startswith(earlier) for earlier, later in itertools.pairwise(slid))


def test_speedup_is_the_ratio_of_seconds() -> None:
    assert _speedup({"seconds": 92.0}, {"seconds": 30.0}) == 3.07
    assert _speedup({"seconds": 92.0}, {"seconds": 0}) is None
