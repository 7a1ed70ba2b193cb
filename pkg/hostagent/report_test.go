package hostagent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os/exec"
	"testing"

	"github.com/airgap-appliance/appliance/pkg/agentapi"
)

// TestReportStepCutByStop: a step whose command the agent's own stop kills (exec.CommandContext's
// "signal: killed") is not reported failed, while a step that fails with the agent running is. CI
// saw the old agent's cut kubectl apply, reported failed as it was stopped for an upgrade, become
// the new build's failure.
func TestReportStepCutByStop(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a := &Agent{log: log, last: map[string]agentapi.Report{}, rep: newReporter(nil, nil, log)}
	ctx, stop := context.WithCancel(context.Background())
	err := a.report(ctx, agentapi.StepAPI, func(ctx context.Context) (string, error) {
		cmd := exec.CommandContext(ctx, "sleep", "30")
		if err := cmd.Start(); err != nil {
			return "", err
		}
		stop() // the agent's SIGTERM, mid-command
		return "", cmd.Wait()
	})
	if err == nil {
		t.Fatal("the cut step returned no error")
	}
	var statuses []string
	for _, r := range a.rep.queue {
		statuses = append(statuses, r.Status)
	}
	if len(statuses) != 1 || statuses[0] != agentapi.StatusRunning {
		t.Errorf("reports of the cut step: %v, want only [running]", statuses)
	}

	a.rep.queue = nil
	err = a.report(context.Background(), agentapi.StepAPI, func(context.Context) (string, error) {
		return "", errors.New("apply the ingress router manifest: exit status 1")
	})
	if err == nil || len(a.rep.queue) != 1 || a.rep.queue[0].Status != agentapi.StatusFailed {
		t.Errorf("a real failure: err %v, reports %+v; want one failed report", err, a.rep.queue)
	}
}
