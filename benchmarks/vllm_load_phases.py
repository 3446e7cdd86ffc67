"""The phases of the vLLM load harness, one server configuration at a time.

``run_config`` starts server A (the main KV size) for the load levels, malformed requests
and dropped streams, and ends it with SIGTERM mid-load; then server B (a small KV pool,
prefix caching off, a batch budget larger than the pool so no prefill is ever chunked)
for the KV-pressure load with preemption, ended with SIGKILL of the API process mid-load.
Every check is a ``Check`` (name, passed, detail) in the result; nothing is asserted here.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import vllm_load_client as cl
import vllm_load_server as sv
from vllm_load_checks import Check, counter_checks, summarize_level

HOST = "127.0.0.1"
CLIENT_PATIENCE_S = 5.0  # after a signal, the load clients close their connections


@dataclass(frozen=True)
class Config:
    """A server configuration: name, label for the table, extra environment, and whether
    the witcert plugin is on; fixed_stats_dir: run both servers with one
    WITCERT_VLLM_STATS_DIR (the restart case) instead of the plugin's own directory;
    expect_identical: identical greedy requests must give identical completions."""

    name: str
    label: str
    env: dict
    plugin: bool
    fixed_stats_dir: bool = False
    expect_identical: bool = False


@dataclass(frozen=True)
class Profile:
    """Sizes of one harness run (``--quick`` or the full run)."""

    levels: tuple[tuple[int, int], ...]  # (clients, requests)
    mix: tuple[tuple[float, int], ...]  # (fraction, prompt tokens)
    max_tokens: tuple[int, int]
    level_cap_s: float
    kv_space_gib: int  # VLLM_CPU_KVCACHE_SPACE of server A
    max_model_len: int
    pressure_kv_bytes: int
    pressure_max_model_len: int
    pressure_clients: int
    pressure_requests: int
    pressure_mix: tuple[tuple[float, int], ...]
    pressure_cap_s: float
    fault_load_s: float  # load before the signal
    orphan_wait_s: float  # how long processes may outlive the API process after SIGKILL
    dropped_streams: int
    repeat_fraction: float
    startup_timeout_s: float = 600.0


@dataclass
class ConfigResult:
    config: str
    checks: list[Check] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, bool(ok), detail))
        return bool(ok)


def model_shape(model_dir: str) -> tuple[int, int]:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return cfg["num_hidden_layers"], cfg["num_attention_heads"]


class Phases:
    """Run the phases of one configuration; results into ``self.res``."""

    def __init__(self, cfg: Config, prof: Profile, *, model: str, workdir: Path,
                 requests: dict, probe: cl.Request, extra_env: dict) -> None:
        self.cfg, self.prof, self.model, self.workdir = cfg, prof, model, workdir
        self.requests, self.probe = requests, probe
        self.res = ConfigResult(cfg.name)
        self.layers, self.heads = model_shape(model)
        self.stats_dir = workdir / f"stats-{cfg.name}" if cfg.fixed_stats_dir else None
        self.extra_env = extra_env
        self.sent: list[cl.Result] = []  # every request answered by the current server
        self.texts: dict[str, str] = {}

    # ------------------------------------------------------------ servers

    def _env(self, *, kv_space: bool) -> dict:
        import os

        env = {k: v for k, v in os.environ.items()
               if not k.startswith("WITCERT_VLLM") and k != "VLLM_CPU_KVCACHE_SPACE"}
        env["VLLM_LOG_STATS_INTERVAL"] = "2"
        if kv_space:  # on CPU it overrides --kv-cache-memory-bytes
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.prof.kv_space_gib)
        env.update(self.cfg.env)
        if self.cfg.plugin:
            env.update(self.extra_env)
            if self.stats_dir is not None:
                env["WITCERT_VLLM_STATS_DIR"] = str(self.stats_dir)
        return env

    def _server(self, tag: str, args: list[str], *, kv_space: bool = True) -> sv.Server:
        s = sv.Server(f"{self.cfg.name}-{tag}", ["--model", self.model, "--dtype", "bfloat16",
                                                  "--enforce-eager", *args],
                      self._env(kv_space=kv_space),
                      self.workdir / f"server-{self.cfg.name}-{tag}.log")
        s.start()
        self.res.data[f"startup_{tag}_s"] = round(s.wait_healthy(self.prof.startup_timeout_s), 1)
        self.sent = []
        return s

    def run(self) -> ConfigResult:
        shm_before = sv.dir_entries("/dev/shm")
        try:
            self.server_a()
            self.server_b()
        finally:
            sv.kill_everything()
        new = sorted(sv.dir_entries("/dev/shm") - shm_before)
        self.res.data["new_dev_shm_entries"] = new
        # recorded above; then the machine is left as found
        self.res.data["dev_shm_removed_by_harness"] = sv.remove_orphan_segments(new)
        return self.res

    # ------------------------------------------------------------ server A

    def server_a(self) -> None:
        p, r = self.prof, self.res
        s = self._server("a", ["--max-model-len", str(p.max_model_len)])
        port = s.port
        self.metrics_at_start(port)
        warm = cl.complete(HOST, port, self.model, cl.Request("warmup", self.probe.prompt[:8], 4),
                           timeout=600)
        self.sent.append(warm)
        r.check("warm-up request answered", warm.ok, warm.error)
        self.ask_probe(port, "probe_before")
        levels = {}
        for clients, n in p.levels:
            before = cl.scrape(HOST, port)
            run = cl.run_load(HOST, port, self.model, self.requests[(clients, n)],
                              concurrency=clients, time_cap_s=p.level_cap_s)
            after = cl.scrape(HOST, port)
            self.sent.extend(run.results)
            gen = cl.metric_sum(after, "vllm:generation_tokens_total") - \
                cl.metric_sum(before, "vllm:generation_tokens_total")
            lv = summarize_level(run, gen)
            lv["preemptions"] = cl.metric_sum(after, "vllm:num_preemptions_total") - \
                cl.metric_sum(before, "vllm:num_preemptions_total")
            levels[f"c{clients}"] = lv
            r.check(f"{clients} clients: no failed request", lv["failed"] == 0,
                    "; ".join(lv["failures"]))
            for res in run.results:
                if res.ok:
                    self.texts[res.rid] = res.text
        r.data["levels"] = levels
        self.ask_probe(port, "probe_after")
        self.identical_pairs()
        self.check_counters(port, "after load")
        self.malformed(port)
        self.dropped(port)
        r.data["rss_a"] = s.rss()
        if self.cfg.plugin:
            self.summary_line(s)
        self.fault(s, signal.SIGTERM, "sigterm")

    def metrics_at_start(self, port: int) -> None:
        if not self.cfg.plugin:
            return
        m = cl.scrape(HOST, port)
        w = {k: v for k, v in m.items() if k.startswith("witcert_")}
        r = self.res
        nan = [k for k, v in w.items() if v != v]
        r.check("metrics at start: no NaN sample", not nan, ", ".join(nan))
        r.check("metrics at start: counters are 0 (no earlier server's snapshot counted)",
                w.get("witcert_decode_tokens_total") == 0 and
                w.get("witcert_certificates_total") == 0,
                f"decode {w.get('witcert_decode_tokens_total')}, certificates "
                f"{w.get('witcert_certificates_total')}")
        r.check("metrics at start: capacity gauges present",
                'witcert_kv_capacity_tokens{cache="witcert"}' in w)
        r.data.setdefault("capacity", {k: v for k, v in w.items()
                                       if "capacity" in k or "memory_bytes" in k
                                       or "bytes_per_token" in k})

    def ask_probe(self, port: int, key: str) -> None:
        res = cl.complete(HOST, port, self.model, self.probe, timeout=900)
        self.sent.append(res)
        self.res.check(f"{key}: answered with the right length", res.ok, res.error)
        self.texts[key] = res.text

    def identical_pairs(self) -> None:
        pairs = [("probe_before", "probe_after")]
        for reqs in self.requests.values():
            pairs += [(q.twin, q.rid) for q in reqs if q.twin is not None]
        done = [(a, b) for a, b in pairs if a in self.texts and b in self.texts]
        same = [self.texts[a] == self.texts[b] for a, b in done]
        d = {"pairs": len(done), "identical": sum(same),
             "differing": [f"{a}/{b}" for (a, b), ok in zip(done, same) if not ok][:10]}
        self.res.data["identical_greedy"] = d
        if self.cfg.expect_identical:
            self.res.check("identical greedy requests give identical completions",
                           all(same), f"{d['identical']} of {d['pairs']} pairs")

    # ------------------------------------------------------------ counters

    def check_counters(self, port: int, when: str, *, exact_decode: bool = False) -> dict:
        """witcert's counters against each other and vLLM's (``vllm_load_checks``)."""
        m = cl.scrape(HOST, port)
        out = {k: v for k, v in m.items() if k.startswith("witcert_") and "bucket" not in k}
        if not self.cfg.plugin:
            return out
        checks, extra = counter_checks(m, when=when, layers=self.layers, heads=self.heads,
                                       sent=self.sent, exact_decode=exact_decode)
        for c in checks:
            self.res.check(c.name, c.ok, c.detail)
        out.update(extra)
        self.res.data.setdefault("counters", {})[when] = out
        return out

    def summary_line(self, s: sv.Server) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if " decode tokens, " in s.log_text() and "witcert: " in s.log_text():
                break
            time.sleep(1)
        lines = [ln for ln in s.log_text().splitlines() if "witcert: " in ln and
                 " decode tokens, " in ln]
        self.res.check("summary log line 'witcert: N decode tokens, ...' appears", bool(lines),
                       lines[-1][-160:] if lines else "")

    # ------------------------------------------------------------ bad clients

    def malformed(self, port: int) -> None:
        rows = cl.send_malformed(HOST, port, self.model)
        self.res.data["malformed"] = rows
        bad = [f"{x['case']}: {x['status']} {x['error'] or x['body'][:80]}" for x in rows
               if not x["ok"]]
        self.res.check(f"malformed requests: clean 4xx ({len(rows)} cases)", not bad,
                       "; ".join(bad))
        st, _ = cl.get(HOST, port, "/health")
        self.res.check("healthy after malformed requests", st == 200)

    def dropped(self, port: int) -> None:
        p = self.prof
        reqs = [cl.Request(f"drop{i}", self.probe.prompt, 256) for i in range(p.dropped_streams)]
        out = [None] * len(reqs)

        def one(i):
            out[i] = cl.stream_and_drop(HOST, port, self.model, reqs[i], chunks=2)

        th = [threading.Thread(target=one, args=(i,)) for i in range(len(reqs))]
        for t in th:
            t.start()
        for t in th:
            t.join(timeout=900)
        t0 = time.monotonic()
        running = None
        while time.monotonic() - t0 < 120:
            m = cl.scrape(HOST, port)
            running = cl.metric_sum(m, "vllm:num_requests_running") + \
                cl.metric_sum(m, "vllm:num_requests_waiting")
            if running == 0:
                break
            time.sleep(0.5)
        self.res.data["dropped"] = {"streams": out, "drained_s": round(time.monotonic() - t0, 2)}
        self.res.check("dropped streams: every stream started", all(
            x and x["status"] == 200 and x["chunks"] >= 1 for x in out), json.dumps(out)[:300])
        self.res.check("dropped streams: the server aborts them (nothing left running)",
                       running == 0, f"running+waiting {running}")
        after = cl.complete(HOST, port, self.model, self.probe, timeout=900)
        self.sent.append(after)
        self.res.check("dropped streams: a new request is answered", after.ok, after.error)
        self.texts["probe_after_drop"] = after.text
        if self.cfg.expect_identical:
            self.res.check("probe after dropped streams = probe before",
                           after.text == self.texts.get("probe_before"))

    # ------------------------------------------------------------ server B

    def server_b(self) -> None:
        p = self.prof
        s = self._server("b", ["--max-model-len", str(p.pressure_max_model_len),
                               "--kv-cache-memory-bytes", str(p.pressure_kv_bytes),
                               "--no-enable-prefix-caching", "--max-num-batched-tokens",
                               str(max(8192, p.pressure_max_model_len))], kv_space=False)
        port = s.port
        self.metrics_at_start(port)
        reqs = self.requests["pressure"]
        before = cl.scrape(HOST, port)
        run = cl.run_load(HOST, port, self.model, reqs, concurrency=p.pressure_clients,
                          time_cap_s=p.pressure_cap_s)
        after = cl.scrape(HOST, port)
        self.sent.extend(run.results)
        gen = cl.metric_sum(after, "vllm:generation_tokens_total") - \
            cl.metric_sum(before, "vllm:generation_tokens_total")
        lv = summarize_level(run, gen)
        lv["preemptions"] = cl.metric_sum(after, "vllm:num_preemptions_total")
        self.res.data["pressure"] = lv
        self.res.check("KV pressure: no failed request", lv["failed"] == 0,
                       "; ".join(lv["failures"]))
        if self.cfg.plugin:  # the decode identity below must see a preemption
            self.res.check("KV pressure: requests were preempted", lv["preemptions"] > 0,
                           f"{lv['preemptions']:.0f} preemptions")
        self.check_counters(port, "KV pressure", exact_decode=True)
        self.res.data["rss_b"] = s.rss()
        self.fault(s, signal.SIGKILL, "sigkill")

    # ------------------------------------------------------------ signals

    def fault(self, s: sv.Server, sig: int, key: str) -> None:
        """Load for a while, then ``sig`` to the API process; how long until every process
        of the server is gone, and what is left behind."""
        p, r = self.prof, self.res
        roles = s.roles()
        token = next((t for pid in (roles.get("engine"), roles.get("worker")) if pid
                      for t in [sv.instance_token(pid)] if t), None)
        reqs = [cl.Request(f"{key}{i}", self.probe.prompt[:64], 64) for i in range(64)]
        box, control = {}, {}
        th = threading.Thread(target=lambda: box.setdefault("run", cl.run_load(
            HOST, s.port, self.model, reqs, concurrency=8, time_cap_s=p.fault_load_s + 600,
            control=control)), daemon=True)
        th.start()
        time.sleep(p.fault_load_s)
        s.refresh()
        pids = set(s.known)
        t0 = time.monotonic()
        s.signal_api(sig)
        # clients of a server going down give up after a while; until they do, uvicorn's
        # graceful shutdown keeps the API process waiting for their connections
        api = s.wait_api_exit(CLIENT_PATIENCE_S)
        control["abort"]()
        if api is None:
            api = s.wait_api_exit(60)
        wait = p.orphan_wait_s if sig == signal.SIGKILL else 90
        gone = s.wait_all_gone(max(0.0, wait - (time.monotonic() - t0)))
        if gone is not None:
            gone = time.monotonic() - t0  # from the signal
        survivors = [f"{pid} {sv.comm(pid)}" for pid in s.living()]
        killed = s.kill_all() if gone is None else []
        th.join(timeout=180)
        d = {"api_exit_s": None if api is None else round(api - t0, 2),
             "clients_closed_at_s": CLIENT_PATIENCE_S,
             "all_gone_s": None if gone is None else round(gone, 2),
             "survivors_after_wait": survivors, "wait_s": wait,
             "killed_by_harness": killed}
        run = box.get("run")
        if run is not None:
            d["requests_answered_before_signal"] = sum(x.ok for x in run.results)
        plugin_dirs = sv.plugin_dirs_of(pids)
        files = sv.instance_files(self.stats_dir, token) if self.stats_dir else []
        d.update(plugin_dirs_left=plugin_dirs, instance_files_left=files, instance=token)
        r.data[key] = d
        name = "SIGTERM" if sig == signal.SIGTERM else "SIGKILL of the API process"
        if self.cfg.plugin:
            r.check(f"{name} mid-load: every server process exits by itself",
                    gone is not None, f"survivors after {wait} s: {survivors}")
            r.check(f"{name} mid-load: nothing of the plugin's left (stats dir, snapshots)",
                    not plugin_dirs and not files, f"{plugin_dirs} {files}")
        elif sig == signal.SIGTERM:
            r.check(f"{name} mid-load: every server process exits by itself", gone is not None,
                    f"survivors after {wait} s: {survivors}")


def result_json(res: ConfigResult) -> dict:
    return {"config": res.config, "checks": [asdict(c) for c in res.checks], **res.data}
