"""scripts/nccl-check's driver: pre-flight (SKIPPED without torch or a GPU), the agent, the two
ranks of each run, and the verdict. The logic it applies lives in check_lib (tested without a
GPU); this file starts and stops processes and reads and writes files."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import check_lib as cl  # noqa: E402

WORLD = 2
WORKER = os.path.join(HERE, "worker.py")
LIVE: List[Any] = []  # processes and agents to stop if the script itself is stopped

PROBE = r"""
import json, sys
info = {"python": sys.version.split()[0]}
try:
    import torch
except BaseException as e:
    info["error"] = "torch"
    info["detail"] = "%s: %s" % (type(e).__name__, e)
    print(json.dumps(info)); sys.exit(0)
info["torch"] = getattr(torch, "__version__", "?")
info["cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
try:
    info["cuda_available"] = bool(torch.cuda.is_available())
    info["device_count"] = int(torch.cuda.device_count()) if info["cuda_available"] else 0
except BaseException as e:
    info["cuda_available"] = False
    info["device_count"] = 0
    info["cuda_error"] = "%s: %s" % (type(e).__name__, e)
try:
    import torch.distributed as dist
    info["nccl_backend"] = bool(dist.is_available() and dist.is_nccl_available())
except BaseException as e:
    info["nccl_backend"] = False
    info["dist_error"] = "%s: %s" % (type(e).__name__, e)
dev = int(sys.argv[1])
if info["device_count"] > dev:
    try:
        info["gpu"] = torch.cuda.get_device_name(dev)
    except BaseException as e:
        info["gpu"] = "? (%s)" % e
try:
    v = torch.cuda.nccl.version()
    info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except BaseException:
    pass
print(json.dumps(info))
"""


def say(msg: str = "") -> None:
    print(msg, flush=True)


def skipped(reason: str) -> int:
    say(f"{cl.SKIPPED_PREFIX} {reason}")
    return 0


def error(msg: str) -> int:
    print(f"nccl-check: error: {msg}", file=sys.stderr, flush=True)
    return 2


# --------------------------------------------------------------------------------------------
# Pre-flight


def probe_torch(python: str, device: int) -> Dict[str, Any]:
    try:
        out = subprocess.run([python, "-c", PROBE, str(device)], capture_output=True, text=True,
                             timeout=180, cwd=REPO)
    except FileNotFoundError:
        return {"error": "python", "detail": f"{python} not found"}
    except subprocess.TimeoutExpired:
        return {"error": "timeout", "detail": f"{python} -c 'import torch' took over 180 s"}
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return {"error": "probe", "detail": (out.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def skip_reason(info: Dict[str, Any], python: str, device: int) -> Optional[str]:
    """Why this machine cannot run the check (None: it can)."""
    if info.get("error") == "torch":
        return f"PyTorch is not importable by {python} ({info.get('detail')})"
    if not info.get("cuda"):
        return f"PyTorch {info.get('torch')} is a build without CUDA"
    if not info.get("cuda_available") or info.get("device_count", 0) == 0:
        extra = f": {info['cuda_error']}" if info.get("cuda_error") else ""
        return f"no CUDA GPU visible to PyTorch {info.get('torch')} (CUDA {info.get('cuda')}){extra}"
    if not info.get("nccl_backend"):
        return f"PyTorch {info.get('torch')} has no NCCL backend in torch.distributed"
    if info.get("device_count", 0) <= device:
        return f"no CUDA device {device} (PyTorch sees {info.get('device_count')})"
    mode = compute_mode(device)
    if mode and mode.lower().startswith(("exclusive", "prohibited")):
        return (f"GPU {device} is in compute mode {mode}: two processes cannot share it "
                "(nvidia-smi -c DEFAULT)")
    return None


def compute_mode(device: int) -> Optional[str]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "-i", str(device), "--query-gpu=compute_mode",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def check_bind(spec: str) -> Optional[str]:
    """An IPv4 rail or OOB address must be bindable here (127.0.0.2 is, on Linux's lo)."""
    addr = spec.split("=", 1)[1] if "=" in spec else spec
    if not cl.valid_ipv4(addr):
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
    except OSError as e:
        return f"cannot bind a TCP socket to {addr}: {e}"
    return None


def unresolved(path: str) -> List[str]:
    """What the dynamic loader could not resolve for `path` (ldd), [] when ldd is absent."""
    ldd = shutil.which("ldd")
    if not ldd:
        return []
    try:
        out = subprocess.run([ldd, path], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return cl.ldd_problems(out.stdout + "\n" + out.stderr)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def executable(path: Optional[str]) -> bool:
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        return ""


# --------------------------------------------------------------------------------------------
# Processes


def stop_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM to the process group we started (start_new_session), then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


class Agent:
    """mpib-agent with a fixed share, on private paths, for one advanced-mode run."""

    def __init__(self, binary: str, probes_dir: str, sup_bw: int, log_path: str):
        self.dir = tempfile.mkdtemp(prefix="mpib-check-")  # 0700, short path for the sockets
        self.hint = os.path.join(self.dir, "hints")
        self.socket = os.path.join(self.dir, "agent.sock")
        self.control = os.path.join(self.dir, "agent.control")
        config = os.path.join(self.dir, "agent.toml")
        with open(config, "w") as f:
            f.write(cl.agent_config(sup_bw))
        shutil.copy(config, os.path.join(os.path.dirname(log_path), "agent.toml"))
        self.cmd = [binary, "run", "--config", config, "--hint-path", self.hint, "--socket",
                    self.socket, "--control", self.control, "--probes-dir", probes_dir,
                    "--metrics-listen", "off"]
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.log.write(f"$ {' '.join(self.cmd)}\n")
        self.log.flush()
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=cl.tool_env(dict(os.environ)), start_new_session=True,
                                     cwd=REPO)
        LIVE.append(self)

    def wait_ready(self, timeout: float = 15.0) -> Optional[str]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return f"mpib-agent exited {self.proc.returncode}: {tail(self.log_path)}"
            if os.path.exists(self.socket) and os.path.exists(self.hint):
                return None
            time.sleep(0.1)
        return f"mpib-agent did not create {self.socket} within {timeout:.0f} s"

    def stop(self) -> None:
        stop_group(self.proc)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        if self in LIVE:
            LIVE.remove(self)


def tail(path: str, n: int = 3) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = [l.rstrip() for l in f if l.strip()]
        return " | ".join(lines[-n:])
    except OSError:
        return ""


def read_records(path: str) -> List[Dict[str, Any]]:
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


class Progress:
    """Prints one line per finished op from rank 0's records while a run goes on."""

    def __init__(self, path: str):
        self.path, self.seen, self.op, self.rows = path, 0, None, []

    def poll(self, final: bool = False) -> None:
        records = read_records(self.path)
        for rec in records[self.seen:]:
            if rec.get("event") == "row":
                if self.op and rec["op"] != self.op:
                    self.flush()
                self.op = rec["op"]
                self.rows.append(rec)
        self.seen = len(records)
        if final:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        rows = self.rows
        wrong = sum(r["wrong"] for r in rows)
        big = rows[-1]
        _, busbw = cl.bandwidths(big["op"], big["size"], big["time_us"], WORLD)
        say(f"    {self.op:<15} {len(rows):>2} sizes {cl.format_size(rows[0]['size'])} .. "
            f"{cl.format_size(big['size'])}: rank 0 wrong {wrong}, {big['time_us']:.0f} us and "
            f"busbw {busbw:.2f} GB/s at the largest")
        self.rows, self.op = [], None


def stuck_at(records: Dict[int, List[Dict[str, Any]]]) -> Tuple[Optional[Tuple[str, int]], str]:
    """Where an unfinished run stopped: the (op, size) some rank began and did not finish, and
    the words for it (" during all_gather 4 MiB", " during NCCL init", ...)."""
    for r in sorted(records):
        begun = [rec for rec in records[r] if rec.get("event") == "begin"]
        rows = {(rec["op"], rec["size"]) for rec in records[r] if rec.get("event") == "row"}
        if begun and (begun[-1]["op"], begun[-1]["size"]) not in rows:
            op, size = begun[-1]["op"], begun[-1]["size"]
            return (op, size), f" during {op} {cl.format_size(size)} (rank {r})"
    events = {r: {rec.get("event") for rec in records[r]} for r in sorted(records)}
    for r, ev in events.items():
        if not ev:
            return None, f" before rank {r} started (see rank{r}.out)"
    for r, ev in events.items():
        if "init" not in ev and "error" not in ev:
            return None, f" during NCCL init (init_process_group, rank {r})"
    for r, ev in events.items():
        if "done" not in ev and "error" not in ev:
            return None, f" after the ops (probes scrape or teardown, rank {r})"
    return None, ""


# --------------------------------------------------------------------------------------------
# One run


def run_one(cfg: cl.Config, mode: str, proto: str, out_dir: str, paths: Dict[str, str],
            python: str) -> cl.RunResult:
    name = cl.run_name(mode, proto)
    run_dir = os.path.join(out_dir, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    probes_dir = os.path.join(run_dir, "probes")
    os.mkdir(probes_dir, 0o700)
    os.chmod(probes_dir, 0o700)
    result = cl.RunResult(mode=mode, proto=proto, status="not-run", dir=run_dir)
    say(f"==> {mode} mode, NCCL_PROTO={cl.proto_label(proto)} ({run_dir})")

    agent = None
    if mode == "advanced":
        agent = Agent(paths["agent"], probes_dir, cfg.sup_bw, os.path.join(run_dir, "agent.log"))
        problem = agent.wait_ready()
        if problem:
            agent.stop()
            result.status, result.detail = "failed", problem
            result.checks = [cl.Check("agent: started", False, problem)]
            say(f"    {problem}")
            return result

    port = free_port()
    envs = [cl.rank_env(
        dict(os.environ), rank=r, world=WORLD, plugin=paths["plugin"], mode=mode, proto=proto,
        run_dir=run_dir, probes_dir=probes_dir, sout=cfg.sout, sup=cfg.sup,
        oob_addr=cfg.oob_addr, master_port=port,
        agent_socket=agent.socket if agent else None, hint_path=agent.hint if agent else None,
    ) for r in range(WORLD)]
    result.env = cl.env_summary(envs[0])
    for r, env in enumerate(envs):
        with open(os.path.join(run_dir, f"env.rank{r}.txt"), "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in cl.env_summary(env).items())

    wargs = [
        WORKER, "--run-dir", run_dir, "--ops", ",".join(cfg.ops),
        "--sizes", ",".join(map(str, cfg.sizes)), "--warmup", str(cfg.warmup),
        "--iters", str(cfg.iters), "--min-iters", str(cfg.min_iters),
        "--iter-bytes", str(cfg.iter_bytes), "--device", str(cfg.device),
        "--timeout", str(int(cfg.timeout)), "--collector", paths["collector"],
        "--probes-dir", probes_dir,
    ]
    if agent:
        wargs += ["--hint-path", agent.hint, "--agent", paths["agent"], "--agent-control", agent.control]

    started = time.time()
    procs: List[subprocess.Popen] = []
    logs = []
    if cfg.launcher == "torchrun":
        env = dict(envs[0])
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
        log = open(os.path.join(run_dir, "torchrun.out"), "w")
        logs.append(log)
        cmd = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}",
               *wargs]
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True, cwd=REPO))
        LIVE.append(procs[-1])
    else:
        for r in range(WORLD):
            log = open(os.path.join(run_dir, f"rank{r}.out"), "w")
            logs.append(log)
            procs.append(subprocess.Popen([python, *wargs], env=envs[r], stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO))
            LIVE.append(procs[-1])

    progress = Progress(os.path.join(run_dir, "rank0.jsonl"))
    status, detail = "completed", ""
    first_exit: Optional[float] = None
    while True:
        progress.poll()
        rcs = [p.poll() for p in procs]
        now = time.time()
        if all(rc is not None for rc in rcs):
            break
        if any(rc not in (None, 0) for rc in rcs):
            first_exit = first_exit or now
            if now - first_exit > 15:  # the peer of a dead rank waits forever in NCCL
                for p in procs:
                    stop_group(p)
                break
        if now - started > cfg.timeout:
            status = "timeout"
            for p in procs:
                stop_group(p)
            break
        time.sleep(0.25)
    progress.poll(final=True)
    for p in procs:
        LIVE.remove(p)
    for log in logs:
        log.close()
    result.duration_s = time.time() - started
    rcs = [p.returncode for p in procs]

    records = {r: read_records(os.path.join(run_dir, f"rank{r}.jsonl")) for r in range(WORLD)}
    errors = [f"rank {r}: {rec['message']}" for r in range(WORLD) for rec in records[r]
              if rec.get("event") == "error"]
    done = all(any(rec.get("event") == "done" for rec in records[r]) for r in range(WORLD))
    hung, where = stuck_at(records)
    if status == "timeout":
        detail = f"timed out after {cfg.timeout:.0f} s{where}; exit codes {rcs}"
    elif not done or any(rc != 0 for rc in rcs):
        status = "failed"
        detail = f"exit codes {rcs}{where}" + (f"; {errors[0]}" if errors else
                                                f"; {tail(os.path.join(run_dir, 'rank0.out'))}")
    else:
        detail = f"both ranks finished in {result.duration_s:.0f} s"
    result.status, result.detail = status, detail

    # Probes: the worker scraped them before its communicators closed; after a crash or a
    # timeout the files of the killed ranks are still there to scrape.
    prom = os.path.join(run_dir, "probes.prom")
    if not os.path.exists(prom) and any(f.endswith(".probes") for f in os.listdir(probes_dir)):
        cmd = [paths["collector"], "--probes-dir", probes_dir, "--once", "--otlp-signals", "none",
               "--stale-after", "600"]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=60,
                                 env=cl.tool_env(dict(os.environ)))
            with open(prom, "w") as f:
                f.write(out.stdout)
            with open(os.path.join(run_dir, "collector.log"), "w") as f:
                f.write(f"$ {' '.join(cmd)}\nexit {out.returncode}\n{out.stderr}")
        except (OSError, subprocess.TimeoutExpired) as e:
            say(f"    mpib-collector after the run: {e}")
    if agent:
        agent.stop()

    per_rank = {r: [rec for rec in records[r] if rec.get("event") == "row"] for r in range(WORLD)}
    result.rows = cl.merge_rank_rows(per_rank, WORLD)
    nccl_logs = {}
    for r in range(WORLD):
        text = ""
        for fn in sorted(os.listdir(run_dir)):
            if fn.startswith(f"nccl.rank{r}.") and fn.endswith(".log"):
                with open(os.path.join(run_dir, fn), errors="replace") as f:
                    text += f.read()
        nccl_logs[r] = cl.parse_nccl_log(text)
    result.nccl_version = next((lg.version_text for lg in nccl_logs.values() if lg.version_text), "")
    result.warns = sorted({w for lg in nccl_logs.values() for w in lg.warns})[:20]

    probes, probes_problem = None, ""
    if os.path.exists(prom):
        try:
            with open(prom) as f:
                probes = cl.summarize_probes(cl.parse_prometheus(f.read()))
        except ValueError as e:
            probes_problem = f"unreadable collector output {prom}: {e}"
    if probes is not None:
        result.probes = {"tx": probes.tx, "rx": probes.rx, "pids": probes.pids,
                         "tx_by_pid": probes.tx_by_pid, "errors": probes.errors,
                         "connections": len(probes.connections),
                         "modes": sorted({c["mode"] for c in probes.connections}),
                         "path_classes": sorted({c["path_class"] for c in probes.connections}),
                         "without_agent": probes.without_agent,
                         "hint_sup_ratio": sorted(set(probes.hint_sup_ratio)),
                         "transfers_by_mask": probes.transfers_by_mask}

    checks = [cl.Check("run: completed", status == "completed", detail)]
    checks += cl.nccl_log_checks(nccl_logs, WORLD, paths["plugin"])
    checks += cl.result_checks(result.rows, cfg.ops, cl.expected_sizes(cfg.ops, cfg.sizes, WORLD),
                               status, hung)
    if probes_problem:
        checks.append(cl.Check("probes: scraped", False, probes_problem))
    else:
        checks += cl.probes_checks(probes, mode, WORLD, cfg.sup_bw)
    result.checks = checks
    leftover = [f for f in os.listdir(probes_dir) if f.endswith(".probes")]
    if status == "completed" and leftover:
        result.warns.append(f"probes files left after a clean exit: {leftover}")
    if result.rows and not cfg.brief:
        say(cl.format_tables(result.rows))
    if result.warns:
        say(f"  warnings: {len(result.warns)} (NCCL WARN lines and more: results.json, nccl_warnings); "
            f"first: {result.warns[0]}")
    key = ("nccl: plugin loaded", "probes: rails carried bytes")
    for c in result.checks:
        if not c.ok or cfg.verbose or c.name in key:
            say(f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}")
    npass = sum(c.ok for c in result.checks)
    say(f"  {npass} of {len(result.checks)} checks passed")
    return result


# --------------------------------------------------------------------------------------------


def main(argv: List[str]) -> int:
    def terminate(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        return check(argv)
    finally:  # stopped (SIGTERM, Ctrl-C) or crashed: leave no rank or agent behind
        for item in list(LIVE):
            if isinstance(item, Agent):
                item.stop()
            else:
                stop_group(item, grace=2.0)


def check(argv: List[str]) -> int:
    cfg = cl.parse_args(argv)
    python = cfg.python or sys.executable
    if cfg.python and not shutil.which(cfg.python) and not os.path.isfile(cfg.python):
        return error(f"--python {cfg.python}: not found")

    info = probe_torch(python, cfg.device)
    if info.get("error") and info.get("error") != "torch":
        return error(f"cannot probe PyTorch with {python}: {info.get('detail')}")
    reason = skip_reason(info, python, cfg.device)
    if reason:
        return skipped(reason)

    paths = {
        "plugin": cfg.plugin or cl.find_default(REPO, cl.PLUGIN_CANDIDATES),
        "agent": cfg.agent or cl.find_default(REPO, cl.AGENT_CANDIDATES),
        "collector": cfg.collector or cl.find_default(REPO, cl.COLLECTOR_CANDIDATES),
    }
    build = "cargo build --release -p mpib -p mpib-agent -p mpib-collector"
    if not paths["plugin"] or not os.path.isfile(paths["plugin"]):
        return error(f"no plugin library ({cfg.plugin or ' or '.join(cl.PLUGIN_CANDIDATES)}); "
                     f"build it ({build}) or pass --plugin")
    if not executable(paths["collector"]):
        return error(f"no mpib-collector ({paths['collector'] or cl.COLLECTOR_CANDIDATES[0]}); "
                     f"build it ({build}) or pass --collector")
    if "advanced" in cfg.modes and not executable(paths["agent"]):
        return error(f"no mpib-agent ({paths['agent'] or cl.AGENT_CANDIDATES[0]}); build it "
                     f"({build}), pass --agent, or run --modes vanilla")
    paths = {k: os.path.abspath(v) for k, v in paths.items() if v}
    problem = cl.plugin_path_problem(paths["plugin"])
    if problem:
        return error(f"{problem}: copy the library to a shorter path and pass --plugin")
    for what, path in paths.items():
        if what == "agent" and "advanced" not in cfg.modes:
            continue
        missing = unresolved(path)
        if missing:
            return error(f"{path} cannot be loaded on this machine: {'; '.join(missing[:4])} "
                         "(install the library, or build where the libraries match)")
    for spec in (cfg.sout, cfg.sup, cfg.oob_addr):
        problem = check_bind(spec)
        if problem:
            return error(problem)

    out_dir = os.path.abspath(cfg.out or os.path.join(REPO, "target", "nccl-check"))
    os.makedirs(out_dir, exist_ok=True)
    machine = {
        "gpu": info.get("gpu"), "torch": info.get("torch"), "cuda": info.get("cuda"),
        "nccl": info.get("nccl"), "python": info.get("python"), "host": socket.gethostname(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(), "plugin": paths["plugin"],
        "plugin_bytes": os.path.getsize(paths["plugin"]),
    }
    config = {
        "modes": cfg.modes, "protos": [cl.proto_label(p) for p in cfg.protos], "ops": cfg.ops,
        "sizes": cfg.sizes, "warmup": cfg.warmup, "iters": cfg.iters, "min_iters": cfg.min_iters,
        "iter_bytes": cfg.iter_bytes, "timeout_s": cfg.timeout, "sout": cfg.sout, "sup": cfg.sup,
        "oob_addr": cfg.oob_addr, "sup_bw": cfg.sup_bw, "launcher": cfg.launcher,
        "world": WORLD, "device": cfg.device,
    }
    say(f"nccl-check: {machine['gpu']}, torch {machine['torch']} (CUDA {machine['cuda']}), "
        f"NCCL {machine['nccl']}; plugin {paths['plugin']}; out {out_dir}")
    say(f"nccl-check: {len(cfg.modes) * len(cfg.protos)} run(s) of {len(cfg.ops)} ops at "
        f"{len(cfg.sizes)} sizes {cl.format_size(cfg.sizes[0])} .. {cl.format_size(cfg.sizes[-1])}, "
        f"{cfg.timeout:.0f} s each at most")

    runs = []
    for mode in cfg.modes:
        for proto in cfg.protos:
            runs.append(run_one(cfg, mode, proto, out_dir, paths, python))

    notes = cl.diagnose(runs)
    passed, failed = cl.tally(runs)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump(cl.results_json(runs, machine, config, notes), f, indent=1)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(cl.markdown_summary(runs, machine, config, notes))
    say("")
    for r in runs:
        bad = [c.name for c in r.checks if not c.ok]
        say(f"  {r.name:<18} {r.status:<8} {len(r.checks) - len(bad):>2} passed"
            + (f", failed: {', '.join(bad)}" if bad else ""))
    for n in notes:
        say(n)
    say(f"results: {os.path.join(out_dir, 'results.json')}, {os.path.join(out_dir, 'summary.md')}")
    say(cl.final_line(passed, failed))
    return 0 if failed == 0 else 1
