"""Overhead of ``trajlake proxy`` per call (issue 27, part 2), against calling the upstream directly, in the same
run.

    python bench/bench_proxy.py [--episodes 100] [--calls 10] [--reply-tokens 60] [--observation-bytes 400]

Three processes: a fake fast upstream (``tests/proxy_upstream.py``'s scripted server: vLLM's ``prompt_token_ids``,
``token_ids`` and log-probs, no model), ``trajlake proxy`` in front of it (the command, with the recorder's default
commit policy: ``LakeWriter``'s defaults, a commit when the oldest finished episode is 30 s old), and this process
as the agent (one kept-alive ``http.client`` connection, like an SDK's). An episode is ``--calls`` chat calls whose
messages grow by the reply and a tool result each, then (through the proxy) the outcome post. Episodes rotate over
three paths (direct; direct asking the upstream for vLLM's token ids and log-probs itself, which is what the proxy
asks on the agent's behalf; through the proxy), so all see the same machine load.

Per call: the median, mean and 90th percentile wall time of a call on each path; the overhead is proxy - direct
(also with the outcome posts spread over the calls; the commits run on the proxy's background thread while the
calls go on, so a run longer than 30 s has them in the calls' times), and also proxy - direct-with-fields (the proxy's own
work, without the upstream's extra work of returning ids and log-probs). The direct path's time is the upstream's
time ("the model's time" of a real server). Target: overhead under 2 ms per call. The lake is checked afterwards: every
episode committed, none partial.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {"return_token_ids": True, "logprobs": True}
"""What the proxy asks the upstream for on the agent's behalf (the third path asks it directly)."""


def _upstream_main(reply_tokens: int) -> None:
    """Child mode: serve the scripted upstream until killed; print its base URL."""
    sys.path.insert(0, str(ROOT / "tests"))
    from proxy_upstream import ScriptedUpstream

    # ids are bytes: the reply (the tool call's JSON and <|end|>) is reply_tokens + 23 tokens, 83 at the default
    with ScriptedUpstream([{"tool": "read_file", "args": {"path": "x" * max(1, reply_tokens - 40)}}]) as up:
        print(up.base_url, flush=True)
        signal.sigwait({signal.SIGTERM, signal.SIGINT})


class Agent:
    """One kept-alive connection; ``call`` posts a chat request and returns (seconds, reply)."""

    def __init__(self, base_url: str):
        u = urllib.parse.urlsplit(base_url)
        self.path = u.path.rstrip("/")
        self.conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)

    def post(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[float, Any]:
        data = json.dumps(body).encode()
        t0 = time.perf_counter()
        self.conn.request("POST", path, body=data, headers={"Content-Type": "application/json",
                                                             "Authorization": "Bearer sk-bench", **(headers or {})})
        resp = self.conn.getresponse()
        raw = resp.read()
        dt = time.perf_counter() - t0
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status} from {path}: {raw[:300]!r}")
        return dt, json.loads(raw)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (Linux ``/proc``; all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def episode(agent: Agent, calls: int, obs_bytes: int, session: str | None,
            extra: dict[str, Any] | None = None) -> tuple[list[float], float]:
    """One episode; returns the calls' times and the outcome post's (0 without a session). ``extra``: fields
    added to each request."""
    headers = {"X-Trajlake-Session": session} if session else None
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You fix bugs with the tools given."},
                                      {"role": "user", "content": "Fix the failing test. " + "t" * obs_bytes}]
    times = []
    for _ in range(calls):
        dt, reply = agent.post(agent.path + "/chat/completions",
                               {"model": "m", "messages": messages, "max_tokens": 64, **(extra or {})}, headers)
        times.append(dt)
        msg = reply["choices"][0]["message"]
        messages.append(msg)
        for tc in msg.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": tc["id"], "content": "o" * obs_bytes})
    post = 0.0
    if session:
        post, _ = agent.post("/trajlake/outcome", {"session": session, "success": True,
                                                   "reward_components": {"resolved": 1.0}})
    return times, post


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=100, help="episodes per path")
    ap.add_argument("--calls", type=int, default=10, help="chat calls per episode")
    ap.add_argument("--reply-tokens", type=int, default=60,
                    help="sets the reply's length: the tool call's path argument is N - 40 bytes (83-token replies)")
    ap.add_argument("--observation-bytes", type=int, default=400)
    ap.add_argument("--upstream-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.upstream_only:
        return _upstream_main(args.reply_tokens)

    tmp = Path(tempfile.mkdtemp(prefix="bench-proxy-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    up = subprocess.Popen([sys.executable, __file__, "--upstream-only", "--reply-tokens", str(args.reply_tokens)],
                          stdout=subprocess.PIPE, text=True, env=env)
    proxy = None
    try:
        assert up.stdout is not None
        upstream_url = up.stdout.readline().strip()
        proxy = subprocess.Popen([sys.executable, *os.environ.get("BENCH_PROXY_RUN", "-m trajlake").split(), "proxy", "--upstream", upstream_url, "--lake",
                                  str(tmp / "lake"), "--run-id", "bench", "--port", "0", "--policy-version", "v0"],
                                 stderr=subprocess.PIPE, text=True, env=env)
        assert proxy.stderr is not None
        line = proxy.stderr.readline()
        if not line.startswith("trajlake proxy: http"):
            raise RuntimeError(f"the proxy did not start: {line}{proxy.stderr.read()}")
        proxy_url = line.split()[2]
        direct, through = Agent(upstream_url), Agent(proxy_url)
        for i in range(3):  # warm both paths (imports, connections)
            episode(direct, args.calls, args.observation_bytes, None)
            episode(through, args.calls, args.observation_bytes, f"warm-{i}")
        d_times: list[float] = []
        f_times: list[float] = []
        p_times: list[float] = []
        posts: list[float] = []
        t0 = time.perf_counter()
        cpu0 = cpu_seconds(proxy.pid)
        for i in range(args.episodes):
            d, _ = episode(direct, args.calls, args.observation_bytes, None)
            f, _ = episode(direct, args.calls, args.observation_bytes, None, FIELDS)
            p, post = episode(through, args.calls, args.observation_bytes, f"ep-{i}")
            d_times += d
            f_times += f
            p_times += p
            posts.append(post)
        wall = time.perf_counter() - t0
        time.sleep(31.0)  # the last episodes' age commit (the default policy's 30 s), inside the CPU count
        proxy_cpu = cpu_seconds(proxy.pid) - cpu0
        proxy.send_signal(signal.SIGTERM)
        _, err = proxy.communicate(timeout=120)
    finally:
        for proc in (proxy, up):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    import trajlake

    lake = trajlake.open_lake(tmp / "lake")
    con = trajlake.connect(lake)
    (n_eps,) = con.execute("select count(*) from episodes where run_id = 'bench'").fetchone() or (0,)
    (n_orphans,) = con.execute("select count(*) from turns_uncommitted").fetchone() or (0,)
    ms = 1000.0
    d_med, p_med = statistics.median(d_times) * ms, statistics.median(p_times) * ms
    d_mean = statistics.fmean(d_times) * ms
    f_med, f_mean = statistics.median(f_times) * ms, statistics.fmean(f_times) * ms
    p_mean_calls = statistics.fmean(p_times) * ms
    p_mean = (sum(p_times) + sum(posts)) / len(p_times) * ms

    def p90(xs: list[float]) -> float:
        return round(statistics.quantiles(xs, n=10)[-1] * ms, 3)

    n_calls = len(p_times)
    print(json.dumps({
        "episodes_per_path": args.episodes, "calls_per_episode": args.calls, "calls_per_path": n_calls,
        "direct_ms": {"median": round(d_med, 3), "mean": round(d_mean, 3)},
        "direct_with_vllm_fields_ms": {"median": round(f_med, 3), "mean": round(f_mean, 3)},
        "proxy_ms": {"median": round(p_med, 3), "mean": round(p_mean_calls, 3),
                     "mean_with_outcome_posts": round(p_mean, 3)},
        "p90_ms": {"direct": p90(d_times), "direct_with_fields": p90(f_times), "proxy": p90(p_times)},
        "overhead_ms": {"median": round(p_med - d_med, 3), "mean": round(p_mean_calls - d_mean, 3),
                        "mean_with_outcome_posts": round(p_mean - d_mean, 3)},
        "overhead_vs_direct_with_fields_ms": {"median": round(p_med - f_med, 3),
                                              "mean": round(p_mean_calls - f_mean, 3)},
        "ratio": {"median": round(p_med / d_med, 3), "mean": round(p_mean_calls / d_mean, 3)},
        "outcome_post_ms_median": round(statistics.median(posts) * ms, 3),
        "proxy_cpu_ms_per_call": round(proxy_cpu / n_calls * ms, 3),
        "episodes_committed": n_eps, "orphan_turns": n_orphans, "wall_s": round(wall, 1),
        "proxy_says": err.strip().splitlines()[-1] if err.strip() else "",
    }, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
