#!/bin/bash
# scripts/rxe-vm/run.sh CMD [ARGS...]     run CMD in a VM with two Soft-RoCE (rdma_rxe) rails
# scripts/rxe-vm/run.sh --prepare         only install the packages and fill the cache
#
# Boots Debian 12's stock kernel (it ships rdma_rxe) under qemu in software emulation (TCG),
# with this machine's / as the VM's root (9p, read-only, under a throw-away tmpfs overlay).
# The checkout that holds this script, and $PWD, are mounted read-write at the same paths.
# CMD runs as root in $PWD with the caller's environment. Its stdout and stderr come back
# merged on stdout. The exit status is CMD's, 255 if the VM died before CMD finished,
# and 124 on timeout.
#
# Two "hosts", A and B, live in one guest kernel and each has two NICs. Every rail is a veth
# pair, so A<->B traffic really crosses a wire that tc/ip can break:
#   rail 0: rxe_a0 on veth_a0 10.100.0.1/24  <->  rxe_b0 on veth_b0 10.100.0.2/24
#   rail 1: rxe_a1 on veth_a1 10.100.1.1/24  <->  rxe_b1 on veth_b1 10.100.1.2/24
# The RoCE v2 IPv4 GID is index 1 on every device. The VM has no NIC: nothing leaves it.
#
# Settings (environment):
#   RXE_VM_CPUS     vCPUs (2)                RXE_VM_MEM      guest memory (2G)
#   RXE_VM_MTU      veth MTU (9000, which gives active_mtu 4096; 1500 gives 1024)
#   RXE_VM_RAILS    rails per host, 2 or 4 (rxe_a0..rxe_a3 and rxe_b0..rxe_b3: two NIC pairs)
#   RXE_VM_TIMEOUT  seconds before the VM is killed and run.sh exits 124 (900)
#   RXE_VM_CACHE    kernel + initramfs cache (/tmp/mpib-rxe-vm, about 440 MB)
#   RXE_VM_RW       extra host dirs to mount read-write, colon-separated
#   RXE_VM_KERNEL_PKG  kernel package to boot (default: linux-image-amd64's, fixed at first run)
#   RXE_VM_QEMU     qemu binary to use (qemu-system-x86_64 from PATH)
#   RXE_VM_NO_RAILS=1  skip the rail setup     RXE_VM_VERBOSE=1  timings on stderr
#   RXE_VM_DEBUG=1     trace the guest setup   RXE_VM_ALLOW_REMOVE=1  let apt remove packages
#
# Usage, measurements, known limits and every pitfall cited below ("README pitfall N"):
# scripts/rxe-vm/README.md.
set -euo pipefail

here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
prog=rxe-vm
die() { echo "$prog: ERROR: $*" >&2; exit 1; }
say() { echo "$prog: $*" >&2; }
verbose() { [ -z "${RXE_VM_VERBOSE-}" ] || say "$*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
t_start=$(now)

case "${1-}" in
  "") sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  -h | --help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --prepare) prepare_only=1 ;;
  *) prepare_only= ;;
esac

cache=${RXE_VM_CACHE:-/tmp/mpib-rxe-vm}
cpus=${RXE_VM_CPUS:-2} mem=${RXE_VM_MEM:-2G} tmo=${RXE_VM_TIMEOUT:-900}
[[ $cpus =~ ^[1-9][0-9]*$ ]] || die "RXE_VM_CPUS must be a positive integer, not '$cpus'"
[[ $tmo =~ ^[1-9][0-9]*$ ]] || die "RXE_VM_TIMEOUT must be a positive number of seconds, not '$tmo'"
[[ ${RXE_VM_MTU:-9000} =~ ^[0-9]+$ ]] || die "RXE_VM_MTU must be a number, not '$RXE_VM_MTU'"

# ---------------------------------------------------------------- packages (idempotent)
# What the rig needs and how apt is asked for qemu: packages.sh (tested by test-packages.sh).
. "$here/packages.sh"
pkgs=$rig_packages
installed() { dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null | grep -q '^ii'; }
missing=$(for p in $pkgs; do installed "$p" || echo "$p"; done)
missing=$(echo $missing)

# apt-get install that never removes a package: this is a shared machine, and someone else's
# tool must not vanish as a side effect of a test rig (RXE_VM_ALLOW_REMOVE=1 lifts that).
apt_install() { # apt_install [APT-OPTIONS...] -- PKG...
  local opts=(); while [ "$1" != -- ]; do opts+=("$1"); shift; done; shift
  local nr=--no-remove; [ -z "${RXE_VM_ALLOW_REMOVE-}" ] || nr=
  DEBIAN_FRONTEND=noninteractive $sudo apt-get "${opts[@]}" install -y -qq \
    --no-install-recommends $nr "$@"
}
if [ -n "$missing" ]; then
  sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
  [ -z "$sudo" ] || command -v sudo >/dev/null ||
    die "missing packages ($missing) and not root to install them"
  say "installing: $missing"
  t=$(now)
  want=(); qemu_words=()
  for p in $missing; do [ "$p" = qemu-system-x86 ] || want+=("$p"); done
  uver=; ! installed qemu-utils || uver=$(dpkg-query -W -f='${Version}' qemu-utils)
  if [[ " $missing " == *" qemu-system-x86 "* ]]; then
    codename=$(rig_codename)
    mapfile -t qemu_words < <(rig_qemu_request "$uver" "$codename")
    [ -z "$uver" ] || say "qemu-utils $uver is installed: asking for the matching ${qemu_words[*]}"
    want+=("${qemu_words[@]}")
  fi
  rig_apt_opts=()
  if [[ "${qemu_words[*]-}" == */*-backports* ]]; then
    rig_backports_apt "$cache/apt-$codename-backports" "$codename"
  fi
  { $sudo apt-get "${rig_apt_opts[@]}" update -qq &&
    apt_install "${rig_apt_opts[@]}" -- "${want[@]}"; } >&2 || fail=1
  [ -z "${fail-}" ] || die "apt-get could not install: ${want[*]}.
  If apt said it would have to REMOVE packages: this rig refuses that by default (shared
  machine); rerun with RXE_VM_ALLOW_REMOVE=1 to allow it, or install them yourself."
  verbose "package install took $(since "$t") s"
fi
qemu=${RXE_VM_QEMU:-qemu-system-x86_64}
command -v "$qemu" >/dev/null || die "qemu ('$qemu') not found even though qemu-system-x86 is installed"
for c in busybox depmod modprobe cpio gzip xz; do
  command -v $c >/dev/null || die "'$c' not found (packages: $pkgs)"
done

# ---------------------------------------------------------------- kernel + initramfs cache
# The kernel comes from the Debian archive as a .deb that is only unpacked (apt-get download +
# dpkg -x), never installed: the host's /boot stays untouched (README "Measured times": packages and cache).
# RXE_VM_KERNEL_PKG pins one (e.g. linux-image-6.1.0-37-amd64); default: what linux-image-amd64
# depends on at the first run.
kpkg_of_meta() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -1
}
# The answer is remembered in $cache/kernel-package (apt-cache costs 0.8 s a run, and the
# kernel should not change under a test suite by itself); delete that file to move on.
mkdir -p "$cache"
kpkg=${RXE_VM_KERNEL_PKG:-$(cat "$cache/kernel-package" 2>/dev/null || true)}
if [ -z "$kpkg" ]; then
  kpkg=$(kpkg_of_meta) || true
  [ -n "$kpkg" ] || { apt-get update -qq >&2 || true; kpkg=$(kpkg_of_meta) || true; }
  [ -n "$kpkg" ] || die "cannot resolve linux-image-amd64 to a kernel package (apt lists?)"
  echo "$kpkg" > "$cache/kernel-package"
fi
kver=${kpkg#linux-image-}
kroot=$cache/$kver
# The initramfs is rebuilt whenever initramfs-init.sh changes: its hash is in the file name.
ihash=$(sha256sum "$here/initramfs-init.sh" | cut -c1-12)
initrd=$kroot/initrd-$ihash.cpio.gz

fill_cache() {
  if [ ! -f "$kroot/.unpacked" ]; then
    say "fetching kernel $kpkg into $kroot"
    rm -rf "$kroot"; mkdir -p "$kroot/dl"
    # -o APT::Sandbox::User=root: _apt cannot write into a root-owned cache dir.
    # Stale apt lists name .debs the mirror has dropped; one apt-get update fixes that.
    (cd "$kroot/dl" && { apt-get download -q -o APT::Sandbox::User=root "$kpkg" ||
      { apt-get update -qq && apt-get download -q -o APT::Sandbox::User=root "$kpkg"; }; } >&2) ||
      die "apt-get download $kpkg failed"
    dpkg -x "$kroot"/dl/*.deb "$kroot" || die "dpkg -x of $kpkg failed"
    rm -rf "$kroot/dl"
    # The package ships no modules.dep (the postinst would make it): build it here, so that
    # both the initramfs list below and modprobe inside the guest work (README "Measured times": packages and cache).
    depmod -b "$kroot" "$kver"
    [ -f "$kroot/boot/vmlinuz-$kver" ] || die "no vmlinuz in $kpkg"
    # Boot speed: the bzImage spends about 5 s of TCG time in SeaBIOS and in decompressing
    # itself (XZ) before the kernel even starts. qemu can boot the uncompressed ELF vmlinux
    # directly through its PVH entry point (Debian sets CONFIG_PVH=y), which skips both:
    # measured 5-8 s instead of 12-14 s to the first command. Extract it once, like the
    # kernel's scripts/extract-vmlinux does; if that fails, boot the bzImage (slower, works).
    local off
    off=$(LC_ALL=C grep -aboP '\xfd7zXZ\x00' "$kroot/boot/vmlinuz-$kver" | head -1 | cut -d: -f1) || true
    if [ -n "$off" ]; then
      tail -c +$((off + 1)) "$kroot/boot/vmlinuz-$kver" | xz -dc 2>/dev/null > "$kroot/vmlinux" || true
      [ "$(head -c 4 "$kroot/vmlinux" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] || rm -f "$kroot/vmlinux"
    fi
    [ -f "$kroot/vmlinux" ] || say "WARNING: could not extract vmlinux; booting the bzImage (about 5 s slower)"
    touch "$kroot/.unpacked"
  fi
  if [ ! -f "$initrd" ]; then
    local ird; ird=$(mktemp -d "$kroot/initrd.XXXXXX")
    mkdir -p "$ird"/{bin,proc,sys,dev,lower,upper,newroot,m}
    cp "$(command -v busybox)" "$ird/bin/busybox"
    # The initramfs only needs to reach the 9p root. insmod order matters (virtio_ring before
    # virtio ...): take it from modprobe's own dependency resolution (README pitfall 4).
    for m in virtio_pci 9pnet_virtio 9p overlay; do
      modprobe -d "$kroot" -S "$kver" --show-depends "$m"
    done | awk '/^insmod/ && !seen[$2]++ { print $2 }' | while read -r f; do
      cp "$f" "$ird/m/"; basename "$f" >> "$ird/m/order"
    done
    [ -s "$ird/m/order" ] || die "no initramfs modules found in $kroot"
    install -m 755 "$here/initramfs-init.sh" "$ird/init"
    (cd "$ird" && find . | cpio -o -H newc 2>/dev/null | gzip -1) > "$initrd.tmp"
    rm -f "$kroot"/initrd-*.cpio.gz                 # older init versions (qemu read them at start)
    mv "$initrd.tmp" "$initrd"; rm -rf "$ird"
  fi
}
t=$(now)
if [ ! -f "$kroot/.unpacked" ] || [ ! -f "$initrd" ]; then
  # Two first runs at once would race on the cache; serialize them.
  exec 9>"$cache/.lock"; flock 9; fill_cache; flock -u 9; exec 9>&-
  verbose "cache fill took $(since "$t") s"
fi
[ -z "$prepare_only" ] || { say "ready: kernel $kver, cache $kroot"; exit 0; }

# ---------------------------------------------------------------- per-run state for the guest
# A small dir shared over 9p: the environment, what to mount, the command; the guest writes
# back the phase it reached and CMD's exit code.
state=$(mktemp -d /tmp/mpib-rxe-run.XXXXXX)
qpid=
cleanup() { [ -z "$qpid" ] || kill "$qpid" 2>/dev/null || true; rm -rf "$state"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# The caller's environment, minus what must not cross: readonly variables (a readonly
# exported SHELLOPTS made the guest's bash abort: README pitfall 7) and per-shell ones.
{ export -p | grep -v -E '^declare -[a-zA-Z]*r[a-zA-Z]* ' |
    grep -v -E '^declare -[a-zA-Z-]+ (PWD|OLDPWD|SHLVL|_|TERM|BASH_[A-Z_]*)(=|$)'
  echo 'export TERM=dumb'; } > "$state/env"

# Read-write mounts: the checkout holding this script, $PWD, and RXE_VM_RW. A dir inside
# another one on the list is covered by that one and is dropped.
checkout=$(git -C "$here" rev-parse --show-toplevel 2>/dev/null || (cd "$here/../.." && pwd))
cands=("$checkout" "$PWD")
if [ -n "${RXE_VM_RW-}" ]; then
  IFS=: read -r -a extra <<< "$RXE_VM_RW"
  for d in "${extra[@]}"; do
    [ -n "$d" ] || continue
    [ -d "$d" ] || die "RXE_VM_RW: '$d' is not a directory"
    cands+=("$(cd "$d" && pwd)")
  done
fi
rw=()
for d in "${cands[@]}"; do
  [ "$d" != / ] || die "refusing to mount / read-write (run from a project dir, not /)"
  keep=1
  for e in "${cands[@]}"; do
    [ "$e" != "$d" ] && [[ $d == "$e"/* ]] && keep=
  done
  for e in "${rw[@]}"; do [ "$e" != "$d" ] || keep=; done
  [ -z "$keep" ] || rw+=("$d")
done
{ printf 'KVER=%q\nKMODS=%q\nGUEST=%q\nCWD=%q\nRW_N=%d\n' "$kver" "$kroot/lib/modules/$kver" \
    "$here/guest.sh" "$PWD" "${#rw[@]}"
  for i in "${!rw[@]}"; do printf 'RW_%d=%q\n' "$i" "${rw[$i]}"; done; } > "$state/boot"
{ printf 'set --'; printf ' %q' "$@"; echo; } > "$state/cmd"
echo 255 > "$state/rc"; echo booting > "$state/phase"

# ---------------------------------------------------------------- qemu
# KVM is not usable on this kind of host: /dev/kvm is PVM (nested in Firecracker); a stock
# kernel aborts or hangs under it (README pitfall 1). So: TCG, multi-threaded, -cpu max.
# qemu option values escape ',' by doubling it.
fsdev() { # fsdev TAG PATH [,readonly=on]
  local p=${2//,/,,}
  qargs+=(-fsdev "local,id=$1,path=$p,security_model=none,multidevs=remap$3"
          -device "virtio-9p-pci,fsdev=$1,mount_tag=$1")
}
kimg=$kroot/vmlinux; [ -f "$kimg" ] || kimg=$kroot/boot/vmlinuz-$kver   # PVH ELF, see fill_cache
# shellcheck disable=SC2054  # the commas are inside qemu option values
qargs=(-accel tcg,thread=multi -cpu max -smp "$cpus" -m "$mem"
       -nodefaults -display none -no-reboot -net none
       # The console is qemu's stdio, with stdin from /dev/null. `-chardev file,path=/proc/self/fd/1`
       # would reopen stdout and clobber the caller's file when stdout is a file (README pitfall 6).
       -chardev stdio,id=con,signal=off -serial chardev:con
       -kernel "$kimg" -initrd "$initrd"
       -append "console=ttyS0 quiet loglevel=3 panic=-1")
fsdev root / ,readonly=on
fsdev state "$state" ""
for i in "${!rw[@]}"; do fsdev "rw$i" "${rw[$i]}" ""; done

verbose "starting qemu after $(since "$t_start") s of host-side prep"
t_boot=$(now)
set +e
"$qemu" "${qargs[@]}" </dev/null &
qpid=$!
# Our own watchdog rather than timeout(1): it lets us say which phase the guest had reached.
# Sleeps run in the background + `wait`, so that the TERM from the main script interrupts
# them at once (bash runs a trap only after a foreground command ends).
(
  s=
  trap 'kill $s 2>/dev/null; exit 0' TERM
  sleep "$tmo" & s=$!; wait $s
  kill -0 "$qpid" 2>/dev/null || exit 0
  echo timeout > "$state/timedout"
  kill -TERM "$qpid" 2>/dev/null
  sleep 10 & s=$!; wait $s
  kill -KILL "$qpid" 2>/dev/null
) &
wpid=$!
wait "$qpid"; qrc=$?
qpid=
kill "$wpid" 2>/dev/null; wait "$wpid" 2>/dev/null
set -e

phase=$(cat "$state/phase" 2>/dev/null || echo '?')
rc=$(cat "$state/rc" 2>/dev/null || echo 255)
verbose "VM ran $(since "$t_boot") s (qemu rc=$qrc); guest reached: $phase;" \
  "guest uptime when the command started: $(cat "$state/uptime" 2>/dev/null || echo '?') s"
if [ -f "$state/timedout" ]; then
  say "TIMEOUT: killed the VM after RXE_VM_TIMEOUT=$tmo s (guest phase: $phase; command: $*)"
  exit 124
fi
if [ "$phase" != "done" ]; then
  case $phase in
    booting) say "the VM died before the guest script started (qemu rc=$qrc): see the console output above" ;;
    setup) say "the guest's rail setup failed (qemu rc=$qrc): see the console output above" ;;
    running) say "the VM died while the command was running (qemu rc=$qrc)" ;;
    *) say "the VM stopped in an unknown state '$phase' (qemu rc=$qrc)" ;;
  esac
  exit 255
fi
exit "$rc"
