package vipcheck

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"
)

func TestParseAdvert(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		ipv6 bool
		want Advert
		err  bool
	}{
		{
			// RFC 3768 §5.1: version 2, type 1, VRID 51, priority 100, 1 address, auth PASS, 1 s.
			name: "v2 PASS",
			b:    []byte{0x21, 51, 100, 1, 1, 1, 0, 0, 10, 0, 0, 100, 'p', 'a', 's', 's', 0, 0, 0, 0},
			want: Advert{Version: 2, VRID: 51, Priority: 100, Interval: time.Second, Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.100")}},
		},
		{
			// RFC 5798 §5.1: version 3, VRID 7, priority 150, 2 addresses, Max Adver Int 25 cs.
			name: "v3 250ms",
			b:    []byte{0x31, 7, 150, 2, 0x00, 25, 0, 0, 10, 0, 0, 100, 10, 0, 0, 101},
			want: Advert{Version: 3, VRID: 7, Priority: 150, Interval: 250 * time.Millisecond,
				Addresses: []netip.Addr{netip.MustParseAddr("10.0.0.100"), netip.MustParseAddr("10.0.0.101")}},
		},
		{
			name: "v3 reserved bits ignored",
			b:    []byte{0x31, 7, 1, 0, 0xf0, 100, 0, 0},
			want: Advert{Version: 3, VRID: 7, Priority: 1, Interval: time.Second},
		},
		{name: "short", b: []byte{0x31, 7, 150}, err: true},
		{name: "type 2", b: []byte{0x32, 7, 150, 0, 0, 100, 0, 0}, err: true},
		{name: "version 4", b: []byte{0x41, 7, 150, 0, 0, 100, 0, 0}, err: true},
		{name: "truncated addresses", b: []byte{0x31, 7, 150, 2, 0, 100, 0, 0, 10, 0, 0, 1}, err: true},
		{name: "v2 over IPv6", b: []byte{0x21, 7, 150, 0, 0, 1, 0, 0}, ipv6: true, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseAdvert(tc.b, tc.ipv6)
			if tc.err {
				if !errors.Is(err, ErrNotAdvertisement) {
					t.Fatalf("ParseAdvert = %+v, %v; want ErrNotAdvertisement", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Version != tc.want.Version || got.VRID != tc.want.VRID || got.Priority != tc.want.Priority ||
				got.Interval != tc.want.Interval || !slices.Equal(got.Addresses, tc.want.Addresses) {
				t.Errorf("ParseAdvert = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// FuzzParseAdvert: any bytes from the wire give an advertisement or ErrNotAdvertisement, never a panic.
func FuzzParseAdvert(f *testing.F) {
	f.Add([]byte{0x21, 51, 100, 1, 1, 1, 0, 0, 10, 0, 0, 100, 'p', 'a', 's', 's', 0, 0, 0, 0}, false)
	f.Add([]byte{0x31, 7, 150, 1, 0x00, 25, 0, 0, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, true)
	f.Add([]byte{0x31, 7, 150, 255, 0, 25, 0, 0}, false)
	f.Fuzz(func(t *testing.T, b []byte, ipv6 bool) {
		a, err := ParseAdvert(b, ipv6)
		if err != nil {
			if !errors.Is(err, ErrNotAdvertisement) {
				t.Fatalf("error %v does not wrap ErrNotAdvertisement", err)
			}
			return
		}
		if a.Version != 2 && a.Version != 3 || int(b[3]) != len(a.Addresses) {
			t.Fatalf("parsed %+v from %x", a, b)
		}
	})
}

// TestWindowHearsDefaultSpeakers: however fast our own adverts, the pre-flight listens at least
// DefaultIntervals × 1 s, VRRP's default interval, so a foreign group that kept the default is heard
// (before: 3 × 250 ms = 0.75 s, shorter than one of its intervals).
func TestWindowHearsDefaultSpeakers(t *testing.T) {
	for _, tc := range []struct {
		advert time.Duration
		want   time.Duration
	}{
		{0, 3 * time.Second},
		{250 * time.Millisecond, 3 * time.Second},
		{10 * time.Millisecond, 3 * time.Second},
		{2 * time.Second, 6 * time.Second},
	} {
		if got := (Options{AdvertInterval: tc.advert}).Window(); got != tc.want {
			t.Errorf("Window with %s adverts = %s, want %s", tc.advert, got, tc.want)
		}
	}
}
