#!/bin/busybox sh
# /init of the rxe-vm initramfs (packed by run.sh; the cache is rebuilt when this file changes).
# Busybox only, no udev: devtmpfs alone creates /dev/infiniband/uverbs*, and skipping udev
# coldplug is what halves the boot time against virtme-ng.
#
# It mounts this machine's / (9p tag "root", read-only) under a tmpfs overlay as the new root,
# the per-run state dir at /run/rxe-vm (tag "state"), the read-write dirs (tags rw0..rwN-1)
# at their host paths, then hands over to guest.sh.
/bin/busybox --install -s /bin
# stty raw: no \n -> \r\n rewriting, so CMD's output reaches the caller byte for byte.
exec </dev/console >/dev/console 2>&1; stty raw -echo
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /m/order); do insmod /m/$m || echo "rxe-vm init: insmod $m failed"; done
o=trans=virtio,version=9p2000.L,msize=512000
fail() { echo "rxe-vm init: $*"; echo 0 > /proc/sys/kernel/printk; poweroff -f; }
mount -t 9p -o $o,ro root /lower || fail "cannot mount the 9p root"
mount -t tmpfs -o mode=755 tmp /upper && mkdir /upper/u /upper/w
mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w root /newroot ||
  fail "cannot mount the overlay root"
mkdir -p /newroot/run/rxe-vm && mount -t 9p -o $o state /newroot/run/rxe-vm || fail "no state dir"
. /newroot/run/rxe-vm/boot                     # KVER KMODS GUEST CWD RW_N RW_0...
i=0
while [ $i -lt "$RW_N" ]; do
  eval d=\$RW_$i
  mkdir -p "/newroot$d" && mount -t 9p -o $o rw$i "/newroot$d" || fail "cannot mount $d"
  i=$((i + 1))
done
# The host has no /lib/modules/$KVER (the kernel is only unpacked into the cache), so point it
# at the cache. Then modprobe and the kernel's own request_module (e.g. sch_netem) work
# (README pitfall 5). This lands in the tmpfs overlay and never touches the host.
mkdir -p /newroot/lib/modules && ln -sfn "$KMODS" "/newroot/lib/modules/$KVER"
for d in proc sys dev; do mount --move /$d /newroot/$d; done
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts; mount -t tmpfs shm /newroot/dev/shm
exec switch_root /newroot /bin/bash "$GUEST"
