"""Pure pieces of training and evaluation: packing, batching, schedule, window, promotion rule. Fast."""

from __future__ import annotations

import random
from datetime import date
from pathlib import Path

import pytest

from lanes_pipeline.dataset.contract import DatasetContractError, check_row, make_row
from lanes_pipeline.dataset.window import (
    dedupe,
    fingerprint,
    load_split,
    partition_dir,
    window_dirs,
)
from lanes_pipeline.dataset.writer import save_rows
from lanes_pipeline.gpu_lane.training.data import IGNORE, Example, batches, collate, label_tokens, pack
from lanes_pipeline.gpu_lane.training.loop import linear_schedule, total_steps
from lanes_pipeline.settings import TrainingConfig


def ex(n: int, start: int = 0) -> Example:
    ids = list(range(start, start + n))
    return Example(input_ids=ids, labels=[IGNORE, *ids[1:]])


def test_labels_mark_tokens_that_start_inside_assistant_spans() -> None:
    offsets = [(0, 5), (5, 6), (6, 10), (10, 12), (12, 12)]
    assert label_tokens(offsets, [(5, 10)]) == [False, True, True, False, False]


def test_packing_fills_bins_and_restarts_positions() -> None:
    examples = [ex(6), ex(5, 100), ex(3, 200), ex(2, 300)]
    packed = pack(examples, max_len=8)
    assert sorted(len(p) for p in packed) == [8, 8]
    assert sum(len(p) for p in packed) == 16  # nothing lost, nothing added
    for row in packed:
        # every example keeps its own positions from 0: the model sees separate sequences
        starts = [i for i, pos in enumerate(row.position_ids) if pos == 0]
        assert starts[0] == 0 and len(starts) == 2
    assert sum(p.trained_tokens for p in packed) == sum(e.trained_tokens for e in examples)


def test_an_example_longer_than_a_bin_gets_its_own_bin() -> None:
    assert [len(p) for p in pack([ex(10), ex(2)], max_len=8)] == [10, 2]


def test_collate_pads_right_and_hides_padding_from_the_loss() -> None:
    batch = collate([ex(3), ex(1, 50)], pad_id=0, packed=False)
    assert batch.input_ids == [[0, 1, 2], [50, 0, 0]]
    assert batch.labels[1] == [IGNORE, IGNORE, IGNORE]
    assert batch.attention_mask == [[1, 1, 1], [1, 0, 0]]
    assert batch.real_tokens == 4
    packed = collate([ex(3), ex(1, 50)], pad_id=0, packed=True)
    assert packed.attention_mask is None
    assert packed.position_ids[1] == [0, 0, 1]  # the padding is a sequence of its own


def test_batches_cover_the_epoch_once_and_are_reproducible() -> None:
    examples = [ex(n) for n in range(1, 30)]
    first = batches(examples, 4, random.Random(0))
    again = batches(examples, 4, random.Random(0))
    assert [[len(e) for e in b] for b in first] == [[len(e) for e in b] for b in again]
    assert sorted(len(e) for b in first for e in b) == sorted(len(e) for e in examples)


def test_schedule_warms_up_then_decays_to_zero() -> None:
    assert [round(linear_schedule(s, 2, 6), 3) for s in range(6)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25]
    assert linear_schedule(6, 0, 6) == 0.0


def test_steps_from_epochs() -> None:
    training = TrainingConfig(max_steps=None, epochs=2.0)
    accumulating = training.model_copy(update={"batch_size": 4, "gradient_accumulation_steps": 2})
    assert total_steps(accumulating, 17) == 5
    assert total_steps(training.model_copy(update={"max_steps": 7}), 17) == 7


def test_dedupe_keeps_one_copy_per_hash_the_latest() -> None:
    a1 = {"content_hash": "a", "v": 1}
    b = {"content_hash": "b", "v": 1}
    a2 = {"content_hash": "a", "v": 2}
    assert dedupe([[a1, b], [a2]]) == [b, a2]


def test_rows_are_checked_against_the_contract() -> None:
    good = make_row([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    check_row(good)
    with pytest.raises(DatasetContractError, match="no assistant"):
        check_row(make_row([{"role": "user", "content": "q"}]))
    with pytest.raises(DatasetContractError, match="task"):
        check_row({**good, "task": "chat"})
    with pytest.raises(DatasetContractError, match="bad message"):
        check_row({**good, "messages": [{"role": "tool", "content": "x"}]})


def test_window_reads_saved_days_from_the_artifact_store(tmp_path: Path) -> None:
    rows = [
        make_row([{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}])
        for i in range(3)
    ]
    save_rows(partition_dir(tmp_path, date(2026, 11, 1)), rows[:2], rows[2:])
    save_rows(partition_dir(tmp_path, date(2026, 11, 2)), rows[1:2], rows[2:])
    (partition_dir(tmp_path, date(2026, 11, 3))).mkdir()  # an unfinished day is not in the window
    # The days as the replay window's mapping gives them (2026-10-30 was never materialized), in any order.
    dirs = window_dirs(tmp_path, ["2026-11-03", "2026-11-02", "2026-10-30", "2026-11-01"])
    assert [d.name for d in dirs] == ["2026-11-01", "2026-11-02"]
    train = load_split(dirs, "train")
    assert [r["content_hash"] for r in train] == [rows[0]["content_hash"], rows[1]["content_hash"]]
    assert fingerprint(dirs) == fingerprint(dirs)
    assert fingerprint(dirs) != fingerprint(dirs[:1])
