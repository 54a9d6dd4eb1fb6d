"""The GPU-free half of scripts/nccl-check: everything that needs neither torch nor a GPU.

Arguments and defaults, the environment of each rank, the data patterns and their exact
verification, the nccl-tests bandwidth arithmetic, the parsing of NCCL's INFO log and of the
collector's Prometheus text, the checks and the verdict, and the results files (JSON and
markdown). Standard library only (Python 3.8+), so it imports and its tests run on any machine.

The data-pattern functions (`mix`, `value`, `op_input`, `op_expected`, `op_poison`) use only
`+ * // % & ^ >>` on non-negative integers: the worker calls them on torch int64 tensors of
indices (on the GPU), the unit tests on plain ints, with the same results.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

# --------------------------------------------------------------------------------------------
# Constants

NET_NAME = "MPIB"  # the plugin's ncclNet_t name (src/ffi/tables.rs PLUGIN_NAME)
HOSTID_PREFIX = "mpib-check-rank"

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "all_to_all")
MODES = ("vanilla", "advanced")
DEFAULT_PROTO = "default"  # NCCL's own choice: NCCL_PROTO unset

CHUNKED_OPS = ("all_gather", "reduce_scatter", "all_to_all")  # buffers of world x chunk
REDUCING_OPS = ("all_reduce", "reduce_scatter")

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

DTYPES = {"int32": (4, 31), "uint8": (1, 8)}  # name -> (bytes, bits of the non-negative domain)

SKIPPED_PREFIX = "SKIPPED:"

# --------------------------------------------------------------------------------------------
# Sizes and arguments


def parse_size(text: str) -> int:
    """`256M`, `1K`, `4G`, `64KiB`, `1048576` -> bytes (binary multiples)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)(?:i?[bB])?\s*", str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 1, 64K, 256M, 1G)")
    number, unit = int(m.group(1)), m.group(2).upper()
    return number * {"": 1, "K": KIB, "M": MIB, "G": GIB}[unit]


def format_size(n: int) -> str:
    for unit, div in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def size_list(min_size: int, max_size: int, factor: int) -> List[int]:
    """min, min*factor, ... up to max; max itself is always the last entry."""
    if min_size < 1 or max_size < min_size or factor < 2:
        raise ValueError("sizes need 1 <= min <= max and a step factor >= 2")
    sizes, s = [], min_size
    while s < max_size:
        sizes.append(s)
        s *= factor
    sizes.append(max_size)
    return sizes


def _csv(text: str) -> List[str]:
    return [t.strip() for t in str(text).split(",") if t.strip()]


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scripts/nccl-check",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Run real NCCL (PyTorch's) through the MPIB net plugin on one GPU: two processes, each\n"
            "with its own NCCL_HOSTID so that NCCL sees two nodes and must use the net plugin, over\n"
            "MPIB_FABRIC=tcp on two loopback addresses. Checks that NCCL loaded and used MPIB (its\n"
            "INFO log), that every collective's result is exact, and that the rails carried the\n"
            "bytes (the plugin's probes through mpib-collector). Without torch or a GPU it prints\n"
            "'SKIPPED: reason' and exits 0."
        ),
        epilog=(
            "exit status: 0 all checks passed (or SKIPPED), 1 a check failed, 2 bad arguments or\n"
            "missing binaries.\n"
            "example: scripts/nccl-check --max-size 64M --out /tmp/nccl-check"
        ),
    )
    p.add_argument("--plugin", help="the plugin .so (default: target/release/libnccl-net-mpib.so, "
                   "else target/release/libnccl_net_mpib.so)")
    p.add_argument("--agent", help="mpib-agent (default: target/release/mpib-agent)")
    p.add_argument("--collector", help="mpib-collector (default: target/release/mpib-collector)")
    p.add_argument("--out", help="directory for logs and results (default: target/nccl-check)")
    p.add_argument("--modes", default="vanilla,advanced", help="MPIB modes to run (default: %(default)s)")
    p.add_argument("--protos", default="default,Simple",
                   help="NCCL_PROTO values, 'default' = unset (default: %(default)s)")
    p.add_argument("--ops", default=",".join(OPS), help="collectives (default: %(default)s)")
    p.add_argument("--min-size", default="1", help="smallest size in bytes (default: %(default)s)")
    p.add_argument("--max-size", default="256M", help="largest size (default: %(default)s)")
    p.add_argument("--step-factor", type=int, default=4, help="size multiplier (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations per size (default: %(default)s)")
    p.add_argument("--iters", type=int, default=20,
                   help="most timed iterations per size (default: %(default)s)")
    p.add_argument("--min-iters", type=int, default=2,
                   help="fewest timed iterations per size (default: %(default)s)")
    p.add_argument("--iter-bytes", default="64M",
                   help="timed iterations per size ~ this / size, within [min-iters, iters] "
                        "(default: %(default)s)")
    p.add_argument("--timeout", type=float, default=180.0,
                   help="seconds for each run (one mode and protocol), start-up included "
                        "(default: %(default)s)")
    p.add_argument("--sout", default="127.0.0.1", help="MPIB_HCA_SOUT (default: %(default)s)")
    p.add_argument("--sup", default="127.0.0.2", help="MPIB_HCA_SUP (default: %(default)s)")
    p.add_argument("--oob-addr", default="127.0.0.1", help="MPIB_OOB_ADDR (default: %(default)s)")
    p.add_argument("--sup-bw", type=int, default=512,
                   help="advanced mode: the agent's static SUP share, parts per 1024 (default: %(default)s)")
    p.add_argument("--device", type=int, default=0, help="CUDA device both ranks use (default: %(default)s)")
    p.add_argument("--launcher", choices=("direct", "torchrun"), default="direct",
                   help="start the two ranks directly (default) or with torchrun --standalone")
    p.add_argument("--python", help="Python with torch for the ranks (default: this interpreter)")
    p.add_argument("--verbose", action="store_true",
                   help="print every check, not only the failed ones and the key lines")
    p.add_argument("--brief", action="store_true",
                   help="leave the per-size tables out of the output (they stay in summary.md)")
    return p


@dataclass
class Config:
    plugin: Optional[str]
    agent: Optional[str]
    collector: Optional[str]
    out: Optional[str]
    modes: List[str]
    protos: List[str]
    ops: List[str]
    sizes: List[int]
    warmup: int
    iters: int
    min_iters: int
    iter_bytes: int
    timeout: float
    sout: str
    sup: str
    oob_addr: str
    sup_bw: int
    device: int
    launcher: str
    python: Optional[str]
    verbose: bool = False
    brief: bool = False


def parse_args(argv: Sequence[str]) -> Config:
    """Parses and validates; a bad value exits 2 through argparse with a message naming it."""
    parser = make_parser()
    a = parser.parse_args(list(argv))

    def bad(msg: str) -> None:
        parser.error(msg)

    modes = _csv(a.modes)
    for m in modes:
        if m not in MODES:
            bad(f"--modes: unknown mode {m!r} (vanilla, advanced)")
    protos = _csv(a.protos)
    for pr in protos:
        if not re.fullmatch(r"\^?[A-Za-z0-9,]+", pr) and pr != DEFAULT_PROTO:
            bad(f"--protos: bad protocol {pr!r}")
    ops = _csv(a.ops)
    for o in ops:
        if o not in OPS:
            bad(f"--ops: unknown op {o!r} ({', '.join(OPS)})")
    if not modes or not protos or not ops:
        bad("--modes, --protos and --ops need at least one value")
    try:
        sizes = size_list(parse_size(a.min_size), parse_size(a.max_size), a.step_factor)
        iter_bytes = parse_size(a.iter_bytes)
    except ValueError as e:
        bad(str(e))
        raise  # unreachable: parser.error exits
    if a.warmup < 0 or a.iters < 1 or a.min_iters < 1 or a.min_iters > a.iters:
        bad("need --warmup >= 0 and 1 <= --min-iters <= --iters")
    if a.timeout <= 0:
        bad("--timeout must be positive")
    if not 0 <= a.sup_bw <= 1024:
        bad("--sup-bw must be 0..1024")
    for name, value in (("--sout", a.sout), ("--sup", a.sup)):
        if not valid_rail_spec(value):
            bad(f"{name} {value!r}: expected IFNAME, IFNAME=IPV4 or IPV4")
    if not valid_ipv4(a.oob_addr):
        bad(f"--oob-addr {a.oob_addr!r}: expected an IPv4 address")
    return Config(
        plugin=a.plugin, agent=a.agent, collector=a.collector, out=a.out, modes=modes,
        protos=protos, ops=ops, sizes=sizes, warmup=a.warmup, iters=a.iters,
        min_iters=a.min_iters, iter_bytes=iter_bytes, timeout=a.timeout, sout=a.sout,
        sup=a.sup, oob_addr=a.oob_addr, sup_bw=a.sup_bw, device=a.device,
        launcher=a.launcher, python=a.python, verbose=a.verbose,
        brief=a.brief,
    )


def valid_ipv4(text: str) -> bool:
    parts = text.split(".")
    return len(parts) == 4 and all(p.isdigit() and int(p) < 256 and len(p) <= 3 for p in parts)


def valid_rail_spec(text: str) -> bool:
    """The TCP fabric's rail spec: IFNAME, IFNAME=IPV4 or a bare IPV4 address."""
    if "=" in text:
        name, addr = text.split("=", 1)
        return bool(re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", name)) and valid_ipv4(addr)
    return valid_ipv4(text) or bool(re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", text))


def find_default(repo: str, candidates: Sequence[str]) -> Optional[str]:
    """The first existing path among `candidates` (relative to the repository)."""
    for c in candidates:
        path = os.path.join(repo, c)
        if os.path.isfile(path):
            return os.path.abspath(path)
    return None


def plugin_path_problem(path: str) -> Optional[str]:
    """NCCL splits NCCL_NET_PLUGIN at commas and ignores a name of 255 characters or more
    (nccl/src/plugin/net.cc, MAX_STR_LEN): such a path would silently not be loaded."""
    if "," in path:
        return f"{path}: NCCL_NET_PLUGIN cannot hold a path with a comma (NCCL splits the list at commas)"
    if len(path) + 1 > 255:
        return f"{path}: {len(path)} characters, NCCL ignores NCCL_NET_PLUGIN names of 255 or more"
    return None


def ldd_problems(output: str) -> List[str]:
    """The unresolvable dependencies in `ldd FILE` output: missing libraries ("libibverbs.so.1 =>
    not found") and too-new symbol versions ("version `GLIBC_2.36' not found")."""
    problems = []
    for line in output.splitlines():
        line = line.strip()
        if "not found" in line:
            problems.append(re.sub(r"\s+\(0x[0-9a-f]+\)$", "", line))
    return problems


PLUGIN_CANDIDATES = ("target/release/libnccl-net-mpib.so", "target/release/libnccl_net_mpib.so")
AGENT_CANDIDATES = ("target/release/mpib-agent",)
COLLECTOR_CANDIDATES = ("target/release/mpib-collector",)

# --------------------------------------------------------------------------------------------
# The environment of each rank


def proto_label(proto: str) -> str:
    return "default" if proto == DEFAULT_PROTO else proto


def run_name(mode: str, proto: str) -> str:
    return f"{mode}-{re.sub(r'[^A-Za-z0-9]+', '_', proto_label(proto))}"


def rank_env(
    base: Dict[str, str],
    *,
    rank: int,
    world: int,
    plugin: str,
    mode: str,
    proto: str,
    run_dir: str,
    probes_dir: str,
    sout: str,
    sup: str,
    oob_addr: str,
    master_port: int,
    agent_socket: Optional[str] = None,
    hint_path: Optional[str] = None,
) -> Dict[str, str]:
    """The environment of one rank: NCCL forced onto the MPIB plugin, the TCP fabric on the
    given rails, probes into a private directory, and the agent's paths in advanced mode."""
    env = dict(base)
    for k in ("NCCL_PROTO", "MPIB_AGENT_TAG", "MPIB_AGENT_SOCKET", "MPIB_HINT_PATH"):
        env.pop(k, None)
    env.update({
        # NCCL: load this exact library, make a failed load or an unused device fatal, and log
        # what it did (INIT: loading and channels, NET: the plugin's own lines, ENV: NCCL_HOSTID).
        "NCCL_NET_PLUGIN": plugin,
        "NCCL_NET": NET_NAME,
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET,ENV",
        "NCCL_DEBUG_FILE": os.path.join(run_dir, f"nccl.rank{rank}.%p.log"),
        # One GPU, two "hosts": NCCL must go through the network, never P2P or SHM.
        "NCCL_HOSTID": f"{HOSTID_PREFIX}{rank}",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_P2P_DISABLE": "1",
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_COLLNET_ENABLE": "0",
        "NCCL_MNNVL_ENABLE": "0",
        # Bootstrap on loopback: the machine needs no other interface.
        "NCCL_SOCKET_IFNAME": "lo",
        # MPIB over TCP on two loopback addresses.
        "MPIB_FABRIC": "tcp",
        "MPIB_HCA_SOUT": sout,
        "MPIB_HCA_SUP": sup,
        "MPIB_OOB_ADDR": oob_addr,
        "MPIB_PROBES": "1",
        "MPIB_PROBES_DIR": probes_dir,
        "MPIB_MODE": "1" if mode == "advanced" else "0",
        # torch.distributed's rendezvous (env://) and an unbuffered worker.
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "PYTHONUNBUFFERED": "1",
    })
    if proto != DEFAULT_PROTO:
        env["NCCL_PROTO"] = proto
    if mode == "advanced":
        if not agent_socket or not hint_path:
            raise ValueError("advanced mode needs the agent's socket and hint paths")
        env["MPIB_AGENT_SOCKET"] = agent_socket
        env["MPIB_HINT_PATH"] = hint_path
    return env


def tool_env(base: Dict[str, str]) -> Dict[str, str]:
    """The environment for mpib-agent and mpib-collector: flags only, no inherited MPIB_*/OTEL_*
    (the agent parses every MPIB_* variable and refuses a value it does not know)."""
    return {k: v for k, v in base.items() if not k.startswith(("MPIB_", "OTEL_"))}


def agent_config(sup_bw: int, interval_ms: int = 50) -> str:
    """An mpib-agent configuration that gives every flow the same fixed SUP share."""
    return (
        "# written by scripts/nccl-check: every flow gets a fixed SUP share\n"
        'default = "static"\n'
        f"interval_ms = {interval_ms}\n"
        'metrics_listen = "off"\n'
        "\n"
        "[[rule]]\n"
        'policy = "static"\n'
        f"sup_bw = {sup_bw}\n"
    )


def env_summary(env: Dict[str, str]) -> Dict[str, str]:
    """The variables of a rank environment worth recording (NCCL_*, MPIB_*, TORCH_*)."""
    return {k: env[k] for k in sorted(env) if k.startswith(("NCCL_", "MPIB_", "TORCH_"))}


# --------------------------------------------------------------------------------------------
# Data patterns and exact verification

M32 = 0xFFFFFFFF


def mix(seed: Any, i: Any) -> Any:
    """A 32-bit hash of (seed, index): no short period, so a misplaced block shows."""
    v = (i * 0x9E3779B1 + seed * 0x85EBCA77 + 0x165667B1) & M32
    v = v ^ (v >> 15)
    v = (v * 0x2C1B3C6D) & M32
    v = v ^ (v >> 12)
    v = (v * 0x297A2D39) & M32
    v = v ^ (v >> 15)
    return v


def value(seed: Any, i: Any, bits: int) -> Any:
    return mix(seed, i) & ((1 << bits) - 1)


@dataclass
class Plan:
    """One op at one size: the buffers, their element type and the value ranges."""

    op: str
    size_index: int
    bytes: int  # nccl-tests' size: the largest per-rank buffer
    dtype: str
    esize: int
    count_in: int
    count_out: int
    chunk: int  # elements per rank-chunk (= count for unchunked ops)
    root: int  # broadcast root, else -1
    value_bits: int  # inputs are < 2**value_bits (sums of `world` of them fit the type)
    storage_bits: int  # every stored value is < 2**storage_bits

    @property
    def count(self) -> int:
        return self.bytes // self.esize

    @property
    def redop(self) -> str:
        return "sum" if self.op in REDUCING_OPS else "none"


def plan_op(op: str, size: int, world: int, size_index: int = 0) -> Optional[Plan]:
    """The buffers of `op` at nccl-tests size `size` (bytes of the largest per-rank buffer), or
    None when the size is too small for the op (a chunked op needs a byte per rank)."""
    if op not in OPS:
        raise ValueError(f"unknown op {op}")
    chunked = op in CHUNKED_OPS
    unit = size // world if chunked else size
    if unit < 1:
        return None
    dtype = "int32" if unit % 4 == 0 else "uint8"
    esize, storage_bits = DTYPES[dtype]
    chunk = unit // esize
    total = chunk * world if chunked else chunk
    if op == "all_gather":
        count_in, count_out = chunk, total
    elif op == "reduce_scatter":
        count_in, count_out = total, chunk
    else:
        count_in = count_out = total
    value_bits = storage_bits
    if op in REDUCING_OPS:
        value_bits = storage_bits - max(1, math.ceil(math.log2(world)))
    return Plan(
        op=op, size_index=size_index, bytes=total * esize, dtype=dtype, esize=esize,
        count_in=count_in, count_out=count_out, chunk=chunk,
        root=(size_index % world) if op == "broadcast" else -1,
        value_bits=value_bits, storage_bits=storage_bits,
    )


def seed(plan: Plan, check: int, rank: Any) -> Any:
    """Distinct per op, size, check round and rank; linear in rank (rank may be a tensor)."""
    base = ((OPS.index(plan.op) * 64 + plan.size_index % 64) * 4 + check % 4) * 1024
    return base + rank


def op_input(plan: Plan, rank: int, world: int, check: int, i: Any) -> Any:
    """What `rank` puts in its input buffer at index i (i < plan.count_in)."""
    if plan.op == "broadcast" and rank != plan.root:
        return op_poison(plan, rank, world, check, i)
    return value(seed(plan, check, rank), i, plan.value_bits)


def op_expected(plan: Plan, rank: int, world: int, check: int, i: Any) -> Any:
    """What `rank` must find in its output buffer at index i (i < plan.count_out)."""
    op, c, bits = plan.op, plan.chunk, plan.value_bits
    if op == "all_reduce":
        return sum(value(seed(plan, check, j), i, bits) for j in range(world))
    if op == "broadcast":
        return value(seed(plan, check, plan.root), i, bits)
    if op == "send_recv":
        return value(seed(plan, check, (rank - 1) % world), i, bits)
    if op == "all_gather":
        return value(seed(plan, check, i // c), i % c, bits)
    if op == "reduce_scatter":
        return sum(value(seed(plan, check, j), rank * c + i, bits) for j in range(world))
    if op == "all_to_all":
        return value(seed(plan, check, i // c), rank * c + i % c, bits)
    raise ValueError(op)


def op_poison(plan: Plan, rank: int, world: int, check: int, i: Any) -> Any:
    """What an output buffer holds before the op: never the expected value, so an element
    nobody wrote is caught."""
    modulus = 1 << plan.storage_bits
    bump = 1 + mix(seed(plan, check, rank) + 0x40000, i) % (modulus - 1)
    return (op_expected(plan, rank, world, check, i) + bump) % modulus


def in_place(op: str) -> bool:
    """Ops whose output is their input buffer (torch: all_reduce, broadcast)."""
    return op in ("all_reduce", "broadcast")


def simulate(plan: Plan, world: int, inputs: Sequence[Sequence[int]]) -> List[List[int]]:
    """The collective's semantics on plain lists (the reference for the tests)."""
    op, c, n = plan.op, plan.chunk, plan.count_in
    if op == "all_reduce":
        total = [sum(inputs[j][i] for j in range(world)) for i in range(n)]
        return [list(total) for _ in range(world)]
    if op == "broadcast":
        return [list(inputs[plan.root]) for _ in range(world)]
    if op == "send_recv":
        return [list(inputs[(r - 1) % world]) for r in range(world)]
    if op == "all_gather":
        gathered = [x for j in range(world) for x in inputs[j]]
        return [list(gathered) for _ in range(world)]
    if op == "reduce_scatter":
        return [[sum(inputs[j][r * c + i] for j in range(world)) for i in range(c)]
                for r in range(world)]
    if op == "all_to_all":
        return [[inputs[j][r * c + i] for j in range(world) for i in range(c)]
                for r in range(world)]
    raise ValueError(op)


def verify(plan: Plan, rank: int, world: int, check: int, out: Sequence[int],
           keep: int = 4) -> Tuple[int, List[Tuple[int, int, int]]]:
    """(#wrong, the first `keep` mismatches as (index, got, expected)) of one rank's output."""
    wrong, first = 0, []
    if len(out) != plan.count_out:
        return max(len(out), plan.count_out), [(-1, len(out), plan.count_out)]
    for i, got in enumerate(out):
        want = op_expected(plan, rank, world, check, i)
        if got != want:
            wrong += 1
            if len(first) < keep:
                first.append((i, got, want))
    return wrong, first


def sample_indices(count: int) -> List[int]:
    """A few indices of a buffer to cross-check a vectorised pattern against `value`."""
    picks = {0, 1, 2, count // 3, count // 2, count - 2, count - 1}
    return sorted(i for i in picks if 0 <= i < count)


# --------------------------------------------------------------------------------------------
# Timing and bandwidth (nccl-tests' definitions)


def busbw_factor(op: str, world: int) -> float:
    n = world
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "send_recv"):
        return 1.0
    raise ValueError(op)


def bandwidths(op: str, size: int, time_us: float, world: int) -> Tuple[float, float]:
    """(algbw, busbw) in GB/s: size / time, times nccl-tests' bus factor."""
    if time_us <= 0:
        return 0.0, 0.0
    algbw = size / (time_us * 1e-6) / 1e9
    return algbw, algbw * busbw_factor(op, world)


def timed_iterations(size: int, iter_bytes: int, min_iters: int, max_iters: int) -> int:
    return max(min_iters, min(max_iters, -(-iter_bytes // max(size, 1))))


# --------------------------------------------------------------------------------------------
# Rows and tables

ROW_HEADER = (
    f"#{'size':>11} {'count':>11} {'type':>6} {'redop':>5} {'root':>4} "
    f"{'time(us)':>10} {'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>7}"
)


@dataclass
class Row:
    op: str
    size: int
    count: int
    dtype: str
    redop: str
    root: int
    iters: int
    time_us: float  # the slowest rank's mean per timed iteration
    algbw: float
    busbw: float
    wrong: int  # mismatched elements, all ranks and both check rounds
    mismatches: List[List[int]] = field(default_factory=list)  # (rank, index, got, expected)
    error: str = ""


def format_row(r: Row) -> str:
    return (
        f"{r.size:>12} {r.count:>11} {r.dtype:>6} {r.redop:>5} {r.root:>4} "
        f"{r.time_us:>10.1f} {r.algbw:>11.3f} {r.busbw:>11.3f} {r.wrong:>7}"
    )


def merge_rank_rows(per_rank: Dict[int, List[Dict[str, Any]]], world: int) -> List[Row]:
    """One Row per (op, size) from each rank's 'row' records: the slowest time, the summed
    #wrong; a row that some rank lacks is missing (that rank died or hung before it)."""
    keyed: Dict[Tuple[str, int], Dict[int, Dict[str, Any]]] = {}
    order: List[Tuple[str, int]] = []
    for rank, records in sorted(per_rank.items()):
        for rec in records:
            key = (rec["op"], int(rec["size"]))
            if key not in keyed:
                keyed[key] = {}
                order.append(key)
            keyed[key][rank] = rec
    rows = []
    for key in order:
        recs = keyed[key]
        if len(recs) < world:
            continue
        first = recs[min(recs)]
        t = max(float(r["time_us"]) for r in recs.values())
        algbw, busbw = bandwidths(key[0], key[1], t, world)
        mism = []
        for rank, r in sorted(recs.items()):
            for m in r.get("mismatches", []):
                mism.append([rank] + list(m))
        rows.append(Row(
            op=key[0], size=key[1], count=int(first["count"]), dtype=first["dtype"],
            redop=first["redop"], root=int(first["root"]), iters=int(first["iters"]),
            time_us=t, algbw=algbw, busbw=busbw,
            wrong=sum(int(r["wrong"]) for r in recs.values()), mismatches=mism[:8],
            error="; ".join(r["error"] for r in recs.values() if r.get("error")),
        ))
    return rows


def format_tables(rows: Sequence[Row]) -> str:
    out: List[str] = []
    for op in OPS:
        mine = [r for r in rows if r.op == op]
        if not mine:
            continue
        out.append(f"# {op}")
        out.append(ROW_HEADER)
        out.extend(format_row(r) for r in mine)
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# NCCL's INFO log
#
# Every line NCCL writes (nccl/src/debug.cc, ncclDebugLog) is
#   [optional "[%F %T] " timestamp, WARN only by default]HOST:PID:TID [DEV] NCCL INFO MESSAGE
#   ...HOST:PID:TID [DEV] FILE:LINE NCCL WARN MESSAGE
# The version line (nccl/src/init.cc showVersion) is an INFO line, "... NCCL INFO NCCL version
# 2.28.9+cuda13.0", at NCCL_DEBUG=INFO, and printed bare at NCCL_DEBUG=VERSION or WARN.
# The messages parsed below are NCCL 2.28's (identical in 2.28.3 ... 2.30.7):

_LINE = re.compile(r"NCCL (INFO|WARN|TRACE) (.*)$")
_VERSION = re.compile(r"^NCCL version (\d+)\.(\d+)\.(\d+)(\S*)")
# nccl/src/plugin/net/net_v11.cc (and net_v6 ... net_v12): INFO "NET/Plugin: Loaded net plugin %s (v11)"
_LOADED = re.compile(r"^NET/Plugin: Loaded net plugin (.+) \(v(\d+)\)$")
# nccl/src/plugin/net.cc ncclNetPluginLoad: "Successfully loaded external network plugin %s" (the path)
_LOADED_PATH = re.compile(r"^Successfully loaded external network plugin (.+)$")
# nccl/src/plugin/net.cc initPluginLibsOnceFunc: "NCCL_NET_PLUGIN set by environment to %s"
_PLUGIN_ENV = re.compile(r"^NCCL_NET_PLUGIN set by environment to (.+)$")
# nccl/src/plugin/net.cc ncclNetPluginInit / ncclNetPluginAssignToComm
_INITIALIZED = re.compile(r"^Initialized NET plugin (\S+)$")
_ASSIGNED = re.compile(r"^Assigned NET plugin (\S+) to comm$")
# nccl/src/init.cc initTransportsRank... "Using network %s"
_USING = re.compile(r"^Using network (\S+)$")
# nccl/src/transport/net.cc sendSetup/recvSetup:
#   "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s%s"   (+ "(%d)" proxy rank variant)
#   "Channel %02d/%d : %d[%d] -> %d[%d] [receive] via NET/%s/%d%s%s%s"
_CHANNEL_NET = re.compile(
    r"^Channel (\d+)/(\d+) : (\d+)\[(\d+)\] -> (\d+)\[(\d+)\] \[(send|receive)\] "
    r"via NET/([^/\s]+)/(\d+)(?:\((\d+)\))?(\S*)$")
# nccl/src/transport/p2p.cc and shm.cc: "Channel ... via P2P/..." and "Channel ... via SHM/..."
_CHANNEL_OTHER = re.compile(r"^Channel \d+.* via (P2P|SHM|CollNet|NVLS)\b")
# nccl/src/misc/utils.cc getHostHashOnce: "NCCL_HOSTID set by environment to %s"
_HOSTID = re.compile(r"^NCCL_HOSTID set by environment to (.+)$")
# nccl/src/init.cc: "comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d MNNVL %d"
_COMM = re.compile(
    r"^comm (\S+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+) MNNVL (\d+)")
# The plugin's own open line (src/net/setup/plugin.rs): "MPIB: opened SOUT+SUP on the FABRIC fabric ..."
_MPIB_OPENED = re.compile(r"^MPIB: opened (\S+) on the (\S+) fabric")
# Lines that mean NCCL did not (or could not) use the plugin.
_FAILURES = [
    re.compile(r"^Failed to initialize any NET plugin"),          # nccl/src/plugin/net.cc (WARN)
    re.compile(r"^Failed to initialize NET plugin (\S+)"),        # nccl/src/plugin/net.cc
    re.compile(r"^External network plugin .* is unsupported"),  # nccl/src/plugin/net.cc
    re.compile(r"^NET/Plugin: Could not find:"),                  # nccl/src/plugin/plugin_open.cc
    re.compile(r"^NET/Plugin: \S+: .*"),                           # plugin_open.cc: dlopen error
]
# Lines of NCCL's internal transports: they appear only when NCCL initialises them, i.e. when
# MPIB was not picked (nccl/src/transport/net_socket.cc, net_ib.cc).
_FALLBACK = [
    re.compile(r"^NET/Socket : Using"),
    re.compile(r"^NET/Socket : no interface found"),
    re.compile(r"^NET/IB ?: Using"),
    re.compile(r"^NET/IB : No device found"),
]


@dataclass
class NcclLog:
    """What one process's NCCL log says."""

    version: Optional[Tuple[int, int, int]] = None
    version_text: str = ""
    plugin_env: List[str] = field(default_factory=list)
    loaded: List[Tuple[str, int]] = field(default_factory=list)
    loaded_paths: List[str] = field(default_factory=list)
    initialized: List[str] = field(default_factory=list)
    assigned: List[str] = field(default_factory=list)
    using: List[str] = field(default_factory=list)
    channels: List[Dict[str, Any]] = field(default_factory=list)
    other_transports: List[str] = field(default_factory=list)
    hostids: List[str] = field(default_factory=list)
    comms: List[Dict[str, int]] = field(default_factory=list)
    mpib_opened: List[Tuple[str, str]] = field(default_factory=list)
    failures: List[str] = field(default_factory=list)
    fallbacks: List[str] = field(default_factory=list)
    warns: List[str] = field(default_factory=list)
    lines: int = 0


def parse_nccl_log(text: str) -> NcclLog:
    log = NcclLog()
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        v = _VERSION.match(line.strip())
        if v:
            log.version = (int(v.group(1)), int(v.group(2)), int(v.group(3)))
            log.version_text = line.strip()[len("NCCL version "):]
            continue
        m = _LINE.search(line)
        if not m:
            continue
        log.lines += 1
        level, msg = m.group(1), m.group(2).strip()
        if level == "WARN":
            log.warns.append(msg)
        for pattern in _FAILURES:
            if pattern.match(msg):
                log.failures.append(msg)
                break
        for pattern in _FALLBACK:
            if pattern.match(msg):
                log.fallbacks.append(msg)
                break
        if level != "INFO":
            continue
        if (x := _VERSION.match(msg)):
            log.version = (int(x.group(1)), int(x.group(2)), int(x.group(3)))
            log.version_text = msg[len("NCCL version "):]
        elif (x := _LOADED.match(msg)):
            log.loaded.append((x.group(1), int(x.group(2))))
        elif (x := _LOADED_PATH.match(msg)):
            log.loaded_paths.append(x.group(1))
        elif (x := _PLUGIN_ENV.match(msg)):
            log.plugin_env.append(x.group(1))
        elif (x := _INITIALIZED.match(msg)):
            log.initialized.append(x.group(1))
        elif (x := _ASSIGNED.match(msg)):
            log.assigned.append(x.group(1))
        elif (x := _USING.match(msg)):
            log.using.append(x.group(1))
        elif (x := _CHANNEL_NET.match(msg)):
            log.channels.append({
                "channel": int(x.group(1)), "conn": int(x.group(2)), "from": int(x.group(3)),
                "to": int(x.group(5)), "dir": x.group(7), "net": x.group(8),
                "dev": int(x.group(9)), "flags": x.group(11),
            })
        elif _CHANNEL_OTHER.match(msg):
            log.other_transports.append(msg)
        elif (x := _HOSTID.match(msg)):
            log.hostids.append(x.group(1))
        elif (x := _COMM.match(msg)):
            log.comms.append({
                "rank": int(x.group(2)), "nRanks": int(x.group(3)), "nNodes": int(x.group(4)),
                "localRanks": int(x.group(5)), "localRank": int(x.group(6)),
            })
        elif (x := _MPIB_OPENED.match(msg)):
            log.mpib_opened.append((x.group(1), x.group(2)))
    return log


def expected_net_abi(version: Optional[Tuple[int, int, int]]) -> Optional[int]:
    """The ncclNetPlugin_vN table NCCL picks from a plugin exporting v7 ... v12
    (docs/NCCL_NET_ABI.md section 1.1); None when unknown."""
    if not version:
        return None
    mm = version[:2]
    for floor, abi in (((2, 30), 12), ((2, 28), 11), ((2, 26), 10), ((2, 24), 9), ((2, 20), 8),
                       ((2, 19), 7)):
        if mm >= floor:
            return abi
    return None


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


def nccl_log_checks(logs: Dict[int, NcclLog], world: int, plugin_path: str,
                    fabric: str = "tcp") -> List[Check]:
    """The checks on the NCCL logs of one run (one log per rank)."""
    checks: List[Check] = []
    ranks = list(range(world))
    missing = [r for r in ranks if r not in logs or logs[r].lines == 0]
    if missing:
        checks.append(Check("nccl: logs", False, f"no NCCL INFO log from rank(s) {missing}"))
        return checks

    # 1. The plugin library was loaded and NCCL took its table.
    problems = []
    for r in ranks:
        lg = logs[r]
        mine = [(n, v) for n, v in lg.loaded if n == NET_NAME]
        want = expected_net_abi(lg.version)
        if not mine:
            problems.append(f"rank {r}: no 'NET/Plugin: Loaded net plugin {NET_NAME} (vN)' line"
                            + (f" (loaded: {lg.loaded})" if lg.loaded else ""))
        elif want is not None and any(v != want for _, v in mine):
            problems.append(f"rank {r}: NCCL {lg.version_text} took table v{mine[0][1]}, "
                            f"expected v{want}")
        if lg.loaded_paths:
            real = os.path.realpath(plugin_path)
            if not any(os.path.realpath(p) == real or p == plugin_path for p in lg.loaded_paths):
                problems.append(f"rank {r}: NCCL loaded {lg.loaded_paths}, not {plugin_path}")
        elif lg.version and lg.version[:2] >= (2, 28):
            problems.append(f"rank {r}: no 'Successfully loaded external network plugin' line")
    tables = sorted({f"v{v}" for r in ranks for n, v in logs[r].loaded if n == NET_NAME})
    checks.append(Check("nccl: plugin loaded", not problems,
                        "; ".join(problems) or f"{NET_NAME} {','.join(tables)} from {plugin_path}"))

    # 2. NCCL initialised MPIB, assigned it to every communicator and used it.
    problems = []
    for r in ranks:
        lg = logs[r]
        if NET_NAME not in lg.initialized:
            problems.append(f"rank {r}: no 'Initialized NET plugin {NET_NAME}'")
        if NET_NAME not in lg.assigned:
            problems.append(f"rank {r}: no 'Assigned NET plugin {NET_NAME} to comm'")
        if NET_NAME not in lg.using:
            problems.append(f"rank {r}: no 'Using network {NET_NAME}'")
        others = sorted({n for n in lg.using + lg.assigned if n != NET_NAME})
        if others:
            problems.append(f"rank {r}: NCCL used network(s) {others}")
    ncomms = [len(logs[r].using) for r in ranks]
    checks.append(Check("nccl: network is MPIB", not problems,
                        "; ".join(problems) or f"'Using network {NET_NAME}' for every communicator "
                        f"({'/'.join(map(str, ncomms))} per rank)"))

    # 3. Every connection went through NET/MPIB, none through P2P or SHM.
    problems = []
    counts = []
    for r in ranks:
        lg = logs[r]
        send = [c for c in lg.channels if c["dir"] == "send"]
        recv = [c for c in lg.channels if c["dir"] == "receive"]
        wrong_net = sorted({c["net"] for c in lg.channels if c["net"] != NET_NAME})
        if not send or not recv:
            problems.append(f"rank {r}: {len(send)} send / {len(recv)} receive channel lines "
                            f"'via NET/{NET_NAME}/N'")
        if wrong_net:
            problems.append(f"rank {r}: channels via NET/{','.join(wrong_net)}")
        if lg.other_transports:
            problems.append(f"rank {r}: {lg.other_transports[0]!r}")
        counts.append(f"{len(send)}+{len(recv)}")
    checks.append(Check("nccl: channels via NET/MPIB", not problems,
                        "; ".join(problems) or f"send+receive channel lines per rank: {', '.join(counts)}"))

    # 4. No fallback to NCCL's Socket or IB transport, no failed load.
    bad = []
    for r in ranks:
        for line in logs[r].failures + logs[r].fallbacks:
            bad.append(f"rank {r}: {line!r}")
    checks.append(Check("nccl: no fallback", not bad,
                        "; ".join(bad[:4]) or "no Socket/IB line, no failed load"))

    # 5. NCCL saw two nodes (distinct NCCL_HOSTID) of one GPU each.
    problems = []
    hostids = {}
    for r in ranks:
        lg = logs[r]
        hostids[r] = lg.hostids[-1] if lg.hostids else None
        if not lg.comms:
            problems.append(f"rank {r}: no 'comm ... nNodes N localRanks L' line")
        for c in lg.comms:
            if c["nNodes"] != c["nRanks"] or c["localRanks"] != 1:
                problems.append(f"rank {r}: nRanks {c['nRanks']} nNodes {c['nNodes']} "
                                f"localRanks {c['localRanks']} (want one rank per node)")
                break
    if None in hostids.values():
        problems.append(f"NCCL_HOSTID not reported by rank(s) {[r for r, h in hostids.items() if h is None]}")
    elif len(set(hostids.values())) != world:
        problems.append(f"NCCL_HOSTID not distinct: {hostids}")
    checks.append(Check("nccl: one rank per node", not problems,
                        "; ".join(problems) or f"nNodes {world}, localRanks 1; NCCL_HOSTID "
                        + ", ".join(str(hostids[r]) for r in ranks)))

    # 6. The plugin opened its rails on the expected fabric.
    problems = []
    opened = []
    for r in ranks:
        lg = logs[r]
        if not lg.mpib_opened:
            problems.append(f"rank {r}: no 'MPIB: opened ... on the {fabric} fabric' line")
        else:
            name, fab = lg.mpib_opened[0]
            opened.append(name)
            if fab != fabric:
                problems.append(f"rank {r}: MPIB opened {name} on the {fab} fabric, not {fabric}")
    checks.append(Check(f"mpib: {fabric} fabric", not problems,
                        "; ".join(problems)
                        or f"opened {', '.join(sorted(set(opened)))} on the {fabric} fabric"))

    # 7. The plugin warned about nothing.
    warns = [f"rank {r}: {w}" for r in ranks for w in logs[r].warns if w.startswith("MPIB:")]
    checks.append(Check("mpib: no WARN", not warns, "; ".join(warns[:3]) or "none"))
    return checks


# --------------------------------------------------------------------------------------------
# The collector's Prometheus text

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


def _unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), v)


def parse_prometheus(text: str) -> List[Tuple[str, Dict[str, str], float]]:
    """Samples of a Prometheus text exposition: (name, labels, value). Comments are skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            raise ValueError(f"not a Prometheus sample: {line!r}")
        name, block, val = m.group(1), m.group(2), m.group(3)
        labels: Dict[str, str] = {}
        if block:
            body, pos = block[1:-1], 0
            while pos < len(body):
                lm = _LABEL.match(body, pos)
                if not lm:
                    raise ValueError(f"bad labels in {line!r}")
                labels[lm.group(1)] = _unescape(lm.group(2))
                pos = lm.end()
        out.append((name, labels, float(val)))
    return out


RAILS = ("sout", "sup")
_ERROR_FAMILIES = ("mpib_rail_error_completions_total", "mpib_mask_mismatches_total",
                   "mpib_protocol_errors_total")


@dataclass
class Probes:
    pids: List[str] = field(default_factory=list)
    tx: Dict[str, float] = field(default_factory=dict)  # rail -> bytes, all processes
    rx: Dict[str, float] = field(default_factory=dict)
    tx_by_pid: Dict[str, Dict[str, float]] = field(default_factory=dict)
    errors: Dict[str, float] = field(default_factory=dict)
    connections: List[Dict[str, str]] = field(default_factory=list)
    without_agent: float = 0.0
    hint_lost: float = 0.0
    hint_sup_ratio: List[float] = field(default_factory=list)
    files: Optional[float] = None
    skipped: float = 0.0
    transfers_by_mask: Dict[str, float] = field(default_factory=dict)


def summarize_probes(samples: Iterable[Tuple[str, Dict[str, str], float]]) -> Probes:
    p = Probes(tx={r: 0.0 for r in RAILS}, rx={r: 0.0 for r in RAILS},
               errors={f: 0.0 for f in _ERROR_FAMILIES})
    pids = set()
    for name, labels, val in samples:
        rail, pid = labels.get("rail"), labels.get("pid")
        if name in ("mpib_rail_tx_bytes_total", "mpib_rail_rx_bytes_total") and rail:
            target = p.tx if name.endswith("tx_bytes_total") else p.rx
            target[rail] = target.get(rail, 0.0) + val
            if pid is not None:
                pids.add(pid)
                if name == "mpib_rail_tx_bytes_total":
                    p.tx_by_pid.setdefault(pid, {r: 0.0 for r in RAILS})
                    p.tx_by_pid[pid][rail] = p.tx_by_pid[pid].get(rail, 0.0) + val
        elif name in _ERROR_FAMILIES:
            p.errors[name] += val
        elif name == "mpib_connection_info":
            p.connections.append({k: labels.get(k, "") for k in
                                  ("pid", "peer", "direction", "path_class", "mode", "hint_slot")})
        elif name == "mpib_connections_without_agent_total":
            p.without_agent += val
        elif name == "mpib_hint_file_lost_total":
            p.hint_lost += val
        elif name == "mpib_connection_hint_sup_ratio":
            p.hint_sup_ratio.append(val)
        elif name == "mpib_probes_files":
            p.files = (p.files or 0.0) + val
        elif name == "mpib_probes_skipped_total":
            p.skipped += val
        elif name == "mpib_transfers_total":
            mask = labels.get("mask", "?")
            p.transfers_by_mask[mask] = p.transfers_by_mask.get(mask, 0.0) + val
    p.pids = sorted(pids)
    return p


def probes_checks(p: Optional[Probes], mode: str, world: int, sup_bw: int) -> List[Check]:
    """The checks on one run's scrape of the plugin's probes."""
    if p is None:
        return [Check("probes: scraped", False, "no mpib-collector output for this run")]
    checks = []
    senders = [pid for pid, by in p.tx_by_pid.items() if sum(by.values()) > 0]
    total = sum(p.tx.values())
    share = f"; SUP share {p.tx.get('sup', 0) / total:.3f}" if total else ""
    if mode == "advanced" and total:
        share += f" (agent's static share {sup_bw / 1024:.3f})"
    detail = (f"tx sout {fmt_bytes(p.tx.get('sout', 0))}, sup {fmt_bytes(p.tx.get('sup', 0))}; "
              f"rx sout {fmt_bytes(p.rx.get('sout', 0))}, sup {fmt_bytes(p.rx.get('sup', 0))}{share}")
    problems = []
    if len(senders) < world:
        problems.append(f"{len(senders)} of {world} processes sent bytes (pids with tx: {senders}, "
                        f"files: {p.pids})")
    classes = sorted({c["path_class"] for c in p.connections})
    if mode == "advanced":
        for rail in RAILS:
            if p.tx.get(rail, 0) <= 0:
                problems.append(f"advanced mode at sup_bw {sup_bw}: rail {rail} carried no bytes")
    else:
        if classes == ["intra"] and p.tx.get("sup", 0) <= 0:
            problems.append("vanilla intra-island: SUP carried no bytes")
        if classes == ["inter"] and p.tx.get("sout", 0) <= 0:
            problems.append("vanilla inter-island: SOUT carried no bytes")
        if sum(p.tx.values()) <= 0:
            problems.append("no bytes on any rail")
    checks.append(Check("probes: rails carried bytes", not problems,
                        "; ".join(problems + [detail]) if problems else
                        detail + (f" (path class {'/'.join(classes)})" if classes else "")))

    problems = []
    modes = sorted({c["mode"] for c in p.connections})
    if not p.connections:
        problems.append("no open connection in the probes (mpib_connection_info)")
    elif modes != [mode]:
        problems.append(f"connections in mode {modes}, expected {mode}")
    if mode == "advanced":
        if p.without_agent > 0:
            problems.append(f"{p.without_agent:.0f} connection(s) got no hint slot from the agent")
        if p.hint_lost > 0:
            problems.append(f"{p.hint_lost:.0f} connection(s) lost the hint file")
    checks.append(Check("probes: mode " + mode, not problems,
                        "; ".join(problems) or f"{len(p.connections)} connection(s), all {mode}"
                        + (f", hint sup ratio {sorted(set(round(x, 3) for x in p.hint_sup_ratio))}"
                           if p.hint_sup_ratio else "")))

    errors = {k: v for k, v in p.errors.items() if v > 0}
    problems = [f"{k} {v:.0f}" for k, v in errors.items()]
    if p.skipped > 0:
        problems.append(f"mpib_probes_skipped_total {p.skipped:.0f} (a probes file was refused)")
    checks.append(Check("probes: no errors", not problems,
                        "; ".join(problems) or "no error completions, mask mismatches or protocol errors"))
    return checks


def fmt_bytes(n: float) -> str:
    for unit, div in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


# --------------------------------------------------------------------------------------------
# Results of a run, the verdict and the files


def result_checks(rows: Sequence[Row], ops: Sequence[str], expected_sizes: Dict[str, List[int]],
                  status: str, hung: Optional[Tuple[str, int]]) -> List[Check]:
    """One check per op: every expected size ran and every element was exact."""
    checks = []
    for op in ops:
        mine = {r.size: r for r in rows if r.op == op}
        wrong = [r for r in mine.values() if r.wrong > 0 or r.error]
        missing = [s for s in expected_sizes.get(op, []) if s not in mine]
        problems = []
        if wrong:
            wrong.sort(key=lambda r: r.size)
            problems.append(f"wrong results at {len(wrong)} of {len(mine)} sizes: " + ", ".join(
                f"{format_size(r.size)} ({r.wrong} wrong{'; ' + r.error if r.error else ''})"
                for r in wrong[:4]) + (", ..." if len(wrong) > 4 else ""))
            first = next((r.mismatches[0] for r in wrong if r.mismatches), None)
            if first:
                problems.append(f"first: rank {first[0]} index {first[1]} got {first[2]} "
                                f"expected {first[3]}")
        if missing:
            where = ""
            if hung and hung[0] == op:
                where = f" ({status} during {format_size(hung[1])})"
            problems.append(f"no result for {len(missing)} size(s) from {format_size(missing[0])}{where}")
        sizes = sorted(mine)
        checks.append(Check(
            f"results: {op}", not problems,
            "; ".join(problems) or (f"exact at {len(sizes)} sizes {format_size(sizes[0])} .. "
                                    f"{format_size(sizes[-1])}" if sizes else "no sizes")))
    return checks


def expected_sizes(ops: Sequence[str], sizes: Sequence[int], world: int) -> Dict[str, List[int]]:
    out: Dict[str, List[int]] = {}
    for op in ops:
        out[op] = []
        for idx, s in enumerate(sizes):
            plan = plan_op(op, s, world, idx)
            if plan is not None:
                out[op].append(plan.bytes)
    return out


@dataclass
class RunResult:
    mode: str
    proto: str
    status: str  # completed | failed | timeout | not-run
    detail: str = ""
    duration_s: float = 0.0
    env: Dict[str, str] = field(default_factory=dict)
    rows: List[Row] = field(default_factory=list)
    checks: List[Check] = field(default_factory=list)
    nccl_version: str = ""
    probes: Optional[Dict[str, Any]] = None
    warns: List[str] = field(default_factory=list)
    dir: str = ""

    @property
    def name(self) -> str:
        return run_name(self.mode, self.proto)

    def results_ok(self) -> bool:
        return all(c.ok for c in self.checks if c.name.startswith("results:")) and any(
            c.name.startswith("results:") for c in self.checks)

    def results_bad(self) -> bool:
        """Wrong data, or a run that died or hung while moving it."""
        return any(not c.ok for c in self.checks if c.name.startswith("results:"))


def diagnose(runs: Sequence[RunResult]) -> List[str]:
    """The protocol finding: results broken with NCCL's default protocols but exact with
    NCCL_PROTO=Simple in the same mode."""
    notes = []
    for mode in MODES:
        default = [r for r in runs if r.mode == mode and r.proto == DEFAULT_PROTO]
        simple = [r for r in runs if r.mode == mode and r.proto.lower() == "simple"]
        if not default or not simple:
            continue
        d, s = default[0], simple[0]
        if d.results_bad() and s.results_ok():
            if any(r.wrong for r in d.rows):
                how = "gave wrong results"
            elif d.status == "timeout":
                how = "hung (the run timed out)"
            else:
                how = f"did not complete ({d.status}: {d.detail})"
            notes.append(
                f"PROTOCOL: in {mode} mode NCCL's default protocols {how}, NCCL_PROTO=Simple was "
                f"exact. NCCL's LL and LL128 protocols poll flags stored beside the data and need "
                f"each 8-byte (LL) or 128-byte (LL128) line to land whole; MPIB's TCP fabric does "
                f"not give that, so the plugin must keep NCCL on Simple (e.g. set NCCL_PROTO=Simple "
                f"at init when the user has not, or export a tuner that disables LL/LL128).")
    return notes


def tally(runs: Sequence[RunResult]) -> Tuple[int, int]:
    checks = [c for r in runs for c in r.checks]
    return sum(c.ok for c in checks), sum(not c.ok for c in checks)


def final_line(passed: int, failed: int) -> str:
    return f"nccl-check: {passed} passed, {failed} failed"


def results_json(runs: Sequence[RunResult], machine: Dict[str, Any], config: Dict[str, Any],
                 notes: Sequence[str]) -> Dict[str, Any]:
    passed, failed = tally(runs)
    return {
        "format": "mpib-nccl-check/1",
        "machine": machine,
        "config": config,
        "runs": [
            {
                "name": r.name, "mode": r.mode, "proto": proto_label(r.proto), "status": r.status,
                "detail": r.detail, "duration_s": round(r.duration_s, 2), "dir": r.dir,
                "nccl_version": r.nccl_version, "env": r.env,
                "rows": [asdict(x) for x in r.rows],
                "checks": [asdict(c) for c in r.checks],
                "probes": r.probes, "nccl_warnings": r.warns,
            }
            for r in runs
        ],
        "diagnosis": list(notes),
        "passed": passed,
        "failed": failed,
    }


def markdown_summary(runs: Sequence[RunResult], machine: Dict[str, Any], config: Dict[str, Any],
                     notes: Sequence[str]) -> str:
    passed, failed = tally(runs)
    m = machine
    lines = [
        "## NCCL through MPIB on one GPU (scripts/nccl-check)",
        "",
        f"{m.get('gpu', '?')}, PyTorch {m.get('torch', '?')} (CUDA {m.get('cuda', '?')}), "
        f"NCCL {m.get('nccl', '?')}; two processes on one GPU with distinct `NCCL_HOSTID`, "
        f"`MPIB_FABRIC=tcp` with SOUT `{config.get('sout')}` and SUP `{config.get('sup')}` "
        f"(loopback), {m.get('date', '')}. Sizes are nccl-tests' (bytes of the largest per-rank "
        "buffer); time is the slower rank's mean over the timed iterations; busbw uses nccl-tests' "
        "factors. Cells: busbw in GB/s (time per iteration), `WRONG n` when any element was wrong.",
        "",
    ]
    for r in runs:
        head = f"### {r.mode}, NCCL_PROTO={proto_label(r.proto)}: {r.status}"
        if r.mode == "advanced":
            head += f" (agent static sup_bw {config.get('sup_bw')})"
        lines += [head, ""]
        if r.detail:
            lines += [f"> {r.detail}", ""]
        ops = [o for o in OPS if any(x.op == o for x in r.rows)]
        if ops:
            sizes = sorted({x.size for x in r.rows})
            lines.append("| size | " + " | ".join(ops) + " |")
            lines.append("|---:|" + "---:|" * len(ops))
            cell = {(x.op, x.size): x for x in r.rows}
            for s in sizes:
                cells = []
                for o in ops:
                    x = cell.get((o, s))
                    if x is None:
                        cells.append("")
                    elif x.wrong or x.error:
                        cells.append(f"WRONG {x.wrong}")
                    else:
                        cells.append(f"{x.busbw:.3f} ({x.time_us:.0f} us)")
                lines.append(f"| {format_size(s)} | " + " | ".join(cells) + " |")
            lines.append("")
        if r.probes:
            tx, rx = r.probes.get("tx", {}), r.probes.get("rx", {})
            lines.append(f"Rails (probes): tx SOUT {fmt_bytes(tx.get('sout', 0))}, SUP "
                         f"{fmt_bytes(tx.get('sup', 0))}; rx SOUT {fmt_bytes(rx.get('sout', 0))}, "
                         f"SUP {fmt_bytes(rx.get('sup', 0))}.")
            lines.append("")
        for c in r.checks:
            lines.append(f"- {'PASS' if c.ok else 'FAIL'} {c.name}: {c.detail}")
        lines.append("")
        if r.rows:
            lines += ["<details><summary>nccl-tests style table</summary>", "", "```text",
                      format_tables(r.rows), "```", "", "</details>", ""]
    for n in notes:
        lines += [f"**{n}**", ""]
    lines.append(f"`{final_line(passed, failed)}`")
    lines.append("")
    return "\n".join(lines)
