package bootstrap

import (
	"context"
	"fmt"

	"github.com/airgap-appliance/appliance/pkg/config"
)

// loadPhase reads, defaults and validates the configuration.
type loadPhase struct{}

func (loadPhase) Name() string { return "load" }

func (loadPhase) Run(_ context.Context, st *State) (Result, error) {
	cfg, warnings, err := config.Load(st.Options.ConfigPath, config.ValidateOptions{CheckFiles: true})
	for _, w := range warnings {
		st.Options.Logger.Warn("configuration warning", "warning", w.Error())
		st.Warnings = append(st.Warnings, w.Error())
	}
	if err != nil {
		return Result{}, fmt.Errorf("%s is not valid:\n%w", st.Options.ConfigPath, err)
	}
	st.Config = cfg
	st.StateDir = cfg.StateDir
	if st.Options.StateDir != "" {
		if err := config.CheckStateDir(st.Options.StateDir); err != nil {
			return Result{}, err
		}
		st.StateDir = st.Options.StateDir
	}
	detail := fmt.Sprintf("cluster %q, %d control-plane and %d worker nodes", cfg.ClusterName, len(cfg.ControlPlaneNodes()), len(cfg.WorkerNodes()))
	if len(warnings) > 0 {
		detail += fmt.Sprintf(", %d warning(s): %s", len(warnings), warnings[0].Error())
	}
	return Result{Detail: detail}, nil
}
