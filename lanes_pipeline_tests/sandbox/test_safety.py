"""The secret scan on real code: what a key looks like is dropped, a number that looks like hex is not."""

from __future__ import annotations

import pytest

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


_AWS = "AKIAIOSFODNN7EXAMPLE"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (f"key = ({_AWS[:10]!r}\n       {_AWS[10:]!r})", "AWS Access Key"),
        (f"key = {_AWS[:8]!r} + {_AWS[8:]!r}", "AWS Access Key"),
        (f"key = {_AWS[::-1]!r}[::-1]", "AWS Access Key"),
        (f"key = bytes({list(_AWS.encode())})", "AWS Access Key"),
        (f"key = ''.join(map(chr, {list(_AWS.encode())}))", "AWS Access Key"),
        ("# key: " + "".join(chr(ord(c) + 0xFEE0) for c in _AWS), "AWS Access Key"),
        (f"Read backwards: {_AWS[::-1]}", "AWS Access Key"),
        (f"The key is {_AWS[:10]}\n{_AWS[10:]}.", "AWS Access Key"),
        ("# aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "AWS Secret Access Key"),
        ("# token hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567", "Hugging Face Token"),
        ("Key: AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe", "Google API Key"),
        ("# -----BEGIN RSA\n# PRIVATE KEY-----\n", "Private Key"),
        ("assert f('password=hunter2-' 'Example-Passw0rd') == 1", "Secret Keyword"),
    ],
)
def test_a_key_spelled_past_a_line_scanner_is_found(text: str, kind: str) -> None:
    assert kind in secret_findings(text)


@pytest.mark.parametrize(
    "text",
    [
        "label = 'sdrow'[::-1]",
        "password_length = len(text)",
        "# the password is read from the environment, never stored here",
        "assert word_count('deadbeef 0x1f') == 1",
        "words = ' '.join(['a', 'b'])",
    ],
)
def test_ordinary_text_and_code_hold_no_secret(text: str) -> None:
    assert secret_findings(text) == []


def test_the_new_shapes_leave_a_file_out_of_the_day() -> None:
    assert committed_secrets("TOKEN = 'hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567'") == ["Hugging Face Token"]


def test_a_password_assignment_leaves_its_file_out_and_a_random_looking_string_does_not() -> None:
    assert committed_secrets('password = "hunter2-Example-Passw0rd"\n') == ["Secret Keyword"]
    assert committed_secrets(HEX_KEY) == []
