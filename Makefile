# The bootstrap appliance. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO        ?= go
BIN       := $(CURDIR)/bin
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/airgap-appliance/appliance/pkg/version.Version=$(VERSION)
# Fixtures (bundle, images, .debs) live outside the repo, keyed by version inside.
export APPLIANCE_CACHE ?= /var/cache/appliance
LAB_CONFIG := test/lab/bootstrap.yaml
LAB_STATE  := /var/lib/appliance-lab/state
KUBERNETES_VERSION := v1.37.2
# The nodes' container runtime (test/fixtures/build-containerd.sh; pinned again in build-bundle.sh).
CONTAINERD_VERSION := v2.3.7
RUNC_VERSION := v1.5.3
# Each stage (deps, build, every fixture, every suite) runs through test/stage.sh: timed, quiet unless V=1.
STAGE := test/stage.sh

# Debian packages the tests and the lab drive as real peers. redfishtool (DMTF) and python3-sushy
# (OpenStack/Ironic) are third-party Redfish clients that check the lab's own Redfish BMC emulator
# (test/redfishbmc; HPE's ilorest was tried and cannot drive a non-HPE service: see its conformance
# test); nbdkit's curl plugin streams its virtual media (InsertMedia TransferMethod Stream).
# libseccomp-dev (libseccomp.a) and pkg-config build the nodes' runc with seccomp (build-containerd.sh).
DEB_PACKAGES := skopeo containerd runc nftables keepalived haproxy openssh-server ignition nginx wrk jq bc \
	iproute2 iputils-ping ca-certificates curl openssl apt-utils dpkg-dev busybox-static xz-utils \
	docker-registry systemd-container debootstrap openipmi ipmitool qemu-system-x86 cpio openssh-client util-linux libc6-dev gcc \
	containernetworking-plugins libc-bin debian-archive-keyring gpgv \
	grub-common grub-pc-bin grub-efi-amd64-bin xorriso mtools squashfs-tools ovmf dosfstools kmod e2fsprogs \
	redfishtool python3-sushy nbdkit ipxe \
	bind9-utils bind9-dnsutils \
	grub2-common fdisk \
	libseccomp-dev pkg-config

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z][a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

.PHONY: deps
deps: ## install the Debian packages the tests and lab use (apt-get; nothing when all present)
	@$(STAGE) deps -- test/deps.sh $(DEB_PACKAGES)

.PHONY: build
build: ## build bin/appliance and bin/hostagent
	@$(STAGE) build -- $(MAKE) --no-print-directory build-bin

.PHONY: build-bin
build-bin:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/appliance ./cmd/appliance
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/hostagent ./cmd/hostagent

# Every fixture is built here, in the root namespace (it downloads from the Go module proxy and Debian's
# mirror), before any test or lab needs it: nothing inside a lab namespace ever downloads (issue 8).
# Two chains at once: the Kubernetes binaries (the Go compiler: CPU) and what needs them, beside the
# Debian systems that need nothing else (debootstrap: mostly the mirror and dpkg).
.PHONY: fixtures fixtures-kubernetes-chain fixtures-systems fixtures-demo fixtures-bundle fixtures-rootfs fixtures-debian
fixtures: deps ## build (or reuse) Kubernetes binaries, node rootfs, VM kit, bundle (with the node image), ISO and node image systems under $(APPLIANCE_CACHE)
	@$(MAKE) --no-print-directory -j2 fixtures-kubernetes-chain fixtures-systems

fixtures-kubernetes-chain: fixtures-bundle
	@$(STAGE) fixture-node-image -- iso/build-node-image.sh --system-only

fixtures-systems: fixtures-debian
	@$(STAGE) fixture-vmkit -- test/fixtures/build-vmkit.sh
	@$(STAGE) fixture-iso-system -- iso/build-iso.sh --system-only

# What make demo boots and nothing else: the Kubernetes chain up to the bundle (its node image inside,
# so that make check reuses the same bundle) beside the Debian systems (the node image base, the nodes' root filesystem); not the VM kit, the ISO
# system or the node image stage, which only the VM suites boot.
fixtures-demo: deps
	@$(MAKE) --no-print-directory -j2 fixtures-bundle fixtures-debian

fixtures-bundle:
	@$(STAGE) fixture-kubernetes -- test/fixtures/build-kubernetes.sh $(KUBERNETES_VERSION)
	@$(STAGE) fixture-containerd -- env RUNC_VERSION=$(RUNC_VERSION) test/fixtures/build-containerd.sh $(CONTAINERD_VERSION)
	@$(STAGE) fixture-bundle -- test/fixtures/build-bundle.sh

fixtures-rootfs:
	@$(STAGE) fixture-rootfs -- test/fixtures/build-rootfs.sh

# The Debian systems that need no bundle, beside the Kubernetes chain: the node image's base first (the
# bundle's node image starts from it: its debootstrap is then off the bundle's path), then the nodes' rootfs.
fixtures-debian:
	@$(STAGE) fixture-node-base -- iso/build-node-image.sh --base-only
	@$(MAKE) --no-print-directory fixtures-rootfs

.PHONY: test
test: deps build fixtures ## the contributor's loop: unit, real-peer and privileged lab tests, -short: no VM, no Kubernetes component, no minute-long timer (those say SKIPPED UNDER -short; make check runs them)
	@# Compile every test binary first, then run four packages at a time: under -short no package boots a
	@# VM or runs Kubernetes, so most of a package's time is waiting on a peer or a VRRP timer (load ~2
	@# with -p 4 on 2 cores; 2026-11-29, warm: -p 1 883 s, -p 4 375 s, every package green). make check
	@# keeps -p 1 for its suite-test (without -short, beside the VM lane).
	@$(STAGE) compile-tests -- $(GO) test -race -count=1 -run '^$$' ./...
	@$(STAGE) suite-test --show -- $(GO) test -race -short -count=1 -p 4 -timeout 40m ./...

# The second proofs: tests that prove a capability make check already proves once. The node image's
# UEFI install (make check: its BIOS install, n2 of TestBareMetalWorkerJoinsCluster) and the ISO's
# boots (make check: TestISOJourney boots it with BIOS and reboots it with UEFI, state kept). make
# check skips them (go test -skip), make check-full runs them.
FULL_ONLY := TestNodeImageISOInstallUEFI|TestISOBoot

.PHONY: check
check: ## CI's tier (.ci/run): make test's packages with their VM tests, plus one end-to-end proof of every capability, arranged for 2 cores (test/check.sh; budget 40 min warm, 70 min cold)
	@GO=$(GO) MAKE=$(MAKE) CHECK_TIER=check FULL_ONLY='$(FULL_ONLY)' test/check.sh

.PHONY: check-full
check-full: ## make check, then the second proofs (FULL_ONLY: the node image's UEFI install, the ISO's boots) and every benchmark (make bench)
	@GO=$(GO) MAKE=$(MAKE) CHECK_TIER=full FULL_ONLY='$(FULL_ONLY)' test/check.sh

.PHONY: e2e
e2e: deps build fixtures ## the end to end suites: blank TCG machines to Kubernetes nodes (PXE behind ipmi_sim, Redfish virtual media behind the lab's own Redfish BMC); the appliance ISO booted in QEMU (BIOS, UEFI, refusals); lab up → bundle → appliance bootstrap → HA cluster proofs → lab down
	@$(STAGE) suite-kubernetes-fixture --show -- $(GO) test -tags e2e -count=1 -p 1 -timeout 60m ./test/fixtures/kubernetes/
	@$(STAGE) suite-nodeimage --show -- bash -c "set -o pipefail; $(GO) test -tags e2e -race -count=1 -p 1 -timeout 30m -v ./test/nodeimage/ 2>&1 | grep -vE '^=== (RUN|PAUSE|CONT)'"
	@$(STAGE) suite-iso --show -- bash -c "set -o pipefail; $(GO) test -tags e2e -count=1 -p 1 -timeout 30m -v ./test/iso/ 2>&1 | grep -vE '^=== (RUN|PAUSE|CONT)'"
	@$(STAGE) suite-e2e --show -- bash -c "set -o pipefail; $(GO) test -tags e2e -count=1 -p 1 -timeout 60m -v -run 'TestKubernetesE2E|TestISOJourney' ./test/integration/ 2>&1 | grep -vE '^=== (RUN|PAUSE|CONT)'"

.PHONY: iso
iso: deps build fixtures ## the appliance ISO (iso/build-iso.sh) with the fixture bundle, cached by content under $(APPLIANCE_CACHE)/iso
	@$(STAGE) iso --show -- iso/build-iso.sh --bundle $(APPLIANCE_CACHE)/bundle

.PHONY: node-image
node-image: deps build fixtures ## the node image (iso/build-node-image.sh: vmlinuz, initrd.img, rootfs.squashfs, node-amd64.iso) in $(APPLIANCE_CACHE)/node-image
	@$(STAGE) node-image --show -- iso/build-node-image.sh --bundle $(APPLIANCE_CACHE)/bundle --hostagent $(BIN)/hostagent

.PHONY: e2e-iso
e2e-iso: deps build fixtures ## the ISO suites alone: test/iso (boots, refusals) and TestISOJourney (the lab bootstrapped from the ISO)
	@$(STAGE) suite-iso --show -- bash -c "set -o pipefail; $(GO) test -tags e2e -count=1 -p 1 -timeout 30m -v ./test/iso/ 2>&1 | grep -vE '^=== (RUN|PAUSE|CONT)'"
	@$(STAGE) suite-iso-journey --show -- bash -c "set -o pipefail; $(GO) test -tags e2e -count=1 -p 1 -timeout 40m -v -run 'TestISOJourney' ./test/integration/ 2>&1 | grep -vE '^=== (RUN|PAUSE|CONT)'"

.PHONY: lint
lint: ## gofmt, go vet, go mod tidy check
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) mod tidy -diff

.PHONY: lab-up
lab-up: deps ## create the namespace lab (fabric, bootstrap host, 3 control planes, 1 worker)
	LAB_WORKER_KIND=nspawn test/lab/lab.sh up 3 1

.PHONY: lab-down
lab-down: ## stop the lab (appliance, nodes, namespaces) and remove all it made under /var/lib/appliance-lab
	@test/lab/purge.sh /var/lib/appliance-lab

.PHONY: demo
demo: deps ## bootstrap the appliance on the lab and pull from it as a node would (builds only the fixtures it boots)
	@# bin/ beside the fixtures: the appliance's own compile overlaps the Kubernetes modules' download
	@# and the Debian systems' debootstrap (fixtures-demo runs its own two jobs).
	@$(MAKE) --no-print-directory -j2 build fixtures-demo
	@$(MAKE) --no-print-directory lab-up
	test/lab/demo.sh

.PHONY: bench
bench: deps build fixtures ## speed benchmarks with ratios against reference servers (nginx, skopeo copy)
	test/bench/run.sh

.PHONY: fuzz
fuzz: ## run the fuzz targets for a short while each
	$(GO) test -run='^$$' -fuzz=FuzzLoad -fuzztime=30s -fuzzminimizetime=2s ./pkg/config
	$(GO) test -run='^$$' -fuzz=FuzzHTTPSurface -fuzztime=30s -fuzzminimizetime=2s ./pkg/server
	$(GO) test -run='^$$' -fuzz=FuzzRepositoryFor -fuzztime=15s -fuzzminimizetime=2s ./registry

.PHONY: docs
docs: ## regenerate docs/reference from the code
	$(GO) run ./cmd/docgen docs/reference && $(GO) run ./cmd/appliance docs docs/reference/cli && $(GO) run ./cmd/hostagent docs docs/reference/cli

.PHONY: clean
clean: ## remove build outputs (not the fixture cache)
	rm -rf $(BIN)
