"""Completion rows: the day's taught functions continued from cuts in exactly the prompt an editor sends,
held-out bodies above a cut masked, trained as raw text with the loss on the continuation only."""

from __future__ import annotations

from typing import Any

import pytest

from lanes_pipeline.daily.resources import LoraTrainingResource
from lanes_pipeline.dataset.completion_rows import completion_rows, spread
from lanes_pipeline.dataset.contract import completion_prompt
from lanes_pipeline.dataset.holdout_rules import route
from lanes_pipeline.dataset.writer import fit, render, shape
from lanes_pipeline.gpu_lane.training.data import IGNORE, encode_row
from lanes_pipeline.gpu_lane.training.model import load_tokenizer
from lanes_pipeline.repos.symbols import Symbol, extract_symbols
from lanes_pipeline.settings import Settings

SOURCE = '''import math


def secret(x):
    """Held out."""
    y = x * 7
    return y + 1


def area(w, h):
    """Area of a rectangle."""
    if w < 0 or h < 0:
        raise ValueError("negative side")
    size = w * h
    return math.floor(size)
'''


def symbols() -> dict[str, Symbol]:
    return {s.name: s for s in extract_symbols("geo.py", SOURCE).symbols}


@pytest.fixture(scope="module")
def tokenizer(settings: Settings) -> Any:
    return load_tokenizer(str(LoraTrainingResource.from_config(settings.training).base_model_path()))


def test_cuts_are_spread_over_the_body() -> None:
    assert spread(5, 3) == [0, 2, 4] and spread(2, 3) == [0, 1] and spread(4, 1) == [0] and spread(0, 3) == []


def test_a_row_is_the_editors_prompt_before_a_cut_and_the_lines_after_it() -> None:
    by_name = symbols()
    rows = completion_rows("geo", by_name["area"], SOURCE, [by_name["secret"]], 3000, cuts=3, lines=2)
    assert [r.task for r in rows] == ["complete"] * 3
    first = rows[0]
    assert first.answer == '\n    if w < 0 or h < 0:\n        raise ValueError("negative side")'
    cut = SOURCE.index("    if w < 0")
    masked = SOURCE[:cut].replace("    y = x * 7\n    return y + 1\n", "    ...  # held out\n")
    assert first.code == completion_prompt("geo.py", masked, 3000)
    assert "x * 7" not in "".join(r.code + r.answer for r in rows)  # the held-out body never trains
    assert rows[-1].answer == "\n    return math.floor(size)"  # the function's last line: no lines after it
    # the held-out function's own rows are routed to the eval split; the taught one's train
    held_rows = completion_rows("geo", by_name["secret"], SOURCE, [by_name["secret"]], 3000, 3, 2)
    assert all(route(r, [by_name["secret"]]).held_out for r in held_rows)
    assert not any(route(r, [by_name["secret"]]).held_out for r in rows)


def test_a_row_is_rendered_verbatim_and_cut_from_the_left_to_fit(tokenizer: Any) -> None:
    by_name = symbols()
    row = completion_rows("geo", by_name["area"], SOURCE, [], 3000, cuts=1, lines=2)[0]
    record = render(row, "system prompt unused")
    assert [m["role"] for m in record.messages] == ["user", "assistant"]
    assert record.messages[1]["content"] == row.answer  # indentation kept: it is part of the answer

    def count(messages: list[dict[str, str]]) -> int:
        return len(tokenizer("".join(m["content"] for m in messages))["input_ids"])

    budget = count(record.messages) - 10
    cut = fit(row, "", count, budget)
    assert cut is not None and count(cut.messages) <= budget
    prompt = cut.messages[0]["content"]
    assert prompt.startswith("# geo.py\n") and prompt.endswith('    """Area of a rectangle."""')
    assert cut.messages[1]["content"] == row.answer
    assert fit(row, "", count, 3) is None  # the answer alone does not fit


def test_the_prompt_is_tokenized_as_in_the_row_so_the_model_continues_at_its_token_boundary(
    tokenizer: Any,
) -> None:
    """The server tokenizes the prompt alone; the trainer the prompt and the continuation as one text. The
    prompt's tokens are the row's first tokens, and the continuation's first token is the newline merged
    with the next line's indentation, the token the model saw before an indented line in training."""
    by_name = symbols()
    for row in completion_rows("geo", by_name["area"], SOURCE, [], 3000, cuts=3, lines=2):
        asked = tokenizer(row.code, add_special_tokens=False)["input_ids"]
        whole = tokenizer(row.code + row.answer, add_special_tokens=False)["input_ids"]
        assert whole[: len(asked)] == asked, row.answer
        first = tokenizer.decode(whole[len(asked) : len(asked) + 1])
        assert first.startswith("\n") and first.strip(" ") == "\n" and len(first) > 1, first


def test_rows_cut_in_one_function_are_not_near_duplicates_of_each_other(tokenizer: Any) -> None:
    by_name = symbols()
    rows = completion_rows("geo", by_name["area"], SOURCE, [], 3000, cuts=3, lines=1)

    def count(messages: list[dict[str, str]]) -> int:
        return len(tokenizer("".join(m["content"] for m in messages))["input_ids"])

    shaped = shape(rows, "", count, 512, 0.85)
    assert len(shaped.train) == 3 and not shaped.dropped


def test_the_loss_is_on_the_continuation_only_and_the_prompt_is_cut_from_the_left(tokenizer: Any) -> None:
    by_name = symbols()
    record = render(completion_rows("geo", by_name["area"], SOURCE, [], 3000, 1, 2)[0], "")
    row = record.model_dump()
    example = encode_row(tokenizer, row, 512)
    assert example is not None
    trained = [t for t, label in zip(example.input_ids, example.labels, strict=True) if label != IGNORE]
    assert tokenizer.decode(trained).strip() == row["messages"][1]["content"].strip()
    assert "<|im_start|>" not in tokenizer.decode(example.input_ids)  # raw text: no chat template
    short = encode_row(tokenizer, row, 12)
    assert short is not None and len(short) == 12
    assert short.input_ids == example.input_ids[-12:]  # the text right before the answer stays
