import pytest
from seqtools import (
    chunk,
    dedupe_keep_order,
    first_index,
    flatten,
    interleave,
    pairwise_sums,
    partition,
    rotate,
    running_total,
    sliding_windows,
)


def test_chunk():
    assert chunk([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert chunk([], 3) == []
    with pytest.raises(ValueError):
        chunk([1], 0)


def test_flatten():
    assert flatten([[1, 2], [], [3]]) == [1, 2, 3]
    assert flatten([[[1]], [[2, 3]]]) == [[1], [2, 3]]


def test_dedupe_keep_order():
    assert dedupe_keep_order([3, 1, 3, 2, 1]) == [3, 1, 2]
    assert dedupe_keep_order(["b", "a", "b"]) == ["b", "a"]
    assert dedupe_keep_order([]) == []


def test_rotate():
    assert rotate([1, 2, 3, 4], 1) == [2, 3, 4, 1]
    assert rotate([1, 2, 3, 4], -1) == [4, 1, 2, 3]
    assert rotate([1, 2, 3], 7) == [2, 3, 1]
    assert rotate([], 2) == []


def test_pairwise_sums():
    assert pairwise_sums([1, 2, 4, 8]) == [3, 6, 12]
    assert pairwise_sums([5]) == []


def test_sliding_windows():
    assert sliding_windows([1, 2, 3, 4], 3) == [(1, 2, 3), (2, 3, 4)]
    assert sliding_windows([1, 2], 1) == [(1,), (2,)]
    assert sliding_windows([1, 2], 3) == []


def test_interleave():
    assert interleave([1, 2, 3], ["a"]) == [1, "a", 2, 3]
    assert interleave([], [7, 8]) == [7, 8]
    assert interleave([1, 2], [3, 4]) == [1, 3, 2, 4]


def test_partition():
    assert partition([1, 2, 3, 4], lambda n: n % 2 == 0) == ([2, 4], [1, 3])
    assert partition([], bool) == ([], [])


def test_first_index():
    assert first_index([5, 8, 9], lambda n: n > 6) == 1
    assert first_index([5, 8, 9], lambda n: n > 60) == -1


def test_running_total():
    assert running_total([1, 2, 3, 4]) == [1, 3, 6, 10]
    assert running_total([]) == []
    assert running_total([5, -5]) == [5, 0]
