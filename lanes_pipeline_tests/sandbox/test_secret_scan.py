"""The secret scan against spellings that hide a key from a line scanner, each beside a harmless control,
and the redaction that keeps a shapeless finding's file usable in prompts."""

from __future__ import annotations

import ast

import pytest

from lanes_pipeline.sandbox.safety import committed_secrets, redact_secrets, secret_findings

AWS = "AKIAIOSFODNN7EXAMPLE"
CODES = ", ".join(str(ord(c)) for c in AWS)
FULLWIDTH = "".join(chr(ord(c) + 0xFEE0) for c in AWS)
HEX = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256 of nothing

SPELLED = [
    ("implicit", f'KEY = "{AWS[:4]}" "{AWS[4:]}"\n', "AWS Access Key"),
    ("across_lines", f'KEY = (\n    "{AWS[:8]}"\n    "{AWS[8:]}"\n)\n', "AWS Access Key"),
    ("plus", f'KEY = "{AWS[:6]}" + "{AWS[6:]}"\n', "AWS Access Key"),
    ("reversed", f'KEY = "{AWS[::-1]}"[::-1]\n', "AWS Access Key"),
    ("bytes", f"KEY = bytes([{CODES}])\n", "AWS Access Key"),
    ("bytearray", f"KEY = bytearray(({CODES}))\n", "AWS Access Key"),
    ("map_chr", f"KEY = ''.join(map(chr, [{CODES}]))\n", "AWS Access Key"),
    ("join_list", f"KEY = ''.join(['{AWS[:4]}', '{AWS[4:10]}', '{AWS[10:]}'])\n", "AWS Access Key"),
    ("chr_sum", "KEY = " + " + ".join(f"chr({ord(c)})" for c in AWS) + "\n", "AWS Access Key"),
    ("encode", f'KEY = "{AWS[:8]}".encode() + b"{AWS[8:]}"\n', "AWS Access Key"),
    ("fullwidth", f"KEY = '{FULLWIDTH}'\n", "AWS Access Key"),
    (
        "aws_unquoted",
        "# aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
        "AWS Secret Access Key",
    ),
    ("hugging_face", "token: hf_AbCdEfGhIjKlMnOpQrStUvWxYzabcdefgh\n", "Hugging Face Token"),
    ("google", "key = AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe\n", "Google API Key"),
]
CONTROLS = [
    ("implicit", 'GREETING = "Hello, " "world"\n'),
    ("across_lines", 'MESSAGE = (\n    "a message that is long"\n    " and split in two"\n)\n'),
    ("plus", 'PATH = "/usr" + "/local"\n'),
    ("reversed", "LABEL = 'sdrow'[::-1]\n"),
    ("bytes", "MAGIC = bytes([137, 80, 78, 71])\n"),
    ("bytearray", "BUFFER = bytearray((0, 1, 2))\n"),
    ("map_chr", "ABC = ''.join(map(chr, [97, 98, 99]))\n"),
    ("join_list", "WORDS = ', '.join(['alpha', 'beta', 'gamma'])\n"),
    ("chr_sum", "NL = chr(13) + chr(10)\n"),
    ("encode", 'DATA = "plain text".encode()\n'),
    ("fullwidth", "TITLE = 'Ｈｅｌｌｏ'\n"),
    ("aws_unquoted", "# aws_secret_access_key is read from the environment\n"),
    ("hugging_face", "model: hf_hub_download\n"),
    ("google", "key = AIza_short\n"),
]


@pytest.mark.parametrize(("name", "text", "kind"), SPELLED, ids=[s[0] for s in SPELLED])
def test_every_spelling_of_a_key_is_found_and_leaves_its_file_out(name: str, text: str, kind: str) -> None:
    assert kind in secret_findings(text)
    assert kind in committed_secrets(text)
    clean, found = redact_secrets(text)
    assert found and "<redacted:" in clean  # overlapping findings share one placeholder, the first's type
    assert AWS not in clean and "wJalrXUtnFEMI" not in clean and "hf_AbCd" not in clean
    assert secret_findings(clean) == []


@pytest.mark.parametrize(("name", "text"), CONTROLS, ids=[c[0] for c in CONTROLS])
def test_the_harmless_control_of_each_spelling_holds_no_secret(name: str, text: str) -> None:
    assert secret_findings(text) == []
    assert redact_secrets(text) == (text, [])


def test_a_hash_is_shapeless_its_value_redacted_and_the_rest_of_the_text_kept() -> None:
    text = f'"""Digests."""\n\nEMPTY = "{HEX}"  # sha256 of b""\nSIZE = 32\n'
    assert secret_findings(text) == ["Hex High Entropy String"]
    assert committed_secrets(text) == []
    clean, found = redact_secrets(text)
    assert found == ["Hex High Entropy String"]
    assert (
        clean
        == '"""Digests."""\n\nEMPTY = "<redacted:Hex High Entropy String>"  # sha256 of b""\nSIZE = 32\n'
    )


def test_a_folded_expression_is_redacted_whole_and_the_code_still_parses() -> None:
    text = f'def key():\n    return ("{HEX[:32]}"\n            "{HEX[32:]}")\n\n\nLIMIT = 3\n'
    clean, found = redact_secrets(text)
    assert found == ["Hex High Entropy String"]
    assert HEX[:32] not in clean and HEX[32:] not in clean and "LIMIT = 3" in clean
    ast.parse(clean)


def test_folding_never_runs_or_looks_up_anything() -> None:
    ran: list[str] = []
    # A call of a name, an attribute of a name and a format spec are not folded: nothing is found in the
    # pieces, and nothing could run (the scan only walks the tree).
    text = (
        f"KEY = make('{AWS[:10]}') + '{AWS[10:]}'\n"
        f"KEY2 = os.environ['{AWS[:10]}'] + '{AWS[10:]}'\n"
        f'KEY3 = f\'{{__import__("os").system("true")}}{AWS[:10]}\'\n'
        f"KEY4 = ''.join(map(ord, [{CODES}]))\n"
    )
    assert secret_findings(text) == []
    assert ran == []


def test_a_huge_fold_is_skipped() -> None:
    text = "BIG = " + " + ".join(["'abcdefgh'"] * 2000) + f" + '{AWS}'\n"
    assert "AWS Access Key" in secret_findings(text)  # the key is on its line as written
    assert secret_findings("BIG = " + " + ".join(["'abcdefgh'"] * 2000) + "\n") == []


def test_an_indented_fragment_of_code_is_read_as_code_and_a_comment_still_as_text() -> None:
    assert secret_findings("    password_length = len(text)") == []
    assert "Secret Keyword" in secret_findings("    x = 1\n    # password=hunter2-Example-Passw0rd\n")
