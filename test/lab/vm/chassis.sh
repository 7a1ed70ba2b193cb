#!/usr/bin/env bash
# chassis.sh NODE_DIR get PARM... | set PARM VALUE... — the chassis of a BMC-managed lab node: ipmi_sim's
# chassis_control program (test/lab/nodes.sh writes `chassis_control "chassis.sh NODE_DIR"` into the
# BMC's lan.conf; ipmi_sim appends the operation, as in OpenIPMI's ipmi_sim_chassiscontrol example).
#
#   get power        power:1 while the QEMU process recorded in NODE_DIR/qemu.pid runs, else power:0
#   get boot         boot:<device> as last set (default "default")
#   set power 1      power on: start QEMU (TCG) detached inside the node's namespace; no-op when on
#   set power 0      power off: SIGTERM the QEMU PID (SIGKILL after 5 s); no-op when off
#   set reset 1      power off, then on
#   set boot DEV     record the boot device (none|pxe|cdrom|bios|disk|default) for `get boot`
# Errors go to stdout (ipmi_sim captures it) and exit non-zero, so the IPMI command fails.
#
# Power-on boots the lab VM kit (test/fixtures/build-vmkit.sh: Debian cloud kernel + busybox
# initramfs, whose /init is test/lab/vm/init), a stand-in for PXE or virtual media: whatever the boot
# device, the VM network-boots. The initramfs is the kit's base.cpio.gz with a second cpio appended
# that holds HOSTAGENT as /bin/hostagent (when that file exists), written to NODE_DIR/initrd.img.
# The kernel command line is
#   console=ttyS0 panic=-1 NET_ARGS <contents of CMDLINE_FILE>
# where CMDLINE_FILE is what the appliance rendered for the node ($STATE/rendered/<node>/kernel-cmdline:
# appliance.url= and appliance.ca_pin=, public data only; see init), and NET_ARGS (the node's static
# addresses, `ip=` in kernel syntax) is left out when that file already has an ip= argument. Power-on
# fails when CMDLINE_FILE is missing: a machine whose PXE server has nothing for it does not boot.
#
# With VM_BOOT=pxe in chassis.env the VM is a blank machine instead (issue 12's bare-metal proof): no
# kit and no kernel command line; its first NIC carries QEMU's iPXE ROM (Debian's ipxe-qemu,
# pxe-virtio.rom) and comes first in the boot order, then one blank virtio disk, NODE_DIR/disk.img
# (created sparse on the first power-on, VM_DISK_GB GiB, default 8; kept across power cycles, as a
# machine's disk is), with serial VM_DISK_SERIAL; with VM_DECOY_GB set, a second blank disk
# NODE_DIR/decoy.img of that size, serial DECOY-NODE, last in the boot order (the root-device hints
# must pass it over: a smaller decoy is what an install without hints would take). What it boots is what the network serves it: the
# appliance's DHCP, TFTP and per-MAC iPXE script (which boots the disk once the machine installed).
#
# NODE_DIR/chassis.env (written by nodes.sh) gives NODE, NETNS, NODE_DIR, KIT_SCRIPT, APPLIANCE_CACHE,
# HOSTAGENT, CMDLINE_FILE, NET_ARGS, MAC_PREFIX, MEMORY_MB, and optionally SYSTEM_UUID, VM_BOOT (kit,
# the default, or pxe), VM_DISK_SERIAL, VM_DISK_GB and VM_DECOY_GB. The VM has two virtio NICs: eth0 on tap0
# (MAC_PREFIX:64:00, bridged to the control plane) and eth1 on tap1 (MAC_PREFIX:c8:00, workload
# plane), and the SMBIOS system UUID SYSTEM_UUID, by default derived from
# MAC_PREFIX: for 52:54:00:01 it is 52540001-6400-4000-8000-525400016400 (what the booted machine
# reads in /sys/class/dmi/id/product_uuid and sends when it enrols). Its serial console is appended
# to NODE_DIR/console.log.
set -uo pipefail

dir=${1:-}
[[ -n $dir && -f $dir/chassis.env ]] || { echo "chassis.sh: NODE_DIR/chassis.env missing (got '$dir')"; exit 1; }
shift
# shellcheck source=/dev/null
. "$dir/chassis.env"
op=${1:-}
shift || true

qemu_alive() {
	local pid
	[[ -s $dir/qemu.pid ]] || return 1
	pid=$(<"$dir/qemu.pid")
	[[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "-name $NODE,process=$NETNS"
}

PXE_ROM=/usr/lib/ipxe/qemu/pxe-virtio.rom

# power_on_pxe: the blank machine of VM_BOOT=pxe (see the header).
power_on_pxe() {
	[[ -r $PXE_ROM ]] || { echo "$PXE_ROM missing (Debian package ipxe-qemu)"; return 1; }
	[[ -e $dir/disk.img ]] || truncate -s "${VM_DISK_GB:-8}G" "$dir/disk.img" || { echo "cannot create $dir/disk.img"; return 1; }
	local decoy=()
	if [[ -n ${VM_DECOY_GB:-} ]]; then
		[[ -e $dir/decoy.img ]] || truncate -s "${VM_DECOY_GB}G" "$dir/decoy.img" || { echo "cannot create $dir/decoy.img"; return 1; }
		decoy=(-drive "file=$dir/decoy.img,format=raw,if=none,id=d1,cache=unsafe" -device "virtio-blk-pci,drive=d1,serial=DECOY-$NODE,bootindex=3")
	fi
	local prefix=${MAC_PREFIX//:/}
	local uuid=${SYSTEM_UUID:-$prefix-6400-4000-8000-${prefix}6400}
	rm -f "$dir/qemu.pid"
	printf '\n=== power on %s: network boot (iPXE ROM), disk serial %s\n' "$(date -u +%FT%T.%NZ)" "${VM_DISK_SERIAL:-LAB-DISK}" >>"$dir/console.log"
	date +%s%N >"$dir/powered-on"
	# pxe-virtio.rom names the modern virtio-net device (1af4:1041): disable-legacy=on, or SeaBIOS skips it.
	nsenter --net="/run/netns/$NETNS" -- qemu-system-x86_64 -name "$NODE,process=$NETNS" \
		-accel tcg -cpu qemu64,+rdrand -m "$MEMORY_MB" -smp 1 -nodefaults -no-user-config -display none -uuid "$uuid" \
		-chardev "file,id=con,path=$dir/console.log,append=on" -serial chardev:con \
		-netdev tap,id=cp,ifname=tap0,script=no,downscript=no \
		-device "virtio-net-pci,disable-legacy=on,netdev=cp,mac=$MAC_PREFIX:64:00,romfile=$PXE_ROM,bootindex=1" \
		-netdev tap,id=wl,ifname=tap1,script=no,downscript=no -device "virtio-net-pci,netdev=wl,mac=$MAC_PREFIX:c8:00,romfile=" \
		-drive "file=$dir/disk.img,format=raw,if=none,id=d0,cache=unsafe" \
		-device "virtio-blk-pci,drive=d0,serial=${VM_DISK_SERIAL:-LAB-DISK},bootindex=2" "${decoy[@]}" \
		-daemonize -pidfile "$dir/qemu.pid" </dev/null >>"$dir/chassis.log" 2>&1 ||
		{ echo "qemu failed to start; see $dir/chassis.log"; return 1; }
	qemu_alive || { echo "qemu exited at once; see $dir/chassis.log"; return 1; }
}

power_on() {
	qemu_alive && return 0
	[[ ${VM_BOOT:-kit} != pxe ]] || { power_on_pxe; return; }
	[[ -s $CMDLINE_FILE ]] || { echo "no kernel command line at $CMDLINE_FILE (nothing to boot: the appliance renders it)"; return 1; }
	local kit rendered args
	# --check only: this runs inside the lab namespace, which has no route out; `make fixtures` builds the kit.
	kit=$(APPLIANCE_CACHE=$APPLIANCE_CACHE "$KIT_SCRIPT" --check 2>>"$dir/chassis.log") ||
		{ echo "VM kit not built ($KIT_SCRIPT --check failed; run make fixtures); see $dir/chassis.log"; return 1; }
	cp "$kit/base.cpio.gz" "$dir/initrd.img.tmp"
	if [[ -x $HOSTAGENT ]]; then
		local stage
		stage=$(mktemp -d)
		mkdir -p "$stage/bin"
		cp "$HOSTAGENT" "$stage/bin/hostagent"
		(cd "$stage" && find . | cpio -o -H newc --quiet -R 0:0 | gzip -1) >>"$dir/initrd.img.tmp"
		rm -rf "$stage"
	else
		echo "chassis.sh: $HOSTAGENT missing: initramfs without /bin/hostagent" >>"$dir/chassis.log"
	fi
	mv "$dir/initrd.img.tmp" "$dir/initrd.img"
	rendered=$(tr '\n' ' ' <"$CMDLINE_FILE")
	args="console=ttyS0 panic=-1"
	[[ " $rendered" == *" ip="* ]] || args+=" $NET_ARGS"
	args+=" $rendered"
	local decoy=()
	if [[ -n ${VM_DECOY_GB:-} ]]; then
		[[ -e $dir/decoy.img ]] || truncate -s "${VM_DECOY_GB}G" "$dir/decoy.img" || { echo "cannot create $dir/decoy.img"; return 1; }
		decoy=(-drive "file=$dir/decoy.img,format=raw,if=none,id=d1,cache=unsafe" -device "virtio-blk-pci,drive=d1,serial=DECOY-$NODE,bootindex=3")
	fi
	local prefix=${MAC_PREFIX//:/}
	local uuid=${SYSTEM_UUID:-$prefix-6400-4000-8000-${prefix}6400}
	rm -f "$dir/qemu.pid"
	printf '\n=== power on %s: %s\n' "$(date -u +%FT%T.%NZ)" "$args" >>"$dir/console.log"
	date +%s%N >"$dir/powered-on"
	nsenter --net="/run/netns/$NETNS" -- qemu-system-x86_64 -name "$NODE,process=$NETNS" \
		-accel tcg -cpu qemu64,+rdrand -m "$MEMORY_MB" -smp 1 -nodefaults -no-user-config -display none -uuid "$uuid" \
		-chardev "file,id=con,path=$dir/console.log,append=on" -serial chardev:con \
		-kernel "$kit/vmlinuz" -initrd "$dir/initrd.img" -append "$args" \
		-netdev tap,id=cp,ifname=tap0,script=no,downscript=no -device "virtio-net-pci,netdev=cp,mac=$MAC_PREFIX:64:00" \
		-netdev tap,id=wl,ifname=tap1,script=no,downscript=no -device "virtio-net-pci,netdev=wl,mac=$MAC_PREFIX:c8:00" \
		-daemonize -pidfile "$dir/qemu.pid" </dev/null >>"$dir/chassis.log" 2>&1 ||
		{ echo "qemu failed to start; see $dir/chassis.log"; return 1; }
	qemu_alive || { echo "qemu exited at once; see $dir/chassis.log"; return 1; }
}

power_off() {
	qemu_alive || { rm -f "$dir/qemu.pid"; return 0; }
	local pid i
	pid=$(<"$dir/qemu.pid")
	kill -TERM "$pid" 2>/dev/null
	for ((i = 0; i < 50; i++)); do [[ -e /proc/$pid ]] || break; sleep 0.1; done
	[[ -e /proc/$pid ]] && kill -KILL "$pid" 2>/dev/null
	for ((i = 0; i < 50; i++)); do [[ -e /proc/$pid ]] || break; sleep 0.1; done
	[[ -e /proc/$pid ]] && { echo "qemu pid $pid survived SIGKILL"; return 1; }
	printf '\n=== power off %s\n' "$(date -u +%FT%T.%NZ)" >>"$dir/console.log"
	rm -f "$dir/qemu.pid"
}

case $op in
get)
	for parm; do
		case $parm in
		power) qemu_alive && echo power:1 || echo power:0 ;;
		boot) echo "boot:$(cat "$dir/boot" 2>/dev/null || echo default)" ;;
		*) echo "Invalid parameter: $parm"; exit 1 ;;
		esac
	done
	;;
set)
	while (($#)); do
		parm=$1 val=${2:-}
		[[ -n $val ]] || { echo "No value present for parameter $parm"; exit 1; }
		shift 2
		case $parm in
		power)
			case $val in
			1) power_on || exit 1 ;;
			0) power_off || exit 1 ;;
			*) echo "Invalid power value: $val"; exit 1 ;;
			esac
			;;
		reset) [[ $val == 1 ]] && { power_off && power_on || exit 1; } ;;
		boot)
			case $val in
			none | pxe | cdrom | bios | disk | default) echo "$val" >"$dir/boot" ;;
			*) echo "Invalid boot value: $val"; exit 1 ;;
			esac
			;;
		identify) shift || true ;; # identify INTERVAL FORCE: no light to blink
		*) echo "Invalid parameter: $parm"; exit 1 ;;
		esac
	done
	;;
check) exit 1 ;; # not supported, as in OpenIPMI's example
*) echo "Unknown operation: $op"; exit 1 ;;
esac
