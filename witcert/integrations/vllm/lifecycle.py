"""Who owns the plugin's state in a vLLM server, and what happens when the owner dies.

vLLM runs the API server, the engine core and the worker(s) as separate processes and
calls ``register()`` in each. The first of them (the API server, or the process that built
an offline ``LLM``) becomes the **owner**: it names a server instance (its pid and start
time, a random token, whether the plugin made the stats directory), publishes it in the
environment that its children inherit, and removes at exit what the plugin made. The
others are **children** of that instance: their snapshots carry the instance, so a stats
directory reused by a later server never mixes the two servers' counters, and each child
runs a watchdog thread on the owner. When the owner dies without running its exit
handlers (SIGKILL, a crash) the watchdog removes the plugin's stats directory (when the
plugin made it) and terminates its own process (SIGTERM, then SIGKILL after a grace
period): an engine whose API server is gone has nobody to answer.

An instance inherited from a process that is not an ancestor (an exported variable, a
server started from a notebook that had built an ``LLM``) is stale: the process starts a
new one. The owner also removes, when it starts, the stats directories and snapshot files
of earlier instances whose owner is dead.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import select
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger("vllm.witcert")

DIR_PREFIX = "witcert-vllm-"
OWNER_FILE = "owner"
GRACE_S = 3.0  # after SIGTERM to itself, a child SIGKILLs itself if still alive (vLLM's
# worker needs about 5 s for its graceful exit, useless once nobody is served)
_STATE: dict = {}  # per process: "role", "watchdog" (thread), "closed" (threading.Event)


@dataclass(frozen=True)
class Instance:
    """One server instance: owner process identity and the stats directory's ownership."""

    owner_pid: int
    owner_start: int  # clock ticks since boot (/proc/<pid>/stat field 22)
    token: str
    owns_dir: bool

    def __post_init__(self) -> None:
        if self.owner_pid <= 0 or self.owner_start < 0 or not self.token.isalnum():
            raise ValueError(f"bad witcert vLLM instance {self}")

    def encode(self) -> str:
        return f"{self.owner_pid}:{self.owner_start}:{self.token}:{int(self.owns_dir)}"

    @staticmethod
    def decode(text: str) -> "Instance | None":
        try:
            pid, start, token, owns = text.strip().split(":")
            return Instance(int(pid), int(start), token, owns == "1")
        except ValueError:
            return None

    def owner_alive(self) -> bool:
        return process_start(self.owner_pid) == self.owner_start


def process_start(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, None if no such process (or a
    zombie: it has exited and only waits for its parent to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may contain spaces
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def is_ancestor(pid: int, of: int | None = None) -> bool:
    """Whether ``pid`` is ``of`` (default: this process) or one of its ancestors."""
    cur = os.getpid() if of is None else of
    for _ in range(256):  # a process tree is never this deep; a guard against cycles
        if cur == pid:
            return True
        if cur is None or cur <= 1:
            return False
        cur = _parent(cur)
    return False


def snapshot_alive(snap: dict) -> bool:
    """The worker that wrote this snapshot is still running (same pid and start time)."""
    start = snap.get("pid_start")
    return start is not None and process_start(int(snap["pid"])) == start


# held while this process writes a snapshot and while its watchdog cleans up, so a write
# either ends before the cleanup or never starts (nothing left behind after a SIGKILL)
_SNAPSHOT_LOCK = threading.Lock()


def snapshot_lock() -> threading.Lock:
    """The lock ``stats`` takes around a snapshot write (see ``_watch``)."""
    return _SNAPSHOT_LOCK


def closed() -> bool:
    """True once this process saw its owner die: stop writing snapshots."""
    ev = _STATE.get("closed")
    return ev is not None and ev.is_set()


def setup(*, stats_dir_env: str, instance_env: str, base: str | None) -> tuple[str, Instance, str]:
    """Decide this process's role and make sure the instance exists.

    stats_dir_env, instance_env: the raw environment values; base: where to make a stats
    directory when the plugin makes one (None: the system temp dir).
    Returns (stats_dir, instance, role) with role ``owner`` or ``child``; the caller
    publishes stats_dir and the encoded instance in the environment.
    """
    inst = Instance.decode(instance_env) if instance_env else None
    if inst is not None and stats_dir_env and is_ancestor(inst.owner_pid) \
            and inst.owner_alive():
        role = "owner" if inst.owner_pid == os.getpid() else "child"
        _STATE.setdefault("role", role)
        return stats_dir_env, inst, role
    # a new instance: this process owns it
    pid = os.getpid()
    start = process_start(pid)
    stale_dir = inst is not None and inst.owns_dir and stats_dir_env
    owns = not stats_dir_env or bool(stale_dir)
    base_dir = base or None
    if owns:
        collect_stale_dirs(base_dir)
        stats_dir = _make_dir(base_dir)
    else:
        stats_dir = stats_dir_env
        os.makedirs(stats_dir, exist_ok=True)
    inst = Instance(pid, start if start is not None else 0, secrets.token_hex(8), owns)
    collect_stale_snapshots(stats_dir)
    if owns:
        (Path(stats_dir) / OWNER_FILE).write_text(inst.encode())
    atexit.register(_owner_exit, stats_dir, inst, pid)
    _STATE["role"] = "owner"
    return stats_dir, inst, "owner"


def _make_dir(base: str | None) -> str:
    import tempfile

    return tempfile.mkdtemp(prefix=DIR_PREFIX, dir=base)


def _owner_exit(stats_dir: str, inst: Instance, pid: int) -> None:
    if os.getpid() != pid:  # a forked child that inherited the handler
        return
    remove_instance_state(stats_dir, inst)


def remove_instance_state(stats_dir: str, inst: Instance) -> None:
    """What the plugin made for this instance: the whole directory if it made it, else
    (a directory the user gave, which stays) this instance's snapshot files."""
    if inst.owns_dir:
        remove_dir(stats_dir)
        return
    for p in Path(stats_dir).glob(f"worker-{inst.token}-*"):
        p.unlink(missing_ok=True)


def remove_dir(path: str) -> None:
    """rmtree that wins against a worker writing one last snapshot meanwhile."""
    for _ in range(5):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return
        time.sleep(0.05)


def collect_stale_dirs(base: str | None) -> list[str]:
    """Remove stats directories the plugin made for instances whose owner is dead (a
    server killed with its whole process group cannot clean up after itself)."""
    import tempfile

    root = Path(base or tempfile.gettempdir())
    removed = []
    for d in root.glob(f"{DIR_PREFIX}*"):
        try:
            inst = Instance.decode((d / OWNER_FILE).read_text())
        except OSError:
            continue  # not ours to judge (no owner file: an older plugin or a foreign dir)
        if inst is not None and not inst.owner_alive():
            remove_dir(str(d))
            removed.append(str(d))
    return removed


def collect_stale_snapshots(stats_dir: str) -> list[str]:
    """Remove snapshot files (and their temporaries) of workers that are gone."""
    import json

    removed = []
    for p in Path(stats_dir).glob("worker-*"):
        try:
            snap = json.loads(p.read_text()) if p.suffix == ".json" else None
        except (OSError, ValueError):
            snap = None
        if snap is not None and snapshot_alive(snap):
            continue
        if snap is None and p.suffix == ".json":
            continue  # being replaced right now, or unreadable: leave it
        if snap is None and p.suffix == ".tmp" and _tmp_writer_alive(p):
            continue
        p.unlink(missing_ok=True)
        removed.append(str(p))
    return removed


def _tmp_writer_alive(p: Path) -> bool:
    # worker-<token>-<pid>.tmp
    try:
        pid = int(p.stem.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return False
    return process_start(pid) is not None


def start_watchdog(inst: Instance, stats_dir: str) -> None:
    """In a child: watch the owner; when it dies, clean up and end this process."""
    if "watchdog" in _STATE or inst.owner_pid == os.getpid():
        return
    _STATE["closed"] = threading.Event()
    t = threading.Thread(target=_watch, args=(inst, stats_dir), name="witcert-owner-watchdog",
                         daemon=True)
    _STATE["watchdog"] = t
    t.start()


def _wait_for_exit(inst: Instance) -> None:
    try:
        fd = os.pidfd_open(inst.owner_pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            if inst.owner_alive():  # the pidfd is of the right process (no pid reuse)
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                while not poller.poll(60_000):
                    pass
            return
        finally:
            os.close(fd)
    while inst.owner_alive():
        time.sleep(1.0)


def _watch(inst: Instance, stats_dir: str) -> None:
    _wait_for_exit(inst)
    with _SNAPSHOT_LOCK:  # a snapshot being written finishes first, none starts after
        _STATE["closed"].set()  # this process writes no snapshot from now on
        remove_instance_state(stats_dir, inst)
    logger.warning("witcert: the owning process %d of this vLLM instance is gone; "
                   "stopping process %d", inst.owner_pid, os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os.kill(os.getpid(), signal.SIGKILL)
