package nodestate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/atomicfile"
)

// KubeadmFile is the node's kubeadm mark inside its directory (0600): written by Record the first
// time the node reports its kubeadm step done, and kept across the node's reboots (which forget the
// steps of status.json) until the node is Removed. It is what makes the appliance stop serving the
// secrets kubeadm consumed (agentapi.WithholdSecrets): the cluster CA key once the init node has
// run `kubeadm init`, a joining node's join secrets once it has joined.
const KubeadmFile = "kubeadm-done.json"

// KubeadmMark is the content of KubeadmFile.
type KubeadmMark struct {
	// Time is when the appliance recorded the report; BootID the boot that reported it.
	Time   time.Time `json:"time"`
	BootID string    `json:"bootID"`
}

// markKubeadm writes KubeadmFile for a kubeadm-done report unless it exists (the caller holds the
// node's lock).
func (s *Store) markKubeadm(node string, r agentapi.Report) error {
	if r.Step != agentapi.StepKubeadm || r.Status != agentapi.StatusDone {
		return nil
	}
	path := filepath.Join(s.dir, node, KubeadmFile)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	b, err := json.Marshal(KubeadmMark{Time: s.now(), BootID: r.BootID})
	if err != nil {
		return err
	}
	if _, err := atomicfile.Write(path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("node %s: record its kubeadm run: %w", node, err)
	}
	return nil
}

// unmarkKubeadm removes KubeadmFile (the node was removed: a node added again under the name runs
// kubeadm anew). The caller holds the node's lock.
func (s *Store) unmarkKubeadm(node string) error {
	if err := os.Remove(filepath.Join(s.dir, node, KubeadmFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("node %s: forget its kubeadm run: %w", node, err)
	}
	return nil
}

// RanKubeadm reports whether node has run kubeadm (init or join) since it was last added, by the
// appliance's records: never after a Removed entry that no Added followed; otherwise its kubeadm
// mark (KubeadmFile), its history (InCluster: ready since it was last added, the record of a
// node that joined before the mark existed), or the kubeadm step of its current boot reported done.
// It takes no lock. Errors: unreadable records (callers that hand out secrets treat an error as
// "ran": they withhold rather than leak).
func (s *Store) RanKubeadm(node string) (bool, error) {
	if err := checkNode(node); err != nil {
		return false, err
	}
	hist, err := s.History(node)
	if err != nil {
		return false, err
	}
	if last, ok := lastOf(hist, Added, Removed); ok && last.Kind == Removed {
		return false, nil
	}
	if _, err := os.Stat(filepath.Join(s.dir, node, KubeadmFile)); err == nil {
		return true, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("node %s: read its kubeadm mark: %w", node, err)
	}
	if InCluster(hist) {
		return true, nil
	}
	st, err := s.read(node)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	return st.Steps[agentapi.StepKubeadm].Status == agentapi.StatusDone, nil
}

// InCluster reports whether a node with history hist is in the cluster by its history alone: not
// removed since it was last added, and since then ready at least once (Ready, Rebooted or
// Upgraded); a history without any Added entry (a node from before histories were kept) counts as
// in when it has any entry.
func InCluster(hist []LifecycleEntry) bool {
	joined := false
	for i := len(hist) - 1; i >= 0; i-- {
		switch hist[i].Kind {
		case Removed:
			return false
		case Added:
			return joined
		case Ready, Rebooted, Upgraded:
			joined = true
		}
	}
	return len(hist) > 0
}
