package vipcheck

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// ProtocolVRRP is VRRP's IP protocol number (RFC 3768 §5.2.4, RFC 5798 §5.1.1.4).
const ProtocolVRRP = 112

// vrrpGroup is the IPv4 multicast group VRRP advertisements are sent to unless a speaker is
// configured for unicast (RFC 3768 §5.2.2, RFC 5798 §5.1.1.2), and its Ethernet group address
// (RFC 1112 §6.4).
var vrrpGroupMAC = [8]byte{0x01, 0x00, 0x5e, 0x00, 0x00, 0x12}

// ErrNotAdvertisement is returned by ParseAdvert for a packet that is not a VRRPv2 or VRRPv3
// advertisement (too short, another version, another type, a truncated address list).
var ErrNotAdvertisement = errors.New("not a VRRP advertisement")

// Advert is one VRRP advertisement as heard on the segment.
type Advert struct {
	// Source is the IP source address of the advertisement: the speaker's own address.
	Source netip.Addr
	// Version is 2 (RFC 3768) or 3 (RFC 5798).
	Version int
	// VRID is the virtual router ID, 1..255.
	VRID uint8
	// Priority of the speaker, 0..255 (0: a master resigning; 255: the address owner).
	Priority uint8
	// Interval is the advertisement interval the speaker announces: whole seconds in VRRPv2
	// (Adver Int), centiseconds in VRRPv3 (Max Adver Int).
	Interval time.Duration
	// Addresses are the virtual addresses the speaker advertises.
	Addresses []netip.Addr
}

// ParseAdvert parses the VRRP part of an IP packet (the bytes after the IP header), from a speaker
// of the given address family (ipv6 selects 16-byte addresses; VRRPv2 is IPv4-only). Layouts:
// RFC 3768 §5.1 (version 2: Adver Int in seconds, then authentication) and RFC 5798 §5.1
// (version 3: a 12-bit Max Adver Int in centiseconds). The checksum is not verified: the
// pre-flight only needs to know who speaks for which VRID, and a corrupt packet from a foreign
// speaker is still a foreign speaker. Errors: ErrNotAdvertisement, wrapped with the reason.
func ParseAdvert(b []byte, ipv6 bool) (Advert, error) {
	if len(b) < 8 {
		return Advert{}, fmt.Errorf("%w: %d bytes, a VRRP header has 8", ErrNotAdvertisement, len(b))
	}
	a := Advert{Version: int(b[0] >> 4), VRID: b[1], Priority: b[2]}
	if typ := b[0] & 0x0f; typ != 1 {
		return Advert{}, fmt.Errorf("%w: type %d, an advertisement is type 1", ErrNotAdvertisement, typ)
	}
	alen := 4
	switch a.Version {
	case 2:
		if ipv6 {
			return Advert{}, fmt.Errorf("%w: VRRPv2 over IPv6", ErrNotAdvertisement)
		}
		a.Interval = time.Duration(b[5]) * time.Second
	case 3:
		if ipv6 {
			alen = 16
		}
		a.Interval = time.Duration(binary.BigEndian.Uint16(b[4:6])&0x0fff) * 10 * time.Millisecond
	default:
		return Advert{}, fmt.Errorf("%w: version %d", ErrNotAdvertisement, a.Version)
	}
	n := int(b[3])
	if len(b) < 8+n*alen {
		return Advert{}, fmt.Errorf("%w: %d addresses announced, %d bytes present", ErrNotAdvertisement, n, len(b)-8)
	}
	for i := range n {
		ip, _ := netip.AddrFromSlice(b[8+i*alen : 8+(i+1)*alen])
		a.Addresses = append(a.Addresses, ip)
	}
	return a, nil
}
