"""Secrets in untrusted text (a repository's files, a model's answers): found, and redacted for prompts.

detect-secrets' line plugins read raw lines, so a key spelled as a Python expression passes them: split by
implicit concatenation across lines, joined with `+`, reversed with `[::-1]`, given as byte values
(`bytes([65, 75, ...])`, `''.join(map(chr, [...]))`), or written in fullwidth letters. The scan therefore
also reads (a) the lines that NFKC normalisation changes, normalised, and (b) when the text parses as
Python, the value of every constant string expression, folded from the syntax tree. Folding is pure AST
walking over literals and a fixed set of operations on them (no name is looked up, nothing is evaluated),
and stops at `MAX_FOLD` characters, so a hostile file can neither run code nor make the scan slow.

A few shapes detect-secrets has no plugin for are detected here (`PROJECT_DETECTORS`); like its own shaped
plugins they leave a file out of the day (`committed_secrets`). The shapeless findings (`SHAPELESS_SECRETS`)
leave the file in, so `redact_secrets` replaces their values in the text a prompt is built from.
"""

from __future__ import annotations

import ast
import re
import textwrap
import unicodedata
from dataclasses import dataclass

from lanes_pipeline.sandbox.python_source import parse_python

MAX_FOLD = 4096  # characters: a folded value longer than this is not a key, and folding it costs time
_MAX_DEPTH = 40  # nested operations a fold follows (a deeper expression is not folded)
_FILENAME = "record.py"  # detect-secrets picks its quoting rules by suffix: Python's for every text

# detect-secrets' findings that only say "random-looking": in real code they are hashes and test vectors as
# often as secrets. A row holding one is still dropped from the dataset (secret_findings), but a file is not
# left out of the day for it: its values are redacted in prompts instead. A password assignment
# (`Secret Keyword`) is a secret by intent: its file is left out.
SHAPELESS_SECRETS = frozenset({"Base64 High Entropy String", "Hex High Entropy String"})

# Keys of a known shape detect-secrets has no plugin for, and the AWS secret it finds only in quotes:
# (type, pattern, the group that is the value).
PROJECT_DETECTORS: tuple[tuple[str, re.Pattern[str], int], ...] = (
    ("Hugging Face Token", re.compile(r"\bhf_[A-Za-z0-9]{34}\b"), 0),
    ("Google API Key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b"), 0),
    (
        "AWS Secret Access Key",
        re.compile(
            r"aws.{0,20}?(?:secret|key).{0,20}?[=:]\s*[\"']?([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])",
            re.IGNORECASE,
        ),
        1,
    ),
)
_KEY_LIKE_TOKEN = re.compile(r"(?=[\w/+=-]*[A-Z0-9])[\w/+=-]{16,}")
_UNQUOTED_KEYWORD = re.compile(r"\b(\w*(?:passw|secret|token|api_?key)\w*)\s*[=:]\s*([^\s'\"]{6,})", re.I)
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
_PRIVATE_KEY_END = re.compile(r"-----END [A-Z ]*PRIVATE KEY-----")


@dataclass(frozen=True)
class Finding:
    kind: str
    start: int  # the value's span in the scanned text; -1: found only in a respelling of the whole text
    end: int
    expression: bool = False  # the span is a whole Python expression (a folded one)


def secret_findings(text: str) -> list[str]:
    """Secret types found in `text` (empty: none): detect-secrets' default plugins and filters, the project's
    detectors, on the text, its NFKC-normalised lines and its folded Python string expressions.

    Every built-in plugin runs, high-entropy strings in quotes included: a dropped record costs one example,
    a kept key is a leak baked into weights. detect-secrets' line scanner is the one `scan_file` uses (its
    public `scan_line` is the ad-hoc mode that reports every word); pyproject pins the 1.5 series for it.
    """
    return sorted({finding.kind for finding in _findings(text)})


def committed_secrets(text: str) -> list[str]:
    """Secret types of a known shape (cloud keys, access tokens, private keys, ...) found in a file's
    `text`: such a file is left out of the day, so no prompt, answer or artifact carries the secret."""
    return [found for found in secret_findings(text) if found not in SHAPELESS_SECRETS]


def redact_secrets(text: str) -> tuple[str, list[str]]:
    """`text` with each secret value found replaced by `<redacted:TYPE>` (the rest of each line kept), and the
    type of each value replaced, one entry per value. A folded Python expression is replaced whole by the
    placeholder as a string literal, so redacted code still parses."""
    findings = _findings(text)
    if not findings:
        return text, []
    located = {f.kind for f in findings if f.start >= 0}
    unlocated = sorted({f.kind for f in findings if f.start < 0} - located)
    findings = [f for f in findings if f.start >= 0]
    if unlocated:  # a key read backwards or across lines has no span to cut: nothing of the text is kept
        return placeholder(", ".join(unlocated)), unlocated
    spans: list[Finding] = []
    for finding in sorted(findings, key=lambda f: (f.start, -f.end)):
        if spans and finding.start < spans[-1].end:  # overlaps the one before: one placeholder for both
            if finding.end > spans[-1].end:  # the union is no longer one expression
                spans[-1] = Finding(spans[-1].kind, spans[-1].start, finding.end)
            continue
        spans.append(finding)
    parts, last = [], 0
    for span in spans:
        parts += [text[last : span.start], placeholder(span.kind, quoted=span.expression)]
        last = span.end
    parts.append(text[last:])
    return "".join(parts), [span.kind for span in spans]


def redacted(text: str) -> str:
    """`text` with its secret values redacted (see `redact_secrets`): for a log line or a reason that quotes
    repository text or an answer."""
    return redact_secrets(text)[0]


def placeholder(kind: str, quoted: bool = False) -> str:
    # Angle brackets: detect-secrets reads `<...>` as a template, so a redacted text scans clean.
    text = f"<redacted:{kind}>"
    return repr(text) if quoted else text


# ---------------------------------------------------------------------------------------------------------
# The scan
# ---------------------------------------------------------------------------------------------------------


def _findings(text: str) -> list[Finding]:
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    found = _line_findings([(i, line.rstrip("\r\n")) for i, line in enumerate(lines)], starts)
    found += _pattern_findings(text, 0)
    for index, line in enumerate(lines):
        if not line.isascii():
            found += _normalised_findings(line.rstrip("\r\n"), starts[index])
    python, folded = _folded_findings(text, lines, starts)
    found += folded
    found += _respelled_findings(text, lines, python or _is_python_fragment(text))
    private = _PRIVATE_KEY.search(text)
    if private:  # detect-secrets reads a PEM header only when the line is the whole key: catch split keys
        end = _PRIVATE_KEY_END.search(text, private.end())
        found.append(Finding("Private Key", private.start(), end.end() if end else len(text)))
    return found


def _respelled_findings(text: str, lines: list[str], python: bool) -> list[Finding]:
    """Shaped findings in the text joined across lines (comment marks and indentation dropped, with and
    without a space), reversed, NFKC-normalised, and with unquoted `password=...` quoted the way
    detect-secrets' keyword plugin reads it. Only shaped findings count: joining lines makes quoted strings
    no author wrote. In Python code only comments get the unquoted-keyword reading: `token = next_token()`
    is code, not a password."""
    joined = re.sub(r"[ \t]*\n[ \t#]*", "", text)
    # Reversed, only the lines that hold a long token with a capital or a digit (every key shape does):
    # reversing the whole text would double the scan's cost for lines that cannot hold a key.
    variants = [joined, "\n".join(line[::-1] for line in lines if _KEY_LIKE_TOKEN.search(line))]
    if "-----BEGIN" in joined:  # a PEM header keeps its spaces
        variants.append(re.sub(r"[ \t]*\n[ \t#]*", " ", text))
    if not text.isascii() and not unicodedata.is_normalized("NFKC", text):
        variants.append(unicodedata.normalize("NFKC", text))
    if python:
        comments = [line for line in lines if line.lstrip().startswith("#")]
        variants.append(_keyword_quoted("".join(comments)) if comments else "")
    else:
        variants = [_keyword_quoted(v) for v in [text, *variants]]
    respelled = "\n".join(v for v in variants if v)
    rows = list(enumerate(respelled.splitlines()))
    kinds = {f.kind for f in _line_findings(rows, [0] * len(rows))}
    kinds |= {f.kind for f in _pattern_findings(respelled, 0)}
    return [Finding(kind, -1, -1) for kind in sorted(kinds - SHAPELESS_SECRETS)]


def _is_python_fragment(text: str) -> bool:
    """An indented piece of Python (a method's lines, a diff's added lines) is code too."""
    dedented = textwrap.dedent(text)
    if dedented == text:
        return False
    try:
        parse_python(dedented)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _keyword_quoted(text: str) -> str:
    """`password=abc123` as `password = "abc123"`, the form detect-secrets' keyword plugin reads."""
    return _UNQUOTED_KEYWORD.sub(r'\1 = "\2"', text)


def _line_findings(lines: list[tuple[int, str]], starts: list[int]) -> list[Finding]:
    """detect-secrets' line plugins over `(index, line)`; each value's span from `starts[index]`."""
    from detect_secrets.core.scan import _process_line_based_plugins
    from detect_secrets.settings import default_settings

    text_of = dict(lines)
    found = []
    with default_settings():
        numbered = [(index + 1, line) for index, line in lines]
        for secret in _process_line_based_plugins(numbered, filename=_FILENAME):
            if _is_number_literal(secret.type, secret.secret_value):
                continue
            index = secret.line_number - 1
            line = text_of[index]
            at = line.find(secret.secret_value) if secret.secret_value else -1
            if at < 0:  # a value detect-secrets transformed: the whole line goes
                found.append(Finding(secret.type, starts[index], starts[index] + len(line)))
            else:
                start = starts[index] + at
                found.append(Finding(secret.type, start, start + len(secret.secret_value)))
    return found


def _pattern_findings(text: str, offset: int) -> list[Finding]:
    return [
        Finding(kind, offset + match.start(group), offset + match.end(group))
        for kind, pattern, group in PROJECT_DETECTORS
        for match in pattern.finditer(text)
    ]


def _normalised_findings(line: str, start: int) -> list[Finding]:
    """Findings in a line's NFKC form (fullwidth `ＡＫＩＡ` is `AKIA`), mapped back to the line's characters.
    Normalised one character at a time, so each normalised character knows the one it came from."""
    pieces = [unicodedata.normalize("NFKC", char) for char in line]
    normal = "".join(pieces)
    if normal == line:
        return []
    origin = [index for index, piece in enumerate(pieces) for _ in piece] + [len(line)]
    found = _line_findings([(0, normal)], [0]) + _pattern_findings(normal, 0)
    return [
        Finding(f.kind, start + origin[f.start], start + (origin[f.end - 1] + 1 if f.end > f.start else 0))
        for f in found
    ]


def _folded_findings(text: str, lines: list[str], starts: list[int]) -> tuple[bool, list[Finding]]:
    """(whether `text` is Python, its findings): each folded string expression scanned as its own quoted
    line, and as the keyword plugin reads `password=...`; a finding covers the whole expression."""
    try:
        tree = parse_python(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False, []
    found = []
    for node, value in _Folder(lines).folds(tree):
        span = _node_span(node, lines, starts)
        if span is None:
            continue
        if not value.isascii():
            value = unicodedata.normalize("NFKC", value)
        # Quoted: detect-secrets' high-entropy plugins read only quoted strings.
        quote = "'" if '"' in value else '"'
        rows = value.splitlines() or [value]
        pieces = [(i, f"{quote}{piece}{quote}") for i, piece in enumerate(rows)]
        pieces += [
            (len(rows) + i, _keyword_quoted(piece))
            for i, piece in enumerate(rows)
            if "=" in piece or ":" in piece
        ]
        scanned = _line_findings(pieces, [0] * len(pieces))
        kinds = {f.kind for f in scanned} | {f.kind for f in _pattern_findings(value, 0)}
        if _PRIVATE_KEY.search(value):
            kinds.add("Private Key")
        found += [Finding(kind, *span, expression=True) for kind in sorted(kinds)]
    return True, found


def _node_span(node: ast.expr, lines: list[str], starts: list[int]) -> tuple[int, int] | None:
    if node.end_lineno is None or node.end_col_offset is None or node.end_lineno > len(lines):
        return None

    def offset(lineno: int, byte_col: int) -> int:
        line = lines[lineno - 1]
        return starts[lineno - 1] + len(line.encode("utf-8")[:byte_col].decode("utf-8", "ignore"))

    return offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)


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


# ---------------------------------------------------------------------------------------------------------
# Folding constant string expressions (pure: literals and a fixed set of operations on them)
# ---------------------------------------------------------------------------------------------------------

_Value = str | bytes
_NO_ARG_METHODS = frozenset({"lower", "upper", "strip", "lstrip", "rstrip", "swapcase"})
_CODECS = frozenset({"utf-8", "utf8", "ascii", "latin-1", "latin1"})


class _Folder:
    """Folds expressions made only of literals; results memoised per node, so a walk folds each once."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.memo: dict[int, _Value | None] = {}

    def folds(self, tree: ast.AST) -> list[tuple[ast.expr, str]]:
        """(node, value) for each outermost foldable expression whose value its source lines do not show
        as written: a plain one-piece literal is already read by the line scan."""
        out: list[tuple[ast.expr, str]] = []
        stack: list[ast.AST] = [tree]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.expr) and not isinstance(node, ast.Name):
                value = self.fold(node, 0)
                if value is not None:
                    text = value.decode("latin-1") if isinstance(value, bytes) else value
                    if text and not self._shown(node, text):
                        out.append((node, text))
                    continue
            stack.extend(ast.iter_child_nodes(node))
        return out

    def _shown(self, node: ast.expr, text: str) -> bool:
        if not isinstance(node, ast.Constant) or node.end_lineno is None:
            return False
        return text in "".join(self.lines[node.lineno - 1 : node.end_lineno])

    def fold(self, node: ast.expr, depth: int) -> _Value | None:
        key = id(node)
        if key not in self.memo:
            value = self._fold(node, depth) if depth < _MAX_DEPTH else None
            self.memo[key] = value if value is None or len(value) <= MAX_FOLD else None
        return self.memo[key]

    def _fold(self, node: ast.expr, depth: int) -> _Value | None:
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, str | bytes) else None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self._sum(node, depth)
        if isinstance(node, ast.Subscript):
            return self._subscript(node, depth)
        if isinstance(node, ast.JoinedStr):
            return self._fstring(node, depth)
        if isinstance(node, ast.Call) and not node.keywords:
            return self._call(node, depth)
        return None

    def _sum(self, node: ast.BinOp, depth: int) -> _Value | None:
        terms: list[ast.expr] = []
        left: ast.expr = node
        while isinstance(left, ast.BinOp) and isinstance(left.op, ast.Add):  # `a + b + c` nests leftwards
            terms.append(left.right)
            left = left.left
        terms.append(left)
        values = [self.fold(term, depth + 1) for term in reversed(terms)]
        if any(v is None for v in values) or len({type(v) for v in values}) != 1:
            return None
        total = sum(len(v) for v in values if v is not None)
        if total > MAX_FOLD:
            return None
        first = values[0]
        return (b"" if isinstance(first, bytes) else "").join(values)  # type: ignore[arg-type]

    def _subscript(self, node: ast.Subscript, depth: int) -> _Value | None:
        value = self.fold(node.value, depth + 1)
        if value is None:
            return None
        index = node.slice
        if isinstance(index, ast.Slice):
            bounds = [_small_int(part) if part is not None else None for part in (index.lower, index.upper)]
            step = _small_int(index.step) if index.step is not None else None
            parts = (index.lower, index.upper, index.step)
            if any(p is not None and b is None for p, b in zip(parts, [*bounds, step], strict=True)):
                return None
            if step == 0:
                return None
            return value[slice(bounds[0], bounds[1], step)]
        at = _small_int(index)
        if at is None or not -len(value) <= at < len(value):
            return None
        return value[at : at + 1] if isinstance(value, bytes) else value[at]

    def _fstring(self, node: ast.JoinedStr, depth: int) -> str | None:
        parts = []
        for part in node.values:
            if isinstance(part, ast.FormattedValue):
                if part.conversion != -1 or part.format_spec is not None:
                    return None
                part = part.value
            value = self.fold(part, depth + 1)
            if not isinstance(value, str):
                return None
            parts.append(value)
        return "".join(parts)

    def _call(self, node: ast.Call, depth: int) -> _Value | None:
        func, args = node.func, node.args
        if isinstance(func, ast.Name):
            if func.id in {"bytes", "bytearray"} and len(args) == 1:
                codes = _int_items(args[0])
                return bytes(codes) if codes is not None and all(0 <= c < 256 for c in codes) else None
            if func.id == "chr" and len(args) == 1:
                code = _small_int(args[0])
                return chr(code) if code is not None and 0 <= code <= 0x10FFFF else None
            return None
        if not isinstance(func, ast.Attribute):
            return None
        owner = self.fold(func.value, depth + 1)
        if owner is None:
            return None
        if func.attr == "join" and len(args) == 1:
            return self._join(owner, args[0], depth)
        if func.attr in {"encode", "decode"} and _codec(args) is not None:
            codec = _codec(args)
            try:
                if func.attr == "encode" and isinstance(owner, str):
                    return owner.encode(codec)  # type: ignore[arg-type]
                if func.attr == "decode" and isinstance(owner, bytes):
                    return owner.decode(codec)  # type: ignore[arg-type]
            except (UnicodeError, LookupError):
                return None
            return None
        if func.attr in _NO_ARG_METHODS and not args:
            return getattr(owner, func.attr)()
        return None

    def _join(self, separator: _Value, items: ast.expr, depth: int) -> _Value | None:
        if not isinstance(separator, str):
            return None
        if isinstance(items, ast.List | ast.Tuple):
            values = [self.fold(item, depth + 1) for item in items.elts]
            if not all(isinstance(v, str) for v in values):
                return None
            return separator.join(values)  # type: ignore[arg-type]
        chars = _chr_map(items)
        if chars is None:
            return None
        return separator.join(chars)


def _small_int(node: ast.expr) -> int | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _small_int(node.operand)
        return -inner if inner is not None else None
    if isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) <= 0x10FFFF:
        return node.value
    return None


def _int_items(node: ast.expr) -> list[int] | None:
    if not isinstance(node, ast.List | ast.Tuple) or len(node.elts) > MAX_FOLD:
        return None
    codes = [_small_int(item) for item in node.elts]
    return None if any(c is None for c in codes) else codes  # type: ignore[return-value]


def _chr_map(node: ast.expr) -> list[str] | None:
    """`map(chr, [ints])` or `(chr(c) for c in [ints])` as characters."""
    codes: list[int] | None = None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "map"
        and len(node.args) == 2
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == "chr"
    ):
        codes = _int_items(node.args[1])
    elif isinstance(node, ast.GeneratorExp | ast.ListComp) and len(node.generators) == 1:
        loop, element = node.generators[0], node.elt
        if (
            not loop.ifs
            and isinstance(loop.target, ast.Name)
            and isinstance(element, ast.Call)
            and isinstance(element.func, ast.Name)
            and element.func.id == "chr"
            and len(element.args) == 1
            and isinstance(element.args[0], ast.Name)
            and element.args[0].id == loop.target.id
        ):
            codes = _int_items(loop.iter)
    if codes is None or not all(0 <= c <= 0x10FFFF for c in codes):
        return None
    return [chr(c) for c in codes]


def _codec(args: list[ast.expr]) -> str | None:
    if not args:
        return "utf-8"
    if len(args) == 1 and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str):
        name = args[0].value.lower()
        return name if name in _CODECS else None
    return None
