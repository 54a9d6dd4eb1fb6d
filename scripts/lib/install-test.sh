#!/usr/bin/env bash
# The install path as a user takes it: scripts/install into a temporary prefix (and sysconfdir),
# then, from outside the checkout, mpib-perf (the installed one) loads the installed plugin by
# its NCCL name (NCCL_NET_PLUGIN=mpib + LD_LIBRARY_PATH, the way NCCL finds it) and moves
# verified bytes over the loopback fabric. Also: the name is not found without the library path
# (so the check cannot pass on some other copy), the units point into the prefix, the
# configuration is kept on a second install, and --uninstall removes every installed file.
# Prints PASS/FAIL lines; exit status 1 when anything failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
work=$(mktemp -d /tmp/mpib-install-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix etc=$work/etc
failed=0
pass() { echo "PASS install: $1"; }
fail() { echo "FAIL install: $1"; failed=1; }

if ! scripts/install --prefix "$prefix" --sysconfdir "$etc" > "$work/install.log" 2>&1; then
    sed 's/^/  | /' "$work/install.log"
    fail "scripts/install --prefix $prefix exited non-zero"
    exit 1
fi
manifest=$prefix/share/mpib/install-manifest
missing=0
while IFS= read -r file; do [ -f "$file" ] || { echo "  missing: $file"; missing=1; }; done < "$manifest"
[ "$missing" = 0 ] && pass "$(wc -l < "$manifest") files installed, every one in the manifest present" ||
    fail "files listed in the manifest are missing"
for file in lib/libnccl-net-mpib.so bin/mpib-collector bin/mpib-agent bin/mpib-perf bin/mpib-top \
    share/mpib/dashboards/mpib.json share/mpib/dashboards/alerts.yml \
    lib/systemd/system/mpib-collector.service lib/systemd/system/mpib-agent.service; do
    [ -f "$prefix/$file" ] || fail "$prefix/$file was not installed"
done
for unit in mpib-collector mpib-agent; do
    if grep -q "^ExecStart=$prefix/bin/$unit" "$prefix/lib/systemd/system/$unit.service"; then
        pass "$unit.service starts $prefix/bin/$unit"
    else
        fail "$unit.service does not start $prefix/bin/$unit: $(grep '^ExecStart' "$prefix/lib/systemd/system/$unit.service")"
    fi
done
grep -q -- "--config $etc/mpib/agent.toml" "$prefix/lib/systemd/system/mpib-agent.service" &&
    [ -f "$etc/mpib/agent.toml" ] && [ -f "$etc/mpib/collector.env" ] &&
    pass "configuration in $etc/mpib, named by the units" || fail "configuration not installed or not named"

# From outside the checkout, with nothing but the environment a job would have.
perf() { (cd / && env -u MPIB_DRIVER_PLUGIN MPIB_FABRIC=loopback "$@" \
    "$prefix/bin/mpib-perf" --max-size 64K --iters 5 --warmup 1 --verify --timeout 60); }
if perf NCCL_NET_PLUGIN=mpib LD_LIBRARY_PATH="$prefix/lib" > "$work/perf.log" 2>&1 &&
    grep -q '65536' "$work/perf.log"; then
    pass "the installed mpib-perf loaded libnccl-net-mpib.so by its NCCL name and moved verified bytes"
else
    sed 's/^/  | /' "$work/perf.log"
    fail "mpib-perf with NCCL_NET_PLUGIN=mpib LD_LIBRARY_PATH=$prefix/lib"
fi
perf NCCL_NET_PLUGIN=mpib LD_LIBRARY_PATH= > "$work/perf-none.log" 2>&1
rc=$?
if ldconfig -p 2>/dev/null | grep -q 'libnccl-net-mpib\.so'; then
    echo "SKIPPED install: the negative check (libnccl-net-mpib.so is in the loader's cache: installed system-wide)"
elif [ "$rc" = 2 ] && grep -q 'libnccl-net-mpib.so' "$work/perf-none.log"; then
    pass "without the library path the name is not found (exit 2, naming it)"
else
    sed 's/^/  | /' "$work/perf-none.log"
    fail "without LD_LIBRARY_PATH mpib-perf exited $rc (expected 2 naming libnccl-net-mpib.so)"
fi

# The installed mpib-top: one text frame of an empty probes directory, from outside the checkout.
mkdir -p "$work/probes"
if (cd / && "$prefix/bin/mpib-top" --probes-dir "$work/probes" --agent-control off --once --interval 0.1) > "$work/top.log" 2>&1 &&
    grep -q "no process writes probes in $work/probes" "$work/top.log"; then
    pass "the installed mpib-top prints a frame"
else
    sed 's/^/  | /' "$work/top.log"
    fail "the installed mpib-top --once"
fi

echo "# edited" >> "$etc/mpib/agent.toml"
if scripts/install --prefix "$prefix" --sysconfdir "$etc" --no-build > "$work/again.log" 2>&1 &&
    grep -q '^# edited' "$etc/mpib/agent.toml"; then
    pass "a second install keeps the edited configuration"
else
    fail "a second install lost the edited $etc/mpib/agent.toml"
fi
# An agent.toml from before the sysfs key (the old example's line): the next install updates it,
# and the installed agent then takes it; a file with another sysfs_root is left, with a warning.
sed -i 's|^# sysfs = "/sys"$|sysfs_root = "/sys/class/infiniband"|' "$etc/mpib/agent.toml"
if grep -qx 'sysfs_root = "/sys/class/infiniband"' "$etc/mpib/agent.toml" &&
    scripts/install --prefix "$prefix" --sysconfdir "$etc" --no-build > "$work/upgrade.log" 2>&1 &&
    ! grep -q '^sysfs_root' "$etc/mpib/agent.toml" && grep -q '^# edited' "$etc/mpib/agent.toml" &&
    [ -f "$etc/mpib/agent.toml.before-sysfs" ] && grep -q "updated $etc/mpib/agent.toml" "$work/upgrade.log"; then
    pass "an agent.toml with the old default sysfs_root line is updated, the rest of it kept"
else
    sed 's/^/  | /' "$work/upgrade.log"
    fail "the old sysfs_root line was not updated in $etc/mpib/agent.toml"
fi
echo 'sysfs_root = "/elsewhere/class/infiniband"' >> "$etc/mpib/agent.toml"
if scripts/install --prefix "$prefix" --sysconfdir "$etc" --no-build > "$work/upgrade2.log" 2>&1 &&
    grep -q '^sysfs_root = "/elsewhere' "$etc/mpib/agent.toml" &&
    grep -q 'WARNING: .*sets sysfs_root' "$work/upgrade2.log"; then
    pass "an agent.toml with another sysfs_root is left as it is, with a warning"
else
    sed 's/^/  | /' "$work/upgrade2.log"
    fail "another sysfs_root line: not left, or no warning"
fi
if scripts/install --prefix "$prefix" --sysconfdir "$etc" --uninstall > "$work/uninstall.log" 2>&1 &&
    [ -z "$(find "$prefix" -type f)" ]; then
    pass "--uninstall removed every installed file"
else
    find "$prefix" -type f | sed 's/^/  left: /'
    fail "--uninstall left files behind"
fi
cd "$root"
exit "$failed"
