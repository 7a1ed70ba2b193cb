package noderemove

import (
	"errors"
	"testing"
)

// TestCheckQuorum: the etcd quorum rule of a control-plane removal, with the numbers in every refusal.
func TestCheckQuorum(t *testing.T) {
	ok := func(n string) Member { return Member{Node: n, Healthy: true} }
	sick := func(n string) Member { return Member{Node: n} }
	for _, tc := range []struct {
		name    string
		members []Member
		node    string
		want    string // "" → allowed
	}{
		{"worker: no member", []Member{ok("cp1"), ok("cp2"), ok("cp3")}, "w1", ""},
		{"3 healthy, remove one", []Member{ok("cp1"), ok("cp2"), ok("cp3")}, "cp2", ""},
		{"2 healthy, remove one (1 of 1 left)", []Member{ok("cp1"), ok("cp2")}, "cp2", ""},
		{"the unhealthy one of 3 can go", []Member{ok("cp1"), ok("cp2"), sick("cp3")}, "cp3", ""},
		{"5 members, 2 unhealthy, remove a third sick one", []Member{ok("cp1"), ok("cp2"), ok("cp3"), sick("cp4"), sick("cp5")}, "cp5", ""},
		{"last control plane", []Member{ok("cp1")}, "cp1",
			"refused: cp1 is the last control plane (the only etcd member): removing it would destroy the cluster; add another control plane first"},
		{"healthy one of 3 while another is sick", []Member{ok("cp1"), ok("cp2"), sick("cp3")}, "cp2",
			"refused: 3 etcd members, 1 unhealthy (cp3): removing cp2 leaves 1 healthy of the 2 needed; fix cp3 first"},
		{"2 members, 1 sick: no quorum now, even to remove the sick one", []Member{ok("cp1"), sick("cp2")}, "cp2",
			"refused: 2 etcd members, 1 unhealthy (cp2): etcd has no quorum now (1 healthy of the 2 needed), so it cannot remove a member; fix cp2 first"},
		{"no quorum now", []Member{ok("cp1"), sick("cp2"), sick("cp3")}, "cp3",
			"refused: 3 etcd members, 2 unhealthy (cp2, cp3): etcd has no quorum now (1 healthy of the 2 needed), so it cannot remove a member; fix cp2, cp3 first"},
		{"5 members, 2 sick, remove a healthy one", []Member{ok("cp1"), ok("cp2"), ok("cp3"), sick("cp4"), sick("cp5")}, "cp1",
			"refused: 5 etcd members, 2 unhealthy (cp4, cp5): removing cp1 leaves 2 healthy of the 3 needed; fix cp4, cp5 first"},
		{"4 members, 1 sick, remove a healthy one", []Member{ok("cp1"), ok("cp2"), ok("cp3"), sick("cp4")}, "cp1", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckQuorum(tc.members, tc.node)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Fatalf("error %v\nwant %s", err, tc.want)
			case tc.want != "" && !errors.Is(err, ErrRefused):
				t.Fatalf("error %v does not wrap ErrRefused", err)
			}
		})
	}
}
