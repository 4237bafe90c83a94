"""Small integer and number helpers."""

import math


def clamp(value: float, low: float, high: float) -> float:
    """`value` limited to the range [`low`, `high`]: clamp(15, 0, 10) == 10, clamp(-3, 0, 10) == 0."""
    if low > high:
        raise ValueError(f"low {low} is above high {high}")
    return max(low, min(value, high))


def is_prime(n: int) -> bool:
    """True when `n` is a prime number; False for 0, 1 and negative numbers. is_prime(7) is True."""
    if n < 2:
        return False
    return all(n % d for d in range(2, math.isqrt(n) + 1))


def gcd(a: int, b: int) -> int:
    """Greatest common divisor of `a` and `b`, always >= 0, by Euclid's algorithm: gcd(12, -18) == 6."""
    a, b = abs(a), abs(b)
    while b:
        a, b = b, a % b
    return a


def lcm(a: int, b: int) -> int:
    """Least common multiple of `a` and `b`, always >= 0; 0 if either is 0: lcm(4, 6) == 12."""
    if a == 0 or b == 0:
        return 0
    return abs(a * b) // gcd(a, b)


def digit_sum(n: int) -> int:
    """Sum of the decimal digits of `n`, ignoring its sign: digit_sum(-472) == 13."""
    return sum(int(d) for d in str(abs(n)))


def mean(values: list[float]) -> float:
    """Arithmetic mean of `values`; raises ValueError for an empty list. mean([1, 2, 6]) == 3.0."""
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)


def median(values: list[float]) -> float:
    """Middle value of `values` once sorted; the mean of the two middle ones for an even count.

    median([3, 1, 2]) == 2 and median([4, 1, 3, 2]) == 2.5; raises ValueError for an empty list.
    """
    if not values:
        raise ValueError("median of an empty list")
    ordered, middle = sorted(values), len(values) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def factorial(n: int) -> int:
    """n! = 1 * 2 * ... * n, with factorial(0) == 1; raises ValueError for a negative `n`."""
    if n < 0:
        raise ValueError(f"factorial of negative number {n}")
    result = 1
    for k in range(2, n + 1):
        result *= k
    return result


def fibonacci(n: int) -> int:
    """The `n`-th Fibonacci number, counting fibonacci(0) == 0, fibonacci(1) == 1: fibonacci(10) == 55."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def is_power_of_two(n: int) -> bool:
    """True when `n` is 1, 2, 4, 8, ...; False for 0 and negative numbers."""
    return n > 0 and n & (n - 1) == 0


def percent(part: float, whole: float, digits: int = 1) -> float:
    """`part` as a percentage of `whole`, rounded to `digits` decimals; 0.0 if `whole` is 0.

    percent(1, 3) == 33.3 and percent(1, 8, digits=2) == 12.5.
    """
    if whole == 0:
        return 0.0
    return round(100 * part / whole, digits)


def round_to_multiple(value: int, step: int) -> int:
    """The multiple of `step` nearest to `value`, halves rounded up; ValueError unless `step` > 0.

    round_to_multiple(7, 5) == 5 and round_to_multiple(8, 5) == 10.
    """
    if step <= 0:
        raise ValueError(f"step must be positive, got {step}")
    return (value + step // 2) // step * step
