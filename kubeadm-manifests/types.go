package kubeadmmanifests

// Minimal mirrors of the kubeadm, kubelet and kube-proxy configuration types this package renders.
// kubeadm's own Go types live in k8s.io/kubernetes, which this module does not import; these structs
// carry only the fields the appliance sets, with the JSON names of the upstream types (YAML tags here),
// and the real `kubeadm config validate` (strict decoding) checks them in the tests. Field order is
// serialisation order, so output is deterministic.
//
// Upstream sources (checked against v1.37.2 and its staging modules v0.37.2; every field here exists
// there with the same JSON name, and none is deprecated):
//   - k8s.io/kubernetes/cmd/kubeadm/app/apis/kubeadm/v1beta4/types.go
//   - k8s.io/kubernetes/cmd/kubeadm/app/apis/bootstraptoken/v1/types.go
//   - k8s.io/kubelet/config/v1beta1/types.go
//   - k8s.io/kube-proxy/config/v1alpha1/types.go

const (
	kubeadmAPIVersion   = "kubeadm.k8s.io/v1beta4"
	kubeletAPIVersion   = "kubelet.config.k8s.io/v1beta1"
	kubeProxyAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"
)

type initConfiguration struct {
	APIVersion       string           `yaml:"apiVersion"`
	Kind             string           `yaml:"kind"`
	BootstrapTokens  []bootstrapToken `yaml:"bootstrapTokens"`
	NodeRegistration nodeRegistration `yaml:"nodeRegistration"`
	LocalAPIEndpoint apiEndpoint      `yaml:"localAPIEndpoint"`
	CertificateKey   string           `yaml:"certificateKey"`
}

// bootstrapToken mirrors bootstraptoken/v1.BootstrapToken.
type bootstrapToken struct {
	Token       string   `yaml:"token"`
	Description string   `yaml:"description,omitempty"`
	TTL         string   `yaml:"ttl"` // metav1.Duration, Go duration syntax ("2h0m0s")
	Usages      []string `yaml:"usages"`
	Groups      []string `yaml:"groups"`
}

type nodeRegistration struct {
	Name                  string   `yaml:"name"`
	CRISocket             string   `yaml:"criSocket"`
	KubeletExtraArgs      []arg    `yaml:"kubeletExtraArgs,omitempty"`
	IgnorePreflightErrors []string `yaml:"ignorePreflightErrors,omitempty"`
	ImagePullPolicy       string   `yaml:"imagePullPolicy"`
}

// arg mirrors v1beta4.Arg: v1beta4 turned every extraArgs map into an ordered list of name/value pairs.
type arg struct {
	Name  string `yaml:"name"`
	Value string `yaml:"value"`
}

type apiEndpoint struct {
	AdvertiseAddress string `yaml:"advertiseAddress"`
	BindPort         int32  `yaml:"bindPort"`
}

type clusterConfiguration struct {
	APIVersion           string              `yaml:"apiVersion"`
	Kind                 string              `yaml:"kind"`
	ClusterName          string              `yaml:"clusterName"`
	KubernetesVersion    string              `yaml:"kubernetesVersion"`
	ControlPlaneEndpoint string              `yaml:"controlPlaneEndpoint"`
	ImageRepository      string              `yaml:"imageRepository"`
	Networking           networking          `yaml:"networking"`
	APIServer            apiServer           `yaml:"apiServer"`
	ControllerManager    controlPlaneProcess `yaml:"controllerManager"`
	Etcd                 etcd                `yaml:"etcd"`
}

type networking struct {
	PodSubnet     string `yaml:"podSubnet"`
	ServiceSubnet string `yaml:"serviceSubnet"`
	DNSDomain     string `yaml:"dnsDomain"`
}

type apiServer struct {
	CertSANs  []string `yaml:"certSANs,omitempty"`
	ExtraArgs []arg    `yaml:"extraArgs,omitempty"`
}

type controlPlaneProcess struct {
	ExtraArgs []arg `yaml:"extraArgs,omitempty"`
}

type etcd struct {
	Local localEtcd `yaml:"local"`
}

type localEtcd struct {
	DataDir string `yaml:"dataDir"`
}

type joinConfiguration struct {
	APIVersion       string            `yaml:"apiVersion"`
	Kind             string            `yaml:"kind"`
	NodeRegistration nodeRegistration  `yaml:"nodeRegistration"`
	Discovery        discovery         `yaml:"discovery"`
	ControlPlane     *joinControlPlane `yaml:"controlPlane,omitempty"`
	Timeouts         timeouts          `yaml:"timeouts"`
}

type discovery struct {
	BootstrapToken bootstrapTokenDiscovery `yaml:"bootstrapToken"`
}

type bootstrapTokenDiscovery struct {
	Token             string   `yaml:"token"`
	APIServerEndpoint string   `yaml:"apiServerEndpoint"`
	CACertHashes      []string `yaml:"caCertHashes"`
}

type joinControlPlane struct {
	LocalAPIEndpoint apiEndpoint `yaml:"localAPIEndpoint"`
	CertificateKey   string      `yaml:"certificateKey"`
}

// timeouts mirrors v1beta4.Timeouts; v1beta4 moved v1beta3's discovery.timeout here.
type timeouts struct {
	Discovery string `yaml:"discovery"`
}

type kubeletConfiguration struct {
	APIVersion               string `yaml:"apiVersion"`
	Kind                     string `yaml:"kind"`
	CgroupDriver             string `yaml:"cgroupDriver"`
	ContainerRuntimeEndpoint string `yaml:"containerRuntimeEndpoint"`
	FailSwapOn               bool   `yaml:"failSwapOn"`
	FailCgroupV1             bool   `yaml:"failCgroupV1"`
	ServerTLSBootstrap       bool   `yaml:"serverTLSBootstrap"`
}

type kubeProxyConfiguration struct {
	APIVersion  string    `yaml:"apiVersion"`
	Kind        string    `yaml:"kind"`
	Mode        string    `yaml:"mode"`
	ClusterCIDR string    `yaml:"clusterCIDR"`
	Conntrack   conntrack `yaml:"conntrack"`
}

// conntrack mirrors v1alpha1.KubeProxyConntrackConfiguration. Every value here is the one that makes
// kube-proxy leave the corresponding host setting alone (cmd/kube-proxy/app/server_linux.go only
// writes a sysctl when the value is > 0, or true for tcpBeLiberal). maxPerCore and min and the two TCP
// timeouts are pointers upstream: leaving them out would let defaulting fill in 32768, 131072, 24h and 1h,
// which kube-proxy then writes to the host's nf_conntrack sysctls, so they are written as explicit zeros.
type conntrack struct {
	MaxPerCore            int32  `yaml:"maxPerCore"`
	Min                   int32  `yaml:"min"`
	TCPEstablishedTimeout string `yaml:"tcpEstablishedTimeout"`
	TCPCloseWaitTimeout   string `yaml:"tcpCloseWaitTimeout"`
	TCPBeLiberal          bool   `yaml:"tcpBeLiberal"`
	UDPTimeout            string `yaml:"udpTimeout"`
	UDPStreamTimeout      string `yaml:"udpStreamTimeout"`
}
