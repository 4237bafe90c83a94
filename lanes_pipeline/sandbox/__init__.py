"""Running code nobody has reviewed: the sandbox (`isolation.py`: a throwaway export of one commit, run
through `unshare` and `sandbox_init.py` with only what the command may see) and the repository's own
environments it runs in (`repo_env.py`). Both lanes use it: the CPU lane to verify what it generated, the
GPU lane to run the evaluation's tasks."""
