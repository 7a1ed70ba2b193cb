package config

// EnrolApproval says who lets an enrolment have the node's token (boot.enrolment.approval).
type EnrolApproval string

const (
	// EnrolApprovalAutomatic hands the token to the first enrolment of a power-on that passes every
	// check (MAC, SMBIOS UUID, power-on window, source address): first come, first served.
	EnrolApprovalAutomatic EnrolApproval = "automatic"
	// EnrolApprovalOperator keeps that enrolment pending, without the token, until the operator has
	// compared its key fingerprint and source address with the machine's console and run
	// `appliance node approve NODE` (like kubelet certificate signing requests).
	EnrolApprovalOperator EnrolApproval = "operator"
)

// EnrolSource says which address an enrolment may come from (boot.enrolment.sourceAddress).
type EnrolSource string

const (
	// EnrolSourceLease: a node the appliance's DHCP server leases an address to (boot.dhcp: server;
	// a network-booted node, or one booted from virtual media: Node.InstallsItself) enrols only from
	// that address, while the lease is its; with no lease for its MAC it cannot enrol.
	EnrolSourceLease EnrolSource = "lease"
	// EnrolSourceAny: no address is checked.
	EnrolSourceAny EnrolSource = "any"
)

// Enrolment is how a machine the appliance booted through its BMC (network boot or virtual media)
// gets its node token: it enrols (`hostagent enroll`: its MACs, SMBIOS UUID and a new key, within 30
// minutes of the power-on, once per power-on). These settings bind that enrolment further, against a
// machine on the provisioning network that races the real one (docs/operator.md, "Enrolment").
type Enrolment struct {
	// Approval: automatic or operator. Default automatic. With operator, an enrolment gets no token
	// until `appliance node approve NODE` approves the key it shows (`appliance status` lists the
	// pending ones); the machine waits and retries until then, or until its enrolment window ends.
	Approval EnrolApproval `yaml:"approval,omitempty"`
	// SourceAddress: lease or any. With lease, the enrolment of a node the appliance's DHCP server
	// leases an address to (network-booted, or booted from virtual media) must come from that
	// address. With boot.dhcp proxy or off the appliance leases no address, so there is none to
	// check: lease is refused there (set approval: operator to have each enrolment checked by the
	// operator instead). Default lease with boot.dhcp: server, any otherwise.
	SourceAddress EnrolSource `yaml:"sourceAddress,omitempty"`
}

// IsZero reports whether nothing is set (the YAML encoder leaves boot.enrolment out then).
func (e Enrolment) IsZero() bool { return e.Approval == "" && e.SourceAddress == "" }

// EnrolFromLease reports whether node n's enrolment must come from the address the appliance's DHCP
// server leased to its MAC: boot.enrolment.sourceAddress lease (so boot.dhcp server) and n is a node
// that server gives an address to (Node.InstallsItself: network-booted, or booted from virtual media
// on the network it leases).
func (c *BootstrapConfiguration) EnrolFromLease(n Node) bool {
	return c.Boot.DHCP == BootDHCPServer && c.Boot.Enrolment.SourceAddress == EnrolSourceLease && n.InstallsItself()
}

// setEnrolmentDefaults fills boot.enrolment once boot.dhcp is defaulted.
func setEnrolmentDefaults(c *BootstrapConfiguration) {
	e := &c.Boot.Enrolment
	if e.Approval == "" {
		e.Approval = EnrolApprovalAutomatic
	}
	if e.SourceAddress == "" {
		e.SourceAddress = EnrolSourceAny
		if c.Boot.DHCP == BootDHCPServer {
			e.SourceAddress = EnrolSourceLease
		}
	}
}

// enrolment validates boot.enrolment.
func (v *validator) enrolment() {
	e := v.c.Boot.Enrolment
	switch e.Approval {
	case EnrolApprovalAutomatic, EnrolApprovalOperator:
	case "":
		v.errorf("boot.enrolment.approval", "is required: automatic (the first enrolment of a power-on gets the node's token) or operator (it waits for `appliance node approve NODE`)")
	default:
		v.errorf("boot.enrolment.approval", "%q is not an approval mode: use automatic or operator", string(e.Approval))
	}
	switch e.SourceAddress {
	case EnrolSourceAny:
	case EnrolSourceLease:
		if d := v.c.Boot.DHCP; d != BootDHCPServer && d != "" {
			v.errorf("boot.enrolment.sourceAddress", "lease needs boot.dhcp: server (it is %s): the appliance leases no address with %s, so there is none to check; remove it (any), set boot.dhcp: server, or set boot.enrolment.approval: operator to check each enrolment yourself", d, d)
		}
	case "":
		v.errorf("boot.enrolment.sourceAddress", "is required: lease (with boot.dhcp: server, a node enrols only from the address the appliance leased it) or any")
	default:
		v.errorf("boot.enrolment.sourceAddress", "%q is not a source rule: use lease (boot.dhcp: server only) or any", string(e.SourceAddress))
	}
}
