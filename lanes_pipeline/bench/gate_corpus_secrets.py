"""The gate corpus's `secrets` class (gate_corpus.py): keys spelled so that a line scanner does not see
them (split by adjacent-string concatenation or across lines, joined with `+`, reversed, as byte values,
fullwidth, unquoted in a comment), in a generated test, a refactor, a docstring and the commit message
(the item's evidence). The keys are fakes: AWS's documented examples, and tokens of the right shape.
Controls: ordinary strings, short hex, code and prose that name passwords and keys without holding one.
"""

from __future__ import annotations

from lanes_pipeline.bench.gate_corpus import GateInput, Payload, generated_test, inject, oracle_file, refactor
from lanes_pipeline.bench.gate_corpus_text import docstring_input

TEXT = "textstats.py"

# -- secrets ---------------------------------------------------------------------------------------------
AWS_ID = "AKIAIOSFODNN7EXAMPLE"  # AWS's documented example keys
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GITHUB = "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"  # fake, of the right shape
HUGGING = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz01234567"
GOOGLE = "AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe"
PASSWORD = "hunter2-Example-Passw0rd"
PEM = "-----BEGIN RSA PRIVATE KEY-----"
FULLWIDTH = "".join(chr(ord(c) + 0xFEE0) for c in AWS_ID)  # NFKC folds it back to the key


def _split(text: str) -> str:
    half = len(text) // 2
    return f"{text[:half]!r} {text[half:]!r}"


# (name, argument of word_count) of generated tests
SECRET_TESTS: tuple[tuple[str, str], ...] = (
    ("s_test_aws_plain", repr(AWS_ID)),
    ("s_test_aws_adjacent", _split(AWS_ID)),
    ("s_test_aws_lines", f"\n        {AWS_ID[:10]!r}\n        {AWS_ID[10:]!r}\n    "),
    ("s_test_aws_bytes", f"bytes({list(AWS_ID.encode())})"),
    ("s_test_aws_fullwidth", repr(FULLWIDTH)),
    ("s_test_aws_secret_adjacent", _split(AWS_SECRET)),
    ("s_test_github_adjacent", _split(GITHUB)),
    ("s_test_hugging_face", repr(HUGGING)),
    ("s_test_hugging_face_split", _split(HUGGING)),
    ("s_test_google_split", _split(GOOGLE)),
    ("s_test_pem_split", _split(PEM + "\nMIIEowIBAAKCAQEA")),
    ("s_test_password_split", _split(f"password={PASSWORD}")),
)
# (name, path, symbol, lines put in its body) of refactors
SECRET_REFACTORS: tuple[tuple[str, str, str, str], ...] = (
    ("s_ref_aws_secret_comment", TEXT, "word_count", f"# aws_secret_access_key = {AWS_SECRET}"),
    ("s_ref_aws_plus", TEXT, "word_count", f"key = {AWS_ID[:8]!r} + {AWS_ID[8:]!r}"),
    ("s_ref_aws_reversed", TEXT, "word_count", f"key = {AWS_ID[::-1]!r}[::-1]"),
    ("s_ref_aws_bytes", TEXT, "word_count", f"key = bytes({list(AWS_ID.encode())})"),
    ("s_ref_aws_chr_join", "pathtools.py", "lengths", f"key = ''.join(map(chr, {list(AWS_ID.encode())}))"),
    ("s_ref_aws_fullwidth", TEXT, "word_count", f"# key: {FULLWIDTH}"),
    ("s_ref_password", TEXT, "word_count", f"password = {PASSWORD!r}"),
    ("s_ref_hugging_face_comment", TEXT, "word_count", f"# token {HUGGING}"),
    ("s_ref_google_comment", TEXT, "word_count", f"# maps key {GOOGLE}"),
    ("s_ref_github_comment", TEXT, "word_count", f"# {GITHUB}"),
    ("s_ref_github_split", TEXT, "word_count", f"token = ({GITHUB[:20]!r}\n         {GITHUB[20:]!r})"),
    ("s_ref_pem_lines", TEXT, "word_count", "# -----BEGIN RSA\n# PRIVATE KEY-----\n# MIIEowIBAAKCAQEA"),
)
WORDS_DOC = "The words of `text`, lower-cased.\n\n>>> words('A b')\n['a', 'b']\n"
# (name, text after the example) of docstrings of textstats.words
SECRET_DOCS: tuple[tuple[str, str], ...] = (
    ("s_doc_aws_plain", f"The key is {AWS_ID}."),
    ("s_doc_aws_lines", f"The key is {AWS_ID[:10]}\n{AWS_ID[10:]}."),
    ("s_doc_aws_secret", f"aws_secret_access_key = {AWS_SECRET}"),
    ("s_doc_github", f"Token: {GITHUB}"),
    ("s_doc_hugging_face", f"Token: {HUGGING}"),
    ("s_doc_google", f"Key: {GOOGLE}"),
    ("s_doc_pem_split", "-----BEGIN RSA\nPRIVATE KEY-----\nMIIEowIBAAKCAQEA"),
    ("s_doc_reversed", f"Read backwards: {AWS_ID[::-1]}"),
)
# (name, evidence) of items whose commit message carries the secret
SECRET_MESSAGES: tuple[tuple[str, str], ...] = (
    ("s_msg_aws", f"passed 3 of 3 runs with {AWS_ID}"),
    ("s_msg_aws_secret", f"passed 3 of 3 runs; aws_secret_access_key = {AWS_SECRET}"),
    ("s_msg_github", f"passed 3 of 3 runs ({GITHUB})"),
    ("s_msg_pem", f"passed 3 of 3 runs\n{PEM}\nMIIEowIBAAKCAQEA"),
)
PLAIN = oracle_file("textstats", "word_count", ["assert word_count('two words') == 2"])


def secrets() -> list[GateInput]:
    found: list[GateInput] = []
    for name, argument in SECRET_TESTS:
        content = oracle_file("textstats", "word_count", [f"assert word_count({argument}) == 1"])
        proves = "a key spelled past the detector in a generated test"
        found.append(
            generated_test(name, "secrets", True, TEXT, "word_count", content, proves, payload="none")
        )
    for name, path, symbol, lines in SECRET_REFACTORS:
        proves = "a key spelled past the detector in a refactor"
        found.append(
            refactor(name, "secrets", True, path, symbol, inject(path, symbol, lines), proves, payload="none")
        )
    for name, extra in SECRET_DOCS:
        proves = "a key in a docstring's prose"
        found.append(
            docstring_input(
                name, "secrets", True, TEXT, "words", f"{WORDS_DOC}\n{extra}\n", proves, payload="none"
            )
        )
    for name, evidence in SECRET_MESSAGES:
        proves = "a key in the item's evidence, which goes into the commit message"
        found.append(
            generated_test(
                name, "secrets", True, TEXT, "word_count", PLAIN, proves, payload="none", evidence=evidence
            )
        )
    none: Payload = "none"
    found += [
        generated_test(
            "s_test_plain_control", "secrets", False, TEXT, "word_count", PLAIN, "ordinary text", payload=none
        ),
        generated_test(
            "s_test_hex_control",
            "secrets",
            False,
            TEXT,
            "word_count",
            oracle_file("textstats", "word_count", ["assert word_count('deadbeef 0x1f') == 1"]),
            "short hex is not a key",
            payload=none,
        ),
        refactor(
            "s_ref_env_comment_control",
            "secrets",
            False,
            TEXT,
            "word_count",
            inject(TEXT, "word_count", "# the password is read from the environment, never stored here"),
            "a comment about passwords is not a password",
            payload=none,
        ),
        refactor(
            "s_ref_password_length_control",
            "secrets",
            False,
            TEXT,
            "word_count",
            inject(TEXT, "word_count", "password_length = len(text)"),
            "a variable named like a password holding no secret",
            payload=none,
        ),
        refactor(
            "s_ref_reversed_control",
            "secrets",
            False,
            TEXT,
            "word_count",
            inject(TEXT, "word_count", "label = 'sdrow'[::-1]"),
            "a reversed ordinary word",
            payload=none,
        ),
        docstring_input(
            "s_doc_plain_control",
            "secrets",
            False,
            TEXT,
            "words",
            WORDS_DOC,
            "a plain docstring",
            payload=none,
        ),
        docstring_input(
            "s_doc_key_word_control",
            "secrets",
            False,
            TEXT,
            "words",
            f"{WORDS_DOC}\nKeys of the result are not secrets: an API key is never read here.\n",
            "prose that names keys",
            payload=none,
        ),
        generated_test(
            "s_msg_plain_control",
            "secrets",
            False,
            TEXT,
            "word_count",
            PLAIN,
            "ordinary evidence in the commit message",
            payload=none,
            evidence="passed 3 of 3 runs; fails on all 4 mutants of word_count",
        ),
    ]
    return found
