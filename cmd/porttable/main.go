// Command porttable prints the firewall port table as Markdown, from the same data the firewall applies,
// for any appliance HTTPS and API port. docs/reference/ports.md has it for the default ports (written by
// cmd/docgen: `make docs`).
//
// Usage: porttable [-https-port 8443] [-api-port 6443]
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/airgap-appliance/appliance/firewall"
)

func main() {
	https := flag.Uint("https-port", uint(firewall.DefaultHTTPSPort), "appliance HTTPS port shown in the table")
	api := flag.Uint("api-port", uint(firewall.DefaultAPIPort), "kube-apiserver/VIP port shown in the table")
	flag.Parse()
	if *https == 0 || *https > 65535 || *api == 0 || *api > 65535 {
		fmt.Fprintln(os.Stderr, "porttable: -https-port and -api-port must be in 1..65535")
		os.Exit(2)
	}
	fmt.Print(firewall.MarkdownTable(uint16(*https), uint16(*api)))
}
