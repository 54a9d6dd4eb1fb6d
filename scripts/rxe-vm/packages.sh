# The rig's Debian packages and how to ask apt for them. Sourced by run.sh and by
# test-packages.sh (which proves the choice with `apt-get -s`); not executed.
#
# Host side: qemu, busybox (the initramfs), kmod (depmod/modprobe on the unpacked kernel), cpio.
# Guest side (the guest's root *is* this machine's /): rdma-core + ibverbs-providers (the rxe
# userspace driver), iproute2 (`ip`, `rdma`, `tc`), ibverbs-utils and libibverbs-dev for tests.
# perftest (ib_write_bw, ib_write_lat) is the yardstick of scripts/perf.
rig_packages="qemu-system-x86 busybox-static kmod cpio xz-utils iproute2 rdma-core ibverbs-providers
      ibverbs-utils libibverbs-dev perftest"

# rig_qemu_request QEMU_UTILS_VERSION CODENAME: the words to give `apt-get install` for qemu,
# one per line, for a machine whose installed qemu-utils has QEMU_UTILS_VERSION ("" = none).
#
# Why not just `qemu-system-x86`: qemu-utils >= 8 declares `Breaks: qemu-system-common (<< 8)`,
# so Debian 12's qemu-system-x86 (7.2) cannot sit beside the backports qemu-utils 10 that some
# machine images carry (apt would remove qemu-utils). The matching qemu-system-x86 from
# backports, asked for alone, fails too ("held broken packages"): it needs qemu-system-common
# of exactly its version, qemu-system-data and seabios newer than Debian 12's, and apt only
# takes those from backports when asked by name. So the whole set is asked for at once.
rig_qemu_request() {
  local uver=$1 codename=$2 p
  if [ -z "$uver" ]; then
    echo qemu-system-x86
  elif [[ $uver == *bpo* ]]; then
    for p in qemu-system-x86 qemu-system-common qemu-system-data seabios; do
      echo "$p/$codename-backports"
    done
  else
    # Debian 12's own qemu: pin the binary packages built from the same source version.
    for p in qemu-system-x86 qemu-system-common qemu-system-data; do echo "$p=$uver"; done
  fi
}

# rig_backports_apt DIR CODENAME: prepares a private apt state under DIR (the system's sources
# plus CODENAME-backports; /etc/apt and /var/lib/apt stay as they are) and sets the array
# `rig_apt_opts` to the apt-get options that use it.
rig_backports_apt() {
  local dir=$1 codename=$2
  mkdir -p "$dir/lists/partial" "$dir/archives/partial"
  { cat /etc/apt/sources.list 2>/dev/null || true
    echo "deb http://deb.debian.org/debian $codename-backports main"; } > "$dir/sources.list"
  # -o APT::Sandbox::User=root: _apt cannot write into a root-owned private dir.
  rig_apt_opts=(-o "Dir::Etc::sourcelist=$dir/sources.list" -o "Dir::State::lists=$dir/lists"
                -o "Dir::Cache::archives=$dir/archives" -o APT::Sandbox::User=root)
}

rig_codename() { (. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}"); }
