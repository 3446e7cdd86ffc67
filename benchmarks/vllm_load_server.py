"""Process side of the vLLM load harness: start the OpenAI API server, know its processes,
signal it, measure what it leaves behind, and never leave one running.

Every server is started in its own session (``start_new_session``), so its process group
id is its pid and the engine core and workers vLLM starts are in that group. The harness
records the tree (pid and start time, so a reused pid is never mistaken for ours) once the
server is healthy and again before signalling it; ``kill_all`` SIGKILLs the group and
every recorded process. ``ALL`` holds every server started; ``kill_everything`` (atexit
and the harness's own SIGINT/SIGTERM handler) stops them all.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ALL: list["Server"] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, start time in ticks, state) of a live (non-zombie) process, else None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = raw[raw.rindex(")") + 2:].split()
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[1]), int(rest[19]), rest[0]


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of ``root`` and all its live descendants."""
    kids: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = proc_stat(int(d))
            if st is not None:
                kids.setdefault(st[0], []).append(int(d))
                starts[int(d)] = st[1]
    out, todo = {}, [root]
    while todo:
        p = todo.pop()
        if p in starts and p not in out:
            out[p] = starts[p]
            todo.extend(kids.get(p, []))
    return out


def alive(pid: int, start: int) -> bool:
    st = proc_stat(pid)
    return st is not None and st[1] == start


@dataclass
class Server:
    """One ``vllm.entrypoints.openai.api_server`` process tree."""

    name: str
    args: list[str]
    env: dict
    log_path: Path
    port: int = 0
    proc: subprocess.Popen | None = None
    known: dict[int, int] = field(default_factory=dict)  # pid -> start time, ever seen
    started_s: float = 0.0

    def start(self) -> None:
        self.port = self.port or free_port()
        log = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
               "--port", str(self.port), *self.args]
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        ALL.append(self)
        self.started_s = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_healthy(self, timeout_s: float) -> float:
        """Seconds from start to a 200 on /health; raises with the log tail otherwise."""
        import http.client

        deadline = self.started_s + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server {self.name} exited with {self.proc.returncode}:\n"
                                   + self.log_tail())
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    self.refresh()
                    return time.monotonic() - self.started_s
            except OSError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"server {self.name} not healthy after {timeout_s} s:\n"
                           + self.log_tail())

    def refresh(self) -> dict[int, int]:
        """Record the current process tree (a process seen once stays known)."""
        now = descendants(self.pid) if self.proc.poll() is None else {}
        self.known.update(now)
        return now

    def roles(self) -> dict[str, int]:
        """'api' / 'engine' / 'worker' -> pid (vLLM names its processes VLLM::...)."""
        out = {"api": self.pid}
        for pid in self.refresh():
            c = comm(pid)
            if "EngineCore" in c:
                out["engine"] = pid
            elif "Worker" in c:
                out["worker"] = pid
        return out

    def rss(self) -> dict[str, int | None]:
        return {role: rss_bytes(pid) for role, pid in self.roles().items()}

    def living(self) -> list[int]:
        return [p for p, s in self.known.items() if alive(p, s)]

    def signal_api(self, sig: int) -> None:
        self.refresh()
        os.kill(self.pid, sig)

    def wait_api_exit(self, timeout_s: float) -> float | None:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        return time.monotonic()

    def wait_all_gone(self, timeout_s: float) -> float | None:
        """Wait until every known process of this server is gone (the API process reaped);
        seconds waited, or None at the timeout."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None and not self.living():
                return time.monotonic() - t0
            time.sleep(0.2)
        return None

    def kill_all(self) -> list[int]:
        """SIGKILL the process group and every known process still alive; returns them."""
        if self.proc is None:
            return []
        left = self.living()
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 30
        while self.living() and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def kill_everything() -> None:
    for s in ALL:
        s.kill_all()


def install_cleanup() -> None:
    """Stop every server at exit and on SIGINT/SIGTERM of the harness itself."""
    atexit.register(kill_everything)

    def handler(signum, frame):
        kill_everything()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


# ---------------------------------------------------------------- what is left behind

def dir_entries(path: str) -> set[str]:
    try:
        return set(os.listdir(path))
    except OSError:
        return set()


def mapped_anywhere(path: str) -> bool:
    """Whether any process maps ``path`` (a /dev/shm segment still in use)."""
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if path in Path(f"/proc/{d}/maps").read_text():
                    return True
            except OSError:
                continue
    return False


def remove_orphan_segments(names: list[str], base: str = "/dev/shm") -> list[str]:
    """Remove vLLM shared-memory segments (``psm_*``, ``sem.mp-*``) among ``names`` that no
    process maps any more (left by processes the harness had to SIGKILL)."""
    removed = []
    for n in names:
        p = os.path.join(base, n)
        if n.startswith(("psm_", "sem.mp-")) and os.path.isfile(p) and not mapped_anywhere(p):
            try:
                os.unlink(p)
                removed.append(n)
            except OSError:
                pass
    return removed


def plugin_dirs_of(pids: set[int], base: str = "/dev/shm") -> list[str]:
    """witcert stats directories under ``base`` whose owner file names one of ``pids``."""
    out = []
    for name in dir_entries(base):
        if not name.startswith("witcert-vllm-"):
            continue
        try:
            owner = int((Path(base) / name / "owner").read_text().split(":")[0])
        except (OSError, ValueError, IndexError):
            continue
        if owner in pids:
            out.append(str(Path(base) / name))
    return out


def instance_files(stats_dir: Path, token: str | None) -> list[str]:
    if token is None or not stats_dir.is_dir():
        return []
    return sorted(str(p) for p in stats_dir.glob(f"worker-{token}-*"))


def instance_token(pid: int) -> str | None:
    """The plugin's instance token from a process's environment (None: plugin off)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for kv in env:
        if kv.startswith(b"WITCERT_VLLM_INSTANCE="):
            parts = kv.split(b"=", 1)[1].decode().split(":")
            return parts[2] if len(parts) == 4 else None
    return None
