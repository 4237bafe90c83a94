"""The secret scan on real code: what a key looks like is dropped, a number that looks like hex is not."""

from __future__ import annotations

from lanes_pipeline.sandbox.safety import committed_secrets, secret_findings

# tabulate 0.10.0's own doctest (tabulate/__init__.py, `_isnumber`): its completion rows were all dropped.
TABULATE_DOCTEST = '''def _isnumber(string):
    """
    >>> _isnumber("123e45678")  # evaluates equal to 'inf', but ... isn't
    True
    """
'''
# The SHA-256 of nothing, and a made-up 32-hex-digit key (its digits and one `e` would also make a float,
# but not its other letters).
HEX_KEY = 'API_DIGEST = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"\n'
HEX_TOKEN = 'token = "9f86d081884c7d659a2feaa0c55ad015"\n'


def test_a_number_in_scientific_notation_is_not_a_hex_secret() -> None:
    assert secret_findings(TABULATE_DOCTEST) == []
    assert secret_findings('LIMITS = ["1e308", "2.5e-10", "123456789e12"]\n') == []


def test_hex_strings_that_are_not_numbers_are_still_found() -> None:
    assert "Hex High Entropy String" in secret_findings(HEX_KEY)
    assert "Hex High Entropy String" in secret_findings(HEX_TOKEN)
    # Random-looking only: a row is dropped for it, a file is not left out of the day for it.
    assert committed_secrets(HEX_KEY) == []
