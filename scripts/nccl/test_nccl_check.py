"""Tests of scripts/nccl-check that need neither torch nor a GPU.

    python3 -m unittest discover -s scripts/nccl -p 'test_*.py'

The log excerpts below are written in the exact formats of NCCL 2.28's source (nccl/src/debug.cc for
the line prefix; nccl/src/plugin/net.cc, nccl/src/plugin/net/net_v11.cc, nccl/src/plugin/plugin_open.cc,
nccl/src/init.cc, nccl/src/misc/utils.cc, nccl/src/transport/net.cc, net_socket.cc and net_ib.cc for the
messages). The end-to-end tests run the real runner and worker against scripts/nccl/fakes: a
stand-in torch whose collectives exchange buffers through files and which writes NCCL-shaped
logs and probes files, and stand-ins for mpib-collector and mpib-agent.
"""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(REPO, "scripts", "nccl-check")
FAKES = os.path.join(HERE, "fakes")
# the stand-in torch (fakes/torch) and the stand-in mpib-agent and mpib-collector (fakes/bin)
sys.path.insert(0, HERE)

import check_lib as cl  # noqa: E402
import runner  # noqa: E402

PLUGIN = "/opt/mpib/lib/libnccl-net-mpib.so"


def nccl_log(rank, *, pid=4242, net="MPIB", abi=11, version="2.28.9", hostid=None, extra=(),
             channels=True, plugin=PLUGIN, opened=True, fabric="tcp"):
    """A rank's NCCL INFO log as NCCL 2.28 writes it with NCCL_DEBUG=INFO and
    NCCL_DEBUG_SUBSYS=INIT,NET,ENV (plus the MPIB plugin's own lines)."""
    p = f"gpu-node:{pid}:{pid + 7} [0] NCCL INFO "
    peer = 1 - rank
    lines = [
        p + f"NCCL version {version}+cuda13.0",
        p + f"NCCL_HOSTID set by environment to {hostid or f'mpib-check-rank{rank}'}",
        p + f"NCCL_NET_PLUGIN set by environment to {plugin}",
        p + f"NET/Plugin: Loaded net plugin MPIB (v{abi})",
        p + f"Successfully loaded external network plugin {plugin}",
    ]
    if opened:
        lines.append(p + f"MPIB: opened 127.0.0.1+127.0.0.2 on the {fabric} fabric in 3 ms: "
                         "sout 10000 Mbps, sup 10000 Mbps")
    lines += [
        p + f"Initialized NET plugin {net}",
        p + f"Assigned NET plugin {net} to comm",
        p + f"Using network {net}",
        p + "ncclCommInitRankConfig comm 0x55d1e2a0 rank %d nranks 2 cudaDev 0 nvmlDev 0 "
            "busId 18000 commId 0x7d2c4e1f0a9b3c11 - Init START" % rank,
        p + "Bootstrap: Using lo:127.0.0.1<0>",
        p + f"comm 0x55d1e2a0 rank {rank} nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
        p + "TUNER/Plugin: Could not find: libnccl-tuner.so. Using internal tuner plugin.",
    ]
    if channels:
        for ch in range(2):
            lines.append(p + f"Channel {ch:02d}/0 : {peer}[0] -> {rank}[0] [receive] via NET/{net}/0")
            lines.append(p + f"Channel {ch:02d}/0 : {rank}[0] -> {peer}[0] [send] via NET/{net}/0")
        lines.append(p + f"Channel 02/1 : {rank}[0] -> {peer}[0] [send] via NET/{net}/0/Shared")
    lines.append(p + "ncclCommInitRankConfig comm 0x55d1e2a0 rank %d nranks 2 cudaDev 0 nvmlDev 0 "
                     "busId 18000 commId 0x7d2c4e1f0a9b3c11 - Init COMPLETE" % rank)
    lines += list(extra)
    return "\n".join(lines) + "\n"


def good_logs(**kw):
    return {r: cl.parse_nccl_log(nccl_log(r, pid=4242 + r, **kw)) for r in (0, 1)}


def failed(checks):
    return {c.name for c in checks if not c.ok}


# ---------------------------------------------------------------------------------------------


class SizesAndArguments(unittest.TestCase):
    def test_sizes(self):
        self.assertEqual(cl.parse_size("256M"), 256 << 20)
        self.assertEqual(cl.parse_size("64KiB"), 64 << 10)
        self.assertEqual(cl.parse_size("1g"), 1 << 30)
        self.assertEqual(cl.parse_size("17"), 17)
        with self.assertRaises(ValueError):
            cl.parse_size("1.5M")
        self.assertEqual(cl.size_list(1, 256 << 20, 4)[-1], 256 << 20)
        self.assertEqual(len(cl.size_list(1, 256 << 20, 4)), 15)  # 4**0 ... 4**14
        self.assertEqual(cl.size_list(1, 100, 4), [1, 4, 16, 64, 100])
        self.assertEqual(cl.format_size(256 << 20), "256 MiB")
        self.assertEqual(cl.format_size(3), "3 B")

    def test_defaults(self):
        c = cl.parse_args([])
        self.assertEqual(c.modes, ["vanilla", "advanced"])
        self.assertEqual(c.protos, ["default", "Simple"])
        self.assertEqual(c.ops, list(cl.OPS))
        self.assertEqual((c.sizes[0], c.sizes[-1]), (1, 256 << 20))
        self.assertEqual((c.sout, c.sup, c.oob_addr), ("127.0.0.1", "127.0.0.2", "127.0.0.1"))
        self.assertIsNone(c.plugin)

    def test_options(self):
        c = cl.parse_args(["--plugin", "/x.so", "--modes", "advanced", "--protos", "LL128",
                           "--max-size", "1M", "--ops", "all_reduce,send_recv", "--sout",
                           "lo=127.0.0.1", "--timeout", "30"])
        self.assertEqual((c.plugin, c.modes, c.protos, c.ops, c.sizes[-1], c.sout, c.timeout),
                         ("/x.so", ["advanced"], ["LL128"], ["all_reduce", "send_recv"], 1 << 20,
                          "lo=127.0.0.1", 30.0))

    def test_bad_arguments_exit_2(self):
        for argv in (["--modes", "turbo"], ["--ops", "reduce"], ["--max-size", "lots"],
                     ["--sup-bw", "2000"], ["--sout", "lo=300.1.1.1"], ["--min-iters", "9",
                     "--iters", "3"], ["--oob-addr", "eth0"]):
            with self.subTest(argv=argv):
                with self.assertRaises(SystemExit) as e:
                    with open(os.devnull, "w") as null:
                        stderr, sys.stderr = sys.stderr, null
                        try:
                            cl.parse_args(argv)
                        finally:
                            sys.stderr = stderr
                self.assertEqual(e.exception.code, 2)

    def test_rail_specs(self):
        for ok in ("127.0.0.2", "lo", "eth0=10.0.0.1", "enp1s0f0"):
            self.assertTrue(cl.valid_rail_spec(ok), ok)
        for bad in ("lo=1.2.3", "a/b=1.1.1.1", "", "a b", "averyveryverylongname"):
            self.assertFalse(cl.valid_rail_spec(bad), bad)

    def test_default_binaries(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "target", "release"))
            self.assertIsNone(cl.find_default(d, cl.PLUGIN_CANDIDATES))
            cargo = os.path.join(d, "target", "release", "libnccl_net_mpib.so")
            open(cargo, "w").close()
            self.assertEqual(cl.find_default(d, cl.PLUGIN_CANDIDATES), cargo)
            installed = os.path.join(d, "target", "release", "libnccl-net-mpib.so")
            open(installed, "w").close()
            self.assertEqual(cl.find_default(d, cl.PLUGIN_CANDIDATES), installed)

    def test_plugin_path_limits(self):
        self.assertIsNone(cl.plugin_path_problem(PLUGIN))
        self.assertIn("comma", cl.plugin_path_problem("/a,b/libnccl-net-mpib.so"))
        self.assertIn("255", cl.plugin_path_problem("/" + "d" * 260 + "/x.so"))
        self.assertIsNone(cl.plugin_path_problem("/" + "d" * 250))  # 251 characters + NUL fit

    def test_ldd(self):
        out = textwrap.dedent("""\
            ./libnccl-net-mpib.so: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.36' not found (required by ./libnccl-net-mpib.so)
            \tlinux-vdso.so.1 (0x00007ffd1c1f2000)
            \tlibibverbs.so.1 => not found
            \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f0e1c000000)
            """)
        problems = cl.ldd_problems(out)
        self.assertEqual(len(problems), 2)
        self.assertIn("GLIBC_2.36", problems[0])
        self.assertEqual(problems[1], "libibverbs.so.1 => not found")
        self.assertEqual(cl.ldd_problems("\tlibc.so.6 => /lib/libc.so.6 (0x1)\n"), [])


class Environment(unittest.TestCase):
    def env(self, mode="vanilla", proto="default", rank=0, base=None, **kw):
        base = {"PATH": "/usr/bin", "NCCL_PROTO": "LL", "MPIB_AGENT_TAG": "x"} if base is None else base
        return cl.rank_env(base, rank=rank, world=2, plugin=PLUGIN, mode=mode, proto=proto,
                           run_dir="/out/run", probes_dir="/out/run/probes", sout="127.0.0.1",
                           sup="127.0.0.2", oob_addr="127.0.0.1", master_port=29555, **kw)

    def test_forces_the_plugin_over_the_network(self):
        e = self.env()
        want = {
            "NCCL_NET_PLUGIN": PLUGIN, "NCCL_NET": "MPIB", "NCCL_DEBUG": "INFO",
            "NCCL_SHM_DISABLE": "1", "NCCL_P2P_DISABLE": "1", "NCCL_HOSTID": "mpib-check-rank0",
            "MPIB_FABRIC": "tcp", "MPIB_HCA_SOUT": "127.0.0.1", "MPIB_HCA_SUP": "127.0.0.2",
            "MPIB_OOB_ADDR": "127.0.0.1", "MPIB_PROBES": "1", "MPIB_PROBES_DIR": "/out/run/probes",
            "MPIB_MODE": "0", "RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29555",
            "PATH": "/usr/bin",
        }
        for k, v in want.items():
            self.assertEqual(e[k], v, k)
        for subsys in ("INIT", "NET", "ENV"):
            self.assertIn(subsys, e["NCCL_DEBUG_SUBSYS"].split(","))
        self.assertEqual(e["NCCL_DEBUG_FILE"], "/out/run/nccl.rank0.%p.log")
        self.assertNotIn("NCCL_PROTO", e)  # default: NCCL chooses
        self.assertNotIn("MPIB_AGENT_TAG", e)
        self.assertNotIn("MPIB_AGENT_SOCKET", e)

    def test_ranks_differ_in_host_id(self):
        self.assertNotEqual(self.env(rank=0)["NCCL_HOSTID"], self.env(rank=1)["NCCL_HOSTID"])
        self.assertEqual(self.env(rank=1)["RANK"], "1")

    def test_protocol_and_advanced_mode(self):
        e = self.env(mode="advanced", proto="Simple", agent_socket="/tmp/a/agent.sock",
                     hint_path="/tmp/a/hints")
        self.assertEqual((e["NCCL_PROTO"], e["MPIB_MODE"]), ("Simple", "1"))
        self.assertEqual((e["MPIB_AGENT_SOCKET"], e["MPIB_HINT_PATH"]),
                         ("/tmp/a/agent.sock", "/tmp/a/hints"))
        with self.assertRaises(ValueError):
            self.env(mode="advanced")

    def test_tools_get_no_plugin_variables(self):
        t = cl.tool_env({"PATH": "/bin", "MPIB_FABRIC": "tcp", "OTEL_EXPORTER_OTLP_ENDPOINT": "x",
                         "NCCL_DEBUG": "INFO"})
        self.assertEqual(t, {"PATH": "/bin", "NCCL_DEBUG": "INFO"})

    def test_agent_config_is_a_fixed_split(self):
        text = cl.agent_config(512)
        self.assertIn('default = "static"', text)
        self.assertIn('policy = "static"', text)
        self.assertIn("sup_bw = 512", text)
        self.assertIn('metrics_listen = "off"', text)
        self.assertEqual(cl.run_name("advanced", "^LL128"), "advanced-_LL128")
        self.assertEqual(cl.run_name("vanilla", "default"), "vanilla-default")


class Patterns(unittest.TestCase):
    WORLDS = (2, 3, 4)

    def sizes(self):
        return [1, 2, 3, 4, 8, 16, 24, 64, 100, 256, 1024]

    def run_op(self, plan, world, check):
        inputs = [[cl.op_input(plan, r, world, check, i) for i in range(plan.count_in)]
                  for r in range(world)]
        return inputs, cl.simulate(plan, world, inputs)

    def test_every_op_verifies_exactly(self):
        for world in self.WORLDS:
            for op in cl.OPS:
                for idx, size in enumerate(self.sizes()):
                    plan = cl.plan_op(op, size, world, idx)
                    if plan is None:
                        continue
                    for check in (0, 1):
                        _, outs = self.run_op(plan, world, check)
                        for r in range(world):
                            wrong, first = cl.verify(plan, r, world, check, outs[r])
                            self.assertEqual(wrong, 0, (op, size, world, r, first))
                            limit = 1 << plan.storage_bits
                            self.assertTrue(all(0 <= v < limit for v in outs[r]), (op, size))

    def test_plans(self):
        p = cl.plan_op("all_gather", 1, 2)
        self.assertIsNone(p)  # half a byte per rank
        p = cl.plan_op("all_gather", 8, 2)
        self.assertEqual((p.dtype, p.count_in, p.count_out, p.bytes), ("int32", 1, 2, 8))
        p = cl.plan_op("reduce_scatter", 256 << 20, 2)
        self.assertEqual((p.dtype, p.count_in, p.count_out, p.value_bits), ("int32", 64 << 20, 32 << 20, 30))
        p = cl.plan_op("all_reduce", 3, 2)
        self.assertEqual((p.dtype, p.count, p.value_bits, p.redop), ("uint8", 3, 7, "sum"))
        p = cl.plan_op("broadcast", 1024, 2, size_index=5)
        self.assertEqual((p.root, p.redop, p.value_bits), (1, "none", 31))
        # sums of world maxima fit the type
        for world in (2, 3, 8, 64):
            for dtype_size in (4, 3):
                q = cl.plan_op("all_reduce", dtype_size, world)
                self.assertLess(world * ((1 << q.value_bits) - 1), 1 << q.storage_bits)

    def test_poison_is_never_the_expected_value(self):
        for op in cl.OPS:
            plan = cl.plan_op(op, 64, 2, 3)
            for r in range(2):
                for i in range(plan.count_out):
                    self.assertNotEqual(cl.op_poison(plan, r, 2, 0, i), cl.op_expected(plan, r, 2, 0, i))

    def test_untouched_output_is_caught(self):
        for op in cl.OPS:
            plan = cl.plan_op(op, 256, 2, 2)
            untouched = [cl.op_poison(plan, 1, 2, 0, i) for i in range(plan.count_out)]
            wrong, _ = cl.verify(plan, 1, 2, 0, untouched)
            self.assertEqual(wrong, plan.count_out, op)

    def test_misplaced_data_is_caught(self):
        world = 2
        plan = cl.plan_op("all_gather", 1024, world, 4)
        _, outs = self.run_op(plan, world, 0)
        c = plan.chunk
        swapped = outs[0][c:] + outs[0][:c]  # rank chunks in the wrong order
        self.assertEqual(cl.verify(plan, 0, world, 0, swapped)[0], plan.count_out)
        shifted = outs[0][1:] + outs[0][:1]  # off by one element
        self.assertGreater(cl.verify(plan, 0, world, 0, shifted)[0], plan.count_out - 3)
        plan = cl.plan_op("all_to_all", 1024, world, 4)
        _, outs = self.run_op(plan, world, 0)
        wrong_peer = outs[1]  # rank 1's output handed to rank 0
        self.assertGreater(cl.verify(plan, 0, world, 0, wrong_peer)[0], plan.count_out - 3)

    def test_stale_data_of_the_previous_round_is_caught(self):
        for op in cl.OPS:
            plan = cl.plan_op(op, 4096, 2, 6)
            _, round0 = self.run_op(plan, 2, 0)
            wrong, _ = cl.verify(plan, 0, 2, 1, round0[0])
            self.assertGreater(wrong, plan.count_out * 0.99, op)

    def test_one_flipped_bit_is_caught_with_its_place(self):
        plan = cl.plan_op("reduce_scatter", 4096, 2, 6)
        _, outs = self.run_op(plan, 2, 1)
        bad = list(outs[1])
        bad[333] ^= 1 << 7
        wrong, first = cl.verify(plan, 1, 2, 1, bad)
        self.assertEqual(wrong, 1)
        self.assertEqual(first[0][0], 333)
        self.assertEqual(first[0][1], bad[333])

    def test_broadcast_from_the_wrong_root_is_caught(self):
        plan = cl.plan_op("broadcast", 1024, 2, 1)  # root 1
        inputs, _ = self.run_op(plan, 2, 0)
        self.assertGreater(cl.verify(plan, 1, 2, 0, inputs[0])[0], plan.count_out - 3)

    def test_pattern_has_no_short_period(self):
        for shift in (1 << 10, 1 << 16, 1 << 20, 1 << 24):
            same = sum(cl.value(7, i, 31) == cl.value(7, i + shift, 31) for i in range(2000))
            self.assertEqual(same, 0, shift)

    def test_pattern_is_pinned(self):
        # The worker evaluates the same formula on torch int64 tensors; these values pin it.
        self.assertEqual([cl.mix(0, 0), cl.mix(0, 1)], [1421339475, 2057884562])
        self.assertEqual(cl.value(1025, 12345, 31), 1532209626)
        self.assertEqual(cl.value(3, 7, 7), 22)
        # int64-safe: the largest intermediate of mix stays below 2**63 for 256 MiB of bytes
        i, s = 256 << 20, 1 << 21
        self.assertLess(i * 0x9E3779B1 + s * 0x85EBCA77 + 0x165667B1, 1 << 63)
        self.assertLess(0xFFFFFFFF * 0x2C1B3C6D, 1 << 63)

    def test_sample_indices(self):
        self.assertEqual(cl.sample_indices(1), [0])
        self.assertEqual(cl.sample_indices(10), [0, 1, 2, 3, 5, 8, 9])


class Bandwidth(unittest.TestCase):
    def test_busbw_factors_are_nccl_tests(self):
        f = {op: cl.busbw_factor(op, 2) for op in cl.OPS}
        self.assertEqual(f, {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5,
                             "broadcast": 1.0, "send_recv": 1.0, "all_to_all": 0.5})
        self.assertAlmostEqual(cl.busbw_factor("all_reduce", 8), 1.75)
        self.assertAlmostEqual(cl.busbw_factor("all_gather", 8), 0.875)

    def test_bandwidths(self):
        algbw, busbw = cl.bandwidths("all_reduce", 1_000_000_000, 1e6, 2)
        self.assertAlmostEqual(algbw, 1.0)
        self.assertAlmostEqual(busbw, 1.0)
        algbw, busbw = cl.bandwidths("all_gather", 256 << 20, 100_000.0, 2)
        self.assertAlmostEqual(algbw, (256 << 20) / 0.1 / 1e9)
        self.assertAlmostEqual(busbw, algbw / 2)
        self.assertEqual(cl.bandwidths("broadcast", 8, 0.0, 2), (0.0, 0.0))

    def test_iterations(self):
        self.assertEqual(cl.timed_iterations(256 << 20, 64 << 20, 2, 20), 2)
        self.assertEqual(cl.timed_iterations(4 << 20, 64 << 20, 2, 20), 16)
        self.assertEqual(cl.timed_iterations(1, 64 << 20, 2, 20), 20)


class NcclLogs(unittest.TestCase):
    def test_a_good_run_passes(self):
        checks = cl.nccl_log_checks(good_logs(), 2, PLUGIN)
        self.assertEqual(failed(checks), set(), [c for c in checks if not c.ok])
        names = [c.name for c in checks]
        for want in ("nccl: plugin loaded", "nccl: network is MPIB", "nccl: channels via NET/MPIB",
                     "nccl: no fallback", "nccl: one rank per node", "mpib: tcp fabric",
                     "mpib: no WARN"):
            self.assertIn(want, names)

    def test_parse(self):
        lg = cl.parse_nccl_log(nccl_log(0))
        self.assertEqual(lg.version, (2, 28, 9))
        self.assertEqual(lg.version_text, "2.28.9+cuda13.0")
        bare = cl.parse_nccl_log("NCCL version 2.30.4+cuda13.0\n")  # NCCL_DEBUG=VERSION or WARN
        self.assertEqual(bare.version, (2, 30, 4))
        self.assertEqual(lg.loaded, [("MPIB", 11)])
        self.assertEqual(lg.loaded_paths, [PLUGIN])
        self.assertEqual(lg.using, ["MPIB"])
        self.assertEqual(lg.hostids, ["mpib-check-rank0"])
        self.assertEqual(len(lg.channels), 5)
        self.assertEqual(lg.channels[-1]["flags"], "/Shared")
        self.assertEqual(lg.comms[0]["nNodes"], 2)
        self.assertEqual(lg.mpib_opened, [("127.0.0.1+127.0.0.2", "tcp")])
        self.assertEqual(lg.failures + lg.fallbacks + lg.warns, [])

    def test_fallback_to_socket_fails(self):
        # NCCL_NET unset and the plugin's init failed: NCCL went on to IB, then Socket.
        def log(rank):
            p = f"gpu-node:{4300 + rank}:{4310 + rank} [0] NCCL INFO "
            return "\n".join([
                p + "NCCL version 2.28.9+cuda13.0",
                p + f"NCCL_HOSTID set by environment to mpib-check-rank{rank}",
                p + f"NCCL_NET_PLUGIN set by environment to {PLUGIN}",
                p + "NET/Plugin: Loaded net plugin MPIB (v11)",
                p + f"Successfully loaded external network plugin {PLUGIN}",
                f"\n[2026-01-05 10:00:00] gpu-node:{4300 + rank}:{4310 + rank} [0] "
                "src/net/setup/plugin.rs:212 NCCL WARN MPIB: MPIB_HCA_SUP=\"127.0.0.9\": no such address",
                p + "Failed to initialize NET plugin MPIB",
                p + "NET/IB : No device found.",
                p + "Initialized NET plugin IB",
                p + "NET/Socket : Using [0]lo:127.0.0.1<0>",
                p + "Initialized NET plugin Socket",
                p + "Assigned NET plugin Socket to comm",
                p + "Using network Socket",
                p + f"comm 0x55d1e2a0 rank {rank} nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0",
                p + f"Channel 00/0 : {1 - rank}[0] -> {rank}[0] [receive] via NET/Socket/0",
                p + f"Channel 00/0 : {rank}[0] -> {1 - rank}[0] [send] via NET/Socket/0",
            ]) + "\n"
        logs = {r: cl.parse_nccl_log(log(r)) for r in (0, 1)}
        bad = failed(cl.nccl_log_checks(logs, 2, PLUGIN))
        self.assertEqual(bad, {"nccl: network is MPIB", "nccl: channels via NET/MPIB",
                               "nccl: no fallback", "mpib: tcp fabric", "mpib: no WARN"})
        self.assertEqual(logs[0].warns, ['MPIB: MPIB_HCA_SUP="127.0.0.9": no such address'])

    def test_plugin_not_found_fails(self):
        p = "gpu-node:77:78 [0] NCCL INFO "
        text = "\n".join([
            p + "NCCL version 2.28.3+cuda13.0",
            p + "NCCL_HOSTID set by environment to mpib-check-rank0",
            p + f"NCCL_NET_PLUGIN set by environment to {PLUGIN}",
            p + f"NET/Plugin: Could not find: {PLUGIN}",
            "",
            "gpu-node:77:78 [0] plugin/net.cc:401 NCCL WARN Failed to initialize any NET plugin",
        ])
        logs = {0: cl.parse_nccl_log(text), 1: cl.parse_nccl_log(nccl_log(1))}
        checks = cl.nccl_log_checks(logs, 2, PLUGIN)
        self.assertIn("nccl: plugin loaded", failed(checks))
        self.assertIn("nccl: no fallback", failed(checks))
        detail = next(c.detail for c in checks if c.name == "nccl: no fallback")
        self.assertIn("Could not find", detail)
        self.assertIn("Failed to initialize any NET plugin", detail)

    def test_dlopen_error_fails(self):
        p = "gpu-node:77:78 [0] NCCL INFO "
        extra = [p + f"NET/Plugin: {PLUGIN}: libibverbs.so.1: cannot open shared object file: "
                     "No such file or directory"]
        logs = good_logs(extra=extra)
        self.assertIn("nccl: no fallback", failed(cl.nccl_log_checks(logs, 2, PLUGIN)))

    def test_p2p_or_shm_channels_fail(self):
        p = "gpu-node:4242:4249 [0] NCCL INFO "
        logs = good_logs(extra=[p + "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"])
        self.assertEqual(failed(cl.nccl_log_checks(logs, 2, PLUGIN)), {"nccl: channels via NET/MPIB"})
        logs = good_logs(extra=[p + "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct"])
        self.assertEqual(failed(cl.nccl_log_checks(logs, 2, PLUGIN)), {"nccl: channels via NET/MPIB"})

    def test_no_channels_fails(self):
        logs = good_logs(channels=False)
        self.assertEqual(failed(cl.nccl_log_checks(logs, 2, PLUGIN)), {"nccl: channels via NET/MPIB"})

    def test_one_node_fails(self):
        logs = {r: cl.parse_nccl_log(nccl_log(r, hostid="same").replace("nNodes 2 localRanks 1",
                                                                         "nNodes 1 localRanks 2"))
                for r in (0, 1)}
        self.assertEqual(failed(cl.nccl_log_checks(logs, 2, PLUGIN)), {"nccl: one rank per node"})

    def test_table_version_follows_nccl(self):
        self.assertEqual(cl.expected_net_abi((2, 28, 3)), 11)
        self.assertEqual(cl.expected_net_abi((2, 29, 7)), 11)
        self.assertEqual(cl.expected_net_abi((2, 30, 4)), 12)
        self.assertEqual(cl.expected_net_abi((2, 27, 7)), 10)
        self.assertEqual(cl.expected_net_abi((2, 19, 3)), 7)
        self.assertIsNone(cl.expected_net_abi((2, 18, 1)))
        logs = good_logs(abi=10)
        self.assertEqual(failed(cl.nccl_log_checks(logs, 2, PLUGIN)), {"nccl: plugin loaded"})
        logs = good_logs(abi=12, version="2.30.4")
        self.assertEqual(failed(cl.nccl_log_checks(logs, 2, PLUGIN)), set())

    def test_another_library_fails(self):
        logs = {0: cl.parse_nccl_log(nccl_log(0, plugin="/usr/lib/libnccl-net.so")),
                1: cl.parse_nccl_log(nccl_log(1))}
        self.assertEqual(failed(cl.nccl_log_checks(logs, 2, PLUGIN)), {"nccl: plugin loaded"})

    def test_wrong_fabric_and_missing_logs(self):
        self.assertEqual(failed(cl.nccl_log_checks(good_logs(fabric="verbs"), 2, PLUGIN)),
                         {"mpib: tcp fabric"})
        checks = cl.nccl_log_checks({0: cl.parse_nccl_log(nccl_log(0))}, 2, PLUGIN)
        self.assertEqual([(c.name, c.ok) for c in checks], [("nccl: logs", False)])


PROM = textwrap.dedent("""\
    # HELP mpib_rail_tx_bytes_total Bytes sent on the rail (payload posted by this process).
    # TYPE mpib_rail_tx_bytes_total counter
    mpib_rail_tx_bytes_total{host="gpu-node",pid="4242",rail="sout",device="127.0.0.1",port="1"} 805306368
    mpib_rail_tx_bytes_total{host="gpu-node",pid="4242",rail="sup",device="127.0.0.2",port="1"} 805306240
    mpib_rail_tx_bytes_total{host="gpu-node",pid="4243",rail="sout",device="127.0.0.1",port="1"} 805306368
    mpib_rail_tx_bytes_total{host="gpu-node",pid="4243",rail="sup",device="127.0.0.2",port="1"} 805306240
    # HELP mpib_rail_rx_bytes_total Bytes received on the rail.
    # TYPE mpib_rail_rx_bytes_total counter
    mpib_rail_rx_bytes_total{host="gpu-node",pid="4242",rail="sout",device="127.0.0.1",port="1"} 805306368
    mpib_rail_rx_bytes_total{host="gpu-node",pid="4242",rail="sup",device="127.0.0.2",port="1"} 805306240
    mpib_rail_rx_bytes_total{host="gpu-node",pid="4243",rail="sout",device="127.0.0.1",port="1"} 805306368
    mpib_rail_rx_bytes_total{host="gpu-node",pid="4243",rail="sup",device="127.0.0.2",port="1"} 805306240
    # TYPE mpib_rail_error_completions_total counter
    mpib_rail_error_completions_total{host="gpu-node",pid="4242",rail="sout",device="127.0.0.1",port="1"} 0
    mpib_rail_error_completions_total{host="gpu-node",pid="4242",rail="sup",device="127.0.0.2",port="1"} 0
    # TYPE mpib_mask_mismatches_total counter
    mpib_mask_mismatches_total{host="gpu-node",pid="4242",rail="sup",device="127.0.0.2",port="1"} 0
    # TYPE mpib_connections_without_agent_total counter
    mpib_connections_without_agent_total{host="gpu-node",pid="4242"} 0
    mpib_connections_without_agent_total{host="gpu-node",pid="4243"} 0
    # TYPE mpib_transfers_total counter
    mpib_transfers_total{host="gpu-node",pid="4242",mask="both"} 9120
    mpib_transfers_total{host="gpu-node",pid="4242",mask="sout"} 311
    # TYPE mpib_connection_info gauge
    mpib_connection_info{host="gpu-node",pid="4242",peer="127.0.0.1:41234",direction="send",path_class="intra",mode="advanced",hint_slot="0"} 1
    mpib_connection_info{host="gpu-node",pid="4243",peer="127.0.0.1:40002",direction="recv",path_class="intra",mode="advanced",hint_slot="0"} 1
    # TYPE mpib_connection_hint_sup_ratio gauge
    mpib_connection_hint_sup_ratio{host="gpu-node",pid="4242",peer="127.0.0.1:41234",direction="send",path_class="intra",mode="advanced"} 0.5
    # TYPE mpib_transfer_latency_seconds histogram
    mpib_transfer_latency_seconds_bucket{host="gpu-node",pid="4242",rail="sout",device="127.0.0.1",port="1",le="0.000001023"} 12
    mpib_transfer_latency_seconds_bucket{host="gpu-node",pid="4242",rail="sout",device="127.0.0.1",port="1",le="+Inf"} 9431
    mpib_transfer_latency_seconds_sum{host="gpu-node",pid="4242",rail="sout",device="127.0.0.1",port="1"} 3.25
    mpib_transfer_latency_seconds_count{host="gpu-node",pid="4242",rail="sout",device="127.0.0.1",port="1"} 9431
    # TYPE mpib_probes_files gauge
    mpib_probes_files{host="gpu-node"} 2
    # TYPE mpib_probes_skipped_total counter
    mpib_probes_skipped_total{host="gpu-node",reason="version"} 0
    mpib_probes_skipped_total{host="gpu-node",reason="untrusted"} 0
    """)


class ProbesText(unittest.TestCase):
    def test_parse(self):
        samples = cl.parse_prometheus(PROM)
        self.assertEqual(samples[0], ("mpib_rail_tx_bytes_total",
                                      {"host": "gpu-node", "pid": "4242", "rail": "sout",
                                       "device": "127.0.0.1", "port": "1"}, 805306368.0))
        esc = cl.parse_prometheus('m{a="x\\"y\\\\z",b="1"} 2 1700000000000\nn 3.5e3\n')
        self.assertEqual(esc, [("m", {"a": 'x"y\\z', "b": "1"}, 2.0), ("n", {}, 3500.0)])
        with self.assertRaises(ValueError):
            cl.parse_prometheus("m{a=} 1\n")

    def test_both_rails_pass_in_advanced_mode(self):
        p = cl.summarize_probes(cl.parse_prometheus(PROM))
        self.assertEqual(p.pids, ["4242", "4243"])
        self.assertEqual(p.tx, {"sout": 2 * 805306368.0, "sup": 2 * 805306240.0})
        self.assertEqual(p.hint_sup_ratio, [0.5])
        self.assertEqual(p.files, 2)
        self.assertEqual(failed(cl.probes_checks(p, "advanced", 2, 512)), set())
        self.assertEqual(failed(cl.probes_checks(p, "vanilla", 2, 512)), {"probes: mode vanilla"})

    def test_an_idle_rail_fails_advanced_mode(self):
        text = "\n".join(l if 'rail="sup"' not in l or "tx_bytes" not in l else l.rsplit(" ", 1)[0] + " 0"
                         for l in PROM.splitlines())
        p = cl.summarize_probes(cl.parse_prometheus(text))
        checks = cl.probes_checks(p, "advanced", 2, 512)
        self.assertEqual(failed(checks), {"probes: rails carried bytes"})
        self.assertIn("rail sup carried no bytes", next(c.detail for c in checks if not c.ok))

    def test_vanilla_intra_island_needs_sup(self):
        text = PROM.replace('mode="advanced"', 'mode="vanilla"')
        p = cl.summarize_probes(cl.parse_prometheus(text))
        self.assertEqual(failed(cl.probes_checks(p, "vanilla", 2, 0)), set())
        no_sup = "\n".join(l for l in text.splitlines() if 'rail="sup"' not in l)
        p = cl.summarize_probes(cl.parse_prometheus(no_sup))
        self.assertEqual(failed(cl.probes_checks(p, "vanilla", 2, 0)), {"probes: rails carried bytes"})

    def test_errors_and_missing_agent_fail(self):
        text = PROM.replace(
            'mpib_rail_error_completions_total{host="gpu-node",pid="4242",rail="sup",device="127.0.0.2",port="1"} 0',
            'mpib_rail_error_completions_total{host="gpu-node",pid="4242",rail="sup",device="127.0.0.2",port="1"} 3',
        ).replace('mpib_connections_without_agent_total{host="gpu-node",pid="4243"} 0',
                  'mpib_connections_without_agent_total{host="gpu-node",pid="4243"} 2')
        p = cl.summarize_probes(cl.parse_prometheus(text))
        self.assertEqual(failed(cl.probes_checks(p, "advanced", 2, 512)),
                         {"probes: no errors", "probes: mode advanced"})

    def test_one_silent_process_and_no_scrape_fail(self):
        text = "\n".join(l for l in PROM.splitlines() if 'pid="4243"' not in l)
        p = cl.summarize_probes(cl.parse_prometheus(text))
        self.assertIn("probes: rails carried bytes", failed(cl.probes_checks(p, "advanced", 2, 512)))
        self.assertEqual(failed(cl.probes_checks(None, "advanced", 2, 512)), {"probes: scraped"})


def rank_rows(op, sizes, wrong=0, time_us=100.0):
    return [{"op": op, "size": s, "count": s // 4, "dtype": "int32", "redop": "sum", "root": -1,
             "iters": 2, "time_us": time_us, "wrong": wrong,
             "mismatches": [[5, 7, 8]] if wrong else [], "error": ""} for s in sizes]


class Results(unittest.TestCase):
    def test_merge_takes_the_slowest_rank_and_sums_wrong(self):
        rows = cl.merge_rank_rows({0: rank_rows("all_reduce", [4, 8], 0, 100.0),
                                   1: rank_rows("all_reduce", [4, 8], 2, 150.0)}, 2)
        self.assertEqual([(r.size, r.time_us, r.wrong) for r in rows], [(4, 150.0, 2), (8, 150.0, 2)])
        self.assertEqual(rows[0].mismatches, [[1, 5, 7, 8]])
        self.assertAlmostEqual(rows[1].algbw, 8 / 150e-6 / 1e9)
        missing = cl.merge_rank_rows({0: rank_rows("all_reduce", [4, 8]), 1: rank_rows("all_reduce", [4])}, 2)
        self.assertEqual([r.size for r in missing], [4])

    def test_result_checks(self):
        sizes = {"all_reduce": [4, 8, 16], "send_recv": [4, 8, 16]}
        rows = (cl.merge_rank_rows({0: rank_rows("all_reduce", [4, 8, 16]),
                                    1: rank_rows("all_reduce", [4, 8, 16])}, 2)
                + cl.merge_rank_rows({0: rank_rows("send_recv", [4, 8, 16], wrong=1),
                                      1: rank_rows("send_recv", [4, 8, 16])}, 2))
        checks = cl.result_checks(rows, ["all_reduce", "send_recv"], sizes, "completed", None)
        self.assertEqual(failed(checks), {"results: send_recv"})
        detail = next(c.detail for c in checks if not c.ok)
        self.assertIn("wrong results", detail)
        self.assertIn("first: rank 0 index 5 got 7 expected 8", detail)
        checks = cl.result_checks(rows[:2], ["all_reduce"], sizes, "timeout", ("all_reduce", 16))
        self.assertIn("timeout during 16 B", checks[0].detail)

    def test_format(self):
        row = cl.merge_rank_rows({0: rank_rows("all_reduce", [1 << 20]), 1: rank_rows("all_reduce", [1 << 20])}, 2)[0]
        line = cl.format_row(row)
        self.assertEqual(len(line), len(cl.ROW_HEADER))
        self.assertEqual(line.split(), ["1048576", "262144", "int32", "sum", "-1", "100.0", "10.486",
                                        "10.486", "0"])
        self.assertIn("# all_reduce", cl.format_tables([row]))

    def run_result(self, mode, proto, wrong=0, status="completed"):
        sizes = {"all_reduce": [4, 8]}
        rows = cl.merge_rank_rows({0: rank_rows("all_reduce", [4, 8], wrong),
                                   1: rank_rows("all_reduce", [4, 8])}, 2)
        if status != "completed":
            rows = rows[:1]
        r = cl.RunResult(mode=mode, proto=proto, status=status, rows=rows)
        r.checks = [cl.Check("run: completed", status == "completed")] + cl.result_checks(
            rows, ["all_reduce"], sizes, status, ("all_reduce", 8) if status != "completed" else None)
        return r

    def test_protocol_diagnosis(self):
        runs = [self.run_result("vanilla", "default", wrong=3), self.run_result("vanilla", "Simple")]
        notes = cl.diagnose(runs)
        self.assertEqual(len(notes), 1)
        self.assertIn("default protocols gave wrong results, NCCL_PROTO=Simple was exact", notes[0])
        self.assertIn("keep NCCL on Simple", notes[0])
        runs = [self.run_result("advanced", "default", status="timeout"),
                self.run_result("advanced", "Simple")]
        self.assertIn("hung", cl.diagnose(runs)[0])
        both = [self.run_result("vanilla", "default", wrong=3), self.run_result("vanilla", "Simple", wrong=1)]
        self.assertEqual(cl.diagnose(both), [])
        fine = [self.run_result("vanilla", "default"), self.run_result("vanilla", "Simple")]
        self.assertEqual(cl.diagnose(fine), [])

    def test_files_and_final_line(self):
        runs = [self.run_result("vanilla", "default", wrong=3), self.run_result("vanilla", "Simple")]
        passed, failed_n = cl.tally(runs)
        self.assertEqual((passed, failed_n), (3, 1))
        self.assertEqual(cl.final_line(passed, failed_n), "nccl-check: 3 passed, 1 failed")
        machine = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cuda": "13.0", "nccl": "2.28.9"}
        doc = cl.results_json(runs, machine, {"sout": "127.0.0.1"}, cl.diagnose(runs))
        doc = json.loads(json.dumps(doc))
        self.assertEqual((doc["passed"], doc["failed"], len(doc["runs"])), (3, 1, 2))
        self.assertEqual(doc["runs"][0]["rows"][0]["wrong"], 3)
        md = cl.markdown_summary(runs, machine, {"sout": "127.0.0.1", "sup": "127.0.0.2"}, cl.diagnose(runs))
        self.assertIn("| size | all_reduce |", md)
        self.assertIn("WRONG 3", md)
        self.assertIn("**PROTOCOL:", md)
        self.assertTrue(md.rstrip().endswith("`nccl-check: 3 passed, 1 failed`"))


# ---------------------------------------------------------------------------------------------
# The script itself, in a subprocess


def run_script(args, env_extra=None, pythonpath=None, timeout=240):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("NCCL_", "MPIB_", "FAKE_")):
            del env[k]
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    env.update(env_extra or {})
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=REPO)


class Script(unittest.TestCase):
    def test_help(self):
        out = run_script(["--help"])
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("SKIPPED", out.stdout)
        self.assertIn("--plugin", out.stdout)
        self.assertTrue(os.access(SCRIPT, os.X_OK))

    def test_without_torch_it_is_skipped(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "torch"))
            with open(os.path.join(d, "torch", "__init__.py"), "w") as f:
                f.write("raise ImportError('No module named torch (hidden by the test)')\n")
            out = run_script([], pythonpath=d)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertTrue(out.stdout.startswith("SKIPPED: PyTorch is not importable"), out.stdout)
        self.assertEqual(len(out.stdout.strip().splitlines()), 1)

    def test_without_a_gpu_it_is_skipped(self):
        out = run_script([], pythonpath=FAKES, env_extra={"FAKE_TORCH": "no-gpu"})
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertTrue(out.stdout.startswith("SKIPPED: no CUDA GPU visible to PyTorch"), out.stdout)

    def test_bad_arguments(self):
        out = run_script(["--modes", "turbo"])
        self.assertEqual(out.returncode, 2)
        self.assertIn("--modes", out.stderr)


class RunnerLogic(unittest.TestCase):
    def test_skip_reasons(self):
        gpu = {"torch": "2.11.0+cu130", "cuda": "13.0", "cuda_available": True, "device_count": 1,
               "nccl_backend": True}
        saved, runner.compute_mode = runner.compute_mode, lambda device: None
        try:
            self.assertIsNone(runner.skip_reason(dict(gpu), "python3", 0))
            runner.compute_mode = lambda device: "Exclusive_Process"
            self.assertIn("compute mode Exclusive_Process", runner.skip_reason(dict(gpu), "python3", 0))
        finally:
            runner.compute_mode = saved
        cases = [
            ({"error": "torch", "detail": "ModuleNotFoundError: No module named 'torch'"},
             "PyTorch is not importable by python3 (ModuleNotFoundError"),
            (dict(gpu, cuda=None), "PyTorch 2.11.0+cu130 is a build without CUDA"),
            (dict(gpu, cuda_available=False, device_count=0), "no CUDA GPU visible to PyTorch"),
            (dict(gpu, nccl_backend=False), "has no NCCL backend"),
        ]
        for info, want in cases:
            self.assertIn(want, runner.skip_reason(info, "python3", 0))
        self.assertIn("no CUDA device 1", runner.skip_reason(dict(gpu), "python3", 1))

    def test_where_a_run_stopped(self):
        init = [{"event": "start-init"}, {"event": "init"}]
        records = {0: init + [{"event": "begin", "op": "all_reduce", "size": 4},
                              {"event": "row", "op": "all_reduce", "size": 4},
                              {"event": "begin", "op": "all_reduce", "size": 16}],
                   1: init + [{"event": "begin", "op": "all_reduce", "size": 4}]}
        self.assertEqual(runner.stuck_at(records), (("all_reduce", 16), " during all_reduce 16 B (rank 0)"))
        self.assertEqual(runner.stuck_at({0: init, 1: [{"event": "start-init"}]})[1],
                         " during NCCL init (init_process_group, rank 1)")
        self.assertEqual(runner.stuck_at({0: init, 1: []})[1], " before rank 1 started (see rank1.out)")
        self.assertEqual(runner.stuck_at({0: init + [{"event": "done"}], 1: init})[1],
                         " after the ops (probes scrape or teardown, rank 1)")
        self.assertEqual(runner.stuck_at({0: init + [{"event": "done"}], 1: init + [{"event": "done"}]}),
                         (None, ""))


class EndToEnd(unittest.TestCase):
    """The runner and the worker against the fakes: nothing here needs torch or a GPU."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.plugin = os.path.join(cls.tmp.name, "libnccl-net-mpib.so")
        open(cls.plugin, "w").close()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def check(self, extra_args, fault="", out_name="out"):
        out_dir = os.path.join(self.tmp.name, out_name)
        args = ["--plugin", self.plugin, "--agent", os.path.join(FAKES, "bin", "mpib-agent"),
                "--collector", os.path.join(FAKES, "bin", "mpib-collector"), "--max-size", "256",
                "--out", out_dir, *extra_args]
        out = run_script(args, pythonpath=FAKES, env_extra={"FAKE_NCCL_FAULT": fault})
        return out, out_dir

    def test_all_runs_pass(self):
        out, out_dir = self.check([], out_name="pass")
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        last = out.stdout.strip().splitlines()[-1]
        self.assertRegex(last, r"^nccl-check: \d+ passed, 0 failed$")
        with open(os.path.join(out_dir, "results.json")) as f:
            doc = json.load(f)
        self.assertEqual([r["name"] for r in doc["runs"]],
                         ["vanilla-default", "vanilla-Simple", "advanced-default", "advanced-Simple"])
        self.assertEqual(doc["failed"], 0)
        adv = doc["runs"][2]
        self.assertEqual(adv["env"]["MPIB_MODE"], "1")
        self.assertGreater(adv["probes"]["tx"]["sout"], 0)
        self.assertGreater(adv["probes"]["tx"]["sup"], 0)
        self.assertNotIn("NCCL_PROTO", doc["runs"][0]["env"])
        self.assertEqual(doc["runs"][1]["env"]["NCCL_PROTO"], "Simple")
        self.assertEqual(len({row["op"] for row in adv["rows"]}), 6)
        self.assertTrue(os.path.exists(os.path.join(out_dir, "summary.md")))
        self.assertTrue(os.path.exists(os.path.join(out_dir, "advanced-Simple", "agent.log")))

    def test_wrong_results_under_default_protocols_are_diagnosed(self):
        out, _ = self.check(["--modes", "vanilla", "--ops", "all_reduce,all_gather"],
                            fault="corrupt-default", out_name="corrupt")
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("FAIL results: all_reduce: wrong results", out.stdout)
        self.assertIn("PROTOCOL: in vanilla mode NCCL's default protocols gave wrong results", out.stdout)
        self.assertRegex(out.stdout.strip().splitlines()[-1], r"^nccl-check: \d+ passed, 2 failed$")

    def test_fallback_to_socket_fails(self):
        out, _ = self.check(["--modes", "vanilla", "--protos", "default", "--ops", "all_reduce"],
                            fault="socket", out_name="socket")
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("FAIL nccl: no fallback", out.stdout)
        self.assertIn("FAIL nccl: network is MPIB", out.stdout)

    def test_an_idle_sup_rail_fails_advanced_mode(self):
        out, _ = self.check(["--modes", "advanced", "--protos", "Simple", "--ops", "all_reduce"],
                            fault="no-sup", out_name="nosup")
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("FAIL probes: rails carried bytes", out.stdout)

    def test_a_hang_times_out(self):
        out, out_dir = self.check(["--modes", "vanilla", "--protos", "default", "--ops",
                                   "all_reduce,all_gather", "--timeout", "5"],
                                  fault="hang:all_gather", out_name="hang")
        self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
        self.assertIn("FAIL run: completed: timed out after 5 s during all_gather 4 B (rank 0)", out.stdout)
        self.assertIn("FAIL results: all_gather: no result", out.stdout)
        with open(os.path.join(out_dir, "results.json")) as f:
            self.assertEqual(json.load(f)["runs"][0]["status"], "timeout")

    def test_torchrun_launcher(self):
        out, out_dir = self.check(["--modes", "vanilla", "--protos", "Simple", "--ops",
                                   "all_gather,send_recv", "--launcher", "torchrun"], out_name="torchrun")
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertTrue(os.path.exists(os.path.join(out_dir, "vanilla-Simple", "torchrun.out")))
        self.assertIn("ok   nccl: plugin loaded", out.stdout)

    def test_missing_plugin_is_an_error(self):
        out = run_script(["--plugin", "/nonexistent/libnccl-net-mpib.so", "--out",
                          os.path.join(self.tmp.name, "missing")], pythonpath=FAKES)
        self.assertEqual(out.returncode, 2, out.stdout + out.stderr)
        self.assertIn("no plugin library", out.stderr)


if __name__ == "__main__":
    unittest.main()
