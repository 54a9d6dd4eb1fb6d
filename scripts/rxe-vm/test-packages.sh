#!/bin/bash
# scripts/rxe-vm/test-packages.sh: proves the rig's package choice (packages.sh) without
# installing anything.
#
#   1. rig_qemu_request for no qemu-utils, Debian 12's qemu-utils and the backports one;
#   2. `apt-get -s install` of the whole request against THIS machine's package state with every
#      qemu-system-*, seabios and ipxe-qemu package taken out (what a fresh machine of this image
#      has), once with qemu-utils kept (the image's case) and once with it taken out too (plain
#      Debian 12). apt must find a solution that removes nothing.
#
# The simulation reads Debian's package lists (an `apt-get update` into a private dir when
# backports are needed), so it needs the package mirror. Prints `packages: N passed, M failed`.
set -uo pipefail
here=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
. "$here/packages.sh"
passed=0 failed=0
check() { # check NAME CONDITION-RESULT DETAIL
  if [ "$2" = 0 ]; then passed=$((passed + 1)); echo "PASS $1"
  else failed=$((failed + 1)); echo "FAIL $1: $3"; fi
}
words() { rig_qemu_request "$1" bookworm | tr '\n' ' ' | sed 's/ $//'; }

got=$(words "")
[ "$got" = qemu-system-x86 ]; check "no qemu-utils: plain qemu-system-x86" $? "got '$got'"
got=$(words "1:7.2+dfsg-7+deb12u18")
[ "$got" = "qemu-system-x86=1:7.2+dfsg-7+deb12u18 qemu-system-common=1:7.2+dfsg-7+deb12u18 qemu-system-data=1:7.2+dfsg-7+deb12u18" ]
check "Debian 12 qemu-utils: the same source version" $? "got '$got'"
got=$(words "1:10.0.2+ds-2+deb13u1~bpo12+1")
[ "$got" = "qemu-system-x86/bookworm-backports qemu-system-common/bookworm-backports qemu-system-data/bookworm-backports seabios/bookworm-backports" ]
check "backports qemu-utils: the whole qemu set from backports" $? "got '$got'"

# ---- simulations against a copy of this machine's dpkg state, minus the rig's qemu.
work=$(mktemp -d /tmp/mpib-rig-packages.XXXXXX)
trap 'rm -rf "$work"' EXIT
# drop_stanzas REGEX < status > status': removes every stanza whose Package matches REGEX.
drop_stanzas() {
  awk -v re="$1" 'BEGIN { RS = ""; ORS = "\n\n" }
    { if (match($0, /(^|\n)Package: [^\n]+/)) { p = substr($0, RSTART, RLENGTH); sub(/.*Package: /, "", p) }
      if (p !~ re) print }'
}
rig_regex='^(qemu-system-.*|seabios|ipxe-qemu)$'
drop_stanzas "$rig_regex" < /var/lib/dpkg/status > "$work/status-image"
drop_stanzas "$rig_regex|^qemu-utils$" < /var/lib/dpkg/status > "$work/status-plain"
codename=$(rig_codename)
rig_backports_apt "$work/apt" "$codename"
bpo_opts=("${rig_apt_opts[@]}")
apt-get "${bpo_opts[@]}" update -qq > "$work/update.log" 2>&1
check "apt-get update of the private backports state" $? "$(tail -3 "$work/update.log")"

# simulate NAME STATUS-FILE: what run.sh would ask for on a machine with that state.
simulate() {
  local name=$1 status=$2 uver want=() opts=()
  uver=$(dpkg-query --admindir="$work/admin-$name" -W -f='${Version}' qemu-utils 2>/dev/null || true)
  want=(${rig_packages/qemu-system-x86/})
  mapfile -t -O "${#want[@]}" want < <(rig_qemu_request "$uver" "$codename")
  [[ "${want[*]}" != */*-backports* ]] || opts=("${bpo_opts[@]}")
  apt-get "${opts[@]}" -o "Dir::State::status=$status" -s install --no-install-recommends \
    --no-remove "${want[@]}" > "$work/$name.log" 2>&1
  local rc=$?
  local removes; removes=$(grep -c '^Remv ' "$work/$name.log")
  [ "$rc" = 0 ] && [ "$removes" = 0 ] && grep -q '^Inst qemu-system-x86 ' "$work/$name.log"
  check "apt-get -s on the $name state (qemu-utils '${uver:-none}'): installs qemu, removes nothing" $? \
    "apt rc=$rc, $removes removal(s): $(grep -E '^(E:| qemu|Remv)' "$work/$name.log" | head -5 | tr '\n' ' ')"
}
for name in image plain; do
  mkdir -p "$work/admin-$name"; cp "$work/status-$name" "$work/admin-$name/status"
  simulate "$name" "$work/status-$name"
done
echo "packages: $passed passed, $failed failed"
[ "$failed" = 0 ]
