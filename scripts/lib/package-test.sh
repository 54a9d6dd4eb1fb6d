#!/usr/bin/env bash
# The Debian package as an operator takes it: scripts/package builds mpib_VERSION-1_amd64.deb,
# `dpkg -i` installs it into this machine, and then
#   - the package declares its runtime dependencies and its two conffiles;
#   - every file it lists is there; the installed mpib-perf, run from outside the checkout with
#     no library path, loads the plugin by its NCCL name and moves verified bytes; mpib-top runs;
#   - `systemd-analyze verify` accepts both units with no warning (Debian's systemd package
#     provides it without systemd running);
#   - `dpkg -r` removes every file but the edited configuration, `dpkg -P` removes that too.
# Refuses to run when a package named mpib is already installed (it would be replaced and then
# removed) or /etc/mpib exists. Needs root. Installs Debian's systemd package (for
# systemd-analyze; nothing is started) and, through scripts/package, dpkg-dev and cargo-deb. Prints PASS/FAIL lines; exit status 1 when anything failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/setup.sh
failed=0
pass() { echo "PASS package: $1"; }
fail() { echo "FAIL package: $1"; failed=1; }

[ "$(id -u)" = 0 ] || { fail "needs root (dpkg -i into this machine)"; exit 1; }
# Any record of mpib but "not-installed" (installed, unpacked, half-configured, config-files):
# a package the test would replace and then purge.
state=$(dpkg-query -W -f='${db:Status-Status}' mpib 2>/dev/null || true)
if [ -n "$state" ] && [ "$state" != not-installed ]; then
    fail "a package named mpib is already on this machine ($state; dpkg -P mpib first): this test installs and removes its own"
    exit 1
fi
if [ -e /etc/mpib ]; then
    fail "/etc/mpib is already there (scripts/install's configuration?): dpkg would take it over and the purge would delete it; move it away first"
    exit 1
fi
ensure_packages systemd
work=$(mktemp -d /tmp/mpib-package-test.XXXXXX)
ours=0
cleanup() {
    [ "$ours" = 0 ] || dpkg -P mpib > /dev/null 2>&1
    rm -rf "$work"
}
trap cleanup EXIT

if ! scripts/package > "$work/package.log" 2>&1; then
    sed 's/^/  | /' "$work/package.log"
    fail "scripts/package exited non-zero"
    exit 1
fi
deb=$(tail -n 1 "$work/package.log")
pass "built $deb ($(du -h "$deb" | cut -f1))"
# libibverbs is opened by the verbs fabric, not linked: recommended, never a dependency.
depends=$(dpkg-deb -f "$deb" Depends) recommends=$(dpkg-deb -f "$deb" Recommends)
case $depends in *libibverbs*) fail "Depends names libibverbs: '$depends'" ;; *) pass "Depends: $depends" ;; esac
case $recommends in *libibverbs1*) pass "Recommends: $recommends" ;; *) fail "Recommends lacks libibverbs1: '$recommends'" ;; esac
conffiles=$(dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles 2>/dev/null | sort | tr '\n' ' ')
[ "$conffiles" = "/etc/mpib/agent.toml /etc/mpib/collector.env " ] &&
    pass "conffiles: $conffiles" || fail "conffiles are '$conffiles'"

ours=1
if ! dpkg -i "$deb" > "$work/install.log" 2>&1; then
    sed 's/^/  | /' "$work/install.log"
    fail "dpkg -i $deb"
    exit 1
fi
dpkg -L mpib | while IFS= read -r path; do [ -d "$path" ] || echo "$path"; done > "$work/files"
missing=$(while IFS= read -r file; do [ -e "$file" ] || echo "$file"; done < "$work/files")
[ -z "$missing" ] && pass "dpkg -i installed $(wc -l < "$work/files") files, every one there" ||
    fail "missing after dpkg -i: $missing"

# From outside the checkout, with no library path: the loader finds the plugin by its name.
if (cd / && env -u LD_LIBRARY_PATH -u MPIB_DRIVER_PLUGIN MPIB_FABRIC=loopback NCCL_NET_PLUGIN=mpib \
    /usr/bin/mpib-perf --max-size 64K --iters 5 --warmup 1 --verify --timeout 60) > "$work/perf.log" 2>&1 &&
    grep -q '65536' "$work/perf.log"; then
    pass "the packaged mpib-perf loaded libnccl-net-mpib.so by its NCCL name and moved verified bytes"
else
    sed 's/^/  | /' "$work/perf.log"
    fail "/usr/bin/mpib-perf with NCCL_NET_PLUGIN=mpib"
fi
mkdir -p "$work/probes"
if (cd / && /usr/bin/mpib-top --probes-dir "$work/probes" --agent-control off --once --interval 0.1) > "$work/top.log" 2>&1 &&
    grep -q 'no process writes probes' "$work/top.log"; then
    pass "the packaged mpib-top prints a frame"
else
    sed 's/^/  | /' "$work/top.log"
    fail "/usr/bin/mpib-top --once"
fi
for unit in mpib-agent mpib-collector; do
    file=/usr/lib/systemd/system/$unit.service
    if systemd-analyze verify --man=no "$file" > "$work/$unit.verify" 2>&1 && [ ! -s "$work/$unit.verify" ] &&
        grep -q "^ExecStart=/usr/bin/$unit" "$file"; then
        pass "systemd-analyze verify accepts $unit.service (ExecStart=/usr/bin/$unit)"
    else
        sed 's/^/  | /' "$work/$unit.verify"
        fail "systemd-analyze verify $file"
    fi
done
if systemctl is-enabled mpib-agent > /dev/null 2>&1 || [ -e /etc/systemd/system/multi-user.target.wants/mpib-agent.service ]; then
    fail "the package enabled mpib-agent (the operator enables it)"
else
    pass "the units are installed, not enabled"
fi

echo "# edited by the package test" >> /etc/mpib/agent.toml
if ! dpkg -r mpib > "$work/remove.log" 2>&1; then
    sed 's/^/  | /' "$work/remove.log"
    fail "dpkg -r mpib"
fi
left=$(while IFS= read -r file; do
    case $file in /etc/mpib/*) ;; *) [ ! -e "$file" ] || echo "$file" ;; esac
done < "$work/files")
[ -z "$left" ] && pass "dpkg -r removed every file but the configuration" || fail "left after dpkg -r: $left"
# The packaged library was the one found: with it removed, the name is not found any more.
(cd / && env -u LD_LIBRARY_PATH -u MPIB_DRIVER_PLUGIN MPIB_FABRIC=loopback NCCL_NET_PLUGIN=mpib \
    "$OLDPWD/target/release/mpib-perf" --max-size 64K --iters 5 --warmup 1 --timeout 60) > "$work/perf-none.log" 2>&1
rc=$?
if [ "$rc" = 2 ] && grep -q 'libnccl-net-mpib.so' "$work/perf-none.log"; then
    pass "after dpkg -r the name is not found (so the packaged library was the one loaded)"
else
    sed 's/^/  | /' "$work/perf-none.log"
    fail "after dpkg -r mpib-perf exited $rc (expected 2 naming libnccl-net-mpib.so)"
fi
if grep -q '^# edited by the package test' /etc/mpib/agent.toml 2>/dev/null && [ -f /etc/mpib/collector.env ] &&
    dpkg-query -W -f='${Status}' mpib | grep -q config-files; then
    pass "dpkg -r kept the edited configuration (status: config-files)"
else
    fail "dpkg -r did not keep /etc/mpib/agent.toml with its edit"
fi
dpkg -P mpib > "$work/purge.log" 2>&1 && ours=0
if [ "$ours" = 0 ] && [ ! -e /etc/mpib ] && ! dpkg-query -W mpib > /dev/null 2>&1; then
    pass "dpkg -P removed the configuration and the package"
else
    cat "$work/purge.log" | sed 's/^/  | /'
    ls -la /etc/mpib 2>&1 | sed 's/^/  | /'
    fail "dpkg -P failed or left /etc/mpib or the package's record"
fi
exit "$failed"
