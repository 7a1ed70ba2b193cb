package csrapprove

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

// resync is how often the informer hands every CSR to the queue again, so one whose inventory
// changed (node provisioned later) or whose approval failed is looked at again.
const resync = 5 * time.Minute

// Approver applies Decide to the cluster's pending CertificateSigningRequests.
type Approver struct {
	client    kubernetes.Interface
	inventory func() (Inventory, error)
	log       *slog.Logger
}

// New returns an Approver that talks to the API server of kubeconfig (a kubeconfig file, such as
// the STATE/kubernetes/admin.conf the appliance keeps; its user needs list/watch on CSRs and the
// "approve" verb on signers/kubernetes.io/kubelet-serving) and asks inventory for the nodes on each
// decision. log receives one line per decision; nil discards. Errors: the kubeconfig does not load.
func New(kubeconfig string, inventory func() (Inventory, error), log *slog.Logger) (*Approver, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	rc.UserAgent = "appliance-csrapprove"
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return newApprover(c, inventory, log), nil
}

func newApprover(c kubernetes.Interface, inventory func() (Inventory, error), log *slog.Logger) *Approver {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Approver{client: c, inventory: inventory, log: log}
}

// Result is what happened to one CSR.
type Result struct {
	// Name is the CSR's metadata.name.
	Name     string
	Decision Decision
	// Applied is true when this call recorded the decision; false when the CSR was already
	// approved, denied or failed (by us earlier, or by someone else), or was deleted meanwhile.
	Applied bool
}

// Sync lists every CSR once and decides the pending ones. It is idempotent: a decided CSR is left
// as it is, so a second Sync applies nothing. It returns the results for the CSRs of signer
// kubelet-serving that were pending, and the first error (listing, the inventory, an approval
// that failed for another reason than a conflict with someone who decided first).
func (a *Approver) Sync(ctx context.Context) ([]Result, error) {
	list, err := a.client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list certificate signing requests: %w", err)
	}
	var out []Result
	var errs []error
	for i := range list.Items {
		r, err := a.handle(ctx, &list.Items[i])
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if r.Decision.Verdict != Ignore {
			out = append(out, r)
		}
	}
	return out, errors.Join(errs...)
}

// Run watches CSRs (a client-go informer) and decides each pending one as it appears, retrying
// failures with backoff, until ctx is done; then it returns nil. Errors: the first list does not
// complete before ctx is done.
func (a *Approver) Run(ctx context.Context) error {
	f := informers.NewSharedInformerFactory(a.client, resync)
	inf := f.Certificates().V1().CertificateSigningRequests()
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer q.ShutDown()
	enqueue := func(obj any) {
		if csr, ok := obj.(*certificatesv1.CertificateSigningRequest); ok && csr.Spec.SignerName == SignerKubeletServing && !decided(csr) {
			q.Add(csr.Name)
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		return fmt.Errorf("list certificate signing requests: %w", context.Cause(ctx))
	}
	a.log.Info("watching certificate signing requests", "signer", SignerKubeletServing)
	go func() {
		<-ctx.Done()
		q.ShutDown()
	}()
	lister := inf.Lister()
	for {
		name, quit := q.Get()
		if quit {
			return nil
		}
		csr, err := lister.Get(name)
		if apierrors.IsNotFound(err) {
			q.Forget(name)
		} else if err != nil {
			a.log.Warn("read certificate signing request from the cache", "csr", name, "error", err)
			q.AddRateLimited(name)
		} else if _, err := a.handle(ctx, csr); err != nil && ctx.Err() == nil {
			a.log.Warn("decide certificate signing request (will retry)", "csr", name, "error", err)
			q.AddRateLimited(name)
		} else {
			q.Forget(name)
		}
		q.Done(name)
	}
}

// RunWhenReady waits until the kubeconfig file exists (checking every poll), then runs an Approver
// on it until ctx is done. A kubeconfig that does not load is logged and tried again after poll.
// Returns nil when ctx is done. client-go's own log lines (watch errors and retries) go through klog
// to stderr: klog's logger is process-wide and may not be replaced while clients run.
func RunWhenReady(ctx context.Context, kubeconfig string, poll time.Duration, inventory func() (Inventory, error), log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	waiting := false
	for {
		_, err := os.Stat(kubeconfig)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if !waiting {
				log.Info("kubelet serving CSR approver waits for the cluster's kubeconfig", "kubeconfig", kubeconfig)
				waiting = true
			}
		case err != nil:
			log.Warn("kubelet serving CSR approver cannot read the kubeconfig", "kubeconfig", kubeconfig, "error", err)
		default:
			a, err := New(kubeconfig, inventory, log)
			if err == nil {
				log.Info("kubelet serving CSR approver starts", "kubeconfig", kubeconfig)
				if err = a.Run(ctx); err == nil {
					return nil
				}
			}
			log.Warn("kubelet serving CSR approver", "kubeconfig", kubeconfig, "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// decided reports whether the CSR carries an Approved, Denied or Failed condition (certificates/v1:
// once set, none of them can be removed).
func decided(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		switch c.Type {
		case certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
			return true
		}
	}
	return false
}

func request(csr *certificatesv1.CertificateSigningRequest) Request {
	usages := make([]string, len(csr.Spec.Usages))
	for i, u := range csr.Spec.Usages {
		usages[i] = string(u)
	}
	return Request{SignerName: csr.Spec.SignerName, Username: csr.Spec.Username, Groups: csr.Spec.Groups,
		Usages: usages, PEM: csr.Spec.Request}
}

// handle decides one CSR and records the decision through the approval subresource. A conflict
// (409: the CSR changed since it was read) is resolved by reading it again: if someone decided it
// meanwhile, that stands and handle returns it as not applied, without error.
func (a *Approver) handle(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) (Result, error) {
	for attempt := 0; ; attempt++ {
		if csr.Spec.SignerName != SignerKubeletServing {
			return Result{Name: csr.Name}, nil
		}
		if decided(csr) {
			return Result{Name: csr.Name, Decision: Decision{Verdict: Ignore, Message: "already decided"}}, nil
		}
		inv, err := a.inventory()
		if err != nil {
			return Result{Name: csr.Name}, err
		}
		d := Decide(inv, request(csr))
		if d.Verdict == Ignore {
			return Result{Name: csr.Name, Decision: d}, nil
		}
		cond := certificatesv1.CertificateSigningRequestCondition{
			Type:           certificatesv1.CertificateApproved,
			Status:         corev1.ConditionTrue,
			Reason:         d.Reason(),
			Message:        d.Message,
			LastUpdateTime: metav1.Now(),
		}
		if d.Verdict == Deny {
			cond.Type = certificatesv1.CertificateDenied
		}
		upd := csr.DeepCopy()
		upd.Status.Conditions = append(upd.Status.Conditions, cond)
		_, err = a.client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, upd, metav1.UpdateOptions{})
		switch {
		case err == nil:
			a.logDecision(csr, d)
			return Result{Name: csr.Name, Decision: d, Applied: true}, nil
		case apierrors.IsNotFound(err):
			return Result{Name: csr.Name, Decision: d}, nil
		case apierrors.IsConflict(err) && attempt < 3:
			fresh, gerr := a.client.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(gerr) {
				return Result{Name: csr.Name, Decision: d}, nil
			} else if gerr != nil {
				return Result{Name: csr.Name, Decision: d}, fmt.Errorf("read certificate signing request %s after a conflict: %w", csr.Name, gerr)
			}
			csr = fresh
		default:
			return Result{Name: csr.Name, Decision: d}, fmt.Errorf("%s certificate signing request %s: %w", d.Verdict, csr.Name, err)
		}
	}
}

func (a *Approver) logDecision(csr *certificatesv1.CertificateSigningRequest, d Decision) {
	attrs := []any{"csr", csr.Name, "node", d.Node, "requestor", csr.Spec.Username, "reason", d.Reason(), "message", d.Message}
	if d.Verdict == Approve {
		a.log.Info("approved kubelet serving certificate request", attrs...)
	} else {
		a.log.Warn("denied kubelet serving certificate request", attrs...)
	}
}
