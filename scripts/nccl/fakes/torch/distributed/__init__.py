"""Fake torch.distributed for the tests of scripts/nccl-check (see fakes/torch/__init__.py).

Collectives exchange each rank's buffer through files in RUN_DIR/fake-exchange (RUN_DIR is the
directory of NCCL_DEBUG_FILE), numbered by call, so both ranks must call the same collectives
in the same order, as with NCCL. init_process_group writes the INFO lines NCCL 2.28 writes when
it loads and uses the MPIB plugin (the formats of nccl/src/plugin/net.cc, nccl/src/init.cc,
nccl/src/transport/net.cc) to NCCL_DEBUG_FILE, and a probes file that fakes/bin/mpib-collector turns
into the plugin's Prometheus series; destroy_process_group removes it, as the plugin does.

FAKE_NCCL_FAULT (comma separated) injects faults:
  corrupt-default   with NCCL_PROTO unset, every output's element 0 is off by one
  socket            NCCL "falls back" to its Socket transport (log lines only)
  hang:OP           the first OP never returns
  no-sup            no bytes are counted on the SUP rail
"""

import json
import os
import socket as _socket
import threading
import time

import torch

_state = {}


def is_available():
    return True


def is_nccl_available():
    return True


class ReduceOp:
    SUM = "sum"


def _faults():
    return [f for f in os.environ.get("FAKE_NCCL_FAULT", "").split(",") if f]


def _log_path():
    path = os.environ.get("NCCL_DEBUG_FILE", "")
    return path.replace("%h", _socket.gethostname()).replace("%p", str(os.getpid()))


def _log(lines):
    path = _log_path()
    if not path:
        return
    host, pid, tid = _socket.gethostname(), os.getpid(), threading.get_native_id()
    with open(path, "a") as f:
        for level, msg in lines:
            if level == "VERSION":
                f.write(msg + "\n")
            elif level == "WARN":
                f.write(f"\n[2026-01-01 00:00:00] {host}:{pid}:{tid} [0] net.cc:1 NCCL WARN {msg}\n")
            else:
                f.write(f"{host}:{pid}:{tid} [0] NCCL INFO {msg}\n")


def init_process_group(backend="nccl", init_method=None, rank=None, world_size=None, timeout=None,
                       device_id=None, **kw):
    rank = int(os.environ["RANK"]) if rank is None else rank
    world = int(os.environ["WORLD_SIZE"]) if world_size is None else world_size
    run_dir = os.path.dirname(_log_path()) or "."
    ex = os.path.join(run_dir, "fake-exchange")
    os.makedirs(ex, exist_ok=True)
    _state.update(rank=rank, world=world, seq=0, ex=ex, tx={"sout": 0, "sup": 0},
                  timeout=timeout.total_seconds() if timeout else 60.0)
    plugin = os.environ.get("NCCL_NET_PLUGIN", "")
    net = os.environ.get("NCCL_NET", "MPIB")
    faults = _faults()
    lines = [("INFO", "NCCL version 2.28.9+cuda13.0"),
             ("INFO", f"NCCL_HOSTID set by environment to {os.environ.get('NCCL_HOSTID', '')}"),
             ("INFO", f"NCCL_NET_PLUGIN set by environment to {plugin}")]
    if "socket" in faults:
        lines += [("INFO", f"NET/Plugin: Could not find: {plugin}"),
                  ("INFO", "NET/IB : No device found."),
                  ("INFO", "Initialized NET plugin IB"),
                  ("INFO", "NET/Socket : Using [0]lo:127.0.0.1<0>"),
                  ("INFO", "Initialized NET plugin Socket"),
                  ("INFO", "Assigned NET plugin Socket to comm"),
                  ("INFO", "Using network Socket")]
        net = "Socket"
    else:
        sout, sup = os.environ.get("MPIB_HCA_SOUT", "?"), os.environ.get("MPIB_HCA_SUP", "?")
        fabric = os.environ.get("MPIB_FABRIC", "verbs")
        lines += [("INFO", "NET/Plugin: Loaded net plugin MPIB (v11)"),
                  ("INFO", f"Successfully loaded external network plugin {plugin}"),
                  ("INFO", f"MPIB: opened {sout}+{sup} on the {fabric} fabric in 1 ms: sout 10000 "
                           "Mbps, sup 10000 Mbps"),
                  ("INFO", "Initialized NET plugin MPIB"),
                  ("INFO", "Assigned NET plugin MPIB to comm"),
                  ("INFO", "Using network MPIB")]
    lines.append(("INFO", f"comm 0x5555deadbeef rank {rank} nRanks {world} nNodes {world} "
                          f"localRanks 1 localRank 0 MNNVL 0"))
    for ch in range(2):
        peer = (rank + 1) % world
        lines.append(("INFO", f"Channel {ch:02d}/0 : {peer}[0] -> {rank}[0] [receive] via NET/{net}/0"))
        lines.append(("INFO", f"Channel {ch:02d}/0 : {rank}[0] -> {peer}[0] [send] via NET/{net}/0"))
    _log(lines)
    _write_probes()


def _probes_path():
    d = os.environ.get("MPIB_PROBES_DIR")
    return os.path.join(d, f"fake-{os.getpid()}.probes") if d else None


def _write_probes():
    path = _probes_path()
    if not path:
        return
    mode = "advanced" if os.environ.get("MPIB_MODE") == "1" else "vanilla"
    doc = {"pid": os.getpid(), "host": _socket.gethostname(), "mode": mode,
           "tx": _state["tx"], "peer": os.environ.get("MPIB_OOB_ADDR", "127.0.0.1") + ":40000",
           "agent": bool(os.environ.get("MPIB_AGENT_SOCKET")
                         and os.path.exists(os.environ["MPIB_AGENT_SOCKET"]))}
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)


def _count(nbytes):
    faults = _faults()
    if os.environ.get("MPIB_MODE") == "1":
        sup = (nbytes * 512) >> 10
    else:
        sup = nbytes
    if "no-sup" in faults:
        sup = 0
    _state["tx"]["sup"] += sup
    _state["tx"]["sout"] += nbytes - sup
    _write_probes()


def _exchange(values, tag):
    """Every rank's list for this call, by rank."""
    _state["seq"] += 1
    seq, rank, world, ex = _state["seq"], _state["rank"], _state["world"], _state["ex"]
    for f in _faults():
        if f == f"hang:{tag}" and not _state.get("hung"):
            _state["hung"] = True
            while True:
                time.sleep(1)
    mine = os.path.join(ex, f"{seq}.{rank}")
    with open(mine + ".tmp", "w") as f:
        json.dump({"tag": tag, "v": values}, f)
    os.replace(mine + ".tmp", mine)
    deadline = time.time() + _state["timeout"]
    out = {}
    while len(out) < world:
        for r in range(world):
            if r not in out:
                p = os.path.join(ex, f"{seq}.{r}")
                if os.path.exists(p):
                    with open(p) as f:
                        doc = json.load(f)
                    if doc["tag"] != tag:
                        raise RuntimeError(f"collective mismatch at call {seq}: {tag} vs {doc['tag']}")
                    out[r] = doc["v"]
        if len(out) < world:
            if time.time() > deadline:
                raise RuntimeError(f"fake NCCL timeout in {tag} (call {seq})")
            time.sleep(0.002)
    _count(4 * (sum(len(v) for v in values.values()) if isinstance(values, dict) else len(values)))
    return [out[r] for r in range(world)]


def _corrupt(t):
    if "corrupt-default" in _faults() and "NCCL_PROTO" not in os.environ and t.numel():
        t[0:1].copy_([t.tolist()[0] + 1])


def all_reduce(t, op=ReduceOp.SUM):
    allv = _exchange(t.tolist(), "all_reduce")
    t.copy_([sum(col) for col in zip(*allv)])
    _corrupt(t)


def broadcast(t, src=0):
    allv = _exchange(t.tolist(), "broadcast")
    t.copy_(allv[src])
    _corrupt(t)


def all_gather_into_tensor(out, inp):
    allv = _exchange(inp.tolist(), "all_gather")
    out.copy_([x for v in allv for x in v])
    _corrupt(out)


def reduce_scatter_tensor(out, inp, op=ReduceOp.SUM):
    allv = _exchange(inp.tolist(), "reduce_scatter")
    c, r = out.numel(), _state["rank"]
    out.copy_([sum(v[r * c + i] for v in allv) for i in range(c)])
    _corrupt(out)


def all_to_all_single(out, inp):
    allv = _exchange(inp.tolist(), "all_to_all")
    world, r = _state["world"], _state["rank"]
    c = inp.numel() // world
    out.copy_([allv[j][r * c + i] for j in range(world) for i in range(c)])
    _corrupt(out)


def isend(t, peer):
    return ("send", t, peer)


def irecv(t, peer):
    return ("recv", t, peer)


class P2POp:
    def __init__(self, op, tensor, peer):
        self.op, self.tensor, self.peer = op, tensor, peer


class _Work:
    def wait(self):
        return True


def batch_isend_irecv(ops):
    send = [o for o in ops if o.op is isend]
    recv = [o for o in ops if o.op is irecv]
    payload = {str(o.peer): o.tensor.tolist() for o in send}
    allv = _exchange(payload, "send_recv")
    for o in recv:
        o.tensor.copy_(allv[o.peer][str(_state["rank"])])
        _corrupt(o.tensor)
    return [_Work() for _ in ops]


def barrier(device_ids=None):
    _exchange([], "barrier")


def destroy_process_group():
    path = _probes_path()
    if path and os.path.exists(path):
        os.remove(path)
