package csrapprove

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
)

// FromConfig returns an inventory source for the Approver: the configuration's nodes[] (name and
// addresses; the configuration gives no further hostnames), each marked Provisioned when the node's
// record in store (STATE/nodes, pkg/nodestate) carries a boot ID, that is when a hostagent this
// appliance served has reported from the node's current boot. A node powered anew (the power phase
// forgets the boot ID) is not provisioned again until its hostagent reports. It reads the store on
// every call, so nodes provisioned while the approver runs are taken into account; it fails only when
// a record cannot be read.
func FromConfig(nodes []config.Node, store *nodestate.Store) func() (Inventory, error) {
	return func() (Inventory, error) {
		inv := Inventory{}
		for _, n := range nodes {
			st, err := store.Get(n.Name)
			if err != nil && !errors.Is(err, nodestate.ErrNotFound) {
				return nil, fmt.Errorf("inventory: %w", err)
			}
			inv[n.Name] = Node{Name: n.Name, Addresses: n.Addresses, Provisioned: err == nil && st.BootID != ""}
		}
		return inv, nil
	}
}

// FromFile returns an inventory source reading path, a JSON array of agentapi.InventoryNode (what the
// hand-off gives each control plane's in-cluster approver): every node listed counts as provisioned,
// since the appliance provisioned all of them before it handed off. It reads the file on every call.
func FromFile(path string) func() (Inventory, error) {
	return func() (Inventory, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("inventory: %w", err)
		}
		var nodes []agentapi.InventoryNode
		if err := json.Unmarshal(b, &nodes); err != nil {
			return nil, fmt.Errorf("inventory %s: %w", path, err)
		}
		inv := Inventory{}
		for _, n := range nodes {
			inv[n.Name] = Node{Name: n.Name, Addresses: n.Addresses, Provisioned: true}
		}
		return inv, nil
	}
}
