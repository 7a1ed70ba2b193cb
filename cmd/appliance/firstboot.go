package main

import (
	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/firstboot"
)

func newFirstbootCommand() *cobra.Command {
	var bannerOnly bool
	cmd := &cobra.Command{
		Use:   "firstboot",
		Short: "Set up a host booted from the appliance ISO: configuration, network, state disk, SSH, then start bootstrapping",
		Long: `Run by appliance-firstboot.service at every boot of the appliance ISO. Finds the configuration (a
volume labelled ` + firstboot.ConfigLabel + ` holding ` + firstboot.ConfigFile + `, or appliance.config=URL on the kernel
command line), gives the host the addresses of host.interfaces (systemd-networkd), mounts host.stateDevice
at stateDir (formatting it only when blank), enables SSH for host.sshAuthorizedKeys, and starts
` + firstboot.BootstrapUnit + `. The console banner (` + firstboot.BannerPath + `) shows the result or
what to provide. --banner-only refreshes the banner (nodes' states) and nothing else.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := firstboot.Options{Log: cmd.ErrOrStderr()}
			if bannerOnly {
				return firstboot.Banner(o)
			}
			return firstboot.Run(cmd.Context(), o)
		},
	}
	cmd.Flags().BoolVar(&bannerOnly, "banner-only", false, "only refresh the console banner")
	return cmd
}
