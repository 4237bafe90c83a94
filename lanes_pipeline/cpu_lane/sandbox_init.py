"""The sandbox's first process: runs as pid 1 of fresh mount, network and pid namespaces, locks the file
system down, sets the limits, drops privileges and execs the untrusted command.

Standard library only and run by path (`python -I sandbox_init.py SPEC`), so nothing of the project is
imported inside the sandbox.
`lanes_pipeline.cpu_lane.sandbox` builds the spec and starts this under `unshare`.

Steps, in order (each failure aborts with exit 125 before any untrusted code runs):
1. every mount becomes private, so nothing below propagates back to the host;
2. folders the interpreter needs that sit below an untraversable folder (e.g. a pyenv under a 0700
   /root) are re-exposed: an empty tmpfs covers the closed folder and only the needed folder is bound back;
3. /dev is replaced by a tmpfs with only null, zero, full, random, urandom and tty (no disks);
4. the writable folders are bound onto themselves, then every mount, / included, is remounted read-only;
5. rlimits (address space, CPU seconds, file size, processes, no core files);
6. setpriv: the sandbox uid/gid (when started as real root) or no capabilities at all (rootless, in a user
   namespace), no_new_privs (setuid binaries cannot regain anything), then exec.
"""

import json
import os
import resource
import subprocess
import sys

SETUP_FAILED = 125


def _mount(*args: str) -> None:
    result = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"mount {' '.join(args)}: {result.stderr.strip()}")


def _mount_points() -> list[tuple[str, str]]:
    """(mount point, per-mount options) of every mount, in mount order."""
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 and friends
            points.append((point, fields[5]))
    return points


def _traversable(path: str) -> bool:
    return bool(os.stat(path).st_mode & 0o001)


def _expose(needed: list[str], staging: str) -> None:
    """Make each needed folder reachable for an unprivileged uid without opening its closed parents."""
    for index, path in enumerate(needed):
        parts = path.rstrip("/").split("/")
        closed = next(
            ("/".join(parts[:i]) for i in range(2, len(parts)) if not _traversable("/".join(parts[:i]))), None
        )
        if closed is None:
            continue
        stage = os.path.join(staging, f"expose{index}")
        os.makedirs(stage, exist_ok=True)
        _mount("--rbind", path, stage)
        _mount("-t", "tmpfs", "-o", "mode=755,size=1m", "tmpfs", closed)
        os.makedirs(path, exist_ok=True)
        _mount("--move", stage, path)


def _private_dev(staging: str) -> None:
    """A fresh /dev with harmless devices only: built in a staging tmpfs, then moved over /dev."""
    dev = os.path.join(staging, "dev")
    os.makedirs(dev, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "mode=755,size=1m,nosuid,noexec", "tmpfs", dev)
    for name, major, minor in (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8),
                               ("urandom", 1, 9), ("tty", 5, 0)):  # fmt: skip
        node = os.path.join(dev, name)
        try:
            os.mknod(node, 0o666 | 0o020000, os.makedev(major, minor))
            os.chmod(node, 0o666)
        except PermissionError:  # rootless: no CAP_MKNOD in a user namespace; bind the host's node
            open(node, "w").close()
            _mount("--bind", f"/dev/{name}", node)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):  # fmt: skip
        os.symlink(target, os.path.join(dev, name))
    # Detach the host's /dev with its submounts (pts, shm) so nothing of it stays reachable or listed.
    result = subprocess.run(["umount", "--recursive", "--lazy", "/dev"], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"umount /dev: {result.stderr.strip()}")
    _mount("--move", dev, "/dev")


_KEEP_FLAGS = ("nosuid", "nodev", "noexec", "relatime", "noatime", "nodiratime", "strictatime")


def _read_only_everywhere(writable: list[str]) -> None:
    for path in writable:
        _mount("--bind", path, path)
    keep = {os.path.realpath(p) for p in writable}
    for point, options in reversed(_mount_points()):
        if point in keep:
            continue
        # Locked flags must be kept in a user namespace, or the remount is refused.
        flags = [f for f in options.split(",") if f in _KEEP_FLAGS]
        _mount("-o", ",".join(["remount", "bind", "ro", *flags]), point)


def _limits(spec: dict) -> None:
    memory = spec["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (spec["cpu_s"], spec["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec["file_bytes"], spec["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_NPROC, (spec["processes"], spec["processes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as handle:
        spec = json.load(handle)
    try:
        _mount("--make-rprivate", "/")
        if spec["drop_to_uid"] is not None:
            _expose(spec["expose"], spec["staging"])
        _private_dev(spec["staging"])
        _read_only_everywhere(spec["writable"])
        os.chdir(spec["cwd"])
    except (OSError, RuntimeError) as exc:
        print(f"sandbox setup failed: {exc}", file=sys.stderr)
        sys.exit(SETUP_FAILED)
    drop = ["--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]
    if spec["drop_to_uid"] is not None:
        uid, gid = spec["drop_to_uid"], spec["drop_to_gid"]
        drop = [f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *drop]
    _limits(spec)
    os.execvpe("setpriv", ["setpriv", *drop, "--", *spec["argv"]], spec["env"])


if __name__ == "__main__":
    main()
