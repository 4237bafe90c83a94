"""What must never reach the model, the sandbox's host or the dataset: pure detectors, no I/O.

- `injection_markers`: text that tries to steer a model (prompt injection) inside repository files or
  model answers. Such files are quarantined at snapshot time and such records are dropped from the dataset.
- `secret_findings`: keys, tokens, passwords and private keys, found with detect-secrets' plugins and
  the shapes it lacks, however the text spells them (split, reversed, fullwidth, built by an expression);
  `committed_secrets`: all but the merely random-looking, for which a whole file is left out of the day.
- `unsafe_calls`: what a generated test may not do even inside the sandbox, because a test that does it
  would teach the LoRA to write such tests (the sandbox is the enforcement; this is the dataset policy).
- `safe_repo_path`: a path a model named may only point inside the repository.
"""

from __future__ import annotations

import ast
import json
import re
import unicodedata
from collections import Counter
from pathlib import PurePosixPath

from lanes_pipeline.sandbox.python_source import parse_python

# Phrases addressed to a model rather than to a human reader. Kept narrow: a false positive quarantines a
# file (it is listed, with the phrase, in the snapshot's left-out files), a false negative is caught by the
# sandbox and the dataset scrub downstream.
_INJECTION_PATTERNS = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"\bignore (all |any )?(the )?(previous|prior|above|earlier) (instructions|prompts?|rules)",
        r"\bdisregard (all |any )?(the )?(previous|prior|above|earlier|system) (instructions|prompts?|rules)",
        r"\bforget (all |everything )?(you were told|your instructions|previous instructions)",
        r"\byou are now (a|an|in) ",
        r"\b(new|updated|override) system prompt\b",
        r"\breveal (the |your )?(system prompt|hidden instructions)",
        r"<\|im_start\|>|<\|system\|>|\[INST\]|<<SYS>>",
        r"\bdo not tell the user\b",
        r"\bas an ai language model,? you must\b",
    )
)


def injection_markers(text: str) -> list[str]:
    """The prompt-injection phrases found in `text` (empty: none)."""
    found = []
    for pattern in _INJECTION_PATTERNS:
        match = pattern.search(text)
        if match:
            found.append(match.group(0))
    return found


def secret_findings(text: str) -> list[str]:
    """Secret types found in `text` (empty: none): detect-secrets' default plugins and filters, and the
    shapes it has no plugin for (SHAPES), over the text and over the spellings that hide a key from a line
    scanner: split across lines, reversed, in fullwidth letters (NFKC), and built by a constant Python
    expression (`"AKIA" "..."`, `+`, `[::-1]`, `bytes([65, ...])`, `''.join(map(chr, ...))`).

    Every built-in plugin runs on the text as written, high-entropy strings in quotes included: a dropped
    record costs one example, a kept key is a leak baked into weights. On the respellings only shaped
    findings count (joining lines makes quoted strings no author wrote). detect-secrets' line scanner is
    the one `scan_file` uses (its public `scan_line` is the ad-hoc mode that reports every word); pyproject
    pins the 1.5 series for it.
    """
    found = set(_line_findings(text))
    respelled = _respellings(text)
    found |= {kind for kind in _line_findings(respelled) if kind not in SHAPELESS_SECRETS}
    # A value a constant expression builds is a value as the author meant it: every plugin counts.
    # and a folded value is scanned as the one quoted string it is.
    folded = folded_strings(text)
    lines = [f"{_keyword_quoted(v)}\nvalue = {json.dumps(v)}" for v in folded]
    found |= set(_line_findings("\n".join(lines)))
    return sorted(found)


# Keys of a known shape detect-secrets has no plugin for, and the AWS secret it finds only in quotes.
SHAPES = {
    "Hugging Face Token": re.compile(r"\bhf_[A-Za-z0-9]{34}\b"),
    "Google API Key": re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b"),
    "AWS Secret Access Key": re.compile(
        r"aws.{0,20}?(?:secret|key).{0,20}?[=:]\s*[\"']?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])", re.IGNORECASE
    ),
}


def _line_findings(text: str) -> set[str]:
    from detect_secrets.core.scan import _process_line_based_plugins
    from detect_secrets.settings import default_settings

    lines = list(enumerate(text.splitlines(), start=1))
    with default_settings():
        found = {
            secret.type
            for secret in _process_line_based_plugins(lines, filename="record.py")
            if not _is_number_literal(secret.type, secret.secret_value)
        }
    found |= {kind for kind, pattern in SHAPES.items() if pattern.search(text)}
    # detect-secrets reads a PEM header only when the line is the whole key; catch split keys too.
    if re.search(r"-----BEGIN [A-Z ]*PRIVATE KEY-----", text):
        found.add("Private Key")
    return found


def _respellings(text: str) -> str:
    """The text joined across lines (comment marks and indentation dropped, with and without a space),
    reversed, and NFKC-normalised, one after the other."""
    joined = re.sub(r"[ \t]*\n[ \t#]*", "", text)
    spaced = re.sub(r"[ \t]*\n[ \t#]*", " ", text)  # a PEM header keeps its spaces
    variants = [joined, text[::-1], spaced if "-----BEGIN" in joined else ""]
    if not unicodedata.is_normalized("NFKC", text):
        variants.append(unicodedata.normalize("NFKC", text))
    return "\n".join(_keyword_quoted(v) for v in variants if v)


def _keyword_quoted(text: str) -> str:
    """`password=abc123` as `password = "abc123"`, the form detect-secrets' keyword plugin reads."""
    return _UNQUOTED_KEYWORD.sub(r'\1 = "\2"', text)


_UNQUOTED_KEYWORD = re.compile(r"\b(\w*(?:passw|secret|token|api_?key)\w*)\s*[=:]\s*([^\s'\"]{6,})", re.I)
MAX_FOLDED_CHARS = 4096


def folded_strings(text: str) -> list[str]:
    """The strings and bytes constant Python expressions in `text` build, folded without running
    anything (empty when `text` is not Python): implicit concatenation, `+`, constant slices,
    `bytes([...])`/`bytearray(...)`, `chr(n)`, `sep.join([...])`, `''.join(map(chr, [...]))`,
    `.encode()`/`.decode()`. Values over MAX_FOLDED_CHARS are left out."""
    try:
        tree = parse_python(text)
    except (SyntaxError, ValueError):
        return []
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.expr):
            value = _fold(node, 0)
            if value and value not in found:
                found.append(value)
    return found


def _ints(node: ast.expr) -> list[int] | None:
    if not isinstance(node, ast.List | ast.Tuple) or len(node.elts) > MAX_FOLDED_CHARS:
        return None
    values = [e.value for e in node.elts if isinstance(e, ast.Constant) and type(e.value) is int]
    return values if len(values) == len(node.elts) and all(0 <= v < 0x110000 for v in values) else None


def _fold(node: ast.expr, depth: int) -> str | None:
    """The text a constant expression makes (bytes as Latin-1), or None."""
    if depth > 20:
        return None
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        return value if isinstance(value, str) and len(value) <= MAX_FOLDED_CHARS else None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _fold(node.left, depth + 1), _fold(node.right, depth + 1)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
        base = _fold(node.value, depth + 1)
        bounds = [node.slice.lower, node.slice.upper, node.slice.step]
        numbers = [b.value if isinstance(b, ast.Constant) else b for b in bounds]
        if base is None or not all(n is None or type(n) is int for n in numbers) or numbers[2] == 0:
            return None
        return base[slice(*numbers)]
    if not isinstance(node, ast.Call) or node.keywords:
        return None
    func, args = node.func, node.args
    if isinstance(func, ast.Name) and len(args) == 1:
        if func.id in ("bytes", "bytearray") and (values := _ints(args[0])) is not None:
            return "".join(chr(v) for v in values if v < 256)
        if func.id == "chr" and isinstance(args[0], ast.Constant) and type(args[0].value) is int:
            return chr(args[0].value) if 0 <= args[0].value < 0x110000 else None
        if func.id in ("str", "bytes", "bytearray"):
            return _fold(args[0], depth + 1)
    if isinstance(func, ast.Attribute) and func.attr in ("encode", "decode") and len(args) <= 1:
        return _fold(func.value, depth + 1)
    if isinstance(func, ast.Attribute) and func.attr == "join" and len(args) == 1:
        separator = _fold(func.value, depth + 1)
        items = args[0]
        if separator is None:
            return None
        if isinstance(items, ast.Call) and ast.unparse(items.func) == "map" and len(items.args) == 2:
            codes = _ints(items.args[1]) if ast.unparse(items.args[0]) == "chr" else None
            return None if codes is None else separator.join(map(chr, codes))
        if isinstance(items, ast.List | ast.Tuple) and len(items.elts) <= MAX_FOLDED_CHARS:
            parts = [_fold(e, depth + 1) for e in items.elts]
            return None if None in parts else separator.join(p for p in parts if p is not None)
    return None


def _is_number_literal(kind: str, value: str | None) -> bool:
    """A "hex" string that is a number: detect-secrets reads the digits and the `e` of "123e45678" (a
    doctest of tabulate's `_isnumber`) as hex, and would drop every dataset row around that line."""
    if kind != "Hex High Entropy String" or not value:
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


# detect-secrets' findings that only say "random-looking": in real code they are hashes and test vectors as
# often as secrets. A row holding one is still dropped from the dataset (secret_findings), but a file is not
# left out of the day for it. A password assignment (`Secret Keyword`) is a secret by intent: its file is.
SHAPELESS_SECRETS = frozenset({"Base64 High Entropy String", "Hex High Entropy String"})


def committed_secrets(text: str) -> list[str]:
    """Secret types of a known shape (cloud keys, access tokens, private keys, ...) found in a file's
    `text`: such a file is left out of the day, so no prompt, answer or artifact carries the secret."""
    return [found for found in secret_findings(text) if found not in SHAPELESS_SECRETS]


def safe_repo_path(path: str) -> bool:
    """True for a relative path that stays inside the repository and avoids `.git`."""
    if not path or "\0" in path or "\\" in path:
        return False
    pure = PurePosixPath(path)
    if pure.is_absolute() or any(part in {"..", ".git"} for part in pure.parts):
        return False
    return all(part not in {"", "."} for part in pure.parts)


_BANNED_MODULES = frozenset(
    {
        "subprocess",
        "socket",
        "ctypes",
        "multiprocessing",
        "shutil",
        "urllib",
        "http",
        "requests",
        "httpx",
        "asyncio.subprocess",
        "pty",
        "signal",
        "resource",
        "importlib",
        "pickle",
        "marshal",
        "ftplib",
        "smtplib",
        "telnetlib",
        "webbrowser",
    }
)
_BANNED_OS_CALLS = frozenset(
    {
        "system",
        "popen",
        "fork",
        "forkpty",
        "kill",
        "killpg",
        "_exit",
        "remove",
        "unlink",
        "rmdir",
        "removedirs",
        "rename",
        "replace",
        "chmod",
        "chown",
        "setuid",
        "putenv",
        "symlink",
        "link",
        "truncate",
    }
)
_BANNED_BUILTINS = frozenset({"eval", "exec", "compile", "__import__", "breakpoint", "input", "exit", "quit"})


def unsafe_calls(tree: ast.AST) -> list[str]:
    """What in a generated test breaks the policy: banned imports, process/file-system calls, dynamic code."""
    return sorted(set(_unsafe_nodes(tree)))


def unsafe_code_added(before: str, after: str) -> list[str]:
    """What a change of a module adds that the policy forbids (each problem counted, so a second
    `os.system()` in a module that had one counts). A refactor runs in the sandbox, where a forbidden call
    can fail quietly (`os.system` returns a status) and every test still passes: it must never be accepted
    as training data. An `after` that does not parse adds nothing here (its tests fail)."""
    try:
        new = Counter(_unsafe_nodes(parse_python(after)))
    except SyntaxError:
        return []
    try:
        old = Counter(_unsafe_nodes(parse_python(before)))
    except SyntaxError:
        old = Counter()
    return sorted((new - old).keys())


def _unsafe_nodes(tree: ast.AST) -> list[str]:
    problems: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            problems += [f"import {a.name}" for a in node.names if _banned_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if _banned_module(module):
                problems.append(f"from {module} import ...")
            elif module == "os":
                problems += [f"from os import {a.name}" for a in node.names if _banned_os(a.name)]
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in _BANNED_BUILTINS:
                problems.append(f"{func.id}()")
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                if func.value.id == "os" and _banned_os(func.attr):
                    problems.append(f"os.{func.attr}()")
                elif func.value.id == "sys" and func.attr == "exit":
                    problems.append("sys.exit()")
    return problems


def _banned_module(name: str) -> bool:
    return any(name == m or name.startswith(f"{m}.") for m in _BANNED_MODULES)


def _banned_os(name: str) -> bool:
    return name in _BANNED_OS_CALLS or name.startswith(("exec", "spawn"))
