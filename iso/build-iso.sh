#!/usr/bin/env bash
# build-iso.sh [--system-only] [--bundle DIR] [--out FILE] [--appliance BIN] [--hostagent BIN] — build (or reuse) the
# appliance ISO: a hybrid image that boots from CD or USB, with BIOS or UEFI, into a Debian 12 system
# that runs the appliance from the medium itself (issue 11).
#
# Two stages, each cached by content under ${APPLIANCE_CACHE:-/var/cache/appliance}:
#   1. the system, iso-system-<key>/ (key: ISO_SYSTEM_VERSION, the package list, iso/init and every file
#      under iso/rootfs/): debootstrap --variant=minbase of Debian 12 with systemd, the generic kernel
#      (linux-image-amd64, for real hardware), keepalived, nftables, openssh-server (disabled until the
#      configuration enables it), e2fsprogs, dbus; iso/rootfs/ on top (units, console banner); docs, man
#      pages and locales removed; packed as system.squashfs (zstd). Beside it vmlinuz and initrd.img: a
#      busybox initramfs of our own (iso/init) with only the modules that find and mount the medium.
#      Why not live-boot: Debian's live-boot initramfs reached a systemd unit in 58 s under TCG here;
#      this one only loads a dozen modules, checks the medium and switches root.
#   2. the ISO, iso/appliance-<version>-amd64.iso (key: the system's key, the appliance and hostagent
#      binaries, the bundle's SHA256SUMS and the medium's files): grub-mkrescue (GRUB for BIOS and for
#      UEFI, xorriso, hybrid MBR/GPT so that `dd` to a USB stick boots too), volume label APPLIANCE:
#        /live/vmlinuz, /live/initrd.img, /live/system.squashfs   the system
#        /live/bin/appliance, /live/bin/hostagent                  this build's binaries
#        /bundle/                                                  the bundle, served from the medium
#        /bootstrap.yaml.example, /README.txt                      for the operator
#        /SHA256SUMS                                               every file above except /bundle (which
#                                                                  has its own SHA256SUMS and signature);
#                                                                  checked at every boot by iso/init
# --system-only builds (or reuses) stage 1 and prints its directory (`make fixtures` runs it, so that
# nothing downloads later). Prints the ISO's path on stdout, and its size (system vs bundle) and build time on stderr.
#
# Needs (Debian packages): debootstrap, squashfs-tools, grub-common, grub-pc-bin, grub-efi-amd64-bin,
# xorriso, mtools, busybox-static, kmod, cpio, gzip, flock; the machine's Debian mirror for stage 1.
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin

# ISO_SYSTEM_VERSION is part of the system's cache key: bump it when the recipe below changes what goes into
# the system (the key already covers the packages, the modules, iso/init and iso/rootfs/).
ISO_SYSTEM_VERSION=2
SUITE=bookworm
PACKAGES=systemd,systemd-sysv,udev,dbus,kmod,linux-image-amd64,keepalived,nftables,openssh-server,iproute2,iputils-ping,ca-certificates,e2fsprogs,procps,curl,less
# Modules the initramfs loads (with their dependencies): the CD and USB paths, virtio for VMs, the
# filesystems of the medium and the system.
MODULES=(cdrom sr_mod isofs ata_piix ahci libata sd_mod usb-storage uas xhci_pci ehci_pci uhci_hcd
	virtio_pci virtio_blk virtio_scsi loop squashfs overlay)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
cache=${APPLIANCE_CACHE:-/var/cache/appliance}
bundle=$cache/bundle
out=""
system_only=false
appliance_bin=$root/bin/appliance
hostagent_bin=$root/bin/hostagent
while [[ $# -gt 0 ]]; do
	case $1 in
	--bundle) bundle=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--appliance) appliance_bin=$2; shift 2 ;;
	--hostagent) hostagent_bin=$2; shift 2 ;;
	--system-only) system_only=true; shift ;;
	*) echo "usage: $0 [--system-only] [--bundle DIR] [--out FILE] [--appliance BIN] [--hostagent BIN]" >&2; exit 2 ;;
	esac
done

log() { printf 'build-iso: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
[[ $(id -u) == 0 ]] || die "must run as root (debootstrap creates device nodes and chowns files)"
for tool in debootstrap mksquashfs grub-mkrescue xorriso mformat depmod cpio gzip flock sha256sum; do
	command -v "$tool" >/dev/null || die "$tool not found (Debian packages: debootstrap squashfs-tools grub-common grub-pc-bin grub-efi-amd64-bin xorriso mtools kmod cpio; \`make deps\`)"
done
[[ -x /bin/busybox ]] || die "/bin/busybox not found (Debian package busybox-static)"
[[ -d /usr/lib/grub/i386-pc && -d /usr/lib/grub/x86_64-efi ]] || die "GRUB for BIOS and UEFI missing (Debian packages grub-pc-bin grub-efi-amd64-bin)"
if ! $system_only; then
	for f in "$appliance_bin" "$hostagent_bin"; do [[ -x $f ]] || die "$f not built (make build)"; done
	[[ -f $bundle/SHA256SUMS && -f $bundle/SHA256SUMS.sig ]] || die "$bundle is not a finished, signed bundle (make fixtures, or appliance bundle create)"
	bundle=$(realpath "$bundle")
fi
start=$(date +%s)
mkdir -p "$cache"

# --- 1. the system -----------------------------------------------------------------------------------
# Paths relative to iso/ (sha256sum prints the name it was given): the key of one content is the same
# in every checkout, which an absolute "$here/init" made differ per clone directory.
system_key=$( (echo "$ISO_SYSTEM_VERSION $SUITE $PACKAGES ${MODULES[*]}"; cd "$here" && sha256sum init
	cd "$here/rootfs" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-12)
sys=$cache/iso-system-$system_key
exec 9>"$sys.lock"
flock 9
if [[ -f $sys.stamp ]]; then
	log "reusing the system $sys ($(cat "$sys.stamp"))"
else
	mirror=${DEBIAN_MIRROR:-$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)}
	[[ -n $mirror ]] || die "no Debian mirror in /etc/apt/sources.list.d/debian.sources; set DEBIAN_MIRROR"
	tmp=$sys.tmp
	rm -rf --one-file-system "$tmp"
	mkdir -p "$tmp"
	trap 'rc=$?; [[ $rc == 0 ]] || rm -rf --one-file-system "$sys.tmp"' EXIT
	rootfs=$tmp/rootfs
	log "debootstrap $SUITE ($PACKAGES) from $mirror"
	t0=$(date +%s)
	debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$mirror" >"$tmp/debootstrap.log" 2>&1 ||
		die "debootstrap failed; see $tmp/debootstrap.log"
	log "debootstrap took $(($(date +%s) - t0)) s"
	kver=$(basename "$(ls -d "$rootfs"/lib/modules/*)")
	cp "$rootfs/boot/vmlinuz-$kver" "$tmp/vmlinuz"
	echo "$kver" >"$tmp/kernel.version"

	# The initramfs: busybox, the modules with their dependencies (depmod of the kept set), iso/init.
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
	install -m 0755 "$here/init" "$ir/init"
	(cd "$ir" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0 | gzip -9n) >"$tmp/initrd.img"

	# The system: our files on top, then what a server never reads.
	cp -a "$here/rootfs/." "$rootfs/"
	rm -f "$rootfs"/etc/ssh/ssh_host_* # made at first boot (ssh is off unless the configuration enables it)
	: >"$rootfs/etc/machine-id"
	rm -rf "$rootfs"/boot/* "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
		"$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
		"$rootfs"/var/log/*.log "$rootfs"/var/cache/debconf/*-old
	chroot "$rootfs" systemctl enable appliance-firstboot.service appliance-console.timer >/dev/null 2>&1 || die "systemctl enable appliance-firstboot.service appliance-console.timer"
	for unit in ssh.service keepalived.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer; do
		chroot "$rootfs" systemctl disable "$unit" >/dev/null 2>&1 || true
	done
	# e2scrub_reap removes stale LVM snapshots of e2scrub: the appliance has no LVM, and under emulation
	# the unit took 2.2 s of CPU beside firstboot at every boot.
	chroot "$rootfs" systemctl mask e2scrub_reap.service >/dev/null 2>&1 || die "systemctl mask e2scrub_reap.service"
	chroot "$rootfs" systemctl enable systemd-networkd.service >/dev/null 2>&1 || die "systemctl enable systemd-networkd"
	t0=$(date +%s)
	mksquashfs "$rootfs" "$tmp/system.squashfs" -comp zstd -noappend -quiet -no-progress >/dev/null ||
		die "mksquashfs failed"
	log "mksquashfs took $(($(date +%s) - t0)) s"
	rm -rf --one-file-system "$rootfs" "$ir"
	mv -T "$tmp" "$sys"
	# Older systems are dead weight (each ~400 MB) but the newest of them (test/fixtures/prune.sh).
	[[ ! -x $root/test/fixtures/prune.sh ]] || "$root/test/fixtures/prune.sh" "$cache" 'iso-system-*' "$sys"
	printf 'kernel=%s squashfs=%s initrd=%s built=%s seconds=%s\n' "$kver" "$(du -h "$sys/system.squashfs" | cut -f1)" \
		"$(du -h "$sys/initrd.img" | cut -f1)" "$(date -u +%FT%TZ)" "$(($(date +%s) - start))" >"$sys.stamp"
	log "built the system $sys ($(cat "$sys.stamp"))"
fi
exec 9>&-
if $system_only; then
	echo "$sys"
	exit 0
fi

# --- 2. the ISO ----------------------------------------------------------------------------------------
version=$("$appliance_bin" version 2>/dev/null | awk '{print $NF; exit}')
version=${version:-dev}
iso_key=$( (echo "$system_key"; sha256sum "$appliance_bin" "$hostagent_bin" "$bundle/SHA256SUMS" "$here/grub.cfg" \
	"$here/README.txt" "$here/bootstrap.yaml.example") | sha256sum | cut -c1-12)
out=${out:-$cache/iso/appliance-$version-amd64.iso}
out=$(realpath -m "$out")
mkdir -p "$(dirname "$out")"
exec 9>"$out.lock"
flock 9
if [[ -f $out && -f $out.key && $(cat "$out.key") == "$iso_key" ]]; then
	log "reusing $out (key $iso_key): $(du -h "$out" | cut -f1)"
	echo "$out"
	exit 0
fi
stage=$(mktemp -d "$(dirname "$out")/.stage.XXXXXX")
trap 'rm -rf --one-file-system "$stage" "$out.tmp"' EXIT
mkdir -p "$stage/live/bin" "$stage/boot/grub"
ln "$sys/vmlinuz" "$stage/live/vmlinuz" 2>/dev/null || cp "$sys/vmlinuz" "$stage/live/vmlinuz"
ln "$sys/initrd.img" "$stage/live/initrd.img" 2>/dev/null || cp "$sys/initrd.img" "$stage/live/initrd.img"
ln "$sys/system.squashfs" "$stage/live/system.squashfs" 2>/dev/null || cp "$sys/system.squashfs" "$stage/live/system.squashfs"
install -m 0755 "$appliance_bin" "$stage/live/bin/appliance"
install -m 0755 "$hostagent_bin" "$stage/live/bin/hostagent"
install -m 0644 "$here/README.txt" "$stage/README.txt"
install -m 0644 "$here/bootstrap.yaml.example" "$stage/bootstrap.yaml.example"
install -m 0644 "$here/grub.cfg" "$stage/boot/grub/grub.cfg"
(cd "$stage" && find live README.txt bootstrap.yaml.example boot/grub/grub.cfg -type f | LC_ALL=C sort | xargs sha256sum) >"$stage/SHA256SUMS"
t0=$(date +%s)
# The bundle goes in as /bundle straight from where it is (xorriso -map), never linked or copied into the
# stage: a hard link changes each file's ctime, and a bundle file with one link whose ctime moved is
# re-hashed by the next appliance run over that bundle (pkg/bundle Verify's stamp), which then reports
# a change (seen in CI: the e2e's second bootstrap found 117 files re-hashed after an ISO build).
grub-mkrescue -o "$out.tmp" "$stage" -- -volid APPLIANCE -map "$bundle" /bundle >"$stage.log" 2>&1 || { cat "$stage.log" >&2; rm -f "$stage.log"; die "grub-mkrescue failed"; }
rm -f "$stage.log"
mv -f "$out.tmp" "$out"
echo "$iso_key" >"$out.key"
# ISOs of other versions (~900 MB each) but the newest of them (test/fixtures/prune.sh).
[[ ! -x $root/test/fixtures/prune.sh ]] || "$root/test/fixtures/prune.sh" "$(dirname "$out")" 'appliance-*-amd64.iso' "$out"
# Older builds of the default name pattern are dead weight (each ~500 MB).
for old in "$(dirname "$out")"/appliance-*-amd64.iso; do
	[[ $old == "$out" || $old == */appliance-test-amd64.iso ]] || rm -f "$old" "$old.key" "$old.lock"
done
log "built $out in $(($(date +%s) - start)) s (grub-mkrescue $(($(date +%s) - t0)) s): $(du -h "$out" | cut -f1) — system $(du -ch "$stage/live" | tail -1 | cut -f1), bundle $(du -sh "$bundle" | cut -f1)"
echo "$out"
