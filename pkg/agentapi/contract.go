package agentapi

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// This file is the rest of the node↔appliance contract besides the documents: the hostagent's steps
// and their order (Plan), report statuses, headers, the VRRP priority scheme both sides must agree on,
// and the CA pin format. The appliance (pkg/server, pkg/nodestate, pkg/bootstrap) and the node
// (pkg/hostagent) both import it; neither imports the other.

// Hostagent step names, in the order the hostagent runs them (Report.Step).
const (
	StepConfig     = "config"
	StepFirewall   = "firewall"
	StepPackages   = "packages"
	StepContainerd = "containerd"
	StepCNI        = "cni"
	StepKeepalived = "keepalived"
	StepAPILB      = "apilb"
	StepKubeadm    = "kubeadm"
	StepAPI        = "api"
	StepDNS        = "dns"
	StepHandoff    = "handoff"
	StepReady      = "ready"
)

// Steps lists every step name in run order (Plan picks from it).
var Steps = []string{StepConfig, StepFirewall, StepPackages, StepContainerd, StepCNI, StepKeepalived, StepAPILB, StepKubeadm, StepAPI, StepDNS, StepHandoff, StepReady}

// Report statuses (Report.Status).
const (
	StatusRunning = "running"
	StatusDone    = "done"
	StatusFailed  = "failed"
)

// BootIDHeader carries the hostagent's boot ID on GET ConfigPathV1. It is informational: fetching the
// config records nothing, a node's state moves only by its reports (Report.BootID).
const BootIDHeader = "Hostagent-Boot-Id"

// Plan returns the steps the hostagent runs for nc, in order: config, firewall; with Kubernetes
// (nc.Kubernetes set) packages; containerd; with Kubernetes cni; on control planes keepalived (when
// nc.Keepalived is set: the VIP must move before kubeadm init talks to it); on control planes apilb
// (when nc.APILoadBalancer is set: before kubeadm, because the node's own traffic for the VIP goes to
// its local HAProxy from then on); with Kubernetes kubeadm
// and, on control planes, api (the local kube-apiserver answers /readyz); dns when the node serves or
// resolves the cluster's zone (nc.DNS set: after kubeadm, whose init preflight wants an empty manifest
// directory); handoff once the hand-off has begun (nc.Handoff set); finally ready. Every step
// but ready is a configuration step: the node is configured when all of them are done.
func Plan(nc NodeConfig) []string {
	k8s := nc.Kubernetes != nil
	cp := slices.Contains(nc.Roles, "control-plane")
	steps := []string{StepConfig, StepFirewall}
	if k8s {
		steps = append(steps, StepPackages)
	}
	steps = append(steps, StepContainerd)
	if k8s {
		steps = append(steps, StepCNI)
	}
	if cp && nc.Keepalived != nil {
		steps = append(steps, StepKeepalived)
	}
	if cp && nc.APILoadBalancer != nil {
		steps = append(steps, StepAPILB)
	}
	if k8s {
		steps = append(steps, StepKubeadm)
		if cp {
			steps = append(steps, StepAPI)
		}
	}
	if nc.DNS != nil {
		steps = append(steps, StepDNS)
	}
	if nc.Handoff != nil {
		steps = append(steps, StepHandoff)
	}
	return append(steps, StepReady)
}

// The API VIP's VRRP scheme (keepalived, RFC 3768/5798 priorities 1-254). Control planes get
// VRRPControlPlaneBasePriority in inventory order, each later one one less (never below 1); a control
// plane's track script adds VRRPAPIHealthWeight while its kube-apiserver answers. The bootstrap host's
// instance (VRRPAppliancePriority) sits strictly between: above every control plane whose API is down,
// below every one whose API is up, so the VIP starts on the bootstrap host and moves to the control
// planes by preemption as their API comes up.
const (
	VRRPInstanceName             = "api-vip"
	VRRPControlPlaneBasePriority = 100
	VRRPAPIHealthWeight          = 50
	VRRPAppliancePriority        = VRRPControlPlaneBasePriority + VRRPAPIHealthWeight/2
)

// VRRPIngressInstanceName is the control planes' second keepalived instance, for the ingress VIP
// (NodeConfig.Ingress): the same peers (without the bootstrap host, which never carries it),
// priorities, interval and track script as the API's, its own VRID.
const VRRPIngressInstanceName = "ingress-vip"

// ErrBadPin is wrapped when a CA pin is not "sha256:" and 64 hex digits.
var ErrBadPin = errors.New("CA pin must be sha256:<64 hex digits>")

// PinOf is the CA pin of cert: "sha256:" + hex SHA-256 of its DER SubjectPublicKeyInfo, the format of
// kubeadm's --discovery-token-ca-cert-hash (cmd/kubeadm/app/util/pubkeypin.Hash; RFC 7469 pins the
// same bytes). It equals `openssl x509 -pubkey -noout | openssl pkey -pubin -outform der | sha256sum`.
// Pinning the key rather than the certificate keeps the pin valid across a re-issue of the CA
// certificate with the same key.
func PinOf(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ParsePin checks pin's format (PinOf's) and returns its canonical lower-case form. Errors wrap ErrBadPin.
func ParsePin(pin string) (string, error) {
	hexPart, ok := strings.CutPrefix(strings.ToLower(strings.TrimSpace(pin)), "sha256:")
	if b, err := hex.DecodeString(hexPart); !ok || err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("%w (kubeadm --discovery-token-ca-cert-hash format), got %q", ErrBadPin, pin)
	}
	return "sha256:" + hexPart, nil
}
