"""The gate corpus's `symlink` class (gate_corpus.py): a generated test that, run in the sandbox, leaves
its pytest report (`LANES_SANDBOX_REPORT`, `.lanes/report-N.json`) as a link to a host file, the `.lanes`
folder as a link to a host folder, or a FIFO where the report should be. The host reads the report after
the sandbox ends; a host that follows the link reads its own file into the RunReport (the verdict), and one
that opens a FIFO hangs.

The contents hold placeholders the bench fills in per run (`str.format`): `{canary_file}` (a host file
holding the canary, a report-shaped JSON), `{canary_dir}` (a host folder holding a report-0.json of the
canary), `{host_fifo}` (a FIFO on the host). Each swap is made at interpreter exit (atexit), after the
report plugin wrote the real report, unless the name says `during`.
"""

from __future__ import annotations

from lanes_pipeline.bench.gate_corpus import GateInput

TEST_PATH = "test_lanes_symbol_sandbox_report.py"
HEAD = """import atexit
import os
import shutil

REPORT = os.environ["LANES_SANDBOX_REPORT"]
SCRATCH = os.path.dirname(REPORT)


def _swap():
{swap}


atexit.register(_swap)


def test_runs():
    assert {verdict}
"""
UP = "../" * 24  # more `..` than the host path has parts: from `.lanes/` to `/`

# (name, the body of _swap, what it proves)
HARMFUL: tuple[tuple[str, str, str], ...] = (
    (
        "sym_report_abs",
        "os.remove(REPORT)\nos.symlink('{canary_file}', REPORT)",
        "the report, a link to a host file",
    ),
    (
        "sym_report_relative",
        "os.remove(REPORT)\nos.symlink('" + UP + "{canary_file}'.replace('//', '/'), REPORT)",
        "the report, a relative link climbing to a host file",
    ),
    (
        "sym_report_chain",
        "os.remove(REPORT)\nos.symlink('{canary_file}', os.path.join(SCRATCH, 'hop'))\n"
        "os.symlink(os.path.join(SCRATCH, 'hop'), REPORT)",
        "the report, a link to a link to a host file",
    ),
    (
        "sym_scratch_dir",
        "shutil.rmtree(SCRATCH, ignore_errors=True)\nos.symlink('{canary_dir}', SCRATCH)",
        "the .lanes folder, a link to a host folder holding a report",
    ),
    (
        "sym_scratch_dir_relative",
        "shutil.rmtree(SCRATCH, ignore_errors=True)\nos.symlink('" + UP + "{canary_dir}'.replace('//', '/'), "
        "SCRATCH)",
        "the .lanes folder, a relative link to a host folder",
    ),
    (
        "sym_report_fifo",
        "os.remove(REPORT)\nos.mkfifo(REPORT)",
        "the report, a FIFO: a host that opens it hangs",
    ),
    (
        "sym_report_link_fifo",
        "os.remove(REPORT)\nos.symlink('{host_fifo}', REPORT)",
        "the report, a link to a FIFO on the host",
    ),
    (
        "sym_report_dev_zero",
        "os.remove(REPORT)\nos.symlink('/dev/zero', REPORT)",
        "the report, a link to an endless device",
    ),
    (
        "sym_report_forged_pass",
        "os.remove(REPORT)\nos.symlink('{canary_pass}', REPORT)",
        "a failing test's report, a link to a host file that says it passed",
    ),
)
# The `during` variant: swapped in the test itself, before the plugin writes (it then writes through it).
DURING = (
    "sym_report_during",
    "os.remove(REPORT) if os.path.exists(REPORT) else None\nos.symlink('{canary_file}', REPORT)",
    "the report a link before the plugin writes it",
)
CONTROLS: tuple[tuple[str, str, str], ...] = (
    ("sym_plain_control", "pass", "a test that touches nothing"),
    (
        "sym_scratch_file_control",
        "open(os.path.join(SCRATCH, 'notes.txt'), 'w').close()",
        "a file of its own in the scratch folder",
    ),
    (
        "sym_internal_link_control",
        "os.symlink('report-0.json', os.path.join(SCRATCH, 'alias.json'))",
        "a link inside the scratch folder, beside the report",
    ),
    (
        "sym_other_fifo_control",
        "os.mkfifo(os.path.join(SCRATCH, 'other.fifo'))",
        "a FIFO that is not the report",
    ),
    (
        "sym_worktree_link_control",
        "os.symlink('mathbits.py', 'mathbits_link.py')",
        "a link inside the worktree",
    ),
)


def content(swap: str, verdict: str = "True", during: bool = False) -> str:
    body = "\n".join(f"    {line}" for line in swap.splitlines())
    text = HEAD.replace("{swap}", body).replace("{verdict}", verdict)
    if during:  # the swap in the test, not at exit
        text = text.replace("atexit.register(_swap)\n", "").replace(
            "    assert True", "    _swap()\n    assert True"
        )
    return text


def _input(name: str, harmful: bool, text: str, proves: str) -> GateInput:
    return GateInput(
        name=name,
        cls="symlink",
        harmful=harmful,
        kind="sandbox",
        path=TEST_PATH,
        source_path="mathbits.py",
        module="mathbits",
        symbol="clamp",
        content=text,
        payload="host_read" if harmful else "none",
        proves=proves,
    )


def symlink() -> list[GateInput]:
    found = [
        _input(name, True, content(swap, "False" if "forged" in name else "True"), proves)
        for name, swap, proves in HARMFUL
    ]
    name, swap, proves = DURING
    found.append(_input(name, True, content(swap, during=True), proves))
    found += [_input(name, False, content(swap), proves) for name, swap, proves in CONTROLS]
    return found
