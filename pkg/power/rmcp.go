package power

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"time"
)

// rmcpPing sends one RMCP/ASF Presence Ping (DMTF ASF 2.0, DSP0136 §3.2.4.3) to addr
// ("host:port", UDP) and waits for the matching Presence Pong. Every IPMI-over-LAN BMC answers it
// without a session, so it tells a BMC that refuses credentials from one that is not there.
func rmcpPing(ctx context.Context, addr string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(2 * time.Second)
	}
	_ = conn.SetDeadline(deadline)
	var tag [1]byte
	_, _ = rand.Read(tag[:])
	if tag[0] == 0xff { // 255 is reserved
		tag[0] = 0
	}
	ping := []byte{
		0x06, 0x00, 0xff, 0x06, // RMCP: version 1.0, reserved, sequence 255 (no ACK), class ASF
		0x00, 0x00, 0x11, 0xbe, // IANA enterprise number 4542 (ASF)
		0x80, tag[0], 0x00, 0x00, // Presence Ping, tag, reserved, data length 0
	}
	if _, err := conn.Write(ping); err != nil {
		return err
	}
	buf := make([]byte, 64)
	for {
		n, err := conn.Read(buf)
		if err != nil {
			return err
		}
		if n >= 12 && buf[0] == 0x06 && buf[3] == 0x06 && buf[8] == 0x40 && buf[9] == tag[0] {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("no RMCP presence pong from %s: %w", addr, ctx.Err())
		}
	}
}
