"""The sandbox's first process: runs as pid 1 of fresh mount, network and pid namespaces, builds a new root
that holds only what the command may see, sets the limits, drops privileges and execs the untrusted command.

Standard library only and run by path (`python -I sandbox_init.py SPEC`), so nothing of the project is
imported inside the sandbox.
`lanes_pipeline.sandbox.isolation` builds the spec and starts this under `unshare`.

Steps, in order (each failure aborts with exit 125 before any untrusted code runs):
1. every mount becomes private, so nothing below propagates back to the host;
2. a new root, an empty tmpfs, gets the system folders (`/usr` and the `/bin`, `/lib`... beside it, `/etc`)
   bound in; in `/etc` the password hashes (`shadow`, `gshadow` and their backups) and every entry that is
   not world-readable are covered by an empty, unreadable stand-in;
3. the spec's readable folders (the interpreter, the repository's environment, the harness) and writable
   ones (the worktree) are bound in at the same paths; nothing else of the host is there: not `/root`,
   `/home`, `/tmp`, `/var`, the data folder, the caches or the project's checkout;
4. a fresh `/proc` (the pid namespace's own) and a `/dev` with only null, zero, full, random, urandom and
   tty (no disks) complete it; `pivot_root` makes it `/` and the old root is detached;
5. every mount, / included, is remounted read-only except the writable folders;
6. rlimits (address space, CPU seconds, file size, processes, no core files);
7. setpriv: the sandbox uid/gid (when started as real root) or no capabilities at all (rootless, in a user
   namespace), no_new_privs (setuid binaries cannot regain anything), then exec.
"""

import json
import os
import resource
import subprocess
import sys

SETUP_FAILED = 125
# What every command needs from the host, bound read-only: programs, libraries and system configuration.
SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
# Masked even when world-readable: password hashes are never anyone's business inside.
ALWAYS_MASKED = frozenset({"shadow", "shadow-", "gshadow", "gshadow-"})
DEVICES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0))


def _run(tool: str, *args: str) -> None:
    result = subprocess.run([tool, *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{tool} {' '.join(args)}: {result.stderr.strip()}")


def _mount(*args: str) -> None:
    _run("mount", *args)


def _mount_points() -> list[tuple[str, str]]:
    """(mount point, per-mount options) of every mount, in mount order."""
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        for line in handle:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 and friends
            points.append((point, fields[5]))
    return points


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _point(new_root: str, path: str, is_dir: bool) -> str:
    """Create `path` below the new root as a mount point; only real folders of the new root's own tmpfs
    are walked (a symlink on the way could lead the mkdir onto a host folder bound in)."""
    current = new_root
    parts = [p for p in path.split("/") if p]
    for index, part in enumerate(parts):
        current = os.path.join(current, part)
        last = index == len(parts) - 1
        if os.path.islink(current):
            raise RuntimeError(f"{path}: {current} is a symlink in the new root")
        if not os.path.exists(current):
            if last and not is_dir:
                open(current, "w").close()
            else:
                os.mkdir(current, 0o755)
    return current


def _system(new_root: str) -> list[str]:
    """Bind the system folders in (symlinks such as /bin -> usr/bin are recreated); the paths now visible."""
    visible = []
    for name in SYSTEM:
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), os.path.join(new_root, name))
            visible.append(host)
        elif os.path.isdir(host):
            _mount("--rbind", host, _point(new_root, host, True))
            visible.append(host)
    return visible


def _mask_etc(new_root: str, staging: str) -> None:
    """Cover password hashes and whatever in /etc is not world-readable with an unreadable stand-in."""
    blank_file, blank_dir = os.path.join(staging, "masked-file"), os.path.join(staging, "masked-dir")
    open(blank_file, "w").close()
    os.makedirs(blank_dir, exist_ok=True)
    os.chmod(blank_file, 0)
    os.chmod(blank_dir, 0)
    for folder, dirs, files in os.walk("/etc"):
        for name in [*dirs, *files]:
            host = os.path.join(folder, name)
            if os.path.islink(host):
                continue
            mode = os.stat(host).st_mode
            is_dir = name in dirs
            wanted = 0o005 if is_dir else 0o004
            if name in ALWAYS_MASKED or mode & wanted != wanted:
                _mount("--bind", blank_dir if is_dir else blank_file, new_root + host)
                if is_dir:
                    dirs.remove(name)


def _dev(new_root: str) -> None:
    """A fresh /dev with harmless devices only."""
    dev = _point(new_root, "/dev", True)
    _mount("-t", "tmpfs", "-o", "mode=755,size=1m,nosuid,noexec", "tmpfs", dev)
    for name, major, minor in DEVICES:
        node = os.path.join(dev, name)
        try:
            os.mknod(node, 0o666 | 0o020000, os.makedev(major, minor))
            os.chmod(node, 0o666)
        except PermissionError:  # rootless: no CAP_MKNOD in a user namespace; bind the host's node
            open(node, "w").close()
            _mount("--bind", f"/dev/{name}", node)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, os.path.join(dev, name))


def _new_root(spec: dict) -> None:
    staging = spec["staging"]
    new_root = os.path.join(staging, "root")
    os.makedirs(new_root, exist_ok=True)
    _mount("-t", "tmpfs", "-o", "mode=755,size=4m", "tmpfs", new_root)
    system = _system(new_root)
    _mask_etc(new_root, staging)
    covered = list(system)
    for path in sorted(set(spec["readable"])):
        if not os.path.isdir(path) or any(_inside(path, folder) for folder in covered):
            continue  # already visible (below /usr, or below another readable folder)
        _mount("--rbind", path, _point(new_root, path, True))
        covered.append(path)
    for path in spec["writable"]:
        if any(_inside(path, folder) for folder in covered):
            raise RuntimeError(f"the writable folder {path} lies inside the read-only {covered}")
        _mount("--bind", path, _point(new_root, path, True))
    _mount("--rbind", "/proc", _point(new_root, "/proc", True))
    _dev(new_root)
    _point(new_root, "/tmp", True)  # exists, empty and (below) read-only, as programs expect
    old = _point(new_root, "/.old-root", True)
    _run("pivot_root", new_root, old)
    os.chdir("/")
    _run("umount", "--recursive", "--lazy", "/.old-root")
    os.rmdir("/.old-root")


_KEEP_FLAGS = ("nosuid", "nodev", "noexec", "relatime", "noatime", "nodiratime", "strictatime")


def _read_only_everywhere(writable: list[str]) -> None:
    keep = set(writable)
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
    # pivot_root lives in sbin, which a user's PATH may lack.
    os.environ["PATH"] = os.pathsep.join(
        [os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin", "/bin"]
    )
    try:
        _mount("--make-rprivate", "/")
        _new_root(spec)
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
