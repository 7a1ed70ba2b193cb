// Package csrapprove approves the kubelets' serving-certificate requests that kubeadm leaves pending
// (kubernetes #73356), and denies every other request for that signer.
//
// With `serverTLSBootstrap: true` (kubeadm-manifests) each kubelet asks for its serving certificate
// with a CertificateSigningRequest for the signer kubernetes.io/kubelet-serving; kube-controller-
// manager signs it once something approves it, and nothing in a kubeadm cluster does. The rule
// (Decide) approves a request only when it comes from a node of the inventory (the configuration's
// nodes[]) that this appliance provisioned, and asks for exactly that node's names and addresses;
// anything looser would let a compromised node obtain a certificate for another node's address and
// impersonate its kubelet. Requests for other signers are left alone (kube-controller-manager
// approves the kubelets' client certificates itself).
//
// The loop (Approver) watches CSRs through the Kubernetes API (plain REST, see kubeapi.go) and records each
// verdict through the /approval subresource with the condition kube-controller-manager's own
// approver uses: Approved or Denied, reason AutoApproved or AutoDenied, and a message saying why.
// It needs only a kubeconfig with a client certificate or token.
package csrapprove

import (
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Names fixed by Kubernetes (k8s.io/api/certificates/v1, the Node authorizer).
const (
	// SignerKubeletServing is the signer of kubelet serving certificates.
	SignerKubeletServing = "kubernetes.io/kubelet-serving"
	// NodeUserPrefix prefixes a node's user name: "system:node:<node name>".
	NodeUserPrefix = "system:node:"
	// NodesGroup is the group every node's credentials carry.
	NodesGroup = "system:nodes"

	// ReasonApproved and ReasonDenied are the conditions' reasons (kube-controller-manager's
	// csrapproving controller uses the same words for the client certificates it approves).
	ReasonApproved = "AutoApproved"
	ReasonDenied   = "AutoDenied"
)

// Key usages as certificates/v1 spells them (KeyUsage).
const (
	UsageDigitalSignature = "digital signature"
	UsageKeyEncipherment  = "key encipherment"
	UsageServerAuth       = "server auth"
)

// Node is what the rule knows of one node of the inventory.
type Node struct {
	// Name is the node name (config nodes[].name), also the Kubernetes Node name and the only DNS
	// name a kubelet started with --hostname-override=<name> puts in its request.
	Name string
	// Hostnames are further DNS names the node may ask for. The configuration gives none today.
	Hostnames []string
	// Addresses are the node's addresses (config nodes[].addresses: control-plane and
	// workload-plane); the request's IP SANs must be among them.
	Addresses []netip.Addr
	// Provisioned is true when this appliance provisioned the node (see FromConfig); a node of the
	// inventory that it did not provision gets no certificate.
	Provisioned bool
}

// Inventory maps node names to nodes.
type Inventory map[string]Node

// Request is what the rule reads of a CertificateSigningRequest (certificates/v1 spec).
type Request struct {
	SignerName string
	// Username and Groups are the requestor's, as the API server recorded them (spec.username,
	// spec.groups); the requestor cannot set them.
	Username string
	Groups   []string
	// Usages are spec.usages.
	Usages []string
	// PEM is spec.request: a PEM "CERTIFICATE REQUEST" block (PKCS #10, RFC 2986).
	PEM []byte
}

// Verdict is what the rule says about a request.
type Verdict int

const (
	// Ignore: not a kubelet-serving request; leave it to whoever handles its signer.
	Ignore Verdict = iota
	Approve
	Deny
)

func (v Verdict) String() string {
	switch v {
	case Approve:
		return "approve"
	case Deny:
		return "deny"
	}
	return "ignore"
}

// Decision is a verdict and the message recorded with it.
type Decision struct {
	Verdict Verdict
	// Node is the node name taken from the requestor ("" when the requestor is not a node).
	Node string
	// Message says why: for Deny every check that failed, joined by "; ".
	Message string
}

// Reason is the condition reason for the decision: ReasonApproved, ReasonDenied, or "" for Ignore.
func (d Decision) Reason() string {
	switch d.Verdict {
	case Approve:
		return ReasonApproved
	case Deny:
		return ReasonDenied
	}
	return ""
}

// Decide applies the rule to one request. It approves a request for SignerKubeletServing only when
// all of these hold, and denies it naming each one that does not:
//
//   - the requestor is "system:node:<name>" in group system:nodes;
//   - <name> is a node of inv that this appliance provisioned;
//   - spec.request is one PEM CERTIFICATE REQUEST with a valid self-signature;
//   - its subject is exactly CN=system:node:<name>, O=system:nodes;
//   - the usages are digital signature and server auth, with or without key encipherment (kubelets
//     with RSA keys ask for it, ECDSA ones do not), and nothing else;
//   - it has at least one DNS or IP SAN; DNS SANs are only <name> and the node's Hostnames, IP SANs
//     only the node's Addresses; no e-mail or URI SANs.
//
// Requests for any other signer are Ignore. Decide has no side effects.
func Decide(inv Inventory, r Request) Decision {
	if r.SignerName != SignerKubeletServing {
		return Decision{Verdict: Ignore, Message: fmt.Sprintf("signer %s is not %s", r.SignerName, SignerKubeletServing)}
	}
	var bad []string
	name, isNode := strings.CutPrefix(r.Username, NodeUserPrefix)
	if !isNode || name == "" {
		bad = append(bad, fmt.Sprintf("requestor %q is not a node (want %s<node name>)", r.Username, NodeUserPrefix))
		name = ""
	}
	if !slices.Contains(r.Groups, NodesGroup) {
		bad = append(bad, fmt.Sprintf("requestor groups %q lack %s", r.Groups, NodesGroup))
	}
	node, known := inv[name]
	switch {
	case name == "":
	case !known:
		bad = append(bad, fmt.Sprintf("node %q is not in the inventory (nodes[])", name))
	case !node.Provisioned:
		bad = append(bad, fmt.Sprintf("node %q was not provisioned by this appliance", name))
	}
	if u := checkUsages(r.Usages); u != "" {
		bad = append(bad, u)
	}
	csr, err := parse(r.PEM)
	if err != nil {
		bad = append(bad, err.Error())
	} else {
		bad = append(bad, checkSubject(csr, name)...)
		if known && node.Provisioned {
			bad = append(bad, checkSANs(csr, node)...)
		} else if len(csr.DNSNames)+len(csr.IPAddresses) == 0 {
			bad = append(bad, "no DNS or IP subject alternative name")
		}
	}
	if len(bad) > 0 {
		return Decision{Verdict: Deny, Node: name, Message: "kubelet serving certificate request denied: " + strings.Join(bad, "; ")}
	}
	return Decision{Verdict: Approve, Node: name, Message: fmt.Sprintf(
		"kubelet serving certificate for inventory node %s approved: subject, usages and SANs (%s) match the inventory",
		name, strings.Join(sans(csr), ", "))}
}

func parse(p []byte) (*x509.CertificateRequest, error) {
	block, rest := pem.Decode(p)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("spec.request is not a PEM CERTIFICATE REQUEST block")
	}
	if len(strings.TrimSpace(string(rest))) > 0 {
		return nil, fmt.Errorf("spec.request has data after its CERTIFICATE REQUEST block")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("spec.request does not parse: %v", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("spec.request signature does not verify: %v", err)
	}
	return csr, nil
}

func checkUsages(usages []string) string {
	have := map[string]bool{}
	var extra []string
	for _, u := range usages {
		switch u {
		case UsageDigitalSignature, UsageKeyEncipherment, UsageServerAuth:
			have[u] = true
		default:
			extra = append(extra, u)
		}
	}
	var missing []string
	for _, u := range []string{UsageDigitalSignature, UsageServerAuth} {
		if !have[u] {
			missing = append(missing, u)
		}
	}
	if len(extra)+len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("usages %q are not the serving ones (%s, %s, optionally %s): extra %q, missing %q",
		usages, UsageDigitalSignature, UsageServerAuth, UsageKeyEncipherment, extra, missing)
}

// Attribute types of X.500 names (RFC 4519 section 2).
var (
	oidCommonName   = asn1.ObjectIdentifier{2, 5, 4, 3}
	oidOrganization = asn1.ObjectIdentifier{2, 5, 4, 10}
)

func checkSubject(csr *x509.CertificateRequest, name string) []string {
	var bad []string
	s := csr.Subject
	if name != "" && s.CommonName != NodeUserPrefix+name {
		bad = append(bad, fmt.Sprintf("subject CN %q is not %s%s", s.CommonName, NodeUserPrefix, name))
	} else if name == "" && !strings.HasPrefix(s.CommonName, NodeUserPrefix) {
		bad = append(bad, fmt.Sprintf("subject CN %q is not %s<node name>", s.CommonName, NodeUserPrefix))
	}
	if !slices.Equal(s.Organization, []string{NodesGroup}) {
		bad = append(bad, fmt.Sprintf("subject O %q is not [%s]", s.Organization, NodesGroup))
	}
	for _, atv := range s.Names {
		if !atv.Type.Equal(oidCommonName) && !atv.Type.Equal(oidOrganization) {
			bad = append(bad, fmt.Sprintf("subject %q has attributes besides CN and O", s.String()))
			break
		}
	}
	if len(csr.EmailAddresses) > 0 {
		bad = append(bad, fmt.Sprintf("e-mail SANs %q are not allowed", csr.EmailAddresses))
	}
	if len(csr.URIs) > 0 {
		var uris []string
		for _, u := range csr.URIs {
			uris = append(uris, u.String())
		}
		bad = append(bad, fmt.Sprintf("URI SANs %q are not allowed", uris))
	}
	return bad
}

func checkSANs(csr *x509.CertificateRequest, n Node) []string {
	var bad []string
	if len(csr.DNSNames)+len(csr.IPAddresses) == 0 {
		bad = append(bad, "no DNS or IP subject alternative name")
	}
	allowed := append([]string{n.Name}, n.Hostnames...)
	for _, d := range csr.DNSNames {
		if !slices.Contains(allowed, d) {
			bad = append(bad, fmt.Sprintf("DNS SAN %q is not node %s's name %q", d, n.Name, allowed))
		}
	}
	for _, ip := range csr.IPAddresses {
		a, ok := netip.AddrFromSlice(ip)
		if !ok || !slices.Contains(n.Addresses, a.Unmap()) {
			bad = append(bad, fmt.Sprintf("IP SAN %s is not an address of node %s %v", ip, n.Name, n.Addresses))
		}
	}
	return bad
}

func sans(csr *x509.CertificateRequest) []string {
	out := slices.Clone(csr.DNSNames)
	for _, ip := range csr.IPAddresses {
		out = append(out, ip.String())
	}
	return out
}
