"""Pure pieces of training and evaluation: packing, batching, schedule, window, eval sample. Fast."""

from __future__ import annotations

import random
from datetime import date
from pathlib import Path

import pytest

from lanes_pipeline.dataset.contract import TASKS, DatasetContractError, Task, check_row, make_row
from lanes_pipeline.dataset.window import (
    dedupe,
    fingerprint,
    load_split,
    partition_dir,
    window_dirs,
)
from lanes_pipeline.dataset.writer import save_rows
from lanes_pipeline.gpu_lane.training.data import (
    IGNORE,
    DatedRow,
    Example,
    batches,
    collate,
    dated_rows,
    eval_sample,
    label_tokens,
    pack,
    validation_split,
)
from lanes_pipeline.gpu_lane.training.loop import checkpoint_steps, linear_schedule, total_steps, warmup_steps
from lanes_pipeline.gpu_lane.training.spec import EvalReport
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


def test_steps_from_epochs_within_the_step_range() -> None:
    training = TrainingConfig(epochs=2.0, step_range={"min": 1, "max": 200})
    accumulating = training.model_copy(update={"batch_size": 4, "gradient_accumulation_steps": 2})
    assert total_steps(accumulating, 17) == 5
    assert total_steps(training.model_copy(update={"max_steps": 7}), 17) == 7
    bounded = TrainingConfig(epochs=2.0, step_range={"min": 10, "max": 40}, batch_size=4)
    assert (total_steps(bounded, 8), total_steps(bounded, 60), total_steps(bounded, 400)) == (10, 30, 40)
    assert (
        TrainingConfig().epochs == 2.0 and TrainingConfig().max_steps is None
    )  # the default trains by epochs
    fixed = TrainingConfig(max_steps=30)  # a fixed run, as configs wrote it before epochs were the default
    assert (fixed.epochs, total_steps(fixed, 1000)) == (None, 30)
    with pytest.raises(ValueError, match="min \\(50\\) is above max \\(40\\)"):
        TrainingConfig(step_range={"min": 50, "max": 40})


def test_warmup_is_a_tenth_of_the_steps_unless_set_and_checkpoints_end_at_the_last_step() -> None:
    assert warmup_steps(TrainingConfig(), 40) == 4 and warmup_steps(TrainingConfig(warmup_steps=3), 40) == 3
    assert checkpoint_steps(30, 3) == [10, 20, 30] and checkpoint_steps(2, 3) == [1, 2]
    assert checkpoint_steps(7, 1) == [7]


def test_validation_rows_are_set_aside_by_hash_whatever_the_order() -> None:
    rows = [
        make_row([{"role": "user", "content": str(i)}, {"role": "assistant", "content": "x"}])
        for i in range(60)
    ]
    train, aside = validation_split(rows, 10)
    assert aside and len(train) + len(aside) == 60
    assert {r["content_hash"] for r in train}.isdisjoint(r["content_hash"] for r in aside)
    _, again_aside = validation_split(list(reversed(rows)), 10)
    assert {r["content_hash"] for r in again_aside} == {r["content_hash"] for r in aside}
    assert validation_split(rows, 0) == (rows, [])
    assert validation_split(rows[:3], 100) == ([], rows[:3])
    assert validation_split(rows[:1], 100) == (rows[:1], [])  # one row cannot choose a checkpoint: it trains


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


def held_out(day: int, task: Task, count: int) -> list[dict[str, object]]:
    return [
        make_row(
            [{"role": "user", "content": f"{task} {day} {i}"}, {"role": "assistant", "content": "a"}], task
        )
        for i in range(count)
    ]


def kinds_and_days(sample: list[dict[str, object]], window: list[DatedRow]) -> set[tuple[object, int]]:
    day_of = {dated.row["content_hash"]: dated.day for dated in window}
    return {(row["task"], day_of[row["content_hash"]]) for row in sample}


def test_a_held_out_row_belongs_to_the_latest_day_that_has_it() -> None:
    old, again = held_out(0, "explain", 2), held_out(0, "explain", 1)
    window = dated_rows([old, again + held_out(1, "write_body", 1)])
    assert [(d.day, d.row["task"]) for d in window] == [(0, "explain"), (1, "explain"), (1, "write_body")]
    assert window[1].row == again[0]


def test_a_small_window_is_evaluated_whole_in_its_order() -> None:
    window = dated_rows([held_out(0, "explain", 3), held_out(1, "write_body", 2)])
    assert eval_sample(window, 5) == [dated.row for dated in window]
    assert eval_sample(window, 64) == [dated.row for dated in window]


def test_the_eval_sample_holds_every_kind_and_day_the_newest_day_included() -> None:
    # 5 days of 20 templated explanations, 2 function bodies on the oldest day only, 3 tests on the newest:
    # the first 16 rows (the old rule) were all explanations of the oldest day.
    days = [held_out(day, "explain", 20) for day in range(5)]
    days[0] += held_out(0, "write_body", 2)
    days[4] += held_out(4, "write_tests", 3)
    window = dated_rows(days)
    sample = eval_sample(window, 16)
    assert len(sample) == 16
    groups = kinds_and_days(sample, window)
    assert groups == {("explain", d) for d in range(5)} | {("write_body", 0), ("write_tests", 4)}
    by_group = {g: sum(1 for r in sample if kinds_and_days([r], window) == {g}) for g in groups}
    # Small groups are taken whole; the rest is shared evenly among the explanations.
    assert by_group[("write_body", 0)] == 2 and by_group[("write_tests", 4)] == 3
    assert sorted(by_group[("explain", d)] for d in range(5)) == [2, 2, 2, 2, 3]
    # The rows keep the window's order.
    order = [dated.row["content_hash"] for dated in window]
    assert [order.index(r["content_hash"]) for r in sample] == sorted(
        order.index(r["content_hash"]) for r in sample
    )


def test_the_eval_sample_is_deterministic_whatever_the_rows_order() -> None:
    days = [held_out(day, task, 7) for day in range(3) for task in TASKS[:2]]
    days = [days[0] + days[1], days[2] + days[3], days[4] + days[5]]
    first = eval_sample(dated_rows(days), 10)
    assert eval_sample(dated_rows(days), 10) == first
    shuffled = [random.Random(seed).sample(rows, len(rows)) for seed, rows in enumerate(days)]
    assert {r["content_hash"] for r in eval_sample(dated_rows(shuffled), 10)} == {
        r["content_hash"] for r in first
    }
    # Within each (kind, day) group, the rows with the smallest content_hashes.
    window = dated_rows(days)
    for group in kinds_and_days(first, window):
        hashes = sorted(d.row["content_hash"] for d in window if (d.row["task"], d.day) == group)
        chosen = sorted(r["content_hash"] for r in first if kinds_and_days([r], window) == {group})
        assert chosen == hashes[: len(chosen)]


def test_with_more_groups_than_samples_the_newest_day_and_every_kind_come_first() -> None:
    # 10 days x 2 kinds = 20 groups for 6 samples; "refactor_diff" only on the oldest day.
    days = [held_out(day, "explain", 3) + held_out(day, "write_body", 3) for day in range(10)]
    days[0] += held_out(0, "refactor_diff", 1)
    window = dated_rows(days)
    sample = eval_sample(window, 6)
    groups = kinds_and_days(sample, window)
    assert len(sample) == 6
    assert {("explain", 9), ("write_body", 9), ("refactor_diff", 0)} <= groups
    assert {task for task, _ in groups} == {"explain", "write_body", "refactor_diff"}
    assert {("explain", 8), ("write_body", 8)} <= groups  # then the next-newest day


def test_an_eval_report_from_before_the_losses_by_kind_still_reads() -> None:
    old = {"results": [{"model": "base", "loss": 0.8, "tokens": 70, "samples": 5}], "samples": 5, "rows": 5}
    report = EvalReport.model_validate(old)
    assert report.results[0].by_kind == {} and report.samples_by_kind == {} and report.scorable_rows is None
