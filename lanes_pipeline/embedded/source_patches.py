"""Exact replacements made to an engine's sources before it is built or run (ik_llama.cpp's tree before its
build, vLLM's installed package after pip): each found as often as expected or the install stops, naming the
file, since another version must be looked at rather than run without the fix."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lanes_pipeline.errors import EmbeddedStartError


@dataclass(frozen=True)
class SourcePatch:
    """One exact replacement in an engine's sources, with the reason."""

    path: str  # relative to the tree patched (ik's source tree, the venv's site-packages)
    old: str
    new: str
    why: str
    occurrences: int = 1  # every one is replaced


def apply_source_patches(tree: Path, patches: tuple[SourcePatch, ...], log_path: Path) -> None:
    """Apply each patch once (a resumed build finds it applied already)."""
    for patch in patches:
        path = tree / patch.path
        text = path.read_text(encoding="utf-8")
        # Applied: its new text is there and its old text gone, or kept inside the new (an insertion).
        # Two patches may write the same new text at different places: that alone says nothing.
        if patch.new in text and (patch.old in patch.new or patch.old not in text):
            continue
        if text.count(patch.old) != patch.occurrences:
            raise EmbeddedStartError(
                f"cannot apply the patch to {path} ({patch.why}): its text occurs "
                f"{text.count(patch.old)} times, expected {patch.occurrences}",
                log_path,
                "",
            )
        path.write_text(text.replace(patch.old, patch.new), encoding="utf-8")
