import pytest
from mathbits import (
    clamp,
    digit_sum,
    factorial,
    fibonacci,
    gcd,
    is_power_of_two,
    is_prime,
    lcm,
    mean,
    median,
    percent,
    round_to_multiple,
)


def test_clamp_limits_both_ends():
    assert clamp(15, 0, 10) == 10
    assert clamp(-3, 0, 10) == 0
    assert clamp(4.5, 0, 10) == 4.5


def test_clamp_rejects_an_empty_range():
    with pytest.raises(ValueError):
        clamp(1, 5, 2)


def test_is_prime():
    assert [n for n in range(-2, 20) if is_prime(n)] == [2, 3, 5, 7, 11, 13, 17, 19]
    assert is_prime(97)
    assert not is_prime(91)


def test_gcd():
    assert gcd(12, 18) == 6
    assert gcd(12, -18) == 6
    assert gcd(0, 7) == 7


def test_lcm():
    assert lcm(4, 6) == 12
    assert lcm(-3, 5) == 15
    assert lcm(0, 9) == 0


def test_digit_sum():
    assert digit_sum(472) == 13
    assert digit_sum(-472) == 13
    assert digit_sum(0) == 0


def test_mean():
    assert mean([1, 2, 6]) == 3.0
    assert mean([2.5]) == 2.5
    with pytest.raises(ValueError):
        mean([])


def test_median_odd_and_even_counts():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 3, 2]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_factorial():
    assert factorial(0) == 1
    assert factorial(5) == 120
    with pytest.raises(ValueError):
        factorial(-1)


def test_fibonacci():
    assert [fibonacci(n) for n in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]
    assert fibonacci(10) == 55


def test_is_power_of_two():
    assert [n for n in range(-4, 17) if is_power_of_two(n)] == [1, 2, 4, 8, 16]
    assert is_power_of_two(1024)
    assert not is_power_of_two(1023)


def test_percent():
    assert percent(1, 3) == 33.3
    assert percent(1, 8, digits=2) == 12.5
    assert percent(5, 0) == 0.0


def test_round_to_multiple():
    assert round_to_multiple(7, 5) == 5
    assert round_to_multiple(8, 5) == 10
    assert round_to_multiple(30, 10) == 30
