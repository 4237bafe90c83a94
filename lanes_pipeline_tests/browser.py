"""A headless Debian chromium for the UI test: found, or installed with apt-get, or the reason it cannot be.

`make test` runs `python -m lanes_pipeline_tests.browser` first (idempotent: nothing happens when chromium is
there); the test calls `ensure_chromium()` too, so `pytest` alone installs it as well. Where installing is
impossible (no root and no password-less sudo, no apt, no mirror), the reason is returned and kept in
`.stamps/chromium-unavailable`, and the test skips with it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from lanes_pipeline.settings import project_root

CANDIDATES = ("chromium", "chromium-browser")
REASON_FILE = ".stamps/chromium-unavailable"
# Flags for a root user in a container: no sandbox (it needs user namespaces), no GPU, no network chatter.
HEADLESS_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def find_chromium() -> Path | None:
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return Path(found)
    return None


def _apt_prefix() -> list[str] | None:
    """How to run apt-get as root here: directly, through password-less sudo, or not at all."""
    if os.geteuid() == 0:
        return []
    sudo = shutil.which("sudo")
    if sudo and subprocess.run([sudo, "-n", "true"], capture_output=True, check=False).returncode == 0:
        return [sudo, "-n"]
    return None


def _tail(text: str, lines: int = 5) -> str:
    return " | ".join(line for line in text.strip().splitlines()[-lines:] if line.strip())


def install_chromium(timeout_s: float = 1200) -> Path | str:
    """apt-get install chromium; the binary's path, or why it could not be installed."""
    if shutil.which("apt-get") is None:
        return "apt-get is not available on this machine (not Debian/Ubuntu)"
    prefix = _apt_prefix()
    if prefix is None:
        return "installing chromium needs root or password-less sudo, and this user has neither"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for step in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]):
        try:
            done = subprocess.run(
                [*prefix, *step], capture_output=True, text=True, env=env, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            return f"`{' '.join(step)}` did not finish within {timeout_s:.0f} s"
        if done.returncode != 0:
            return f"`{' '.join(step)}` exited {done.returncode}: {_tail(done.stderr or done.stdout)}"
    return find_chromium() or "apt-get installed chromium, but no chromium binary is on PATH"


def ensure_chromium() -> Path | str:
    """The chromium binary, installing it when missing; else the reason, which is also kept on disk."""
    found = find_chromium()
    reason_file = project_root() / REASON_FILE
    if found is not None:
        reason_file.unlink(missing_ok=True)
        return found
    result = install_chromium()
    if isinstance(result, str):
        reason_file.parent.mkdir(parents=True, exist_ok=True)
        reason_file.write_text(result + "\n")
    else:
        reason_file.unlink(missing_ok=True)
    return result


def main() -> int:
    result = ensure_chromium()
    if isinstance(result, Path):
        print(f"chromium: {result}")
    else:
        print(f"chromium unavailable, the UI screenshot test will skip: {result}", file=sys.stderr)
    return 0  # never fails the build: the test reports the reason


if __name__ == "__main__":
    sys.exit(main())
