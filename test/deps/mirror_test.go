package deps

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// aptSources reads this machine's apt sources: the one-line files (/etc/apt/sources.list,
// sources.list.d/*.list) and the deb822 ones (sources.list.d/*.sources), keyed by their path under
// /etc/apt. Other files there (e.g. *.disabled) are not sources to apt and are left out.
func aptSources(etcApt string) (map[string]string, error) {
	files := map[string]string{}
	paths, _ := filepath.Glob(filepath.Join(etcApt, "sources.list.d", "*"))
	paths = append(paths, filepath.Join(etcApt, "sources.list"))
	for _, p := range paths {
		if !strings.HasSuffix(p, ".list") && !strings.HasSuffix(p, ".sources") {
			continue
		}
		b, err := os.ReadFile(p)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		rel, _ := filepath.Rel(etcApt, p)
		files[rel] = string(b)
	}
	return files, nil
}

// sourceURIs returns the archive URIs of the enabled "deb" entries in apt source files (name → text):
// one-line `deb [options] URI suite…` entries in *.list files, `URIs:` fields of deb822 stanzas in
// *.sources files (a stanza with `Enabled: no` is skipped). Sorted, each once.
func sourceURIs(files map[string]string) ([]*url.URL, error) {
	var raw []string
	for name, text := range files {
		if strings.HasSuffix(name, ".sources") {
			for _, stanza := range strings.Split(text, "\n\n") {
				var uris []string
				enabled, deb := true, false
				for _, l := range strings.Split(stanza, "\n") {
					k, v, ok := strings.Cut(l, ":")
					if !ok || strings.HasPrefix(strings.TrimSpace(l), "#") {
						continue
					}
					switch strings.ToLower(strings.TrimSpace(k)) {
					case "uris":
						uris = append(uris, strings.Fields(v)...)
					case "types":
						deb = slices.Contains(strings.Fields(v), "deb")
					case "enabled":
						enabled = strings.TrimSpace(v) != "no"
					}
				}
				if enabled && deb {
					raw = append(raw, uris...)
				}
			}
			continue
		}
		for _, l := range strings.Split(text, "\n") {
			f := strings.Fields(l)
			if len(f) < 3 || f[0] != "deb" {
				continue
			}
			i := 1
			if strings.HasPrefix(f[1], "[") { // [options]
				for i < len(f) && !strings.HasSuffix(f[i], "]") {
					i++
				}
				i++
			}
			if i < len(f) {
				raw = append(raw, f[i])
			}
		}
	}
	slices.Sort(raw)
	raw = slices.Compact(raw)
	var out []*url.URL
	for _, r := range raw {
		u, err := url.Parse(r)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("apt source URI %q: not an absolute URL", r)
		}
		out = append(out, u)
	}
	return out, nil
}

// mirrorProxy is an HTTP forward proxy that passes GET and HEAD requests for plain-http URLs on the
// allowed hosts (host:port, the mirror) and refuses everything else, without dialing, recording what
// it refused. It dials from the process's own network namespace.
type mirrorProxy struct {
	allowed map[string]bool
	rp      *httputil.ReverseProxy

	mu       sync.Mutex
	requests int
	bytes    int64
	refused  []string
	failed   []string
}

func newMirrorProxy(allowed []string) *mirrorProxy {
	p := &mirrorProxy{allowed: map[string]bool{}}
	for _, a := range allowed {
		p.allowed[a] = true
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(*httputil.ProxyRequest) {}, // the request's absolute URL already names the mirror
		Transport: &http.Transport{
			Proxy:                 nil, // no proxy from the environment: straight to the mirror
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second}).DialContext,
			ResponseHeaderTimeout: 2 * time.Minute,
			MaxIdleConnsPerHost:   4,
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			p.mu.Lock()
			p.failed = append(p.failed, fmt.Sprintf("%s %s: %v", r.Method, r.URL, err))
			p.mu.Unlock()
			http.Error(w, err.Error(), http.StatusBadGateway)
		},
	}
	return p
}

func (p *mirrorProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hostport := r.URL.Host
	if r.URL.Port() == "" {
		hostport = net.JoinHostPort(r.URL.Hostname(), "80")
	}
	if (r.Method != http.MethodGet && r.Method != http.MethodHead) || r.URL.Scheme != "http" || !p.allowed[hostport] {
		p.mu.Lock()
		p.refused = append(p.refused, r.Method+" "+r.RequestURI)
		p.mu.Unlock()
		http.Error(w, "test/deps: this container reaches only the Debian mirror over plain http", http.StatusForbidden)
		return
	}
	cw := &countingWriter{ResponseWriter: w}
	p.rp.ServeHTTP(cw, r)
	p.mu.Lock()
	p.requests++
	p.bytes += cw.n
	p.mu.Unlock()
}

// counts returns the requests passed so far, the bytes they returned, and copies of the refused and
// failed lists.
func (p *mirrorProxy) counts() (requests int, bytes int64, refused, failed []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.requests, p.bytes, slices.Clone(p.refused), slices.Clone(p.failed)
}

type countingWriter struct {
	http.ResponseWriter
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n += int64(n)
	return n, err
}

func TestSourceURIs(t *testing.T) {
	files := map[string]string{
		"sources.list.d/debian.sources": "Types: deb\n# a comment: with a colon\nURIs: http://deb.debian.org/debian\n" +
			"Suites: bookworm bookworm-updates\nComponents: main\n\n" +
			"Types: deb\nURIs: http://security.example/debian-security http://deb.debian.org/debian\nSuites: bookworm-security\n\n" +
			"Types: deb-src\nURIs: http://src.example/debian\n\n" +
			"Types: deb\nEnabled: no\nURIs: http://off.example/debian\n",
		"sources.list": "# deb http://commented.example/debian bookworm main\n" +
			"deb [arch=amd64 signed-by=/k.gpg] http://opts.example/debian bookworm main\n" +
			"deb-src http://src2.example/debian bookworm main\n" +
			"deb http://plain.example:8080/debian bookworm main\n",
	}
	got, err := sourceURIs(files)
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, u := range got {
		s = append(s, u.String())
	}
	want := []string{"http://deb.debian.org/debian", "http://opts.example/debian", "http://plain.example:8080/debian",
		"http://security.example/debian-security"}
	if !slices.Equal(s, want) {
		t.Errorf("sourceURIs = %q, want %q", s, want)
	}
	if _, err := sourceURIs(map[string]string{"x.list": "deb debian bookworm main\n"}); err == nil {
		t.Error("a relative URI was accepted")
	}
}

// TestMirrorProxy drives the proxy with Go's own client on 127.0.0.1: the allowed host is reached, any
// other host, a CONNECT and a POST are refused without a connection to them.
func TestMirrorProxy(t *testing.T) {
	mirror := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "package index for %s", r.URL.Path)
	}))
	defer mirror.Close()
	mu, _ := url.Parse(mirror.URL)
	p := newMirrorProxy([]string{mu.Host})
	front := httptest.NewServer(p)
	defer front.Close()
	fu, _ := url.Parse(front.URL)
	client := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(fu)}}

	resp, err := client.Get(mirror.URL + "/dists/bookworm/InRelease")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "package index for /dists/bookworm/InRelease" {
		t.Errorf("allowed host: %d %q", resp.StatusCode, body)
	}
	for _, u := range []string{"http://elsewhere.invalid/x", "http://" + net.JoinHostPort("127.0.0.1", "1") + "/y"} {
		resp, err := client.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("GET %s: %d, want 403", u, resp.StatusCode)
		}
	}
	if resp, err := client.Post(mirror.URL+"/upload", "text/plain", strings.NewReader("x")); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusForbidden {
		t.Errorf("POST to the mirror: %d, want 403", resp.StatusCode)
	}
	tls := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(fu)}}
	if _, err := tls.Get("https://" + mu.Host + "/"); err == nil {
		t.Error("CONNECT through the proxy succeeded")
	}
	requests, bytes, refused, failed := p.counts()
	if requests != 1 || bytes != int64(len(body)) || len(refused) != 4 || len(failed) != 0 {
		t.Errorf("counts: %d requests, %d bytes, refused %q, failed %q; want 1, %d, 4 refused, none failed",
			requests, bytes, refused, failed, len(body))
	}
}
