package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/spf13/cobra"

	"github.com/airgap-appliance/appliance/pkg/config"
	"github.com/airgap-appliance/appliance/pkg/dnsrecords"
)

func newDNSCommand(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dns",
		Short: "The cluster's DNS records (api, api-int, *.apps, etcd-N, etcd SRV, nodes) under baseDomain",
	}
	cmd.AddCommand(newDNSZoneCommand(g))
	return cmd
}

// newDNSZoneCommand is `appliance dns zone --config FILE`: the zone <clusterName>.<baseDomain> as an
// RFC 1035 zone file on stdout, for the datacenter's own DNS (pkg/dnsrecords).
func newDNSZoneCommand(g *globalFlags) *cobra.Command {
	var configPath, nameServer string
	var serial uint32
	cmd := &cobra.Command{
		Use:   "zone",
		Short: "Print the cluster's DNS zone as a zone file for the datacenter's DNS (JSON records with -o json)",
		Long: `Print the zone <clusterName>.<baseDomain> as an RFC 1035 zone file (BIND's named-checkzone accepts it):
api and api-int (apiServer.vip), *.apps (the control planes), etcd-N and the _etcd-server-ssl._tcp SRV
records (the control planes), one A record per node, and the zone's SOA and NS records. The name server
ns.<zone> has the address dns.listenAddress (where appliance serve answers the same records), or the
one given with --name-server. The SOA serial is the configuration file's modification time (seconds
since 1970) unless --serial sets one.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, _, err := config.Load(configPath, config.ValidateOptions{})
			if err != nil {
				return fmt.Errorf("%s is not valid:\n%w", configPath, err)
			}
			var o dnsrecords.Options
			if nameServer != "" {
				a, err := netip.ParseAddr(nameServer)
				if err != nil || !a.Is4() {
					return fmt.Errorf("--name-server %q is not an IPv4 address: give the address of the server that will load the zone, e.g. 10.100.0.2", nameServer)
				}
				o.NameServer = a
			}
			if o.Serial = serial; serial == 0 {
				if o.Serial, err = dnsrecords.FileSerial(configPath); err != nil {
					return err
				}
			}
			z, err := dnsrecords.New(cfg, o)
			switch {
			case errors.Is(err, dnsrecords.ErrNoBaseDomain):
				return fmt.Errorf("%s: %w", configPath, err)
			case errors.Is(err, dnsrecords.ErrNoNameServer):
				return fmt.Errorf("%s: %w (--name-server ADDRESS)", configPath, err)
			case err != nil:
				return err
			}
			if g.output == outputJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(struct {
					Origin  string              `json:"origin"`
					Records []dnsrecords.Record `json:"records"`
				}{z.Origin, z.Records()})
			}
			_, err = z.WriteTo(cmd.OutOrStdout())
			return err
		},
	}
	cmd.Flags().StringVarP(&configPath, "config", "c", "bootstrap.yaml", "BootstrapConfiguration file (sets baseDomain)")
	cmd.Flags().StringVar(&nameServer, "name-server", "", "IPv4 address of the zone's name server ns.<zone> (default: dns.listenAddress)")
	cmd.Flags().Uint32Var(&serial, "serial", 0, "SOA serial (default: the configuration file's modification time, seconds since 1970)")
	return cmd
}
