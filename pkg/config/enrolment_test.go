package config

import (
	"reflect"
	"testing"
)

// serverBoot is a boot section leasing addresses (boot.dhcp: server) on the lab's control-plane network.
const serverBoot = "boot:\n  dhcp: server\n  range: {start: 10.100.0.200, end: 10.100.0.250}\n"

// TestEnrolmentDefaults: approval is automatic; the source address is checked against the lease
// (lease) where the appliance leases addresses (boot.dhcp: server) and not otherwise (any); written
// values stay; SetDefaults is idempotent; EnrolFromLease holds for the nodes the DHCP server gives
// an address to (w1, network-booted), never for an SSH node, and not with any.
func TestEnrolmentDefaults(t *testing.T) {
	tests := []struct {
		name  string
		extra string
		want  Enrolment
		w1    bool // EnrolFromLease(w1); every other node: false
	}{
		{"proxy: nothing to check", "", Enrolment{Approval: EnrolApprovalAutomatic, SourceAddress: EnrolSourceAny}, false},
		{"server: the lease", serverBoot, Enrolment{Approval: EnrolApprovalAutomatic, SourceAddress: EnrolSourceLease}, true},
		{"server, any written", serverBoot + "  enrolment: {sourceAddress: any}\n", Enrolment{Approval: EnrolApprovalAutomatic, SourceAddress: EnrolSourceAny}, false},
		{"operator written", serverBoot + "  enrolment: {approval: operator}\n", Enrolment{Approval: EnrolApprovalOperator, SourceAddress: EnrolSourceLease}, true},
		{"proxy, operator", "boot:\n  enrolment: {approval: operator}\n", Enrolment{Approval: EnrolApprovalOperator, SourceAddress: EnrolSourceAny}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, warns, errs := labWith(t, tt.extra, w1MAC...)
			if len(errs) > 0 || len(warns) > 0 {
				t.Fatalf("errors %v, warnings %v", errs, warns)
			}
			if c.Boot.Enrolment != tt.want {
				t.Errorf("boot.enrolment = %+v, want %+v", c.Boot.Enrolment, tt.want)
			}
			before := c.Boot
			SetDefaults(c)
			if !reflect.DeepEqual(c.Boot, before) {
				t.Errorf("SetDefaults not idempotent: %+v then %+v", before, c.Boot)
			}
			for _, n := range c.Nodes {
				want := map[string]bool{"w1": tt.w1}[n.Name]
				if got := c.EnrolFromLease(n); got != want {
					t.Errorf("EnrolFromLease(%s) = %v, want %v", n.Name, got, want)
				}
			}
		})
	}
}

// TestEnrolmentInvalid asserts the exact error paths, each saying what to write instead.
func TestEnrolmentInvalid(t *testing.T) {
	type want = fieldWant
	tests := []struct {
		name  string
		extra string
		want  []want
	}{
		{"unknown approval", serverBoot + "  enrolment: {approval: manual}\n", []want{
			{"boot.enrolment.approval", `"manual" is not an approval mode: use automatic or operator`}}},
		{"unknown source", serverBoot + "  enrolment: {sourceAddress: mac}\n", []want{
			{"boot.enrolment.sourceAddress", `"mac" is not a source rule: use lease (boot.dhcp: server only) or any`}}},
		{"lease with proxy", "boot:\n  dhcp: proxy\n  enrolment: {sourceAddress: lease}\n", []want{
			{"boot.enrolment.sourceAddress", "lease needs boot.dhcp: server (it is proxy): the appliance leases no address with proxy, so there is none to check; remove it (any), set boot.dhcp: server, or set boot.enrolment.approval: operator"}}},
		{"lease with off", "boot:\n  dhcp: \"off\"\n  enrolment: {sourceAddress: lease}\n", []want{
			{"boot.enrolment.sourceAddress", "lease needs boot.dhcp: server (it is off)"}}},
		{"unknown key", "boot:\n  enrolment: {approve: true}\n", []want{{"boot.enrolment.approve", ""}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, errs := labWith(t, tt.extra, w1MAC...)
			requireExactly(t, errs, tt.want)
		})
	}
	// Without defaults, an empty field says what it takes.
	c := labConfig(t)
	c.Boot.Enrolment = Enrolment{}
	v := validator{c: c}
	v.enrolment()
	requireExactly(t, v.errs, []want{
		{"boot.enrolment.approval", "is required: automatic (the first enrolment of a power-on gets the node's token) or operator"},
		{"boot.enrolment.sourceAddress", "is required: lease"}})
}
