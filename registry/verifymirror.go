package registry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// MirrorCheck is what VerifyMirror pulled from one mirror.
type MirrorCheck struct {
	BaseURL   string // e.g. https://10.100.0.11:5443
	Manifests int    // manifests and indexes pulled
	Blobs     int    // distinct configs and layers pulled
	Bytes     int64  // bytes received and hashed
}

// manifestAccept is every manifest media type the mirror may hold (OCI and Docker v2.2, image and index).
var manifestAccept = strings.Join([]string{string(types.OCIImageIndex), string(types.OCIManifestSchema1),
	string(types.DockerManifestList), string(types.DockerManifestSchema2)}, ", ")

// VerifyMirror pulls every manifest (each index and every manifest it lists) and every blob (config and
// layers) of images from the registry at baseURL over the OCI distribution API (GET
// /v2/<repository>/manifests/<digest>, /v2/<repository>/blobs/<digest>), hashing every byte and
// comparing it with its digest (and the descriptor's size). A blob shared by several images is pulled
// once. client must trust the mirror's CA. It is the hand-off's proof that a mirror holds everything
// the appliance serves before nodes depend on it.
//
// Errors name the mirror, repository and digest: a status other than 200, a digest or size mismatch,
// or a manifest that does not parse.
func VerifyMirror(ctx context.Context, client *http.Client, baseURL string, images []Image) (MirrorCheck, error) {
	c := MirrorCheck{BaseURL: baseURL}
	seen := map[string]bool{}
	get := func(repo, kind, dgst, accept string, size int64) ([]byte, error) {
		url := strings.TrimSuffix(baseURL, "/") + "/v2/" + repo + "/" + kind + "/" + dgst
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", url, err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("%s: %s", url, resp.Status)
		}
		h := sha256.New()
		var keep bytes.Buffer
		w := io.Writer(h)
		if kind == "manifests" {
			w = io.MultiWriter(h, &keep)
		}
		n, err := io.Copy(w, resp.Body)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", url, err)
		}
		c.Bytes += n
		if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != dgst {
			return nil, fmt.Errorf("%s: %w: got %s", url, ErrDigestMismatch, got)
		}
		if size >= 0 && n != size {
			return nil, fmt.Errorf("%s: %w: %d bytes, the descriptor says %d", url, ErrDigestMismatch, n, size)
		}
		return keep.Bytes(), nil
	}
	var manifest func(repo, dgst string, size int64) error
	manifest = func(repo, dgst string, size int64) error {
		if seen[repo+"@"+dgst] {
			return nil
		}
		seen[repo+"@"+dgst] = true
		body, err := get(repo, "manifests", dgst, manifestAccept, size)
		if err != nil {
			return err
		}
		c.Manifests++
		var probe struct {
			MediaType string          `json:"mediaType"`
			Manifests json.RawMessage `json:"manifests"`
		}
		_ = json.Unmarshal(body, &probe)
		if len(probe.Manifests) > 0 {
			idx, err := v1.ParseIndexManifest(bytes.NewReader(body))
			if err != nil {
				return fmt.Errorf("%s/v2/%s/manifests/%s: %w", baseURL, repo, dgst, err)
			}
			for _, d := range idx.Manifests {
				if err := manifest(repo, d.Digest.String(), d.Size); err != nil {
					return err
				}
			}
			return nil
		}
		m, err := v1.ParseManifest(bytes.NewReader(body))
		if err != nil {
			return fmt.Errorf("%s/v2/%s/manifests/%s: %w", baseURL, repo, dgst, err)
		}
		for _, d := range append([]v1.Descriptor{m.Config}, m.Layers...) {
			if seen[d.Digest.String()] {
				continue
			}
			if _, err := get(repo, "blobs", d.Digest.String(), "", d.Size); err != nil {
				return err
			}
			seen[d.Digest.String()] = true
			c.Blobs++
		}
		return nil
	}
	for _, im := range images {
		if err := ctx.Err(); err != nil {
			return c, err
		}
		if err := manifest(im.Repository, im.Digest, -1); err != nil {
			return c, err
		}
	}
	return c, nil
}
