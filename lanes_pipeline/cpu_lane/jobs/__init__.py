"""The CPU lane's jobs on the day's symbols: prompts and task parsing, the backlog, and each job with its
verification: tests (oracles, mutants), docstrings (doctests), refactors (confined diffs, the suite); what
was asked and decided is remembered (`memo.py`) and written as rows (`rows.py`). Pure where it can be; the
sandbox runs what must be executed."""
