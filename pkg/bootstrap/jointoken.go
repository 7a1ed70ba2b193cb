package bootstrap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	kubeadmmanifests "github.com/airgap-appliance/appliance/kubeadm-manifests"
	"github.com/airgap-appliance/appliance/pkg/agentapi"
	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/kubeapi"
	"github.com/airgap-appliance/appliance/pkg/nodestate"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// The bootstrap token Secret's format (Kubernetes "Authenticating with Bootstrap Tokens",
// k8s.io/cluster-bootstrap/token/api): kube-system/bootstrap-token-<token-id>, type
// bootstrap.kubernetes.io/token, what `kubeadm init phase bootstrap-token` writes.
const (
	bootstrapTokenSecretType   = "bootstrap.kubernetes.io/token"
	bootstrapTokenSecretPrefix = "bootstrap-token-"
	// kubeadmNodeTokenGroup is the extra group kubeadm gives its node tokens
	// (kubeadm constants.NodeBootstrapTokenAuthGroup): kubeadm's RBAC rules let it create node
	// CSRs, read kubeadm-config and, for joining control planes, the kubeadm-certs Secret.
	kubeadmNodeTokenGroup = "system:bootstrappers:kubeadm:default-node-token"
)

// joinSecretsLeader is the control plane whose hostagent keeps the join secrets in the cluster: the
// plan's kubeadm leader (plan.RenewsJoinSecrets: the init node, or after its removal the first
// control plane that joined), or without a plan the first control plane of nodes[].
func joinSecretsLeader(st *State) string {
	if st.Plan != nil {
		if n := st.Plan.JoinSecretsRenewer(); n != "" {
			return n
		}
	}
	return st.Config.ControlPlaneNodes()[0].Name
}

// ensureJoinToken makes the bootstrap tokens of the run's kubeadm join secrets (st.Kubeadm) exist
// in a cluster that exists already (the kubeadm leader, joinSecretsLeader, reported its kubeadm step
// done): when the pki phase renewed the secrets (a run more than
// pki.BootstrapTokenTTL-KubeadmSecretsMargin after they were made), the nodes about to join carry
// the new tokens, and kubeadm join's discovery waits until a token Secret signs cluster-info. The
// leader's hostagent creates them too, with `kubeadm init phase bootstrap-token` (idempotent), but
// only once its config watch sees the change; it also re-uploads the control-plane certificates
// under the new certificate key, which only a control plane can. The appliance creates at once,
// through the API with its admin kubeconfig, each worker's own token (pki.KubeadmSecrets
// NodeBootstrapToken) for the workers that have yet to join, and the control planes' token unless
// a control plane has yet to join: that one needs the re-uploaded certificates too, so that token is
// left to the leader, which uploads them first. The leader is the init node, or after its removal
// the first control plane that joined. It returns a detail and whether it created a Secret (a dry
// run only says it would); "" when there is nothing to do (no Kubernetes, no cluster yet: kubeadm
// init makes the tokens). Errors: the API did not answer or refused a Secret.
func ensureJoinToken(ctx context.Context, st *State) (string, bool, error) {
	if st.Config == nil || !st.Config.Kubernetes.IsEnabled() || st.Kubeadm.BootstrapToken == "" {
		return "", false, nil
	}
	cps := st.Config.ControlPlaneNodes()
	if len(cps) == 0 {
		return "", false, nil
	}
	leader := joinSecretsLeader(st)
	store := nodestate.Open(statedir.Nodes(st.StateDir))
	s, err := store.Get(leader)
	if err != nil || s.Steps[agentapi.StepKubeadm].Status != agentapi.StatusDone {
		return "", false, nil // kubeadm init creates the tokens
	}
	id, _, ok := strings.Cut(st.Kubeadm.BootstrapToken, ".")
	if !ok {
		return "", false, errors.New("the kubeadm bootstrap token has no token-id.token-secret form")
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	c, err := kubeapi.Load(statedir.AdminKubeconfig(st.StateDir))
	if err != nil {
		return "", false, err
	}
	expires := st.Kubeadm.Expires(pki.BootstrapTokenTTL).UTC()
	var details []string
	changed := false
	// The workers' own tokens first: they need no certificates.
	for _, w := range st.Config.Nodes {
		if w.HasRole(config.RoleControlPlane) {
			continue
		}
		if ran, err := store.RanKubeadm(w.Name); err != nil || ran {
			continue
		}
		d, created, err := ensureTokenSecret(ctx, c, st.Options.DryRun, st.Kubeadm.NodeBootstrapToken(w.Name),
			"worker "+w.Name+"'s join token", kubeadmmanifests.NodeTokenDescription(w.Name), expires)
		if err != nil {
			return "", false, err
		}
		details, changed = append(details, d), changed || created
	}
	// A control plane that has yet to join needs the certificates the first control plane re-uploads
	// under the new certificate key; its hostagent does that before it creates the token, so with
	// the token left to it, kubeadm join's discovery holds the joiner until both are in place.
	waiting := ""
	for _, cp := range cps {
		if cp.Name == leader {
			continue
		}
		if s, err := store.Get(cp.Name); err != nil || s.Steps[agentapi.StepKubeadm].Status != agentapi.StatusDone {
			waiting = cp.Name
			break
		}
	}
	if waiting == "" {
		d, created, err := ensureTokenSecret(ctx, c, st.Options.DryRun, st.Kubeadm.BootstrapToken, "join token",
			"kubeadm join token renewed by appliance bootstrap", expires)
		if err != nil {
			return "", false, err
		}
		details, changed = append(details, d), changed || created
	} else if _, err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/kube-system/secrets/"+bootstrapTokenSecretPrefix+id, nil); err == nil {
		details = append(details, "join token "+id+" in the cluster")
	} else if errors.Is(err, kubeapi.ErrNotFound) {
		details = append(details, fmt.Sprintf("join token %s not in the cluster yet: %s creates it at its next resync, with the certificates control plane %s joins with",
			id, leader, waiting))
	} else {
		return "", false, fmt.Errorf("look up join token %s through %s: %w", id, c.Server(), err)
	}
	return strings.Join(details, "; "), changed, nil
}

// ensureTokenSecret makes the bootstrap token Secret of token (what) exist through c, with the
// kubeadm node token's usages and group, description and expiration; dryRun only says what it
// would do. It returns a detail and whether it created the Secret.
func ensureTokenSecret(ctx context.Context, c *kubeapi.Client, dryRun bool, token, what, description string, expires time.Time) (string, bool, error) {
	id, secret, ok := strings.Cut(token, ".")
	if !ok {
		return "", false, fmt.Errorf("%s has no token-id.token-secret form", what)
	}
	path := "/api/v1/namespaces/kube-system/secrets/" + bootstrapTokenSecretPrefix + id
	if _, err := c.Do(ctx, http.MethodGet, path, nil); err == nil {
		return what + " " + id + " in the cluster", false, nil
	} else if !errors.Is(err, kubeapi.ErrNotFound) {
		return "", false, fmt.Errorf("look up %s %s through %s: %w", what, id, c.Server(), err)
	}
	if dryRun {
		return "would create " + what + " " + id + " in the cluster (expires " + expires.Format(time.RFC3339) + ")", true, nil
	}
	body, err := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "Secret", "type": bootstrapTokenSecretType,
		"metadata": map[string]any{"name": bootstrapTokenSecretPrefix + id, "namespace": "kube-system"},
		"stringData": map[string]string{
			"description":                    description,
			"token-id":                       id,
			"token-secret":                   secret,
			"expiration":                     expires.Format(time.RFC3339),
			"usage-bootstrap-authentication": "true",
			"usage-bootstrap-signing":        "true",
			"auth-extra-groups":              kubeadmNodeTokenGroup,
		},
	})
	if err != nil {
		return "", false, err
	}
	if _, err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/kube-system/secrets", body); errors.Is(err, kubeapi.ErrConflict) {
		return what + " " + id + " in the cluster", false, nil // the leader was quicker
	} else if err != nil {
		return "", false, fmt.Errorf("create %s %s through %s: %w", what, id, c.Server(), err)
	}
	return "created " + what + " " + id + " in the cluster (expires " + expires.Format(time.RFC3339) + ")", true, nil
}
