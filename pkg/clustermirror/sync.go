package clustermirror

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airgap-appliance/appliance/registry"
)

// Mirror settings for the copy from the appliance: the appliance's indexes are kept whole (they are
// already filtered to the bundle's platforms), and Mirror retries little because Run retries the
// whole sync with backoff.
const (
	mirrorRetries = 2
	mirrorTimeout = 30 * time.Second
	catalogPage   = 1000 // n= of /v2/_catalog and tags/list requests
	maxListing    = 64 << 20
)

// newClient is the HTTPS client for the catalog and the repository: the appliance CA only, TLS 1.2+,
// no proxy (the appliance is on the node network), bounded connect, handshake and header waits.
func (c *config) newClient() *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		DialContext:           d.DialContext,
		TLSClientConfig:       c.tlsClientConfig(),
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: mirrorTimeout,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
	}
	return &http.Client{Transport: tr}
}

// sync copies everything once and writes the marker.
func (c *config) sync(ctx context.Context, st *state) (*marker, error) {
	start := time.Now()
	client := c.newClient()
	defer client.CloseIdleConnections()
	m := &marker{Version: markerVersion, Upstream: c.Upstream}

	refs, err := c.listImages(ctx, client)
	if err != nil {
		return nil, err
	}
	refs = mergeRefs(refs, c.extra)
	st.update(func(s *state) { s.imagesTotal = len(refs) })
	res, fetchedImages, err := c.syncImages(ctx, refs, st)
	if err != nil {
		return nil, err
	}
	for _, img := range res.Images {
		m.Images = append(m.Images, markerImage{Ref: img.Ref, Digest: img.Digest})
	}
	imp, err := c.importImages(ctx)
	if err != nil {
		return nil, err
	}
	m.Blobs = imp.Blobs
	st.update(func(s *state) { s.h.Phase = "packages" })
	repo, debs, repoBytes, fetchedRepo, err := c.syncRepo(ctx, client, st)
	if err != nil {
		return nil, err
	}
	m.Repo, m.Debs = repo, debs
	m.Bytes = res.Size + repoBytes
	if err := syncFS(c.Dir); err != nil {
		return nil, err
	}
	m.Completed = time.Now().UTC().Truncate(time.Second)
	if err := writeMarker(c.Dir, m); err != nil {
		return nil, fmt.Errorf("write %s: %w", markerFile, err)
	}
	d := time.Since(start)
	fetched := fetchedImages + fetchedRepo
	c.Log.Info("sync complete", "images", len(m.Images), "blobs", m.Blobs, "debs", m.Debs, "bytes", m.Bytes,
		"fetched_bytes", fetched, "seconds", d.Seconds(), "mb_per_s", float64(fetched)/1e6/d.Seconds())
	return m, nil
}

// listImages returns every image the upstream registry lists, as fully qualified references with a
// tag, e.g. "registry.k8s.io/pause:3.10" for repository "registry.k8s.io/pause" (the inverse of
// registry.HostComponent for the first path component: "myreg_5000/app" is "myreg:5000/app").
func (c *config) listImages(ctx context.Context, client *http.Client) ([]string, error) {
	repos, err := c.listPaged(ctx, client, fmt.Sprintf("/v2/_catalog?n=%d", catalogPage), "repositories")
	if err != nil {
		return nil, err
	}
	var refs []string
	for _, repo := range repos {
		tags, err := c.listPaged(ctx, client, fmt.Sprintf("/v2/%s/tags/list?n=%d", repo, catalogPage), "tags")
		if errors.Is(err, errNotFound) {
			err = nil // NAME_UNKNOWN: distribution's answer for a repository without tags
		}
		if err != nil {
			return nil, err
		}
		if len(tags) == 0 {
			if !c.namesRepository(repo) {
				c.Log.Warn("repository has no tags; its digest-only images are not copied (--images-file names none of them)", "repository", repo)
			}
			continue
		}
		first, rest, ok := strings.Cut(repo, "/")
		if !ok {
			c.Log.Warn("repository is not <registry host>/<path>; not copied", "repository", repo)
			continue
		}
		host := strings.Replace(first, "_", ":", 1) // HostComponent: a host name never holds '_'
		for _, tag := range tags {
			ref := host + "/" + rest + ":" + tag
			if r, t, err := registry.RepositoryFor(ref); err != nil || r != repo || t != tag {
				c.Log.Warn("image does not map back to its repository; not copied", "repository", repo, "tag", tag, "err", err)
				continue
			}
			refs = append(refs, ref)
		}
	}
	sort.Strings(refs)
	return refs, nil
}

// listPaged GETs path and the pages its Link headers name (distribution spec, "Listing
// Repositories"/"Listing Tags": `Link: <url>; rel="next"`), collecting the JSON string array field.
func (c *config) listPaged(ctx context.Context, client *http.Client, path, field string) ([]string, error) {
	var out []string
	next := c.base.String() + path
	for pages := 0; next != ""; pages++ {
		if pages > 10000 {
			return nil, fmt.Errorf("%w: GET %s: more than 10000 pages", ErrUpstreamContent, path)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, next, nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("upstream unreachable: %w", err)
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxListing))
		_ = resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("GET %s: %w", next, err)
		}
		if resp.StatusCode == http.StatusNotFound {
			return nil, fmt.Errorf("GET %s: %w", next, errNotFound)
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %s: %s", next, resp.Status, strings.TrimSpace(string(body[:min(len(body), 200)])))
		}
		var doc map[string]json.RawMessage
		var list []string
		if err := json.Unmarshal(body, &doc); err != nil {
			return nil, fmt.Errorf("%w: GET %s: %w", ErrUpstreamContent, next, err)
		}
		if raw, ok := doc[field]; ok && string(raw) != "null" {
			if err := json.Unmarshal(raw, &list); err != nil {
				return nil, fmt.Errorf("%w: GET %s: %q: %w", ErrUpstreamContent, next, field, err)
			}
		}
		out = append(out, list...)
		next, err = nextLink(resp.Request.URL, resp.Header.Values("Link"))
		if err != nil {
			return nil, fmt.Errorf("%w: GET %s: %w", ErrUpstreamContent, path, err)
		}
	}
	return out, nil
}

// nextLink returns the absolute URL of the rel="next" link (RFC 8288) among the Link header values,
// or "" when there is none. Only links to the same host are followed.
func nextLink(base *url.URL, values []string) (string, error) {
	for _, v := range values {
		for l := range strings.SplitSeq(v, ",") {
			target, params, ok := strings.Cut(strings.TrimSpace(l), ";")
			if !ok || !strings.HasPrefix(target, "<") || !strings.HasSuffix(target, ">") {
				continue
			}
			rel := false
			for p := range strings.SplitSeq(params, ";") {
				k, val, _ := strings.Cut(strings.TrimSpace(p), "=")
				if strings.EqualFold(k, "rel") && strings.Trim(val, `"`) == "next" {
					rel = true
				}
			}
			if !rel {
				continue
			}
			u, err := base.Parse(strings.Trim(target, "<>"))
			if err != nil {
				return "", fmt.Errorf("link %q: %w", target, err)
			}
			if u.Host != base.Host || u.Scheme != base.Scheme {
				return "", fmt.Errorf("link %q leaves %s", target, base.Host)
			}
			return u.String(), nil
		}
	}
	return "", nil
}

// syncImages copies refs from the upstream into Dir/oci with registry.Mirror, the upstream as the
// only mirror of every source registry. It returns Mirror's result and the bytes downloaded.
func (c *config) syncImages(ctx context.Context, refs []string, st *state) (registry.MirrorResult, int64, error) {
	ups := map[string]registry.Upstream{}
	for _, ref := range refs {
		host, _, _ := strings.Cut(ref, "/")
		comp, err := registry.HostComponent(host)
		if err != nil {
			return registry.MirrorResult{}, 0, fmt.Errorf("%w: %w", ErrUpstreamContent, err)
		}
		ups[strings.ToLower(host)] = registry.Upstream{Mirrors: []string{"https://" + c.base.Host + "/" + comp}, MirrorsOnly: true}
	}
	res, err := registry.Mirror(ctx, filepath.Join(c.Dir, ociDir), refs, registry.MirrorOptions{
		Platforms:     []string{"all"},
		Upstreams:     ups,
		RootCAs:       c.roots,
		Timeout:       mirrorTimeout,
		Retries:       mirrorRetries,
		Log:           c.Log,
		VerifiedStamp: filepath.Join(c.Dir, ociStamp),
		Progress: func(e registry.Event) {
			switch e.Kind {
			case registry.EventBlobFetched, registry.EventBlobReused:
				st.update(func(s *state) { s.blobsDone++; s.bytesDone += e.Size })
			case registry.EventImageDone:
				if e.Error == "" {
					st.update(func(s *state) { s.imagesDone++ })
				}
			}
		},
	})
	if err != nil {
		switch {
		case errors.Is(err, registry.ErrDigestMismatch):
			err = fmt.Errorf("copy images: %w: %w", ErrMismatch, err)
		case errors.Is(err, registry.ErrUnsupportedManifest), errors.Is(err, registry.ErrLayout), errors.Is(err, registry.ErrInvalidReference):
			err = fmt.Errorf("copy images: %w: %w", ErrUpstreamContent, err)
		default:
			err = fmt.Errorf("copy images: %w", err)
		}
		return res, 0, err
	}
	return res, res.Fetched.Bytes, nil
}

// importImages makes Dir/oci servable from Dir/registry (hard links, no copy).
func (c *config) importImages(ctx context.Context) (registry.ImportResult, error) {
	res, err := registry.Import(ctx, filepath.Join(c.Dir, ociDir), filepath.Join(c.Dir, registryDir), c.Log)
	if err != nil {
		return res, fmt.Errorf("import images into %s: %w", filepath.Join(c.Dir, registryDir), err)
	}
	return res, nil
}

// checkLocal makes sure the complete sync m is still on disk, without the upstream: the registry
// tree is checked (and repaired from Dir/oci, locally) with registry.Check/Import, and every
// repository file must be there with its size.
func (c *config) checkLocal(ctx context.Context, m *marker) error {
	if _, ok, err := registry.Check(filepath.Join(c.Dir, ociDir), filepath.Join(c.Dir, registryDir)); err != nil {
		return err
	} else if !ok {
		c.Log.Warn("registry tree incomplete; rebuilding it from the local OCI layout")
		if _, err := c.importImages(ctx); err != nil {
			return err
		}
	}
	if m.Repo != nil {
		for p, size := range m.Repo.Files {
			fi, err := os.Stat(filepath.Join(c.Dir, repoDir, filepath.FromSlash(p)))
			if err != nil {
				return err
			}
			if !fi.Mode().IsRegular() || fi.Size() != size {
				return fmt.Errorf("%s: %d bytes, the sync copied %d", filepath.Join(repoDir, p), fi.Size(), size)
			}
		}
	}
	return nil
}

// syncFS flushes the filesystem holding dir (syncfs(2)): every rename before the marker is durable.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// sha256File returns the hex SHA-256 and size of the file at p.
func sha256File(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, f, make([]byte, 1<<20))
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// mergeRefs is listed plus the references of extra it lacks, sorted.
func mergeRefs(listed, extra []string) []string {
	out := slices.Clone(listed)
	for _, r := range extra {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	sort.Strings(out)
	return out
}

// namesRepository reports whether ImagesFile names an image of the mirror repository repo.
func (c *config) namesRepository(repo string) bool {
	for _, r := range c.extra {
		if rr, _, err := registry.RepositoryFor(r); err == nil && rr == repo {
			return true
		}
	}
	return false
}
