package labns

import (
	"net"
	"runtime"
	"slices"
	"testing"

	"github.com/vishvananda/netns"
)

// InNamespace runs f on an OS thread that has entered the network namespace at nsPath (a
// /run/netns/NAME path) and returns f's error, or the error of entering it. The thread is never
// handed back to the runtime (it ends locked, and Go retires it), so no other code runs in the
// namespace by accident; sockets f makes (listeners, connections) stay in it.
func InNamespace(nsPath string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		h, err := netns.GetFromPath(nsPath)
		if err != nil {
			errc <- err
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}

// RootLinks lists the root network namespace's interface names, sorted: a lab never adds one there,
// so tests compare the list before and after.
func RootLinks(t testing.TB) []string {
	t.Helper()
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name)
	}
	slices.Sort(names)
	return names
}
