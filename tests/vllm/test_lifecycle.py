"""The plugin's server instance, its stats directory and the owner watchdog (no vLLM engine:
plain processes play the API server and the worker)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from witcert.integrations.vllm import lifecycle
from witcert.integrations.vllm.lifecycle import Instance
from witcert.integrations.vllm.stats import WorkerStats, merge, read_snapshots

pytestmark = pytest.mark.vllm


def _dead_pid() -> tuple[int, int]:
    """(pid, start) of a process that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    start = lifecycle.process_start(p.pid)
    p.wait()
    return p.pid, start or 1


def test_instance_round_trips_and_bad_text_is_refused():
    inst = Instance(123, 456, "abc123", True)
    assert Instance.decode(inst.encode()) == inst
    for bad in ("", "1:2:3", "x:2:tok:1", "1:2:to-k:1", "0:1:tok:1"):
        assert Instance.decode(bad) is None


def test_owner_makes_a_fresh_dir_and_a_stale_instance_is_not_inherited(tmp_path):
    d, inst, role = lifecycle.setup(stats_dir_env="", instance_env="", base=str(tmp_path))
    assert role == "owner" and inst.owner_pid == os.getpid() and inst.owns_dir
    assert Path(d).parent == tmp_path and Path(d).name.startswith(lifecycle.DIR_PREFIX)
    assert Instance.decode((Path(d) / lifecycle.OWNER_FILE).read_text()) == inst
    # the same process again: same instance
    assert lifecycle.setup(stats_dir_env=d, instance_env=inst.encode(), base=str(tmp_path)) \
        == (d, inst, "owner")
    # an instance from a process that is not an ancestor (here: dead) is stale: a new owner,
    # and a new directory since the stale one was the plugin's
    pid, start = _dead_pid()
    stale = Instance(pid, start, "feed", True)
    d2, inst2, role2 = lifecycle.setup(stats_dir_env=d, instance_env=stale.encode(),
                                       base=str(tmp_path))
    assert role2 == "owner" and inst2.token != "feed" and d2 != d and inst2.owns_dir
    # a directory the user gave (no instance) is used, never owned
    given = tmp_path / "given"
    d3, inst3, _ = lifecycle.setup(stats_dir_env=str(given), instance_env="", base=str(tmp_path))
    assert d3 == str(given) and given.is_dir() and not inst3.owns_dir
    for dd, ii in ((d, inst), (d2, inst2), (d3, inst3)):
        lifecycle.remove_instance_state(dd, ii)
    assert not Path(d).exists() and not Path(d2).exists() and given.is_dir()


def test_stale_dirs_of_dead_owners_are_collected_live_and_foreign_ones_kept(tmp_path):
    pid, start = _dead_pid()
    dead = tmp_path / f"{lifecycle.DIR_PREFIX}dead"
    live = tmp_path / f"{lifecycle.DIR_PREFIX}live"
    foreign = tmp_path / f"{lifecycle.DIR_PREFIX}foreign"  # no owner file: not ours to judge
    for p in (dead, live, foreign):
        p.mkdir()
    (dead / lifecycle.OWNER_FILE).write_text(Instance(pid, start, "aa", True).encode())
    me = Instance(os.getpid(), lifecycle.process_start(os.getpid()), "bb", True)
    (live / lifecycle.OWNER_FILE).write_text(me.encode())
    assert lifecycle.collect_stale_dirs(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and live.is_dir() and foreign.is_dir()


def test_snapshots_of_dead_workers_and_of_other_instances_are_never_counted(tmp_path):
    """A fixed stats directory reused across a restart: the old server's worker snapshots
    stay on disk (a SIGKILL of the whole group) but add nothing to the new server's sums."""
    def snap(token, decode, *, dead):
        ws = WorkerStats(num_layers=1, num_q_heads=1, tau=0.2, stats_dir=str(tmp_path),
                         info={}, instance=token)
        ws.decode_tokens = decode
        s = ws.snapshot()
        if dead:
            s["pid"], s["pid_start"] = _dead_pid()
        name = f"worker-{token}-{s['pid']}.json"
        (tmp_path / name).write_text(json.dumps(s))
        return name

    old = snap("old", 7, dead=True)
    other_live = snap("other", 5, dead=False)
    dead_same = snap("new", 11, dead=True)
    mine = snap("new", 3, dead=False)
    assert merge(read_snapshots(tmp_path, instance="new"))["decode_tokens"] == 3
    assert merge(read_snapshots(tmp_path, instance="other"))["decode_tokens"] == 5
    # a new owner collects the dead ones at start-up, keeps the live ones
    removed = {Path(p).name for p in lifecycle.collect_stale_snapshots(str(tmp_path))}
    assert removed == {old, dead_same}
    assert {p.name for p in tmp_path.iterdir()} == {other_live, mine}


_OWNER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from witcert.integrations.vllm import lifecycle, settings
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))  # as vLLM's API server does
    d, inst, role = lifecycle.setup(stats_dir_env=settings.stats_dir_env(),
                                    instance_env=settings.instance_env(), base=sys.argv[1])
    settings.publish(stats_dir=d, instance=inst.encode())
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2]])
    print(d, child.pid, flush=True)
    time.sleep(600)
""")

_CHILD = textwrap.dedent("""
    import time
    from witcert.integrations.vllm import lifecycle, settings
    d, inst, role = lifecycle.setup(stats_dir_env=settings.stats_dir_env(),
                                    instance_env=settings.instance_env(), base=None)
    assert role == "child", role
    lifecycle.start_watchdog(inst, d)
    open(f"{d}/worker-{inst.token}-0.json", "w").write("{}")
    x = 0
    while True:  # a worker computing
        x += 1
""")


def _start_pair(tmp_path, extra_env=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WITCERT_VLLM")}
    env.update(extra_env or {})
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, str(tmp_path), _CHILD], env=env,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    d, child = owner.stdout.readline().split()
    deadline = time.monotonic() + 60
    while not list(Path(d).glob("worker-*")) and time.monotonic() < deadline:
        time.sleep(0.1)  # the child is up and watching
    return owner, d, int(child)


def _wait_gone(pid: int, timeout: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if lifecycle.process_start(pid) is None:
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.parametrize("given_dir", [False, True])
def test_child_stops_and_nothing_of_the_plugin_is_left_when_its_owner_dies(tmp_path, sig,
                                                                          given_dir):
    """SIGKILL: the child's watchdog removes the plugin's directory (or, in a directory the
    user gave, this instance's snapshots) and ends the child, within the grace period.
    SIGTERM: the owner's exit handler does the cleanup and the child follows."""
    given = tmp_path / "given"
    env = {"WITCERT_VLLM_STATS_DIR": str(given)} if given_dir else {}
    owner, d, child = _start_pair(tmp_path, env)
    try:
        assert Path(d).is_dir() and lifecycle.process_start(child) is not None
        os.kill(owner.pid, sig)
        owner.wait(timeout=30)
        took = _wait_gone(child, lifecycle.GRACE_S + 10)
        assert took is not None, "child outlived its owner"
        if given_dir:
            assert given.is_dir() and not list(given.iterdir())
        else:
            assert not Path(d).exists()
        print(f"\nchild gone {took:.2f} s after its owner ({signal.Signals(sig).name})")
    finally:
        for pid in (owner.pid, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
