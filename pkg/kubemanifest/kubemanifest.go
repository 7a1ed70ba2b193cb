// Package kubemanifest serialises typed Kubernetes objects (k8s.io/api types, or structs shaped like
// them) into the YAML an applied manifest holds: what `kubectl apply --server-side` takes, without the
// zero-valued fields the Go types always carry and an applied object must not set. pkg/calico and
// pkg/ingressrouter render their manifests with it, and HostNetworkDaemonSet, ServiceAccountWithRole and
// RestrictedSecurityContext are the shapes their host-network DaemonSets share.
package kubemanifest

import (
	"bytes"
	"encoding/json"

	"sigs.k8s.io/yaml"
)

// Marshal returns o as YAML with sorted keys (o's JSON form, through sigs.k8s.io/yaml), without
// "status" and metadata.creationTimestamp at the top, in spec and in spec.template (a workload's pod
// template), which typed objects carry empty. Errors: o does not marshal to a JSON object.
func Marshal(o any) ([]byte, error) {
	j, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(j, &m); err != nil {
		return nil, err
	}
	prune(m)
	return yaml.Marshal(m)
}

func prune(m map[string]any) {
	delete(m, "status")
	if md, ok := m["metadata"].(map[string]any); ok {
		delete(md, "creationTimestamp")
	}
	for _, k := range []string{"spec", "template"} {
		if sub, ok := m[k].(map[string]any); ok {
			prune(sub)
		}
	}
}

// Stream marshals objs with Marshal into one YAML stream, documents separated by "---".
func Stream(objs ...any) ([]byte, error) {
	var out bytes.Buffer
	for i, o := range objs {
		b, err := Marshal(o)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			out.WriteString("---\n")
		}
		out.Write(b)
	}
	return out.Bytes(), nil
}
