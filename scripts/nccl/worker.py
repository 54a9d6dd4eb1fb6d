"""One rank of scripts/nccl-check: real NCCL collectives through torch.distributed.

Started twice by scripts/nccl-check (or by `torchrun --standalone --nproc_per_node=2`), both ranks
on the same GPU. Before NCCL starts it sets this rank's NCCL_HOSTID and NCCL_DEBUG_FILE, so NCCL
takes the two ranks for two nodes and must connect them through the net plugin. For every op and
size it fills the inputs with a pattern of (op, size, round, rank, index) and the outputs with
values that are never the expected ones, runs the op, checks every element exactly (on the GPU,
against check_lib's formulas), times a few iterations, then checks again with fresh data of a
second round. Each record goes to RUN_DIR/rank<R>.jsonl as soon as it is known, so a hang or a
crash leaves the op and size it happened in. Rank 0 prints the table as it goes and, while both
ranks still hold their communicators, scrapes the plugin's probes with mpib-collector --once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from datetime import timedelta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_lib as cl  # noqa: E402

CHUNK = 1 << 24  # elements per vectorised fill/verify step (bounds the int64 temporaries)


def parse(argv):
    p = argparse.ArgumentParser(description="one rank of scripts/nccl-check")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--ops", default=",".join(cl.OPS))
    p.add_argument("--sizes", required=True, help="comma-separated bytes")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--min-iters", type=int, default=2)
    p.add_argument("--iter-bytes", type=int, default=64 << 20)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--timeout", type=float, default=180.0)
    p.add_argument("--collector")
    p.add_argument("--probes-dir")
    p.add_argument("--hint-path")
    p.add_argument("--agent")
    p.add_argument("--agent-control")
    return p.parse_args(argv)


class Records:
    def __init__(self, path):
        self.f = open(path, "a", buffering=1)

    def write(self, **rec):
        rec["t"] = round(time.time(), 3)
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    # Set before NCCL reads them (torchrun gives every rank the same environment).
    os.environ["NCCL_HOSTID"] = f"{cl.HOSTID_PREFIX}{rank}"
    os.environ["NCCL_DEBUG_FILE"] = os.path.join(args.run_dir, f"nccl.rank{rank}.%p.log")
    rec = Records(os.path.join(args.run_dir, f"rank{rank}.jsonl"))
    try:
        run(args, rank, world, rec)
    except BaseException as e:  # noqa: BLE001 - record everything, then fail
        rec.write(event="error", message=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        print(f"rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # do not wait for NCCL's teardown of a broken communicator
    rec.write(event="done")


def run(args, rank, world, rec):
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", args.device)
    torch.cuda.set_device(dev)
    nccl = nccl_version(torch)
    rec.write(event="start-init", torch=torch.__version__, cuda=torch.version.cuda, nccl=nccl,
              gpu=torch.cuda.get_device_name(dev))
    kwargs = dict(backend="nccl", init_method="env://", rank=rank, world_size=world,
                  timeout=timedelta(seconds=args.timeout))
    try:
        dist.init_process_group(device_id=dev, **kwargs)  # eager NCCL init
    except TypeError:
        dist.init_process_group(**kwargs)
    rec.write(event="init")

    ops = cl._csv(args.ops)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if rank == 0:
        print(f"# nccl-check worker: {world} ranks on {torch.cuda.get_device_name(dev)}, "
              f"torch {torch.__version__}, NCCL {nccl}; rank 0's times and #wrong",
              flush=True)
    for op in ops:
        if rank == 0:
            print(f"# {op}\n{cl.ROW_HEADER}", flush=True)
        for idx, size in enumerate(sizes):
            plan = cl.plan_op(op, size, world, idx)
            if plan is None:
                continue
            rec.write(event="begin", op=op, size=plan.bytes)
            row = run_one(torch, dist, dev, plan, rank, world, args)
            rec.write(event="row", **row)
            if rank == 0:
                print(cl.format_row(cl.Row(
                    op=op, size=plan.bytes, count=plan.count, dtype=plan.dtype, redop=plan.redop,
                    root=plan.root, iters=row["iters"], time_us=row["time_us"],
                    algbw=cl.bandwidths(op, plan.bytes, row["time_us"], world)[0],
                    busbw=cl.bandwidths(op, plan.bytes, row["time_us"], world)[1],
                    wrong=row["wrong"])), flush=True)

    # Scrape the probes while both ranks still hold their communicators: the plugin removes
    # its probes file when the last one is finalized.
    dist.barrier(device_ids=[args.device])
    torch.cuda.synchronize()
    if rank == 0:
        scrape(args, rec)
    dist.barrier(device_ids=[args.device])
    torch.cuda.synchronize()
    dist.destroy_process_group()


def nccl_version(torch):
    v = torch.cuda.nccl.version()
    if isinstance(v, int):  # older torch: 22809 / 2809 style
        major, rest = divmod(v, 10000) if v >= 10000 else divmod(v, 1000)
        return f"{major}.{rest // 100}.{rest % 100}"
    return ".".join(map(str, v))


def scrape(args, rec):
    if args.collector and args.probes_dir:
        cmd = [args.collector, "--probes-dir", args.probes_dir, "--once", "--otlp-signals", "none",
               "--stale-after", "600"]
        if args.hint_path:
            cmd += ["--hint-path", args.hint_path]
        out = run_tool(cmd)
        with open(os.path.join(args.run_dir, "probes.prom"), "w") as f:
            f.write(out.stdout)
        with open(os.path.join(args.run_dir, "collector.log"), "w") as f:
            f.write(f"$ {' '.join(cmd)}\nexit {out.returncode}\n{out.stderr}")
        rec.write(event="probes", rc=out.returncode)
    if args.agent and args.agent_control:
        out = run_tool([args.agent, "status", "--control", args.agent_control])
        with open(os.path.join(args.run_dir, "agent-status.txt"), "w") as f:
            f.write(out.stdout + out.stderr)


def run_tool(cmd):
    env = cl.tool_env(dict(os.environ))
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(cmd, 127, "", f"{e}\n")


# --------------------------------------------------------------------------------------------


TORCH_DTYPE = {"int32": "int32", "uint8": "uint8"}


def fill(torch, buf, fn, dev):
    """buf[i] = fn(i) for every i, in chunks (fn takes an int64 index tensor)."""
    n = buf.numel()
    for start in range(0, n, CHUNK):
        stop = min(n, start + CHUNK)
        i = torch.arange(start, stop, dtype=torch.int64, device=dev)
        buf[start:stop].copy_(fn(i).to(buf.dtype))


def count_wrong(torch, buf, fn, dev, rank, keep=4):
    """(#elements of buf that differ from fn(i), the first few as (index, got, expected))."""
    wrong, first = 0, []
    n = buf.numel()
    for start in range(0, n, CHUNK):
        stop = min(n, start + CHUNK)
        i = torch.arange(start, stop, dtype=torch.int64, device=dev)
        want = fn(i)
        got = buf[start:stop].to(torch.int64)
        bad = got != want
        k = int(bad.sum().item())
        if k:
            wrong += k
            if len(first) < keep:
                where = bad.nonzero().flatten()[: keep - len(first)].tolist()
                for w in where:
                    first.append((start + w, int(got[w].item()), int(want[w].item())))
    return wrong, first


def cross_check(torch, buf, fn_py):
    """The vectorised pattern in `buf` against the plain-Python formula at a few indices."""
    idx = cl.sample_indices(buf.numel())
    got = buf[torch.tensor(idx, dtype=torch.int64, device=buf.device)].to("cpu").tolist()
    return [(i, int(g), fn_py(i)) for i, g in zip(idx, got) if int(g) != fn_py(i)]


def run_one(torch, dist, dev, plan, rank, world, args):
    dtype = getattr(torch, TORCH_DTYPE[plan.dtype])
    op = plan.op
    inp = torch.empty(plan.count_in, dtype=dtype, device=dev)
    out = inp if cl.in_place(op) else torch.empty(plan.count_out, dtype=dtype, device=dev)

    def prepare(check):
        fill(torch, inp, lambda i: cl.op_input(plan, rank, world, check, i), dev)
        if out is not inp:
            fill(torch, out, lambda i: cl.op_poison(plan, rank, world, check, i), dev)
        torch.cuda.synchronize()
        return cross_check(torch, inp, lambda i: cl.op_input(plan, rank, world, check, i))

    nxt, prv = (rank + 1) % world, (rank - 1) % world

    def once():
        if op == "all_reduce":
            dist.all_reduce(inp, op=dist.ReduceOp.SUM)
        elif op == "broadcast":
            dist.broadcast(inp, src=plan.root)
        elif op == "all_gather":
            dist.all_gather_into_tensor(out, inp)
        elif op == "reduce_scatter":
            dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.SUM)
        elif op == "all_to_all":
            dist.all_to_all_single(out, inp)
        elif op == "send_recv":
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, inp, nxt),
                                           dist.P2POp(dist.irecv, out, prv)])
            for r in reqs:
                r.wait()
        else:
            raise ValueError(op)

    def check_round(check):
        bad_pattern = prepare(check)
        once()
        torch.cuda.synchronize()
        wrong, first = count_wrong(torch, out, lambda i: cl.op_expected(plan, rank, world, check, i),
                                   dev, rank)
        error = ""
        if bad_pattern:
            error = f"torch pattern differs from check_lib at {bad_pattern[:2]}"
            wrong += len(bad_pattern)
        return wrong, first, error

    # Round 0: checked warm-up (the first iteration also makes NCCL connect, lazily).
    wrong, first, error = check_round(0)
    for _ in range(max(0, args.warmup - 1)):
        once()
    torch.cuda.synchronize()
    iters = cl.timed_iterations(plan.bytes, args.iter_bytes, args.min_iters, args.iters)
    t0 = time.perf_counter()
    for _ in range(iters):
        once()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    # Round 1: fresh data of another round, so a stale buffer cannot pass.
    w1, f1, e1 = check_round(1)
    del inp, out
    return {
        "op": op, "size": plan.bytes, "count": plan.count, "dtype": plan.dtype,
        "redop": plan.redop, "root": plan.root, "iters": iters,
        "time_us": elapsed / iters * 1e6, "wrong": wrong + w1,
        "mismatches": [list(m) for m in (first + f1)[:4]], "error": "; ".join(x for x in (error, e1) if x),
    }


if __name__ == "__main__":
    main()
