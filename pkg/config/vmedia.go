package config

import (
	"net/url"
)

// virtualMedia checks power.virtualMediaImage (path is "nodes[i].power"): only for kind redfish with
// bootDevice cdrom, an http:// or https:// URL with a host and without credentials (the BMC fetches
// it and the URL appears in the BMC's logs and the appliance's progress lines).
func (v *validator) virtualMedia(path string, p Power) {
	if p.VirtualMediaImage == "" {
		return
	}
	f := path + ".virtualMediaImage"
	switch {
	case p.Kind != PowerRedfish && p.Kind != "":
		v.errorf(f, "is only used with power.kind redfish (virtual media is a Redfish BMC feature; kind %s has none): remove it, or drive the node's BMC with kind redfish", p.Kind)
	case p.BootDevice != BootCDROM:
		v.errorf(f, "needs power.bootDevice: cdrom (the node boots the inserted image once; it is %s): set bootDevice: cdrom, or remove virtualMediaImage to boot from %s", p.BootDevice, p.BootDevice)
	}
	u, err := url.Parse(p.VirtualMediaImage)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		v.errorf(f, "is not an http:// or https:// URL with a host: give the URL the BMC fetches the ISO from, e.g. https://10.0.0.2:8443/boot/node.iso")
	case u.User != nil:
		v.errorf(f, "%s carries credentials: the URL shows in the BMC's and the appliance's logs; serve the image without them (it holds public data only)", u.Redacted())
	case u.Fragment != "":
		v.errorf(f, "%q has a #fragment, which is never sent to the server: remove it", p.VirtualMediaImage)
	}
}
