"""The disk-full drill of `bench drills` (see drills.py): a day's dataset written the way lora_dataset writes
it (an atomic folder in the artifact store, `save_dataset` into its staging) onto a filesystem that fills up.

The filesystem is a small tmpfs mounted for the drill (root may mount one); where mounting is refused, the
writes run in a process whose RLIMIT_FSIZE is small (the error is then EFBIG, not ENOSPC), and the report
says which. Each write runs in a child process (`python -m lanes_pipeline.bench.drills_disk`), so the limit
touches only it, and reports its error as one JSON line.
"""

from __future__ import annotations

import json
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lanes_pipeline.dataset.contract import Record, content_hash
from lanes_pipeline.dataset.writer import ShapedDataset, save_dataset
from lanes_pipeline.store import ArtifactStore, sha256_tree

TMPFS_MB = 4
FSIZE_LIMIT = 2 * 2**20
SMALL = (20, 300)  # rows, characters per answer: a day that fits
HUGE = (3000, 3000)  # about 9 MB: more than the filesystem holds
DAYS = ("2026-11-01", "2026-11-02")


def shaped(rows: int, chars: int, day: str) -> ShapedDataset:
    records = []
    for i in range(rows):
        messages = [
            {"role": "user", "content": f"{day} question {i}"},
            {"role": "assistant", "content": (f"answer {i} " * chars)[:chars]},
        ]
        records.append(
            Record(messages=messages, task="explain", content_hash=content_hash(messages, "explain"))
        )
    return ShapedDataset(train=records[1:], eval=records[:1], dropped=[], cut_to_fit=0)


def write_day(store_root: Path, day: str, rows: int, chars: int) -> dict[str, Any]:
    """lora_dataset's write: the day's folder replaced in one rename, or left as it was."""
    store = ArtifactStore(store_root)
    try:
        with store.atomic_folder(store.folder("lora_dataset", day)) as staging:
            save_dataset(shaped(rows, chars, day), staging)
    except OSError as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "errno": exc.errno}
    return {"ok": True}


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, not a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))


def _write_in_child(store_root: Path, day: str, size: tuple[int, int], limited: bool) -> dict[str, Any]:
    argv = [sys.executable, "-m", "lanes_pipeline.bench.drills_disk", str(store_root), day, *map(str, size)]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, preexec_fn=_limit_file_size if limited else None
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"ok": False, "error": f"the writer exited with code {done.returncode}: {done.stderr[-800:]}"}
    return json.loads(lines[-1])


@contextmanager
def small_filesystem() -> Iterator[tuple[Path, str]]:
    """A folder on a small tmpfs, or (mount refused) a plain folder written under RLIMIT_FSIZE."""
    folder = Path(tempfile.mkdtemp(prefix="lanes-drill-disk-"))
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m", "tmpfs", str(folder)], capture_output=True
    )
    try:
        yield folder, f"tmpfs {TMPFS_MB} MiB" if mounted.returncode == 0 else f"RLIMIT_FSIZE {FSIZE_LIMIT} B"
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", str(folder)], check=False)
        shutil.rmtree(folder, ignore_errors=True)


def _readable(folder: Path) -> bool:
    from datasets import load_from_disk

    try:
        data = load_from_disk(str(folder))
        return all(len(split) >= 0 for split in data.values())
    except (OSError, ValueError):
        return False


def clear_error(message: str, where: Path) -> bool:
    """Says what ran out (the system's words for a full disk, or a file over the size limit) and where."""
    lowered = message.lower()
    said = any(words in lowered for words in ("no space left on device", "file too large"))
    return said and str(where) in message


def disk_full() -> dict[str, Any]:
    with small_filesystem() as (folder, filesystem):
        limited = filesystem.startswith("RLIMIT")
        store_root = folder / "artifacts"
        writes = [_write_in_child(store_root, day, SMALL, limited) for day in DAYS]
        if not all(w["ok"] for w in writes):
            raise RuntimeError(f"the days that fit failed to write: {writes}")
        parts = {day: store_root / "lora_dataset" / day for day in DAYS}
        before = {day: sha256_tree(path) for day, path in parts.items()}
        used_before = shutil.disk_usage(folder).used
        full = _write_in_child(store_root, DAYS[1], HUGE, limited)  # the second day again, much larger
        after = {day: sha256_tree(path) for day, path in parts.items() if path.is_dir()}
        staging = [p.name for p in (store_root / "lora_dataset").iterdir() if p.name.startswith(".")]
        freed = shutil.disk_usage(folder).used <= used_before
        intact = after == before and all(_readable(path) for path in parts.values())
    error = full.get("error", "")
    return {
        "done": f"two days' datasets written, then the second day again, ~{HUGE[0] * HUGE[1] // 2**20} MB, "
        f"onto a filesystem too small for it ({filesystem}), as lora_dataset writes it",
        "filesystem": filesystem,
        "write_failed": not full["ok"],
        "error_message": error[:400],
        "clear_error": not full["ok"] and clear_error(error, parts[DAYS[1]]),
        "previous_partitions_intact": intact,
        "staging_left": len(staging),
        "space_given_back": freed,
    }


if __name__ == "__main__":
    root, day, rows, chars = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(write_day(root, day, rows, chars)), flush=True)
