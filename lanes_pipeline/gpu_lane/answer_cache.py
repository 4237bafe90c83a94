"""Answers asked once: a model's answer to a task (with its verdict) is kept under
`<data>/evaluation_answers/<model>/<task set>.json`, keyed by the task's id and a hash of everything that
makes the answer and its verdict (the prompt, the settings, the tests), so a day asks its candidate every
task and the base and the current adapter only the tasks they have not answered yet. A version's name is
never reused within a data folder, and the base model's key names its folder, so a key is one model.

Verdicts are shared across models too: an answer the same as one already judged for the same task (the
candidate often writes what the base wrote) takes that verdict instead of a second sandbox run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from lanes_pipeline.gpu_lane.judged import TaskAnswer
from lanes_pipeline.store import ArtifactStore, canonical_json, sha256_bytes

_ANSWERS = TypeAdapter(dict[str, TaskAnswer])


def task_key(task_id: str, content: object) -> str:
    """The cache key of one task as asked and judged: its id and a hash of `content` (JSON-able)."""
    return f"{task_id}#{sha256_bytes(canonical_json(content))[:16]}"


def model_key(name: str) -> str:
    """A model's folder name: its served name made safe for a path."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


class AnswerCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _file(self, model: str, task_set: str) -> Path:
        return self.root / model_key(model) / f"{task_set}.json"

    def load(self, model: str, task_set: str) -> dict[str, TaskAnswer]:
        """key -> answer; {} when the model never answered this task set. A file that cannot be read is
        an error naming it (deleting it only costs asking again)."""
        path = self._file(model, task_set)
        if not path.is_file():
            return {}
        try:
            return _ANSWERS.validate_json(path.read_bytes())
        except ValidationError as exc:
            raise ValueError(
                f"{path}: not a file of cached answers (delete it to ask again): {exc}"
            ) from None

    def save(self, model: str, task_set: str, answers: Mapping[str, TaskAnswer]) -> None:
        """Merge `answers` into the model's file (written whole, atomically)."""
        if not answers:
            return
        merged = self.load(model, task_set) | dict(answers)
        payload = {key: answer.model_dump(mode="json") for key, answer in sorted(merged.items())}
        data = json.dumps(payload, indent=1, ensure_ascii=False).encode("utf-8")
        ArtifactStore(self.root).write_bytes(self._file(model, task_set), data)

    def verdicts(self, task_set: str, keys: Iterable[str]) -> dict[tuple[str, str], TaskAnswer]:
        """(key, answer text) -> a judged answer, from every model's file of this task set."""
        wanted = set(keys)
        known: dict[tuple[str, str], TaskAnswer] = {}
        if not self.root.is_dir():
            return known
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
            path = folder / f"{task_set}.json"
            if not path.is_file():
                continue
            for key, answer in self.load(folder.name, task_set).items():
                if key in wanted:
                    known.setdefault((key, answer.answer), answer)
        return known
