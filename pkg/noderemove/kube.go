package noderemove

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/kubeapi"
)

// The Kubernetes API calls of a removal (core/v1 Nodes and Pods, policy/v1 Evictions), plain REST
// through pkg/kubeapi.

// pod is the part of a core/v1 Pod the drain reads.
type pod struct {
	Metadata struct {
		Name              string            `json:"name"`
		Namespace         string            `json:"namespace"`
		Annotations       map[string]string `json:"annotations"`
		DeletionTimestamp *time.Time        `json:"deletionTimestamp"`
		OwnerReferences   []struct {
			Kind       string `json:"kind"`
			Controller *bool  `json:"controller"`
		} `json:"ownerReferences"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Status struct {
		Phase      string `json:"phase"`
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
	} `json:"status"`
}

func (p pod) key() string { return p.Metadata.Namespace + "/" + p.Metadata.Name }

// ready reports the pod's Ready condition.
func (p pod) ready() bool {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// evictable is what `kubectl drain --ignore-daemonsets` evicts: neither a pod that stays nor a
// finished one.
func (p pod) evictable() bool {
	return !p.stays() && !p.finished()
}

// stays reports the pods a drain leaves on the node: static (mirror) pods, and pods a DaemonSet
// owns (its controller would recreate them on the node at once, and they tolerate unschedulable).
func (p pod) stays() bool {
	if _, mirror := p.Metadata.Annotations["kubernetes.io/config.mirror"]; mirror {
		return true
	}
	for _, o := range p.Metadata.OwnerReferences {
		if o.Kind == "DaemonSet" {
			return true
		}
	}
	return false
}

// finished reports a pod in a terminal phase. Since Kubernetes 1.27 the kubelet also moves a pod
// that is being deleted (an evicted one) to Succeeded or Failed before it deletes the object
// (kubelet getPhase with podIsTerminal), so a finished pod with a deletionTimestamp is still on
// the node.
func (p pod) finished() bool { return p.Status.Phase == "Succeeded" || p.Status.Phase == "Failed" }

// managed reports whether a controller (ReplicaSet, StatefulSet, Job…) owns the pod and recreates
// it elsewhere once evicted; an unmanaged pod is gone for good (`kubectl drain` wants --force).
func (p pod) managed() bool {
	for _, o := range p.Metadata.OwnerReferences {
		if o.Controller != nil && *o.Controller {
			return true
		}
	}
	return false
}

// node is the part of a core/v1 Node the removal reads.
type node struct {
	Spec struct {
		Unschedulable bool `json:"unschedulable"`
	} `json:"spec"`
	Status struct {
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
	} `json:"status"`
}

func (n node) ready() bool {
	for _, c := range n.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

type kube struct{ c *kubeapi.Client }

func nodePath(name string) string { return "/api/v1/nodes/" + url.PathEscape(name) }

// getNode returns the Node, or ok false when there is none.
func (k kube) getNode(ctx context.Context, name string) (node, bool, error) {
	b, err := k.c.Do(ctx, http.MethodGet, nodePath(name), nil)
	if errors.Is(err, kubeapi.ErrNotFound) {
		return node{}, false, nil
	} else if err != nil {
		return node{}, false, err
	}
	var n node
	if err := json.Unmarshal(b, &n); err != nil {
		return node{}, false, fmt.Errorf("decode node %s: %w", name, err)
	}
	return n, true, nil
}

// listPods lists pods by a field or label selector (query: "fieldSelector=..." or "labelSelector=...").
func (k kube) listPods(ctx context.Context, namespace string, query url.Values) ([]pod, error) {
	p := "/api/v1/pods"
	if namespace != "" {
		p = "/api/v1/namespaces/" + url.PathEscape(namespace) + "/pods"
	}
	b, err := k.c.Do(ctx, http.MethodGet, p+"?"+query.Encode(), nil)
	if err != nil {
		return nil, err
	}
	var l struct {
		Items []pod `json:"items"`
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("decode pod list: %w", err)
	}
	return l.Items, nil
}

// etcdMembers returns the etcd members as kubeadm's stacked etcd static pods show them: one pod
// labelled component=etcd in kube-system per control plane, healthy when Ready (kubelet runs the
// pod's probes against the member's own /livez and /readyz on 127.0.0.1:2381), sorted by node.
// It is the API's view, not etcd's member list: a member whose node and pod are gone is not in it.
func (k kube) etcdMembers(ctx context.Context) ([]Member, error) {
	pods, err := k.listPods(ctx, "kube-system", url.Values{"labelSelector": {"component=etcd,tier=control-plane"}})
	if err != nil {
		return nil, fmt.Errorf("list the etcd static pods: %w", err)
	}
	var out []Member
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			out = append(out, Member{Node: p.Spec.NodeName, Healthy: p.ready()})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out, nil
}

// cordon marks the Node unschedulable (a JSON merge patch, RFC 7396, as `kubectl cordon` sends).
func (k kube) cordon(ctx context.Context, name string) error {
	_, err := k.c.DoContentType(ctx, http.MethodPatch, nodePath(name), "application/merge-patch+json",
		[]byte(`{"spec":{"unschedulable":true}}`))
	return err
}

// evictablePods lists the pods on the node a drain evicts.
func (k kube) evictablePods(ctx context.Context, name string) ([]pod, error) {
	pods, err := k.podsOn(ctx, name)
	if err != nil {
		return nil, err
	}
	var out []pod
	for _, p := range pods {
		if p.evictable() {
			out = append(out, p)
		}
	}
	return out, nil
}

// podsOn lists every pod bound to the node.
func (k kube) podsOn(ctx context.Context, name string) ([]pod, error) {
	pods, err := k.listPods(ctx, "", url.Values{"fieldSelector": {"spec.nodeName=" + name}})
	if err != nil {
		return nil, fmt.Errorf("list the pods on %s: %w", name, err)
	}
	return pods, nil
}

// evict asks for the pod's eviction (policy/v1 Eviction, the API `kubectl drain` uses: it honours
// PodDisruptionBudgets). A pod already gone is no error; a budget that forbids it now is
// kubeapi.ErrTooManyRequests.
func (k kube) evict(ctx context.Context, p pod) error {
	body, _ := json.Marshal(map[string]any{
		"apiVersion": "policy/v1", "kind": "Eviction",
		"metadata": map[string]string{"name": p.Metadata.Name, "namespace": p.Metadata.Namespace},
	})
	_, err := k.c.Do(ctx, http.MethodPost, "/api/v1/namespaces/"+url.PathEscape(p.Metadata.Namespace)+"/pods/"+
		url.PathEscape(p.Metadata.Name)+"/eviction", body)
	if errors.Is(err, kubeapi.ErrNotFound) {
		return nil
	}
	return err
}

// drain evicts every evictable pod on the node and waits until they are gone, re-asking evictions a
// PodDisruptionBudget refused, until timeout. A pod is gone when its object is deleted (as `kubectl
// drain` waits, by name): a pod being deleted is still on the node whatever its phase, since the
// kubelet moves an evicted pod to Succeeded or Failed before it deletes the object. On a node that
// is not Ready a pod being deleted counts as gone: its kubelet cannot confirm, and deleting the Node
// removes it. It returns the pods it evicted (namespace/name, sorted, each once); on timeout an
// error naming the pods left.
func (k kube) drain(ctx context.Context, name string, timeout time.Duration) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	evicted := map[string]bool{}
	for {
		n, found, err := k.getNode(ctx, name)
		if err != nil {
			return sortedKeys(evicted), err
		}
		if !found {
			return sortedKeys(evicted), nil
		}
		pods, err := k.podsOn(ctx, name)
		if err != nil {
			return sortedKeys(evicted), err
		}
		var left []string
		for _, p := range pods {
			if p.stays() {
				continue
			}
			if p.Metadata.DeletionTimestamp != nil {
				if !n.ready() {
					continue
				}
				left = append(left, p.key()+" (being deleted)")
				continue
			}
			if p.finished() {
				continue
			}
			if err := k.evict(ctx, p); err != nil {
				if !errors.Is(err, kubeapi.ErrTooManyRequests) || ctx.Err() != nil {
					return sortedKeys(evicted), fmt.Errorf("evict %s: %w", p.key(), err)
				}
				left = append(left, p.key()+" (its PodDisruptionBudget allows no eviction now)")
				continue
			}
			evicted[p.key()] = true
			left = append(left, p.key())
		}
		if len(left) == 0 {
			return sortedKeys(evicted), nil
		}
		select {
		case <-ctx.Done():
			sort.Strings(left)
			return sortedKeys(evicted), fmt.Errorf("drain %s: %d pods still on it after %s: %s; rerun when they can move (more capacity, a looser PodDisruptionBudget)",
				name, len(left), timeout, strings.Join(left, ", "))
		case <-time.After(2 * time.Second):
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// deleteNode deletes the Node object; none is no error. It reports whether it deleted one.
func (k kube) deleteNode(ctx context.Context, name string) (bool, error) {
	_, err := k.c.Do(ctx, http.MethodDelete, nodePath(name), nil)
	if errors.Is(err, kubeapi.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}
