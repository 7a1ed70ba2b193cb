// Package ingressrouter is the appliance's own ingress controller, `appliance ingress-router`: the
// "router" of issue 13 item 4 that the ingress VIP's HAProxy on the control planes balances
// *.apps port 80 to (kcli's and OpenShift's layout, where the router is also the platform's own Go
// controller). It runs as a DaemonSet from the appliance image itself (registry.ExecutableImage),
// so the bundle needs no extra image; Manifest renders that DaemonSet and its RBAC.
//
// What it serves. Ingresses (networking.k8s.io/v1) whose spec.ingressClassName (or the legacy
// kubernetes.io/ingress.class annotation) names the router's IngressClass or any IngressClass whose
// spec.controller is ControllerName, and Ingresses with no class when such an IngressClass carries
// ingressclass.kubernetes.io/is-default-class: "true". Routing follows the Ingress spec (see
// Table.Lookup): exact and "*." wildcard hosts, Exact/Prefix paths (ImplementationSpecific is
// Prefix), longest match, spec.defaultBackend. Backends are Service ports, resolved through
// discovery.k8s.io/v1 EndpointSlices to ready endpoint addresses, and reached over plain HTTP with
// httputil.ReverseProxy, round robin (see Proxy). Resource backends are not routed.
//
// HTTPS (Options.ListenTLS, port 443, which HAProxy on the VIP passes through in TCP mode): TLS is
// terminated with the certificate of the served Ingresses' spec.tls for the client's server name
// (SNI; see Certificates), read from kubernetes.io/tls Secrets (only that type is listed), and the
// request goes the same way as over HTTP. There is no default certificate: a name without one
// fails the handshake. No HTTP-to-HTTPS redirect, no TLS to the backends.
//
// Not done: per-Ingress annotations (rewrites, timeouts, affinity), HTTP/2, and metrics besides
// the health endpoint.
//
// How. client-go shared informers (tools/cache) with listers on Ingresses, IngressClasses,
// Services and EndpointSlices, over one RESTClient built on a scheme of those three API groups:
// not the generated clientset and informer factory, which register and link every API group (a
// minimal program using them was 40.5 MB, one using this 20.9 MB; pkg/kubeapi records the same
// for the appliance, which this package makes 2.2 MB larger: 69.7 → 71.9 MB). Every event marks the table dirty; one goroutine rebuilds the whole table from the
// listers and swaps it atomically, so a request sees one consistent table. When
// Options.StatusAddress is set, the router writes it into each served Ingress's
// status.loadBalancer.ingress (several replicas write the same value: no conflict loop).
//
// Health. Options.HealthListen serves HealthPath: 503 until the informers have synced and the
// first table is in place, then 200 "ok" (the DaemonSet's readiness probe, and what the VIP's
// HAProxy may check). Before that every proxied request is 503 too, never a premature 404.
package ingressrouter

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	listersdiscoveryv1 "k8s.io/client-go/listers/discovery/v1"
	listersnetworkingv1 "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// ControllerName is the spec.controller of the router's IngressClass.
const ControllerName = "appliance.airgap.dev/ingress-router"

// DefaultIngressClass is the name of the IngressClass Manifest creates and the router serves.
const DefaultIngressClass = "appliance"

// Ports and path the router listens on by default: HTTP on ListenPort and HTTPS on TLSListenPort
// (every address of the node: the DaemonSet runs on the host network), and HealthPath on
// HealthPort, OpenShift's router statistics/health port.
const (
	ListenPort    = 80
	TLSListenPort = 443
	HealthPort    = 1936
	HealthPath    = "/healthz"
)

// InCluster is the Options.Kubeconfig value that means the pod's service account
// (rest.InClusterConfig).
const InCluster = "in-cluster"

// Annotations and labels of the Ingress API the router reads.
const (
	// AnnotationIngressClass is the legacy class annotation (before spec.ingressClassName).
	AnnotationIngressClass = "kubernetes.io/ingress.class"
	// AnnotationDefaultClass marks the IngressClass given to Ingresses without one.
	AnnotationDefaultClass = networkingv1.AnnotationIsDefaultIngressClass
)

// Options configure Run.
type Options struct {
	// Kubeconfig is a kubeconfig file, or InCluster.
	Kubeconfig string
	// Listen is the HTTP address, e.g. ":80"; HealthListen the health endpoint's, e.g. ":1936".
	Listen, HealthListen string
	// ListenTLS is the HTTPS address, e.g. ":443": TLS terminated with the served Ingresses'
	// spec.tls certificates, chosen by SNI (Certificates). "" serves no HTTPS and watches no
	// Secrets.
	ListenTLS string
	// IngressClass is the name of the IngressClass served besides those whose controller is
	// ControllerName; "" means DefaultIngressClass.
	IngressClass string
	// StatusAddress, when valid, is written into status.loadBalancer.ingress[].ip of each served
	// Ingress: the ingress VIP.
	StatusAddress netip.Addr
	// DrainDelay is how long Serve keeps proxying after its context ends while the health
	// endpoint already answers 503 ("draining"), so that a balancer checking it stops sending
	// new connections first (kubelet's SIGTERM grace period must be longer). 0: stop at once.
	DrainDelay time.Duration
	// Resync is the informers' resync period; 0 means none (events only).
	Resync time.Duration
	// Log receives progress and errors; nil discards them.
	Log *slog.Logger
}

// ErrOptions is wrapped by Run's errors for Options it cannot use.
var ErrOptions = errors.New("ingress-router: invalid options")

// RESTConfig loads the client configuration of kubeconfig (a file, or InCluster).
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		return nil, fmt.Errorf("%w: --kubeconfig: empty (a file, or %q)", ErrOptions, InCluster)
	}
	if kubeconfig == InCluster {
		c, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", InCluster, err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	return c, nil
}

// Run serves until ctx ends: it starts the controller and its listeners, and returns the first
// listener error, or nil after a graceful stop (Controller.Serve: the drain, then 10 s for
// in-flight requests).
func Run(ctx context.Context, o Options) error {
	if o.Listen == "" || o.HealthListen == "" {
		return fmt.Errorf("%w: --listen and --health-listen are required", ErrOptions)
	}
	cfg, err := RESTConfig(o.Kubeconfig)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", o.Listen, err)
	}
	hln, err := net.Listen("tcp", o.HealthListen)
	if err != nil {
		ln.Close()
		return fmt.Errorf("--health-listen %s: %w", o.HealthListen, err)
	}
	var tln net.Listener
	if o.ListenTLS != "" {
		if tln, err = net.Listen("tcp", o.ListenTLS); err != nil {
			ln.Close()
			hln.Close()
			return fmt.Errorf("--listen-tls %s: %w", o.ListenTLS, err)
		}
	}
	c, err := NewController(cfg, o)
	if err != nil {
		ln.Close()
		hln.Close()
		if tln != nil {
			tln.Close()
		}
		return err
	}
	return c.Serve(ctx, ln, hln, tln)
}

// Controller watches the API and keeps a Proxy's table current.
type Controller struct {
	opts  Options
	log   *slog.Logger
	rc    *rest.RESTClient
	proxy *Proxy
	ready atomic.Bool
	// draining is set when Serve's context ended and DrainDelay runs.
	draining atomic.Bool
	dirty    chan struct{}
	ingInf   cache.SharedIndexInformer
	clsInf   cache.SharedIndexInformer
	svcInf   cache.SharedIndexInformer
	epsInf   cache.SharedIndexInformer
	secInf   cache.SharedIndexInformer // nil without ListenTLS
	certs    atomic.Pointer[Certificates]
	// certProblems are the TLS problems last logged, so that each is logged once.
	certProblems map[string]bool
	ingList      listersnetworkingv1.IngressLister
	clsList      listersnetworkingv1.IngressClassLister
	svcList      listerscorev1.ServiceLister
	epsList      listersdiscoveryv1.EndpointSliceLister
	secList      listerscorev1.SecretLister
}

// scheme holds the three API groups the router reads.
var scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme, networkingv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err) // generated registration of k8s.io/api types: cannot fail
		}
	}
	return s
}()

// NewController makes the informers (not started) on cfg.
func NewController(cfg *rest.Config, o Options) (*Controller, error) {
	if o.IngressClass == "" {
		o.IngressClass = DefaultIngressClass
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	c := rest.CopyConfig(cfg)
	c.APIPath = "/apis"
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = "appliance-ingress-router"
	}
	rc, err := rest.UnversionedRESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("ingress-router: API client: %w", err)
	}
	ctl := &Controller{opts: o, log: o.Log, rc: rc, proxy: NewProxy(o.Log), dirty: make(chan struct{}, 1)}
	newInf := func(prefix, resource string, obj runtime.Object, fieldSelector ...string) cache.SharedIndexInformer {
		lw := &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
				opts.FieldSelector = strings.Join(fieldSelector, ",")
				return rc.Get().AbsPath(prefix, resource).VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Get()
			},
			WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				opts.Watch = true
				opts.FieldSelector = strings.Join(fieldSelector, ",")
				return rc.Get().AbsPath(prefix, resource).VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
			},
		}
		inf := cache.NewSharedIndexInformer(lw, obj, o.Resync, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { ctl.markDirty() },
			UpdateFunc: func(any, any) { ctl.markDirty() },
			DeleteFunc: func(any) { ctl.markDirty() },
		})
		return inf
	}
	ctl.ingInf = newInf("/apis/networking.k8s.io/v1", "ingresses", &networkingv1.Ingress{})
	ctl.clsInf = newInf("/apis/networking.k8s.io/v1", "ingressclasses", &networkingv1.IngressClass{})
	ctl.svcInf = newInf("/api/v1", "services", &corev1.Service{})
	ctl.epsInf = newInf("/apis/discovery.k8s.io/v1", "endpointslices", &discoveryv1.EndpointSlice{})
	ctl.ingList = listersnetworkingv1.NewIngressLister(ctl.ingInf.GetIndexer())
	ctl.clsList = listersnetworkingv1.NewIngressClassLister(ctl.clsInf.GetIndexer())
	ctl.svcList = listerscorev1.NewServiceLister(ctl.svcInf.GetIndexer())
	ctl.epsList = listersdiscoveryv1.NewEndpointSliceLister(ctl.epsInf.GetIndexer())
	if o.ListenTLS != "" {
		// Only TLS Secrets: the router never holds the cluster's other Secrets in memory.
		ctl.secInf = newInf("/api/v1", "secrets", &corev1.Secret{}, "type="+string(corev1.SecretTypeTLS))
		ctl.secList = listerscorev1.NewSecretLister(ctl.secInf.GetIndexer())
	}
	return ctl, nil
}

// Proxy is the controller's HTTP handler.
func (c *Controller) Proxy() *Proxy { return c.proxy }

// Ready reports whether the informers synced and the first table is in place.
func (c *Controller) Ready() bool { return c.ready.Load() }

func (c *Controller) markDirty() {
	select {
	case c.dirty <- struct{}{}:
	default:
	}
}

// HealthHandler answers HealthPath: 200 "ok" once Ready, else 503; 503 "draining" once Serve
// drains.
func (c *Controller) HealthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+HealthPath, func(w http.ResponseWriter, _ *http.Request) {
		if c.draining.Load() {
			http.Error(w, "draining: the router is stopping", http.StatusServiceUnavailable)
			return
		}
		if !c.Ready() {
			http.Error(w, "not synced with the API server yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

// Run starts the informers and rebuilds the table on every change until ctx ends. It returns an
// error only if the caches do not sync before ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	infs := []cache.SharedIndexInformer{c.ingInf, c.clsInf, c.svcInf, c.epsInf}
	if c.secInf != nil {
		infs = append(infs, c.secInf)
	}
	synced := make([]cache.InformerSynced, len(infs))
	for i, inf := range infs {
		go inf.RunWithContext(ctx)
		synced[i] = inf.HasSynced
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("ingress-router: informers did not sync: %w", ctx.Err())
	}
	c.rebuild(ctx)
	c.ready.Store(true)
	c.log.Info("ingress router synced", "ingressClass", c.opts.IngressClass)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.dirty:
			c.rebuild(ctx)
		}
	}
}

// Serve runs the controller, the proxy on ln and the health endpoint on hln until ctx ends and
// Options.DrainDelay has passed (or a listener fails: its error is returned). In-flight requests
// then get 10 s.
func (c *Controller) Serve(ctx context.Context, ln, hln, tln net.Listener) error {
	runCtx, stopRun := context.WithCancel(context.Background()) // the controller outlives ctx by the drain
	defer stopRun()
	srv := &http.Server{Handler: c.proxy, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 120 * time.Second}
	hsrv := &http.Server{Handler: c.HealthHandler(), ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 4)
	go func() { errc <- c.Run(runCtx) }()
	go func() { errc <- srv.Serve(ln) }()
	go func() { errc <- hsrv.Serve(hln) }()
	var tsrv *http.Server
	if tln != nil {
		tsrv = &http.Server{Handler: c.proxy, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 120 * time.Second,
			TLSConfig: c.TLSConfig(), ErrorLog: discardLog}
		go func() { errc <- tsrv.Serve(tls.NewListener(tln, tsrv.TLSConfig)) }()
		c.log.Info("ingress router serving HTTPS", "listen", tln.Addr().String())
	}
	c.log.Info("ingress router serving", "listen", ln.Addr().String(), "health", hln.Addr().String()+HealthPath)
	var err error
	select {
	case <-ctx.Done():
		if c.opts.DrainDelay > 0 {
			// Health answers 503 while requests are still served, so that the balancer in front
			// takes this router out before its port closes.
			c.draining.Store(true)
			c.log.Info("ingress router draining", "delay", c.opts.DrainDelay.String())
			t := time.NewTimer(c.opts.DrainDelay)
			select {
			case <-t.C:
			case err = <-errc:
			}
			t.Stop()
		}
	case err = <-errc:
	}
	stopRun()
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	_ = srv.Shutdown(sctx)
	_ = hsrv.Shutdown(sctx)
	if tsrv != nil {
		_ = tsrv.Shutdown(sctx)
	}
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// TLSConfig is the HTTPS listener's configuration: TLS 1.2 or newer, HTTP/1.1 only (what the
// proxy speaks), the certificate chosen by SNI from the served Ingresses' spec.tls; a name without
// one fails the handshake (ErrNoCertificate).
func (c *Controller) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.certs.Load().Get(hello.ServerName)
		},
	}
}

// discardLog silences net/http's log of failed TLS handshakes: every client asking for a name
// without a certificate (or a port scanner) would write a line.
var discardLog = log.New(io.Discard, "", 0)

// servedClasses returns the IngressClass names the router serves and whether one of them is the
// cluster's default.
func (c *Controller) servedClasses() (map[string]bool, bool) {
	served := map[string]bool{c.opts.IngressClass: true}
	isDefault := false
	classes, _ := c.clsList.List(labels.Everything())
	for _, cl := range classes {
		if cl.Name == c.opts.IngressClass || cl.Spec.Controller == ControllerName {
			served[cl.Name] = true
			if cl.Annotations[AnnotationDefaultClass] == "true" {
				isDefault = true
			}
		}
	}
	return served, isDefault
}

// Served reports whether the router serves in, given servedClasses' answer.
func served(in *networkingv1.Ingress, classes map[string]bool, isDefault bool) bool {
	if in.Spec.IngressClassName != nil {
		return classes[*in.Spec.IngressClassName]
	}
	if a, ok := in.Annotations[AnnotationIngressClass]; ok {
		return classes[a]
	}
	return isDefault
}

func (c *Controller) rebuild(ctx context.Context) {
	classes, isDefault := c.servedClasses()
	all, _ := c.ingList.List(labels.Everything())
	var ours []*networkingv1.Ingress
	for _, in := range all {
		if served(in, classes, isDefault) {
			ours = append(ours, in)
		}
	}
	svcs, _ := c.svcList.List(labels.Everything())
	eps, _ := c.epsList.List(labels.Everything())
	c.proxy.SetTable(Build(ours, svcs, eps, c.proxy.Table()))
	if c.secList != nil {
		secrets, _ := c.secList.List(labels.Everything())
		certs, problems := BuildCertificates(ours, secrets)
		c.certs.Store(certs)
		seen := map[string]bool{}
		for _, p := range problems {
			seen[p.Error()] = true
			if !c.certProblems[p.Error()] {
				c.log.Warn("ingress TLS certificate not served", "problem", p.Error())
			}
		}
		c.certProblems = seen
	}
	if c.opts.StatusAddress.IsValid() {
		for _, in := range ours {
			c.updateStatus(ctx, in)
		}
	}
}

// updateStatus writes StatusAddress into in's status.loadBalancer.ingress unless it is there.
func (c *Controller) updateStatus(ctx context.Context, in *networkingv1.Ingress) {
	want := []networkingv1.IngressLoadBalancerIngress{{IP: c.opts.StatusAddress.String()}}
	if slices.EqualFunc(in.Status.LoadBalancer.Ingress, want, func(a, b networkingv1.IngressLoadBalancerIngress) bool {
		return a.IP == b.IP && a.Hostname == b.Hostname && len(a.Ports) == 0 && len(b.Ports) == 0
	}) {
		return
	}
	up := in.DeepCopy()
	up.APIVersion, up.Kind = networkingv1.SchemeGroupVersion.String(), "Ingress"
	up.Status.LoadBalancer.Ingress = want
	body, err := json.Marshal(up)
	if err != nil {
		return
	}
	err = c.rc.Put().AbsPath("/apis/networking.k8s.io/v1", "namespaces", in.Namespace, "ingresses", in.Name, "status").
		SetHeader("Content-Type", runtime.ContentTypeJSON).Body(body).Do(ctx).Error()
	if err != nil && !apierrors.IsConflict(err) { // a conflict: a newer version is on its way, and with it a rebuild
		c.log.Warn("ingress status not updated", "ingress", in.Namespace+"/"+in.Name, "error", err)
	}
}
