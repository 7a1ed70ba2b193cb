package bootstrap

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
)

// The lists are core/v1 JSON as the API server sends it (trimmed to the fields read); the real API is
// exercised by the e2e (TestKubernetesE2E), whose converge phase ends only through this check.
const nodesJSON = `{"kind":"NodeList","items":[
 {"metadata":{"name":"cp1"},"status":{"conditions":[{"type":"MemoryPressure","status":"False"},{"type":"Ready","status":"True"}]}},
 {"metadata":{"name":"cp2"},"status":{"conditions":[{"type":"Ready","status":"True"}]}},
 {"metadata":{"name":"cp3"},"status":{"conditions":[{"type":"Ready","status":"False","reason":"KubeletNotReady"}]}}]}`

const podsJSON = `{"kind":"PodList","items":[
 {"metadata":{"labels":{"component":"etcd","tier":"control-plane"}},"spec":{"nodeName":"cp1"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}},
 {"metadata":{"labels":{"component":"kube-apiserver","tier":"control-plane"}},"spec":{"nodeName":"cp1"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}},
 {"metadata":{"labels":{"component":"kube-controller-manager","tier":"control-plane"}},"spec":{"nodeName":"cp1"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}},
 {"metadata":{"labels":{"component":"kube-scheduler","tier":"control-plane"}},"spec":{"nodeName":"cp1"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}},
 {"metadata":{"labels":{"component":"etcd","tier":"control-plane"}},"spec":{"nodeName":"cp2"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}},
 {"metadata":{"labels":{"component":"kube-apiserver","tier":"control-plane"}},"spec":{"nodeName":"cp2"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"False"}]}},
 {"metadata":{"labels":{"component":"kube-controller-manager","tier":"control-plane"}},"spec":{"nodeName":"cp2"},"status":{"phase":"Pending"}}]}`

const proxiesJSON = `{"kind":"PodList","items":[
 {"metadata":{"labels":{"k8s-app":"kube-proxy"}},"spec":{"nodeName":"cp1"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}},
 {"metadata":{"labels":{"k8s-app":"kube-proxy"}},"spec":{"nodeName":"cp2"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}},
 {"metadata":{"labels":{"k8s-app":"kube-proxy"}},"spec":{"nodeName":"w1"},"status":{"phase":"Pending","conditions":[{"type":"Ready","status":"False","reason":"ContainersNotReady"}]}}]}`

func TestNotReady(t *testing.T) {
	var nl nodeList
	var pl, proxies podList
	if err := json.Unmarshal([]byte(nodesJSON), &nl); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(podsJSON), &pl); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(proxiesJSON), &proxies); err != nil {
		t.Fatal(err)
	}
	cp := []config.Role{config.RoleControlPlane}
	nodes := []config.Node{{Name: "cp1", Roles: cp}, {Name: "cp2", Roles: cp}, {Name: "cp3", Roles: cp}, {Name: "w1", Roles: []config.Role{config.RoleWorker}}}
	got := notReady(nl, pl, proxies, nodes)
	want := map[string]string{
		"cp2": "pods not Ready: kube-apiserver, kube-controller-manager, kube-scheduler",
		"cp3": "Node NotReady",
		"w1":  "no Node object yet",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("notReady (-want +got):\n%s", d)
	}
	// A worker needs its Node Ready and its kube-proxy Running and Ready.
	nl.Items = append(nl.Items, nl.Items[0])
	nl.Items[len(nl.Items)-1].Metadata.Name = "w1"
	if got := notReady(nl, pl, proxies, nodes[3:]); got["w1"] != "pods not Ready: kube-proxy" {
		t.Errorf("worker whose kube-proxy is pending reported as %v", got)
	}
	proxies.Items[2].Status.Phase = "Running"
	proxies.Items[2].Status.Conditions[0].Status = "True"
	if got := notReady(nl, pl, proxies, nodes[3:]); len(got) != 0 {
		t.Errorf("ready worker reported as %v", got)
	}
}

func TestNodeBoardPlain(t *testing.T) {
	var buf bytes.Buffer
	b := newNodeBoard(&buf, []string{"cp1", "w1"})
	now := time.Now()
	st := agentapi.NodeStatus{Node: "cp1", State: agentapi.StateConfigured, Steps: map[string]agentapi.Report{
		"packages": {Step: "packages", Status: "done", Time: now.Add(-time.Second)},
		"kubeadm":  {Step: "kubeadm", Status: "running", Detail: "waiting for cp1 to finish kubeadm", Time: now},
	}}
	b.set("cp1", nodeLine(st))
	b.set("cp1", nodeLine(st)) // unchanged: not printed again
	b.set("w1", nodeLine(agentapi.NodeStatus{State: agentapi.StatePending}))
	b.flush() // not a terminal: nothing to redraw
	out := buf.String()
	if strings.Count(out, "\n") != 2 || strings.Contains(out, "\x1b[") {
		t.Fatalf("plain board printed %q, want two plain lines", out)
	}
	if !strings.Contains(out, "cp1") || !strings.Contains(out, "configured · kubeadm running: waiting for cp1 to finish kubeadm") {
		t.Errorf("board line lacks the current step: %q", out)
	}
}
