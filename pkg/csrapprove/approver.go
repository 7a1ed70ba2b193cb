package csrapprove

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// resync is how long one watch lasts before the approver lists every CSR again, so one whose
// inventory changed (node provisioned later) is looked at again.
const resync = 5 * time.Minute

// callTimeout bounds one list, get or approval call.
const callTimeout = 30 * time.Second

// Approver applies Decide to the cluster's pending CertificateSigningRequests.
type Approver struct {
	api       *apiClient
	inventory func() (Inventory, error)
	log       *slog.Logger
}

// New returns an Approver that talks to the API server of kubeconfig (a kubeconfig file, such as
// the STATE/kubernetes/admin.conf the appliance keeps: its current context's server, cluster CA and
// client certificate or token; its user needs list/watch on CSRs and the "approve" verb on
// signers/kubernetes.io/kubelet-serving) and asks inventory for the nodes on each decision. log
// receives one line per decision; nil discards. Errors: the kubeconfig does not load (naming the
// field at fault).
func New(kubeconfig string, inventory func() (Inventory, error), log *slog.Logger) (*Approver, error) {
	c, err := loadKubeconfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Approver{api: c, inventory: inventory, log: log}, nil
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
// kubelet-serving that were pending, and the errors (listing, the inventory, an approval that
// failed for another reason than someone deciding first).
func (a *Approver) Sync(ctx context.Context) ([]Result, error) {
	out, _, err := a.sync(ctx)
	return out, err
}

func (a *Approver) sync(ctx context.Context) ([]Result, string, error) {
	lctx, cancel := context.WithTimeout(ctx, callTimeout)
	list, rv, err := a.api.list(lctx)
	cancel()
	if err != nil {
		return nil, "", fmt.Errorf("list certificate signing requests: %w", err)
	}
	var out []Result
	var errs []error
	for _, o := range list {
		r, err := a.handle(ctx, o)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if r.Decision.Verdict != Ignore {
			out = append(out, r)
		}
	}
	return out, rv, errors.Join(errs...)
}

// Run decides every pending CSR (Sync), then watches CSRs and decides each pending one as it
// appears; every resync (5 min) it lists again. A failed call is retried after an exponential
// backoff (up to 30 s) with a fresh list. It returns nil when ctx is done.
func (a *Approver) Run(ctx context.Context) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = time.Second, 30*time.Second
	a.log.Info("watching certificate signing requests", "signer", SignerKubeletServing, "server", a.api.Server())
	var lastErr string
	for {
		_, rv, err := a.sync(ctx)
		if err == nil {
			// The server ends the watch after resync; the client-side bound covers a connection
			// that died without a word (the VIP moved).
			wctx, cancel := context.WithTimeout(ctx, resync+time.Minute)
			_, err = a.api.watch(wctx, rv, resync, func(o *csrObject) error {
				_, err := a.handle(ctx, o)
				return err
			})
			cancel()
		}
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			b.Reset()
			lastErr = ""
			continue
		}
		wait := b.NextBackOff()
		// The same failure again (the API is not up yet, the VIP is moving) is logged once at Warn.
		level := slog.LevelWarn
		if errors.Is(err, errGone) || err.Error() == lastErr {
			level = slog.LevelDebug
		}
		lastErr = err.Error()
		a.log.Log(ctx, level, "kubelet serving CSR approver (will list again)", "error", err, "retryIn", wait.Round(time.Millisecond).String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// RunWhenReady waits until the kubeconfig file exists (checking every poll), then runs an Approver
// on it until ctx is done. A kubeconfig that does not load is logged (once per distinct error) and
// tried again after poll. Returns nil when ctx is done.
func RunWhenReady(ctx context.Context, kubeconfig string, poll time.Duration, inventory func() (Inventory, error), log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	waiting, lastErr := false, ""
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
			if err.Error() != lastErr { // logged once per distinct failure, not every poll
				log.Warn("kubelet serving CSR approver", "kubeconfig", kubeconfig, "error", err)
				lastErr = err.Error()
			}
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
func decided(o *csrObject) bool {
	for _, c := range o.Status.Conditions {
		switch c.Type {
		case "Approved", "Denied", "Failed":
			return true
		}
	}
	return false
}

func request(o *csrObject) Request {
	return Request{SignerName: o.Spec.SignerName, Username: o.Spec.Username, Groups: o.Spec.Groups,
		Usages: o.Spec.Usages, PEM: o.Spec.Request}
}

// handle decides one CSR and records the decision through the approval subresource. A conflict
// (409: the CSR changed since it was read) is resolved by reading it again: if someone decided it
// meanwhile, that stands and handle returns it as not applied, without error.
func (a *Approver) handle(ctx context.Context, o *csrObject) (Result, error) {
	for attempt := 0; ; attempt++ {
		name := o.Metadata.Name
		if o.Spec.SignerName != SignerKubeletServing {
			return Result{Name: name}, nil
		}
		if decided(o) {
			return Result{Name: name, Decision: Decision{Verdict: Ignore, Message: "already decided"}}, nil
		}
		inv, err := a.inventory()
		if err != nil {
			return Result{Name: name}, err
		}
		d := Decide(inv, request(o))
		if d.Verdict == Ignore {
			return Result{Name: name, Decision: d}, nil
		}
		cond := condition{Type: "Approved", Status: "True", Reason: d.Reason(), Message: d.Message,
			LastUpdateTime: time.Now().UTC().Format(time.RFC3339)}
		if d.Verdict == Deny {
			cond.Type = "Denied"
		}
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		err = a.api.updateApproval(cctx, o, cond)
		cancel()
		switch {
		case err == nil:
			a.logDecision(o, d)
			return Result{Name: name, Decision: d, Applied: true}, nil
		case errors.Is(err, errNotFound):
			return Result{Name: name, Decision: d}, nil
		case errors.Is(err, errConflict) && attempt < 3:
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			fresh, gerr := a.api.get(cctx, name)
			cancel()
			if errors.Is(gerr, errNotFound) {
				return Result{Name: name, Decision: d}, nil
			} else if gerr != nil {
				return Result{Name: name, Decision: d}, fmt.Errorf("read certificate signing request %s after a conflict: %w", name, gerr)
			}
			o = fresh
		default:
			return Result{Name: name, Decision: d}, fmt.Errorf("%s certificate signing request %s: %w", d.Verdict, name, err)
		}
	}
}

func (a *Approver) logDecision(o *csrObject, d Decision) {
	attrs := []any{"csr", o.Metadata.Name, "node", d.Node, "requestor", o.Spec.Username, "reason", d.Reason(), "message", d.Message}
	if d.Verdict == Approve {
		a.log.Info("approved kubelet serving certificate request", attrs...)
	} else {
		a.log.Warn("denied kubelet serving certificate request", attrs...)
	}
}
