"""HTTP side of the vLLM load harness (``bench_vllm_load.py``): prompts, bounded concurrent
load, malformed requests, dropped streams, and /metrics parsing. Standard library only.

Prompts are token ids (the completions API takes a list of ints), windows of real text
(``pydoc_data.topics``, the Python documentation that ships with CPython) tokenized once
with the model's tokenizer, so every prompt has exactly the length asked for and the
server does no tokenization work that differs between configurations.
"""

from __future__ import annotations

import http.client
import json
import random
import re
import socket
import threading
import time
from dataclasses import dataclass, field


# ---------------------------------------------------------------- prompts

def corpus_ids(model_dir: str) -> list[int]:
    """Token ids of the Python documentation topics (deterministic order)."""
    import pydoc_data.topics as topics
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    return tok(text, add_special_tokens=False)["input_ids"]


@dataclass(frozen=True)
class Request:
    """One completion request: ``prompt`` token ids, ``max_tokens`` (ignore_eos: exact)."""

    rid: str
    prompt: tuple[int, ...]
    max_tokens: int
    twin: str | None = None  # rid of an identical earlier request (greedy: same answer?)

    def body(self, model: str, *, stream: bool = False) -> dict:
        return {"model": model, "prompt": list(self.prompt), "max_tokens": self.max_tokens,
                "temperature": 0.0, "ignore_eos": True, "stream": stream}


def make_requests(ids: list[int], *, n: int, mix: tuple[tuple[float, int], ...],
                  max_tokens: tuple[int, int], seed: int, prefix: str,
                  repeat_fraction: float = 0.0) -> list[Request]:
    """n requests: lengths drawn from ``mix`` ((fraction, tokens), ...), windows of the corpus
    at seeded offsets, max_tokens uniform in the closed range; the last
    ``round(n * repeat_fraction)`` are copies of earlier ones (twins), shuffled in."""
    rng = random.Random(seed)
    n_rep = round(n * repeat_fraction)
    fresh = []
    weights = [f for f, _ in mix]
    for i in range(n - n_rep):
        length = rng.choices([t for _, t in mix], weights)[0]
        off = rng.randrange(0, len(ids) - length)
        fresh.append(Request(f"{prefix}{i}", tuple(ids[off:off + length]),
                             rng.randint(*max_tokens)))
    out = list(fresh)
    for j in range(n_rep):
        src = fresh[rng.randrange(len(fresh))]
        out.insert(rng.randrange(len(out) + 1),
                   Request(f"{prefix}r{j}", src.prompt, src.max_tokens, twin=src.rid))
    return out


# ---------------------------------------------------------------- HTTP

@dataclass
class Result:
    rid: str
    status: int | None  # HTTP status; None: no response (connection error, cancelled)
    latency_s: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    text: str = ""
    error: str = ""
    max_tokens: int = 0
    twin: str | None = None
    cancelled: bool = False  # cut by the harness at the level's time cap

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error and self.completion_tokens == self.max_tokens


def post_json(host: str, port: int, path: str, body: bytes, *, timeout: float,
              headers: dict | None = None, conns: list | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    if conns is not None:
        conns.append(conn)
    try:
        conn.request("POST", path, body=body,
                     headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def get(host: str, port: int, path: str, *, timeout: float = 10.0) -> tuple[int, str]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def complete(host: str, port: int, model: str, req: Request, *, timeout: float,
             conns: list | None = None) -> Result:
    t0 = time.monotonic()
    res = Result(req.rid, None, 0.0, max_tokens=req.max_tokens, twin=req.twin)
    try:
        status, raw = post_json(host, port, "/v1/completions",
                                json.dumps(req.body(model)).encode(), timeout=timeout,
                                conns=conns)
        res.status = status
        if status == 200:
            d = json.loads(raw)
            res.prompt_tokens = d["usage"]["prompt_tokens"]
            res.completion_tokens = d["usage"]["completion_tokens"]
            res.text = d["choices"][0]["text"]
            if res.completion_tokens != req.max_tokens:
                res.error = f"completion_tokens {res.completion_tokens} != {req.max_tokens}"
            elif res.prompt_tokens != len(req.prompt):
                res.error = f"prompt_tokens {res.prompt_tokens} != {len(req.prompt)}"
        else:
            res.error = raw[:300].decode(errors="replace")
    except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
        res.error = f"{type(e).__name__}: {e}"
    res.latency_s = time.monotonic() - t0
    return res


@dataclass
class LoadRun:
    results: list[Result] = field(default_factory=list)
    wall_s: float = 0.0
    not_started: int = 0


def run_load(host: str, port: int, model: str, reqs: list[Request], *, concurrency: int,
             time_cap_s: float, request_timeout_s: float = 1800.0,
             control: dict | None = None) -> LoadRun:
    """``concurrency`` client threads take requests in order until none is left; at
    ``time_cap_s`` no new request starts and the ones in flight are cut (their sockets
    closed: vLLM aborts a request whose client went away), marked ``cancelled``.
    control: a dict that receives ``abort``, a callable that cuts the run now."""
    todo = list(reversed(reqs))
    lock = threading.Lock()
    run = LoadRun()
    conns: list[http.client.HTTPConnection] = []
    stop = threading.Event()

    def worker():
        while not stop.is_set():
            with lock:
                if not todo:
                    return
                req = todo.pop()
            res = complete(host, port, model, req, timeout=request_timeout_s, conns=conns)
            if stop.is_set() and res.status is None:
                res.cancelled = True
            with lock:
                run.results.append(res)

    def cut():
        stop.set()
        with lock:
            run.not_started += len(todo)
            todo.clear()
        for c in list(conns):
            _abort(c)

    if control is not None:
        control["abort"] = cut
    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    deadline = t0 + time_cap_s
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        cut()
        for t in threads:
            t.join(timeout=30)
    run.wall_s = time.monotonic() - t0
    return run


def _abort(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def stream_and_drop(host: str, port: int, model: str, req: Request, *, chunks: int,
                    timeout: float = 600.0) -> dict:
    """Stream a completion, read ``chunks`` data events, then close the connection."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    got, t0 = 0, time.monotonic()
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(req.body(model, stream=True)),
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        status = r.status
        while got < chunks:
            line = r.fp.readline()
            if not line:
                break
            if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                got += 1
    except (OSError, http.client.HTTPException) as e:
        return {"rid": req.rid, "status": None, "chunks": got, "error": str(e)}
    finally:
        _abort(conn)
        conn.close()
    return {"rid": req.rid, "status": status, "chunks": got, "error": "",
            "dropped_after_s": round(time.monotonic() - t0, 3)}


def malformed_cases(model: str) -> list[tuple[str, str, bytes, tuple[int, int]]]:
    """(name, path, raw body, accepted status range): requests a server must refuse
    cleanly with a 4xx and survive."""
    ok = {"model": model, "prompt": "Hello", "max_tokens": 4}

    def j(**kw):
        return json.dumps({**ok, **kw}).encode()

    return [
        ("not json", "/v1/completions", b"{this is not json", (400, 499)),
        ("empty body", "/v1/completions", b"", (400, 499)),
        ("json array", "/v1/completions", b"[1, 2, 3]", (400, 499)),
        ("missing prompt", "/v1/completions", json.dumps({"model": model}).encode(), (400, 499)),
        ("negative max_tokens", "/v1/completions", j(max_tokens=-5), (400, 499)),
        ("max_tokens not a number", "/v1/completions", j(max_tokens="many"), (400, 499)),
        ("temperature not a number", "/v1/completions", j(temperature="hot"), (400, 499)),
        ("prompt longer than max-model-len", "/v1/completions",
         j(prompt=[1] * 4096), (400, 499)),
        ("token id out of vocabulary", "/v1/completions", j(prompt=[10**9, 5]), (400, 499)),
        ("unknown model", "/v1/completions", j(model="no-such-model"), (400, 499)),
        ("chat without messages", "/v1/chat/completions",
         json.dumps({"model": model}).encode(), (400, 499)),
        ("unknown path", "/v1/no-such-endpoint", j(), (404, 405)),
    ]


def send_malformed(host: str, port: int, model: str) -> list[dict]:
    out = []
    for name, path, body, (lo, hi) in malformed_cases(model):
        try:
            status, raw = post_json(host, port, path, body, timeout=60)
            err = ""
        except (OSError, http.client.HTTPException) as e:
            status, raw, err = None, b"", str(e)
        out.append({"case": name, "status": status, "ok": status is not None and lo <= status <= hi,
                    "expected": f"{lo}-{hi}", "error": err,
                    "body": raw[:160].decode(errors="replace")})
    return out


# ---------------------------------------------------------------- /metrics

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def scrape(host: str, port: int) -> dict[str, float]:
    """``name{labels}`` -> value of every sample on /metrics (labels as printed)."""
    status, text = get(host, port, "/metrics")
    if status != 200:
        raise RuntimeError(f"/metrics answered {status}")
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def metric_sum(metrics: dict[str, float], name: str) -> float:
    """Sum of a metric over all its label sets (vLLM labels by engine and model)."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))
