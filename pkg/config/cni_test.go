package config

import (
	"strings"
	"testing"
)

// The lab's networks block, edited by the CNI tests.
const (
	labWorkloadPlane = "  workloadPlane:\n    cidrs: [10.200.0.0/24]\n"
	labControlPlane  = "  controlPlane:\n    cidrs: [10.100.0.0/24]\n"
	labServices      = "  services: 10.96.0.0/16\n"
)

func TestCNIValid(t *testing.T) {
	for name, tt := range map[string]struct {
		edits   []string
		cni     string
		podMTU  int
		warning string
	}{
		"default":            {cni: CNIBridge},
		"calico":             {edits: []string{labServices, labServices + "  cni: calico\n"}, cni: CNICalico},
		"calico, mtu 1500":   {edits: []string{labServices, labServices + "  cni: calico\n", labWorkloadPlane, labWorkloadPlane + "    mtu: 1500\n"}, cni: CNICalico, podMTU: 1450},
		"calico, jumbo":      {edits: []string{labServices, labServices + "  cni: calico\n", labWorkloadPlane, labWorkloadPlane + "    mtu: 9000\n"}, cni: CNICalico, podMTU: 8950},
		"calico, mtu 626":    {edits: []string{labServices, labServices + "  cni: calico\n", labWorkloadPlane, labWorkloadPlane + "    mtu: 626\n"}, cni: CNICalico, podMTU: MinPodMTU},
		"flannel":            {edits: []string{labServices, labServices + "  cni: flannel\n"}, cni: CNIFlannel},
		"flannel, mtu 1500":  {edits: []string{labServices, labServices + "  cni: flannel\n", labWorkloadPlane, labWorkloadPlane + "    mtu: 1500\n"}, cni: CNIFlannel, podMTU: 1450},
		"flannel, jumbo":     {edits: []string{labServices, labServices + "  cni: flannel\n", labWorkloadPlane, labWorkloadPlane + "    mtu: 9000\n"}, cni: CNIFlannel, podMTU: 8950},
		"bridge, mtu unused": {edits: []string{labServices, labServices + "  cni: bridge\n", labWorkloadPlane, labWorkloadPlane + "    mtu: 1500\n"}, cni: CNIBridge, podMTU: 1450, warning: "networks.workloadPlane.mtu"},
	} {
		t.Run(name, func(t *testing.T) {
			c, warns, errs := labWith(t, "", tt.edits...)
			if len(errs) > 0 {
				t.Fatalf("errors %v", errs)
			}
			var wantWarns []string
			if tt.warning != "" {
				wantWarns = []string{tt.warning}
			}
			var got []string
			for _, w := range warns {
				got = append(got, w.Path)
			}
			if strings.Join(got, ",") != strings.Join(wantWarns, ",") {
				t.Errorf("warnings %v, want paths %v", warns, wantWarns)
			}
			if c.Networks.CNI != tt.cni || c.Networks.PodMTU() != tt.podMTU {
				t.Errorf("cni %q, pod MTU %d; want %q, %d", c.Networks.CNI, c.Networks.PodMTU(), tt.cni, tt.podMTU)
			}
		})
	}
}

// TestCNIInvalid asserts the exact set of error paths, each with what its message must say.
func TestCNIInvalid(t *testing.T) {
	type want struct{ path, msg string }
	for _, tt := range []struct {
		name  string
		edits []string
		want  []want
	}{
		{"unknown CNI", []string{labServices, labServices + "  cni: weave\n"},
			[]want{{"networks.cni", `"weave" is not a CNI the appliance deploys: write "bridge" (one L2 segment, no NetworkPolicy), "flannel" (VXLAN across subnets, no NetworkPolicy) or "calico"`}}},
		{"flannel, MTU without room for VXLAN", []string{labServices, labServices + "  cni: flannel\n", labWorkloadPlane, labWorkloadPlane + "    mtu: 620\n"},
			[]want{{"networks.workloadPlane.mtu", "620 leaves 570 bytes for pods after the 50-byte VXLAN encapsulation; pods need at least 576 (RFC 791): write the interfaces' real MTU (at least 626)"}}},
		{"MTU without room for VXLAN", []string{labServices, labServices + "  cni: calico\n", labWorkloadPlane, labWorkloadPlane + "    mtu: 600\n"},
			[]want{{"networks.workloadPlane.mtu", "600 leaves 550 bytes for pods after the 50-byte VXLAN encapsulation; pods need at least 576 (RFC 791): write the interfaces' real MTU (at least 626)"}}},
		{"MTU 625", []string{labWorkloadPlane, labWorkloadPlane + "    mtu: 625\n"},
			[]want{{"networks.workloadPlane.mtu", "625 leaves 575 bytes for pods"}}},
		{"negative MTU", []string{labWorkloadPlane, labWorkloadPlane + "    mtu: -1\n"},
			[]want{{"networks.workloadPlane.mtu", "-1 is not valid: write an integer from 0 to"}}},
		{"MTU over 65535", []string{labWorkloadPlane, labWorkloadPlane + "    mtu: 65536\n"},
			[]want{{"networks.workloadPlane.mtu", "65536 is out of range: write the node interfaces' MTU in bytes (e.g. 1500, or 9000 for jumbo frames), at most 65535"}}},
		{"control-plane MTU", []string{labControlPlane, labControlPlane + "    mtu: 1500\n"},
			[]want{{"networks.controlPlane.mtu", "is not used: only networks.workloadPlane.mtu sets the pod network's MTU"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, errs := labWith(t, "", tt.edits...)
			if len(errs) != len(tt.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(errs), len(tt.want), errs)
			}
			for i, w := range tt.want {
				if errs[i].Path != w.path || !strings.Contains(errs[i].Msg, w.msg) {
					t.Errorf("error %d = %s: %s; want %s: …%s…", i, errs[i].Path, errs[i].Msg, w.path, w.msg)
				}
				if errs[i].Line == 0 {
					t.Errorf("error %d (%s) has no line", i, errs[i].Path)
				}
			}
		})
	}
}

// TestCNIEmptyAfterDefaults: a configuration built in Go without SetDefaults is refused with the
// field path, not deployed without a network.
func TestCNIEmptyAfterDefaults(t *testing.T) {
	c, _, errs := labWith(t, "")
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	c.Networks.CNI = ""
	_, errs = Validate(c, ValidateOptions{})
	if len(errs) != 1 || errs[0].Path != "networks.cni" || !strings.Contains(errs[0].Msg, `is required: write "bridge", "flannel" or "calico"`) {
		t.Errorf("errors %v, want one at networks.cni", errs)
	}
}
