package noderemove

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// ErrRefused marks a removal refused before anything changed: the last control plane, a removal
// that would lose etcd quorum, a control plane the appliance cannot reach to run kubeadm reset.
// The error's text says what to fix.
var ErrRefused = errors.New("refused")

// Member is one etcd member as the removal sees it: the control-plane node it runs on and whether
// it is healthy (its etcd static pod is Ready, see Remove).
type Member struct {
	Node    string
	Healthy bool
}

// majority is the quorum of an etcd cluster of n voting members: floor(n/2)+1 (etcd's Raft
// needs a majority of the members to commit, including a membership change).
func majority(n int) int { return n/2 + 1 }

// CheckQuorum decides whether the etcd member on node can be removed from members without losing
// quorum, and returns nil when it can (also when node runs no member: a worker). Refusals wrap
// ErrRefused and carry the numbers:
//   - node is the only member: the last control plane;
//   - the healthy members are already fewer than a majority of all members (etcd cannot commit
//     the member removal itself);
//   - after the removal the healthy members left are fewer than a majority of the members left,
//     e.g. "3 etcd members, 1 unhealthy (cp3): removing cp2 leaves 1 healthy of the 2 needed; fix
//     cp3 first".
//
// Removing an unhealthy member is what restores the margin and is allowed whenever the rest keep a
// majority.
func CheckQuorum(members []Member, node string) error {
	var self *Member
	healthy := 0
	var sick []string
	for i, m := range members {
		if m.Node == node {
			self = &members[i]
		}
		if m.Healthy {
			healthy++
		} else {
			sick = append(sick, m.Node)
		}
	}
	if self == nil {
		return nil
	}
	n := len(members)
	if n == 1 {
		return fmt.Errorf("%w: %s is the last control plane (the only etcd member): removing it would destroy the cluster; add another control plane first", ErrRefused, node)
	}
	sort.Strings(sick)
	state := fmt.Sprintf("%d etcd members, %d unhealthy", n, len(sick))
	if len(sick) > 0 {
		state += " (" + strings.Join(sick, ", ") + ")"
	}
	if healthy < majority(n) {
		return fmt.Errorf("%w: %s: etcd has no quorum now (%d healthy of the %d needed), so it cannot remove a member; fix %s first",
			ErrRefused, state, healthy, majority(n), strings.Join(sick, ", "))
	}
	left := healthy
	if self.Healthy {
		left--
	}
	if need := majority(n - 1); left < need {
		others := without(sick, node)
		return fmt.Errorf("%w: %s: removing %s leaves %d healthy of the %d needed; fix %s first",
			ErrRefused, state, node, left, need, strings.Join(others, ", "))
	}
	return nil
}

func without(s []string, x string) []string {
	var out []string
	for _, v := range s {
		if v != x {
			out = append(out, v)
		}
	}
	return out
}
