#!/usr/bin/env bash
# Builds the Soft-RoCE guest: Debian 12's own kernel (linux-image-*-amd64, fetched with apt-get download and unpacked,
# nothing installed) and a small initramfs (busybox-static, the rxe modules and their dependencies, iproute2's rdma,
# rdma-core's ibverbs tools and providers, perftest). Cached in $IFEC_RXE_CACHE (default /var/cache/ifec/rxe): a
# second run only checks. Prints the kernel and initramfs paths.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
CACHE="${IFEC_RXE_CACHE:-/var/cache/ifec/rxe}"
KVER="${IFEC_RXE_KERNEL:-6.1.0-50-amd64}"
DEBS=(linux-image-$KVER-unsigned rdma-core ibverbs-providers ibverbs-utils perftest libibverbs1 librdmacm1
      libnl-3-200 libnl-route-3-200 libibumad3 libpci3)
HERE="$(cd "$(dirname "$0")" && pwd)"
KERNEL="$CACHE/vmlinuz-$KVER"
INITRD="$CACHE/initrd-$KVER.cpio.gz"
key=$(cat "$0" "$HERE/init" | sha256sum | cut -c1-12)
if [[ -f "$KERNEL" && -f "$INITRD" && "$(cat "$CACHE/key" 2>/dev/null)" == "$key" ]]; then
  echo "$KERNEL $INITRD"; exit 0
fi
mkdir -p "$CACHE/debs"
(cd "$CACHE/debs" && for d in "${DEBS[@]}"; do ls "${d}"_*.deb >/dev/null 2>&1 || apt-get download -q "$d" >&2; done)
X="$CACHE/extract"; rm -rf "$X"; mkdir -p "$X"
for f in "$CACHE"/debs/*.deb; do dpkg-deb -x "$f" "$X"; done
cp "$X/boot/vmlinuz-$KVER" "$KERNEL"

R="$(mktemp -d)"; trap 'rm -rf "$R"' EXIT
mkdir -p "$R"/{bin,sbin,dev,proc,sys,tmp,etc,lib/modules,usr/lib/x86_64-linux-gnu/libibverbs,etc/libibverbs.d,run}
cp /usr/bin/busybox "$R/bin/busybox"
for a in $("$R/bin/busybox" --list); do [[ -e "$R/bin/$a" ]] || ln -s busybox "$R/bin/$a"; done
printf '#!/bin/sh\nexec /bin/busybox modprobe "$@"\n' > "$R/sbin/modprobe"; chmod +x "$R/sbin/modprobe"
# Modules: rxe and the NIC, with everything they depend on (modinfo's depends, transitively).
M="$X/lib/modules/$KVER"
declare -A seen=()
add_mod() {
  local name="$1" f
  [[ -n "${seen[$name]:-}" ]] && return; seen[$name]=1
  f=$(find "$M/kernel" -name "$name.ko" -o -name "$name.ko.xz" | head -1)
  [[ -n "$f" ]] || { echo "build_guest: no module $name" >&2; exit 1; }
  for dep in $(modinfo -F depends "$f" | tr ',' ' '); do add_mod "$dep"; done
  mkdir -p "$R/lib/modules/$(dirname "${f#$M/}")"; cp "$f" "$R/lib/modules/${f#$M/}"
  echo "${f#$M/}" >> "$R/lib/modules/order"
}
for m in crc32_generic virtio_pci virtio_net ib_core ib_uverbs rdma_rxe; do add_mod "$m"; done
# Programs and their libraries (the unpacked packages first, then this machine's, which is the same Debian 12).
progs=(/usr/bin/rdma "$X/usr/bin/ibv_devices" "$X/usr/bin/ibv_devinfo" "$X/usr/bin/ibv_rc_pingpong"
       "$X/usr/bin/ib_write_bw" "$X/usr/bin/ib_read_bw" "$X/usr/bin/ib_atomic_bw" "$X/usr/bin/ib_send_bw")
export LD_LIBRARY_PATH="$X/usr/lib/x86_64-linux-gnu:$X/lib/x86_64-linux-gnu"
for p in "${progs[@]}"; do
  cp "$p" "$R/bin/"
  if ldd "$p" | grep -q "not found"; then echo "build_guest: $(basename "$p") lacks $(ldd "$p" | grep "not found" | tr -s '\t\n' ' ')" >&2; exit 1; fi
  ldd "$p" | awk '/=> \// {print $3} /^\t\// {print $1}' | while read -r lib; do
    mkdir -p "$R$(dirname "$lib")"; cp -L "$lib" "$R$lib" 2>/dev/null || true
    base=$(basename "$lib"); [[ -e "$R/usr/lib/x86_64-linux-gnu/$base" ]] || cp -L "$lib" "$R/usr/lib/x86_64-linux-gnu/$base"
  done
done
cp -L "$X"/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so "$R/usr/lib/x86_64-linux-gnu/libibverbs/"
cp "$X"/etc/libibverbs.d/rxe.driver "$R/etc/libibverbs.d/"
mkdir -p "$R/lib64"; cp -L /lib64/ld-linux-x86-64.so.2 "$R/lib64/"
cp "$HERE/init" "$R/init"; chmod +x "$R/init"
(cd "$R" && find . | cpio -o -H newc --quiet | gzip -1) > "$INITRD.part" && mv "$INITRD.part" "$INITRD"
echo "$key" > "$CACHE/key"
echo "$KERNEL $INITRD"
