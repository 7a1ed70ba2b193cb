package bootstrap

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/airgap-appliance/appliance/pkg/atomicfile"
	"github.com/airgap-appliance/appliance/pkg/pki"
	"github.com/airgap-appliance/appliance/pkg/statedir"
)

// adminCertValidity is the admin kubeconfig's client certificate lifetime (kubeadm: 1 year).
const adminCertValidity = 365 * 24 * time.Hour

// kubeconfig is the subset of client-go's clientcmd v1 Config that admin.conf uses.
type kubeconfig struct {
	APIVersion     string              `yaml:"apiVersion"`
	Kind           string              `yaml:"kind"`
	CurrentContext string              `yaml:"current-context"`
	Clusters       []kubeconfigCluster `yaml:"clusters"`
	Contexts       []kubeconfigContext `yaml:"contexts"`
	Users          []kubeconfigUser    `yaml:"users"`
}

// base64Data is a kubeconfig *-data field: bytes written as one standard base64 string, as
// client-go's clientcmd (encoding/json's []byte) writes and reads them. go.yaml.in/yaml writes a
// plain []byte as a sequence of integers, which kubectl refuses ("cannot unmarshal array into Go
// struct field ... of type []uint8" / "!!seq into string").
type base64Data []byte

// MarshalYAML writes the bytes as a base64 string.
func (b base64Data) MarshalYAML() (any, error) { return base64.StdEncoding.EncodeToString(b), nil }

// UnmarshalYAML reads a base64 string; anything else (e.g. the integer sequence older appliances
// wrote) is an error, so the file counts as invalid and is written again.
func (b *base64Data) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return err
	}
	d, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return err
	}
	*b = d
	return nil
}

type kubeconfigCluster struct {
	Name    string `yaml:"name"`
	Cluster struct {
		Server                   string     `yaml:"server"`
		CertificateAuthorityData base64Data `yaml:"certificate-authority-data"`
	} `yaml:"cluster"`
}

type kubeconfigContext struct {
	Name    string `yaml:"name"`
	Context struct {
		Cluster string `yaml:"cluster"`
		User    string `yaml:"user"`
	} `yaml:"context"`
}

type kubeconfigUser struct {
	Name string `yaml:"name"`
	User struct {
		ClientCertificateData base64Data `yaml:"client-certificate-data"`
		ClientKeyData         base64Data `yaml:"client-key-data"`
	} `yaml:"user"`
}

// APIServerURL is https://VIP:port of the cluster.
func APIServerURL(st *State) string {
	return "https://" + net.JoinHostPort(st.Config.APIServer.VIP.String(), strconv.Itoa(int(st.Config.APIServer.Port)))
}

// ensureAdminKubeconfig keeps AdminKubeconfigPath a kubeconfig for kubeadm's admin identity
// (CN=kubernetes-admin, O=kubeadm:cluster-admins, bound to cluster-admin by kubeadm init) signed by the
// cluster CA, server APIServerURL. An existing file is kept when it names that server and CA and its
// certificate chains to the CA and stays valid for 30 more days; otherwise it is rewritten (0600).
func ensureAdminKubeconfig(st *State, ca *pki.CA, now time.Time) (bool, error) {
	path := statedir.AdminKubeconfig(st.StateDir)
	server := APIServerURL(st)
	if adminKubeconfigCurrent(st, ca, now) {
		return false, nil
	}
	cc, err := pki.IssueClientCert(ca, "kubernetes-admin", []string{"kubeadm:cluster-admins"}, adminCertValidity, now)
	if err != nil {
		return false, err
	}
	var cl kubeconfigCluster
	cl.Name = st.Config.ClusterName
	cl.Cluster.Server, cl.Cluster.CertificateAuthorityData = server, ca.CertPEM
	var cx kubeconfigContext
	cx.Name = "kubernetes-admin@" + st.Config.ClusterName
	cx.Context.Cluster, cx.Context.User = st.Config.ClusterName, "kubernetes-admin"
	var u kubeconfigUser
	u.Name = "kubernetes-admin"
	u.User.ClientCertificateData, u.User.ClientKeyData = cc.CertPEM, cc.KeyPEM
	kc := kubeconfig{APIVersion: "v1", Kind: "Config", CurrentContext: cx.Name,
		Clusters: []kubeconfigCluster{cl}, Contexts: []kubeconfigContext{cx}, Users: []kubeconfigUser{u}}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(kc); err != nil {
		return false, err
	}
	if _, err := atomicfile.Write(path, buf.Bytes(), 0o600); err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	return true, nil
}

// adminKubeconfigCurrent reports whether ensureAdminKubeconfig would keep the file as it is.
func adminKubeconfigCurrent(st *State, ca *pki.CA, now time.Time) bool {
	b, err := os.ReadFile(statedir.AdminKubeconfig(st.StateDir))
	return err == nil && adminKubeconfigValid(b, APIServerURL(st), ca, now)
}

func adminKubeconfigValid(b []byte, server string, ca *pki.CA, now time.Time) bool {
	var kc kubeconfig
	if yaml.Unmarshal(b, &kc) != nil || len(kc.Clusters) != 1 || len(kc.Users) != 1 {
		return false
	}
	if kc.Clusters[0].Cluster.Server != server || !bytes.Equal(kc.Clusters[0].Cluster.CertificateAuthorityData, ca.CertPEM) {
		return false
	}
	blk, _ := pem.Decode(kc.Users[0].User.ClientCertificateData)
	if blk == nil {
		return false
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil || cert.CheckSignatureFrom(ca.Cert) != nil {
		return false
	}
	return now.Add(30 * 24 * time.Hour).Before(cert.NotAfter)
}
