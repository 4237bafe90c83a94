"""What must never reach the model, the sandbox's host or the dataset: pure detectors, no I/O.

- `injection_markers`: text that tries to steer a model (prompt injection) inside repository files or
  model answers. Such files are quarantined at snapshot time and such records are dropped from the dataset.
- `secret_findings`: keys, tokens, passwords and private keys, found with detect-secrets' plugins and
  the shapes it lacks, however the text spells them (split, reversed, fullwidth, built by an expression);
  `committed_secrets`: all but the merely random-looking, for which a whole file is left out of the day;
  `redact_secrets`: the values replaced by placeholders (what prompts and logs carry). They live in
  secret_scan.py and are imported from here.
- `unsafe_calls`: what a generated test may not do even inside the sandbox, because a test that does it
  would teach the LoRA to write such tests (the sandbox is the enforcement; this is the dataset policy).
- `safe_repo_path`: a path a model named may only point inside the repository.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import PurePosixPath

from lanes_pipeline.sandbox.python_source import parse_python
from lanes_pipeline.sandbox.secret_scan import (
    SHAPELESS_SECRETS,
    committed_secrets,
    redact_secrets,
    redacted,
    secret_findings,
)

__all__ = [
    "SHAPELESS_SECRETS",
    "committed_secrets",
    "injection_markers",
    "redact_secrets",
    "redacted",
    "safe_repo_path",
    "secret_findings",
    "unsafe_calls",
    "unsafe_code_added",
]

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
