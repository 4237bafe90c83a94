"""The artifact store: every file an asset writes lands here, atomically, under `<root>/<asset>/<partition>/`.

Atomic means written beside the target and renamed into place, so a killed run leaves either the old
artifact or the new one, never half of one. Content hashes make "byte-identical on re-run" checkable.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_tree(path: Path) -> str:
    """One hash over a file or a folder: relative names and contents, in sorted order."""
    if path.is_file():
        return sha256_bytes(path.read_bytes())
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


# A full disk, a quota, a file-size limit: the system's error names neither the artifact nor that the old
# one is kept (the fault drills' disk_full found "[Errno 28] No space left on device" and nothing more).
_OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def _out_of_space(exc: OSError, target: Path) -> OSError:
    return OSError(exc.errno, f"{exc.strerror} while writing {target}; its previous version, if any, is kept")


def canonical_json(obj: Any) -> bytes:
    """JSON with sorted keys and no whitespace variance: equal data gives equal bytes and hashes."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def folder(self, asset: str, partition: str | None = None) -> Path:
        return self.root / asset / (partition or "_unpartitioned")

    def write_bytes(self, target: Path, data: bytes) -> str:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, target)
        except OSError as exc:
            Path(temp).unlink(missing_ok=True)
            if exc.errno in _OUT_OF_SPACE:
                raise _out_of_space(exc, target) from exc
            raise
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        return sha256_bytes(data)

    def write_json(self, asset: str, partition: str | None, name: str, obj: Any) -> str:
        """Write canonical JSON (pretty enough to read, stable enough to hash); return its sha256."""
        data = json.dumps(obj, sort_keys=True, ensure_ascii=False, indent=1).encode("utf-8") + b"\n"
        return self.write_bytes(self.folder(asset, partition) / name, data)

    def read_json(self, asset: str, partition: str | None, name: str) -> Any:
        return json.loads((self.folder(asset, partition) / name).read_text(encoding="utf-8"))

    def exists(self, asset: str, partition: str | None, name: str) -> bool:
        return (self.folder(asset, partition) / name).exists()

    @contextmanager
    def atomic_folder(self, target: Path) -> Iterator[Path]:
        """Yield an empty staging folder; on success it replaces `target` in one rename."""
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            yield staging
            if target.exists():
                retired = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
                os.replace(target, retired / "x")
                os.replace(staging, target)
                shutil.rmtree(retired, ignore_errors=True)
            else:
                os.replace(staging, target)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if exc.errno in _OUT_OF_SPACE:
                raise _out_of_space(exc, target) from exc
            raise
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
