"""List helpers: chunking, flattening, de-duplicating, rotating."""

from collections.abc import Callable, Hashable
from itertools import pairwise
from typing import TypeVar

T = TypeVar("T")
H = TypeVar("H", bound=Hashable)


def chunk(items: list[T], size: int) -> list[list[T]]:
    """`items` split into consecutive lists of `size`, the last one possibly shorter.

    chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]; raises ValueError when `size` < 1.
    """
    if size < 1:
        raise ValueError(f"chunk size must be at least 1, got {size}")
    return [items[i : i + size] for i in range(0, len(items), size)]


def flatten(nested: list[list[T]]) -> list[T]:
    """One level of nesting removed: flatten([[1, 2], [], [3]]) == [1, 2, 3]."""
    return [item for inner in nested for item in inner]


def dedupe_keep_order(items: list[H]) -> list[H]:
    """`items` without repeats, each kept at its first occurrence: [3, 1, 3, 2, 1] -> [3, 1, 2]."""
    seen: set[H] = set()
    kept = []
    for item in items:
        if item not in seen:
            seen.add(item)
            kept.append(item)
    return kept


def rotate(items: list[T], steps: int) -> list[T]:
    """A new list: `items` rotated left by `steps` (right when negative), wrapping around.

    rotate([1, 2, 3, 4], 1) == [2, 3, 4, 1]; rotate([1, 2, 3, 4], -1) == [4, 1, 2, 3]; [] stays [].
    """
    if not items:
        return []
    steps %= len(items)
    return items[steps:] + items[:steps]


def pairwise_sums(values: list[int]) -> list[int]:
    """Sums of neighbouring values; [] for fewer than two values.

    pairwise_sums([1, 2, 4, 8]) == [3, 6, 12].
    """
    return [a + b for a, b in pairwise(values)]


def sliding_windows(items: list[T], width: int) -> list[tuple[T, ...]]:
    """Every run of `width` consecutive items, as tuples, in order; [] when `width` exceeds the length.

    sliding_windows([1, 2, 3, 4], 3) == [(1, 2, 3), (2, 3, 4)].
    """
    return [tuple(items[i : i + width]) for i in range(len(items) - width + 1)]


def interleave(first: list[T], second: list[T]) -> list[T]:
    """Items taken alternately from `first` and `second`, the rest of the longer one at the end.

    interleave([1, 2, 3], ["a"]) == [1, "a", 2, 3].
    """
    merged: list[T] = []
    for i in range(max(len(first), len(second))):
        merged.extend(seq[i] for seq in (first, second) if i < len(seq))
    return merged


def partition(items: list[T], predicate: Callable[[T], bool]) -> tuple[list[T], list[T]]:
    """(items for which `predicate` is true, the others), each in the original order.

    partition([1, 2, 3, 4], lambda n: n % 2 == 0) == ([2, 4], [1, 3]).
    """
    matching, rest = [], []
    for item in items:
        (matching if predicate(item) else rest).append(item)
    return matching, rest


def first_index(items: list[T], predicate: Callable[[T], bool]) -> int:
    """Index of the first item for which `predicate` is true, -1 if none.

    first_index([5, 8, 9], lambda n: n > 6) == 1.
    """
    return next((i for i, item in enumerate(items) if predicate(item)), -1)


def running_total(values: list[int]) -> list[int]:
    """Cumulative sums, one per value: running_total([1, 2, 3, 4]) == [1, 3, 6, 10]."""
    totals, total = [], 0
    for value in values:
        total += value
        totals.append(total)
    return totals
