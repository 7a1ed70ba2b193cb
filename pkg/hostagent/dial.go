package hostagent

import (
	"context"
	"net"
	"net/netip"
	"time"
)

// localAddrKey carries the source address set by WithLocalAddr.
type localAddrKey struct{}

// WithLocalAddr returns a copy of ctx under which every connection the agent opens to the
// appliance (FetchCA, Enroll, and a Client's requests, for connections the request under ctx
// opens) is dialled from addr instead of the address the kernel's route picks. addr must be local
// (assigned to an interface, or inside an AnyIP `ip route add local PREFIX dev lo`); dialling from
// any other address fails with the kernel's EADDRNOTAVAIL.
//
// The appliance limits connections and enrolments per source address (pkg/connlimit,
// pkg/server's rate limits), so a process that speaks for many nodes — the fleet bench's simulated
// nodes (test/bench/fleet) — gives each node the address the configuration says it has, as a real
// fleet would.
func WithLocalAddr(ctx context.Context, addr netip.Addr) context.Context {
	return context.WithValue(ctx, localAddrKey{}, addr)
}

// dialContext is the agent's transports' DialContext: net/http's default dialer (30 s connect
// timeout, 30 s TCP keep-alive), from the address WithLocalAddr put in ctx when there is one.
// net/http dials with a context carrying the values of the request that asked for the connection.
func dialContext(ctx context.Context, network, address string) (net.Conn, error) {
	d := net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	if a, ok := ctx.Value(localAddrKey{}).(netip.Addr); ok && a.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: a.AsSlice()}
	}
	return d.DialContext(ctx, network, address)
}
