#!/usr/bin/env python3
"""scripts/bed/stranger.py SECONDS ADDRESS:PORT...: what a third host that reaches a job's ports
can do without reading its handshakes (docs/SECURITY.md), for SECONDS against every port given:

  silent    connections that never send a byte, held open (more than a tcp rail keeps waiting)
  scan      connect and close at once (what every port scanner does)
  junk      64 random bytes, then close
  hello     the tcp fabric's hello ("MPIBTCP2") naming a random QP with a random secret, sent
            from this host's own address (the one the kernel sees)

Run by scripts/bed/suite.sh from a third network namespace while a pair runs; the pair must go
on byte-exact. Prints one line per kind with how many were made, and how many of the silent ones
the other end closed (it drops the oldest and those past the hello deadline). Exits 0 unless no
port could be reached at all."""

import os
import socket
import struct
import sys
import time

HELLO_MAGIC = 0x4D50_4942_5443_5032  # proto/src/tcp_wire.rs
SILENT_PER_PORT = 100
EACH_PER_ROUND = 4


def connect(address, port):
    try:
        return socket.create_connection((address, port), timeout=1)
    except OSError:
        return None


def forged_hello(own_address):
    target_qpn, source_qpn = struct.unpack("<II", os.urandom(8))
    secret = struct.unpack("<Q", os.urandom(8))[0]
    return struct.pack("<QII4sHxxQ", HELLO_MAGIC, target_qpn, source_qpn,
                       socket.inet_aton(own_address), 4000, secret)


def closed_by_peer(stream):
    stream.setblocking(False)
    try:
        return stream.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def main():
    seconds = float(sys.argv[1])
    ports = [(a, int(p)) for a, p in (arg.rsplit(":", 1) for arg in sys.argv[2:])]
    counts = {"silent": 0, "scan": 0, "junk": 0, "hello": 0}
    silent = []
    reached = set()
    for address, port in ports:
        for _ in range(SILENT_PER_PORT):
            stream = connect(address, port)
            if stream is not None:
                silent.append(stream)
                counts["silent"] += 1
                reached.add((address, port))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for address, port in ports:
            for _ in range(EACH_PER_ROUND):
                for kind in ("scan", "junk", "hello"):
                    stream = connect(address, port)
                    if stream is None:
                        continue
                    reached.add((address, port))
                    try:
                        if kind == "junk":
                            stream.sendall(os.urandom(64))
                        elif kind == "hello":
                            stream.sendall(forged_hello(stream.getsockname()[0]))
                    except OSError:
                        pass
                    stream.close()
                    counts[kind] += 1
        time.sleep(0.1)
    dropped = sum(1 for stream in silent if closed_by_peer(stream))
    for stream in silent:
        stream.close()
    print(f"stranger: {len(reached)} of {len(ports)} port(s) reached in {seconds:.0f} s: "
          f"{counts['silent']} silent connection(s) ({dropped} closed by the other end), "
          f"{counts['scan']} scan(s), {counts['junk']} junk, {counts['hello']} forged hello(s)")
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
