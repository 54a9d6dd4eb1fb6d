"""Fake `python -m torch.distributed.run --standalone --nproc_per_node=N script args...` for the
tests of scripts/nccl-check: starts N copies of the script with torchrun's variables."""
import os
import socket
import subprocess
import sys


def main(argv):
    nproc, rest = 1, list(argv)
    while rest and rest[0].startswith("--"):
        arg = rest.pop(0)
        if arg.startswith("--nproc_per_node="):
            nproc = int(arg.split("=", 1)[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, *rest], env=env))
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
