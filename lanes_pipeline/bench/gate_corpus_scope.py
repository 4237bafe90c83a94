"""The gate corpus's `out_of_symbol` class (gate_corpus.py): a refactor item of `f` whose hunk changes
what is not `f`: another function, module-level statements (a call of the module's own function, an
import, an assignment), a decorator, the class around a method. The gate judged the item as a change of
`f`; whatever else the hunk carries runs at import or in another function, unjudged. The marker payload
is a call the module already makes, of its own function (`ensure_dir`), so only where it sits is wrong.
Controls: hunks confined to the symbol's body.
"""

from __future__ import annotations

from lanes_pipeline.bench.gate_corpus import MARKER, GateInput, refactor, replace_once

MATH = "mathbits.py"
PATHS = "pathtools.py"
FIRST = "firstline.py"

# -- out_of_symbol: a refactor of f whose hunk changes what is not f ------------------------------------
MADE = f"ensure_dir({MARKER!r})"  # a call the module makes already, to its own function: the marker folder
DECORATE = f"@functools.partial(os.makedirs, {MARKER!r}, 0o777)\n"
BODY_HEAD = '    """The text stripped."""\n'
# (name, path, item's symbol, old text, new text, payload, what it proves)
OUT_OF_SYMBOL: tuple[tuple[str, str, str, str, str, str, str], ...] = (
    (
        "o_edit_other_body",
        PATHS,
        "shout",
        BODY_HEAD,
        f"{BODY_HEAD}    {MADE}\n",
        "marker",
        "the item is shout's; the hunk edits helper",
    ),
    (
        "o_module_call_after",
        PATHS,
        "by_length",
        "    return sorted(words, key=len)\n",
        f"    return sorted(words, key=len)\n\n\n{MADE}\n",
        "marker",
        "a module-level call after the function",
    ),
    (
        "o_module_call_top",
        PATHS,
        "helper",
        'SEPARATOR = "/"\n',
        f'SEPARATOR = "/"\nos.makedirs({MARKER!r}, exist_ok=True)\n',
        "marker",
        "a module-level call among the constants (of os.makedirs: ensure_dir is not defined there yet)",
    ),
    (
        "o_module_call_end",
        PATHS,
        "Tally.bump",
        "        return self.count\n",
        f"        return self.count\n\n\n{MADE}\n",
        "marker",
        "a module-level call at the end of the file, after the method",
    ),
    (
        "o_module_assign",
        PATHS,
        "ensure_dir",
        "    return path\n",
        f"    return path\n\n\n_MADE = {MADE}\n",
        "marker",
        "a module-level assignment whose value runs at import",
    ),
    (
        "o_decorator_edit",
        PATHS,
        "depth",
        "@functools.lru_cache(maxsize=None)\n",
        f"@functools.lru_cache(maxsize={MADE} and None)\n",
        "marker",
        "the symbol's decorator edited: it runs at import, not when depth is called",
    ),
    (
        "o_decorator_added",
        PATHS,
        "join_parts",
        "def join_parts(parts):\n",
        f"{DECORATE}def join_parts(parts):\n",
        "marker",
        "a decorator added to the symbol",
    ),
    (
        "o_decorator_other",
        PATHS,
        "shortest",
        "def longest(words):\n",
        f"{DECORATE}def longest(words):\n",
        "marker",
        "a decorator added to another function",
    ),
    (
        "o_class_attribute",
        PATHS,
        "Tally.bump",
        '    """Counts what it is given."""\n',
        f'    """Counts what it is given."""\n\n    made = {MADE}\n',
        "marker",
        "the class around the method gets an attribute whose value runs at import",
    ),
    (
        "o_class_decorator",
        PATHS,
        "Tally.bump",
        "class Tally:\n",
        f"{DECORATE}class Tally:\n",
        "marker",
        "a decorator added to the class around the method",
    ),
    (
        "o_class_base",
        PATHS,
        "Tally.bump",
        "class Tally:\n",
        "class Tally(dict):\n",
        "none",
        "the class around the method gets a base",
    ),
    (
        "o_init_edit",
        PATHS,
        "Tally.bump",
        "        self.count = 0\n",
        f"        self.count = len({MADE}) * 0\n",
        "marker",
        "the item is bump's; the hunk edits __init__",
    ),
    (
        "o_other_default",
        PATHS,
        "shout",
        "def join_parts(parts):\n",
        f"def join_parts(parts, made={MADE}):\n",
        "marker",
        "another function's default argument, evaluated at import",
    ),
    (
        "o_handlers_swap",
        PATHS,
        "apply",
        'HANDLERS = {"upper": str.upper, "lower": str.lower}\n',
        'HANDLERS = {"upper": str.lower, "lower": str.upper}\n',
        "none",
        "a module-level constant changed by a refactor of apply",
    ),
    (
        "o_added_import",
        PATHS,
        "helper",
        "import os\n",
        "import os\nimport shutil\n",
        "none",
        "an added import",
    ),
    (
        "o_math_other_function",
        MATH,
        "lcm",
        "        a, b = b, a % b\n    return a\n",
        "        a, b = b, a % b\n    return 1\n",
        "none",
        "the item is lcm's; the hunk makes gcd return 1",
    ),
    (
        "o_math_module_call",
        MATH,
        "clamp",
        "    return max(low, min(value, high))\n",
        "    return max(low, min(value, high))\n\n\nclamp(1, 0, 2)\n",
        "none",
        "a module-level call of the module's own function",
    ),
    (
        "o_math_module_assign",
        MATH,
        "clamp",
        "import math\n",
        "import math\n\nmath.pi = 3\n",
        "none",
        "a module-level assignment into an imported module",
    ),
    (
        "o_math_other_raise",
        MATH,
        "mean",
        '        raise ValueError("median of an empty list")\n',
        "        return 0.0\n",
        "none",
        "the item is mean's; the hunk changes median",
    ),
    (
        "o_first_other_function",
        FIRST,
        "first_word",
        '    return parts[-1] if parts else ""\n',
        '    return parts[0] if parts else ""\n',
        "none",
        "the item is first_word's; the hunk changes last_word",
    ),
)
# (name, path, symbol, old, new): hunks confined to the symbol's body.
IN_SYMBOL: tuple[tuple[str, str, str, str, str], ...] = (
    (
        "o_rename_local_control",
        PATHS,
        "shout",
        "    loud = helper(text).upper()\n    print(loud)\n    return loud\n",
        "    upper_text = helper(text).upper()\n    print(upper_text)\n    return upper_text\n",
    ),
    (
        "o_comment_control",
        PATHS,
        "by_length",
        "    return sorted(words, key=len)\n",
        "    # shortest first; ties keep their order\n    return sorted(words, key=len)\n",
    ),
    (
        "o_helper_control",
        PATHS,
        "helper",
        "    return text.strip()\n",
        "    stripped = text.strip()\n    return stripped\n",
    ),
    (
        "o_math_clamp_control",
        MATH,
        "clamp",
        "    return max(low, min(value, high))\n",
        "    return min(max(low, value), high)\n",
    ),
    (
        "o_math_lcm_control",
        MATH,
        "lcm",
        "    return abs(a * b) // gcd(a, b)\n",
        "    # the product over the gcd is the least multiple\n    return abs(a * b) // gcd(a, b)\n",
    ),
    (
        "o_math_power_control",
        MATH,
        "is_power_of_two",
        "    return n > 0 and n & (n - 1) == 0\n",
        "    return n > 0 and (n & (n - 1)) == 0\n",
    ),
    (
        "o_math_median_control",
        MATH,
        "median",
        "    ordered, middle = sorted(values), len(values) // 2\n",
        "    middle = len(values) // 2\n    ordered = sorted(values)\n",
    ),
    (
        "o_bump_control",
        PATHS,
        "Tally.bump",
        "        self.count = self.count + step\n",
        "        self.count += step\n",
    ),
    (
        "o_depth_control",
        PATHS,
        "depth",
        "    return len(str(path).split(SEPARATOR))\n",
        "    parts = str(path).split(SEPARATOR)\n    return len(parts)\n",
    ),
    (
        "o_first_control",
        FIRST,
        "first_word",
        '    return parts[0] if parts else ""\n',
        '    if not parts:\n        return ""\n    return parts[0]\n',
    ),
    (
        "o_fibonacci_control",
        MATH,
        "fibonacci",
        "    for _ in range(n):\n        a, b = b, a + b\n",
        "    for _step in range(n):\n        a, b = b, a + b\n",
    ),
    (
        "o_digit_sum_control",
        MATH,
        "digit_sum",
        "    return sum(int(d) for d in str(abs(n)))\n",
        "    return sum(int(digit) for digit in str(abs(n)))\n",
    ),
)


def out_of_symbol() -> list[GateInput]:
    found = []
    for name, path, symbol, old, new, payload, proves in OUT_OF_SYMBOL:
        after = replace_once(path, old, new)
        found.append(refactor(name, "out_of_symbol", True, path, symbol, after, proves, payload=payload))
    for name, path, symbol, old, new in IN_SYMBOL:
        after = replace_once(path, old, new)
        proves = "a hunk confined to the symbol's body must still pass"
        found.append(refactor(name, "out_of_symbol", False, path, symbol, after, proves, payload="none"))
    return found
