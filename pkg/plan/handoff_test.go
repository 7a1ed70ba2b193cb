package plan

import (
	"slices"
	"strings"
	"testing"
)

// TestBuildHandoff: before the switch only the control planes get the in-cluster mirror (its image,
// port, the appliance as upstream, their own certificate) and every node keeps the appliance's mirrors;
// once switched, every node's containerd mirrors list the control planes' mirrors in inventory order and
// its apt source their /repo, and a control plane without a certificate is neither a mirror nor listed.
func TestBuildHandoff(t *testing.T) {
	in := labInputs(t)
	h := &Handoff{Image: "appliance.local/airgap-appliance/appliance@sha256:aa", Port: 5443,
		Certs:            map[string]CertPair{"cp1": {[]byte("c1"), []byte("k1")}, "cp2": {[]byte("c2"), []byte("k2")}},
		DigestOnlyImages: []string{"registry.k8s.io/etcd@sha256:" + strings.Repeat("e", 64)}}
	in.Handoff = h
	p, err := Build(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range p.Nodes {
		nc := n.NodeConfig
		if nc.Handoff == nil {
			t.Fatalf("%s: no handoff config", n.Name)
		}
		m := nc.Handoff.Mirror
		switch n.Name {
		case "cp1", "cp2":
			if m == nil || m.Image != h.Image || m.Port != 5443 || m.Upstream != in.ApplianceURL || m.CertPEM != "c"+n.Name[2:] || m.KeyPEM != "k"+n.Name[2:] ||
				!slices.Equal(m.Images, h.DigestOnlyImages) {
				t.Errorf("%s: mirror %+v", n.Name, m)
			}
		default:
			if m != nil {
				t.Errorf("%s runs a mirror without a certificate or the role: %+v", n.Name, m)
			}
		}
		if len(nc.Handoff.RepoURLs) != 0 || nc.Mirrors[0].Endpoints != nil || nc.Mirrors[0].Endpoint != in.ApplianceURL+"/v2/registry.k8s.io" {
			t.Errorf("%s switched before the switch: %+v %+v", n.Name, nc.Handoff, nc.Mirrors)
		}
	}
	h.Switched = true
	if p, err = Build(in); err != nil {
		t.Fatal(err)
	}
	wantRepo := []string{"https://10.100.0.11:5443/repo", "https://10.100.0.12:5443/repo"}
	for _, n := range p.Nodes {
		nc := n.NodeConfig
		if !slices.Equal(nc.Handoff.RepoURLs, wantRepo) {
			t.Errorf("%s: repo URLs %v, want %v", n.Name, nc.Handoff.RepoURLs, wantRepo)
		}
		for _, m := range nc.Mirrors {
			want := []string{"https://10.100.0.11:5443/v2/" + m.Registry, "https://10.100.0.12:5443/v2/" + m.Registry}
			if !slices.Equal(m.Endpoints, want) || m.Endpoint != want[0] {
				t.Errorf("%s: mirror of %s: %s %v, want %v", n.Name, m.Registry, m.Endpoint, m.Endpoints, want)
			}
		}
	}
	h.Certs = nil
	if _, err := Build(in); err == nil {
		t.Errorf("a switch with no mirror at all was accepted")
	}
}
