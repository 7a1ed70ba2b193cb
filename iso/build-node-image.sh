#!/usr/bin/env bash
# build-node-image.sh [--base-only|--system-only] [--bundle DIR] [--hostagent BIN] [--out DIR] [--iso-args "ARGS"] — build
# (or reuse) the node image (issue 12): what a BMC-powered machine with a blank disk boots from the
# network (or from virtual media), to enrol with the appliance and install itself to its disk.
#
# Same recipe and cache as the appliance ISO (iso/build-iso.sh), two stages under ${APPLIANCE_CACHE:-/var/cache/appliance}:
#   0. the base, node-base-<key>/rootfs (key: NODE_BASE_VERSION, SUITE, PACKAGES): the debootstrap below,
#      which needs no bundle; --base-only builds (or reuses) it alone and prints its directory, so that
#      `make fixtures` / `make fixtures-demo` build it beside the Kubernetes binaries, off the bundle's
#      path (the debootstrap is 236 of the system's 371 s). Stage 1 starts from a copy of it.
#   1. the system, node-system-<key>/ (key: NODE_SYSTEM_VERSION, the package lists, the modules, every
#      file under iso/node/rootfs/, and the bundle repo's Packages index): debootstrap --variant=minbase
#      of Debian 12 with systemd, the generic kernel, Debian's ignition (2.14, in bookworm), GRUB for
#      BIOS and UEFI, fdisk, e2fsprogs, dosfstools, mtools, squashfs-tools; then, inside the tree, apt-get installs containerd, runc,
#      containernetworking-plugins, kubelet, kubeadm and kubectl from the BUNDLE's own package repo
#      (repo/debian, signature checked with its appliance-repo.gpg), at the exact versions its Packages
#      index lists, so the node always runs what the bundle serves; iso/node/rootfs/ on top (the
#      first-boot unit). Outputs: vmlinuz; rootfs.squashfs (zstd; /boot/vmlinuz inside, for the
#      installed system); initramfs-base/ (busybox and the modules for NICs, disks, the CD and the file
#      systems, with their dependencies).
#   2. the product, DIR (default $cache/node-image, a stable path: pkg/power's virtual media takes
#      DIR/node-amd64.iso), keyed by the system's key, the hostagent binary and the ISO arguments:
#        DIR/vmlinuz            the kernel                       (netboot: boot.kernel)
#        DIR/initrd.img         initramfs-base + iso/node/init + /bin/hostagent (netboot: boot.initrd; the
#                               installed system boots with it too, root=UUID=…)
#        DIR/rootfs.squashfs    the root filesystem              (netboot serves it beside the initrd)
#        DIR/node-amd64.iso     hybrid BIOS/UEFI ISO (grub-mkrescue, label APPLNODE) with the three above
#                               under /live; --iso-args go on its kernel command line (e.g.
#                               "appliance.url=https://10.0.0.2:8443 appliance.ca_pin=sha256:…": public data only)
#                               through its embed area /boot/grub/appliance-args.cfg, which `appliance serve`
#                               rewrites with its own URL and pin when it serves the ISO (pkg/nodeiso)
# Neither hostagent nor iso/node/init is in the system (a new build of either would rebuild it): they go
# into the initramfs here (hostagent in a second cpio appended to it: the kernel unpacks concatenated
# archives), and init copies hostagent into the live root. --system-only builds (or reuses) stage 1 and prints its directory. Prints DIR on stdout and
# the build times on stderr ("node image system built in N s": the cold build).
#
# Needs (Debian packages): debootstrap, squashfs-tools, grub-common, grub-pc-bin, grub-efi-amd64-bin,
# xorriso, mtools, busybox-static, kmod, cpio, gzip, flock; the machine's Debian mirror for stage 1.
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin

# Bump NODE_SYSTEM_VERSION when the recipe below changes what goes into the system.
NODE_SYSTEM_VERSION=1
# Bump NODE_BASE_VERSION when the debootstrap (stage 0) changes in a way SUITE and PACKAGES do not show.
NODE_BASE_VERSION=1
SUITE=bookworm
PACKAGES=systemd,systemd-sysv,udev,dbus,kmod,linux-image-amd64,iproute2,iputils-ping,ca-certificates,e2fsprogs,dosfstools,mtools,procps,curl,less,fdisk,squashfs-tools,grub-pc-bin,grub-efi-amd64-bin,grub2-common,ignition,conntrack,iptables,socat,ethtool
# From the bundle's repo, at the versions its Packages index lists.
BUNDLE_PACKAGES=(containerd runc containernetworking-plugins kubelet kubeadm kubectl)
# Modules the initramfs loads (with their dependencies): NICs (virtio and the common server NICs),
# disks (virtio, SATA/AHCI, NVMe, SCSI, USB), the CD, and the filesystems; crc32c_generic is ext4's
# soft dependency (metadata checksums), which modules.dep does not list.
MODULES=(virtio_pci virtio_net virtio_blk virtio_scsi e1000 e1000e igb ixgbe i40e tg3 bnx2 r8169
	ata_piix ahci libata sd_mod nvme usb-storage uas xhci_pci ehci_pci uhci_hcd cdrom sr_mod isofs
	af_packet loop squashfs overlay ext4 crc32c_generic)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${APPLIANCE_CACHE:-/var/cache/appliance}
bundle=$cache/bundle
out=$cache/node-image
hostagent_bin=$root/bin/hostagent
iso_args=""
system_only=false
base_only=false
while [[ $# -gt 0 ]]; do
	case $1 in
	--base-only) base_only=true; shift ;;
	--bundle) bundle=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--hostagent) hostagent_bin=$2; shift 2 ;;
	--iso-args) iso_args=$2; shift 2 ;;
	--system-only) system_only=true; shift ;;
	*) echo "usage: $0 [--base-only|--system-only] [--bundle DIR] [--hostagent BIN] [--out DIR] [--iso-args ARGS]" >&2; exit 2 ;;
	esac
done

log() { printf 'build-node-image: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
[[ $(id -u) == 0 ]] || die "must run as root (debootstrap creates device nodes and chowns files)"
for tool in debootstrap mksquashfs grub-mkrescue xorriso mformat depmod cpio gzip flock sha256sum; do
	command -v "$tool" >/dev/null || die "$tool not found (Debian packages: debootstrap squashfs-tools grub-common grub-pc-bin grub-efi-amd64-bin xorriso mtools kmod cpio; \`make deps\`)"
done
[[ -x /bin/busybox ]] || die "/bin/busybox not found (Debian package busybox-static)"
mkdir -p "$cache"

# --- 0. the base ---------------------------------------------------------------------------------------
# debootstrap of SUITE with PACKAGES: everything of the system that does not come from the bundle. Kept
# as a tree (stage 1 copies it), made in BASE.tmp and renamed into place, so BASE exists only complete.
base_key=$(echo "$NODE_BASE_VERSION $SUITE $PACKAGES" | sha256sum | cut -c1-12)
base=$cache/node-base-$base_key
exec 8>"$base.lock"
flock 8
if [[ -f $base.stamp ]]; then
	log "reusing the base $base ($(cat "$base.stamp"))"
else
	mirror=${DEBIAN_MIRROR:-$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
	[[ -n $mirror ]] || die "no Debian mirror in /etc/apt/sources.list.d/debian.sources; set DEBIAN_MIRROR"
	rm -rf --one-file-system "$base.tmp" "$base"
	mkdir -p "$base.tmp"
	log "debootstrap $SUITE ($PACKAGES) from $mirror"
	t0=$(date +%s)
	debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$base.tmp/rootfs" "$mirror" >"$base.tmp/debootstrap.log" 2>&1 ||
		die "debootstrap failed; see $base.tmp/debootstrap.log"
	rm -rf "$base.tmp/rootfs"/var/cache/apt/archives/*.deb
	mv -T "$base.tmp" "$base"
	printf 'suite=%s mirror=%s built=%s seconds=%s\n' "$SUITE" "$mirror" "$(date -u +%FT%TZ)" "$(($(date +%s) - t0))" >"$base.stamp"
	log "debootstrap took $(($(date +%s) - t0)) s: $base"
	[[ ! -x $root/test/fixtures/prune.sh ]] || "$root/test/fixtures/prune.sh" "$cache" 'node-base-*' "$base"
fi
if $base_only; then
	echo "$base"
	exit 0
fi

repo=$bundle/repo/debian
index=$repo/dists/stable/main/binary-amd64/Packages
[[ -f $index && -f $repo/appliance-repo.gpg ]] || die "$bundle has no package repo (repo/debian with Packages and appliance-repo.gpg): make fixtures, or appliance bundle create"
repo=$(realpath "$repo")
if ! $system_only; then
	[[ -x $hostagent_bin ]] || die "$hostagent_bin not built (make build)"
fi
start=$(date +%s)

# The exact versions the bundle serves.
pins=()
for p in "${BUNDLE_PACKAGES[@]}"; do
	v=$(awk -v p="$p" '$1 == "Package:" { cur = $2 } $1 == "Version:" && cur == p { print $2; exit }' "$index")
	[[ -n $v ]] || die "the bundle's repo has no $p ($index): the node image needs ${BUNDLE_PACKAGES[*]}"
	pins+=("$p=$v")
done

# --- 1. the system -----------------------------------------------------------------------------------
# The index without X-Appliance-Origin (the upstream a package came from: a fixture's upstream listens
# on a new port every build): every package's version and SHA-256 are in the key, where it was fetched
# from is not.
system_key=$( (echo "$NODE_SYSTEM_VERSION $base_key ${pins[*]} ${MODULES[*]}"; grep -v '^X-Appliance-Origin:' "$index" | sha256sum
	cd "$here/node/rootfs" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-12)
sys=$cache/node-system-$system_key
exec 9>"$sys.lock"
flock 9
if [[ -f $sys.stamp ]]; then
	log "reusing the system $sys ($(cat "$sys.stamp"))"
else
	tmp=$sys.tmp
	umount -R "$tmp/rootfs/mnt/bundle-repo" 2>/dev/null || true
	rm -rf --one-file-system "$tmp"
	mkdir -p "$tmp"
	trap 'rc=$?; umount "$sys.tmp/rootfs/mnt/bundle-repo" 2>/dev/null || true; [[ $rc == 0 ]] || rm -rf --one-file-system "$sys.tmp"' EXIT
	rootfs=$tmp/rootfs
	t0=$(date +%s)
	cp -a --reflink=auto "$base/rootfs" "$rootfs" || die "copying the base $base/rootfs failed"
	log "copying the base took $(($(date +%s) - t0)) s"

	# The Kubernetes node packages from the bundle's repo only (its own signed index), at its versions.
	t0=$(date +%s)
	mkdir -p "$rootfs/mnt/bundle-repo"
	mount --bind -o ro "$repo" "$rootfs/mnt/bundle-repo"
	mkdir -p "$tmp/apt"
	printf 'deb [signed-by=/mnt/bundle-repo/appliance-repo.gpg] file:/mnt/bundle-repo stable main\n' >"$tmp/apt/bundle.list"
	aptopts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=/mnt/bundle-repo.sources"
		-o "Dir::State::Lists=/var/lib/apt/bundle-lists" -o "APT::Sandbox::User=root")
	mkdir -p "$rootfs/mnt/bundle-repo.sources" "$rootfs/var/lib/apt/bundle-lists/partial"
	cp "$tmp/apt/bundle.list" "$rootfs/mnt/bundle-repo.sources/"
	chroot "$rootfs" apt-get "${aptopts[@]}" update >"$tmp/apt.log" 2>&1 || die "apt-get update from the bundle's repo failed; see $tmp/apt.log"
	DEBIAN_FRONTEND=noninteractive chroot "$rootfs" apt-get "${aptopts[@]}" install -y --no-install-recommends "${pins[@]}" >>"$tmp/apt.log" 2>&1 ||
		die "apt-get install ${pins[*]} from the bundle's repo failed; see $tmp/apt.log"
	umount "$rootfs/mnt/bundle-repo"
	rm -rf "$rootfs/mnt/bundle-repo" "$rootfs/mnt/bundle-repo.sources" "$rootfs/var/lib/apt/bundle-lists"
	log "bundle packages (${pins[*]}) took $(($(date +%s) - t0)) s"

	kver=$(basename "$(ls -d "$rootfs"/lib/modules/*)")
	cp "$rootfs/boot/vmlinuz-$kver" "$tmp/vmlinuz"
	echo "$kver" >"$tmp/kernel.version"

	# The initramfs: busybox, the modules with their dependencies (depmod of the kept set), iso/node/init.
	ir=$tmp/initramfs
	mkdir -p "$ir"/{bin,sbin,etc,proc,sys,dev,run,tmp,sysroot,medium,lower,upper,usr/bin,usr/sbin}
	cp /bin/busybox "$ir/bin/busybox"
	for applet in $(/bin/busybox --list); do
		[[ -e $ir/bin/$applet ]] || ln -s busybox "$ir/bin/$applet"
	done
	mdir=$rootfs/lib/modules/$kver
	want=("${MODULES[@]}")
	declare -A kept=()
	while ((${#want[@]})); do
		m=${want[0]}; want=("${want[@]:1}")
		m=${m//-/_}
		[[ -n ${kept[$m]:-} ]] && continue
		line=$(awk -v m="$m" '{ f=$1; sub(/:$/, "", f); n=f; sub(/.*\//, "", n); sub(/\.ko.*$/, "", n); gsub(/-/, "_", n); if (n == m) { print; exit } }' "$mdir/modules.dep")
		if [[ -z $line ]]; then
			grep -qE "/${m//_/[-_]}\.ko" "$mdir/modules.builtin" && { kept[$m]=builtin; continue; }
			die "module $m is neither in $kver's modules.dep nor built in"
		fi
		f=${line%%:*}
		kept[$m]=$f
		mkdir -p "$ir/lib/modules/$kver/$(dirname "$f")"
		case $f in
		*.ko) cp "$mdir/$f" "$ir/lib/modules/$kver/$f" ;;
		*.ko.xz) xz -dc "$mdir/$f" >"$ir/lib/modules/$kver/${f%.xz}" ;;
		*.ko.zst) zstd -qdc "$mdir/$f" >"$ir/lib/modules/$kver/${f%.zst}" ;;
		esac
		for dep in ${line#*:}; do
			d=$(basename "$dep"); want+=("${d%%.ko*}")
		done
	done
	cp "$mdir/modules.builtin" "$mdir/modules.order" "$ir/lib/modules/$kver/"
	depmod -b "$ir" "$kver"
	printf '%s\n' "${MODULES[@]}" >"$ir/etc/modules"
	# Kept as a tree: stage 2 adds iso/node/init and hostagent (an edit of init rebuilds no system).
	mv "$ir" "$tmp/initramfs-base"

	# The system: our files on top; kernel and initramfs at fixed names for the installed system's GRUB.
	cp -a "$here/node/rootfs/." "$rootfs/"
	rm -rf "$rootfs"/boot/*
	cp "$tmp/vmlinuz" "$rootfs/boot/vmlinuz"
	: >"$rootfs/etc/machine-id"
	echo node >"$rootfs/etc/hostname"
	rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
		"$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
		"$rootfs"/var/log/*.log "$rootfs"/var/cache/debconf/*-old
	chroot "$rootfs" systemctl enable node-firstboot.service systemd-networkd.service >/dev/null 2>&1 || die "systemctl enable node-firstboot.service systemd-networkd"
	# kubelet starts when hostagent has configured the node (kubeadm), not before.
	for unit in kubelet.service containerd.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer; do
		chroot "$rootfs" systemctl disable "$unit" >/dev/null 2>&1 || true
	done
	chroot "$rootfs" systemctl mask e2scrub_reap.service >/dev/null 2>&1 || die "systemctl mask e2scrub_reap.service"
	t0=$(date +%s)
	mksquashfs "$rootfs" "$tmp/rootfs.squashfs" -comp zstd -noappend -quiet -no-progress >/dev/null ||
		die "mksquashfs failed"
	log "mksquashfs took $(($(date +%s) - t0)) s"
	rm -rf --one-file-system "$rootfs"
	mv -T "$tmp" "$sys"
	# Older systems are dead weight (each ~400 MB) but the newest of them (test/fixtures/prune.sh).
	# Only from the repository: as the bundle's nodeImage.build recipe (appliance bundle create runs a
	# copy of this script and iso/node, without the repository's test/) the cache is not ours to prune.
	[[ ! -x $root/test/fixtures/prune.sh ]] || "$root/test/fixtures/prune.sh" "$cache" 'node-system-*' "$sys"
	printf 'kernel=%s squashfs=%s packages=%s built=%s seconds=%s\n' "$kver" "$(du -h "$sys/rootfs.squashfs" | cut -f1)" \
		"$(echo "${pins[*]}" | tr ' ' ,)" "$(date -u +%FT%TZ)" "$(($(date +%s) - start))" >"$sys.stamp"
	log "node image system built in $(($(date +%s) - start)) s: $sys ($(cat "$sys.stamp"))"
fi
exec 9>&- 8>&-
if $system_only; then
	echo "$sys"
	exit 0
fi

# --- 2. the product ------------------------------------------------------------------------------------
key=$( (echo "$system_key $iso_args"; sha256sum "$hostagent_bin" "$here/node/grub.cfg" "$here/node/init") | sha256sum | cut -c1-12)
out=$(realpath -m "$out")
mkdir -p "$out"
exec 9>"$out.lock"
flock 9
if [[ -f $out/key && $(cat "$out/key") == "$key" ]]; then
	log "reusing $out (key $key)"
	echo "$out"
	exit 0
fi
t0=$(date +%s)
rm -f "$out/key"
stage=$(mktemp -d "$out.stage.XXXXXX")
trap 'rm -rf --one-file-system "$stage"' EXIT
mkdir -p "$stage/agent/bin" "$stage/iso/live" "$stage/iso/boot/grub"
install -m 0755 "$hostagent_bin" "$stage/agent/bin/hostagent"
install -m 0755 "$here/node/init" "$stage/agent/init"
(cd "$sys/initramfs-base" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 | gzip -9n) >"$stage/initrd.img"
(cd "$stage/agent" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 | gzip -1n) >>"$stage/initrd.img"
for f in vmlinuz rootfs.squashfs; do
	ln -f "$sys/$f" "$out/$f.new" 2>/dev/null || cp "$sys/$f" "$out/$f.new"
done
mv "$stage/initrd.img" "$out/initrd.img.new"
for f in vmlinuz initrd.img rootfs.squashfs; do
	ln -f "$out/$f.new" "$stage/iso/live/$f" 2>/dev/null || cp "$out/$f.new" "$stage/iso/live/$f"
done
cp "$here/node/grub.cfg" "$stage/iso/boot/grub/grub.cfg"
# The embed area (pkg/nodeiso): 4096 bytes the menu sources, its first line the magic `appliance
# serve` finds the file by, the second the kernel arguments; `appliance serve` rewrites it at
# /boot/node.iso with its own URL and CA pin, so one ISO serves every appliance.
embed_area() {
	local f=$1 size n
	printf '# appliance node ISO kernel arguments, v1 (appliance serve rewrites this file)\nset appliance_args="%s"\n' "$2" >"$f"
	size=$(stat -c %s "$f")
	((size < 4096)) || die "--iso-args too long for the 4096-byte embed area"
	while ((size < 4096)); do
		n=$((4096 - size < 64 ? 4096 - size : 64))
		printf '%*s\n' $((n - 1)) '' | tr ' ' '#' >>"$f"
		size=$((size + n))
	done
}
[[ $iso_args != *[\"\\\$\`]* ]] || die "--iso-args must not hold quotes, backslashes, \$ or \`: $iso_args"
embed_area "$stage/iso/boot/grub/appliance-args.cfg" "$iso_args"
grub-mkrescue -o "$out/node-amd64.iso.new" "$stage/iso" -- -volid APPLNODE >"$stage/grub.log" 2>&1 || { cat "$stage/grub.log" >&2; die "grub-mkrescue failed"; }
for f in vmlinuz initrd.img rootfs.squashfs node-amd64.iso; do mv -f "$out/$f.new" "$out/$f"; done
(cd "$out" && sha256sum vmlinuz initrd.img rootfs.squashfs node-amd64.iso >SHA256SUMS)
echo "$key" >"$out/key"
log "built $out in $(($(date +%s) - t0)) s (system $(cat "$sys.stamp")): rootfs $(du -h "$out/rootfs.squashfs" | cut -f1), initrd $(du -h "$out/initrd.img" | cut -f1), ISO $(du -h "$out/node-amd64.iso" | cut -f1)"
echo "$out"
