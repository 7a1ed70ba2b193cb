package bundlecreate

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/airgap-appliance/appliance/pkg/bundle"
	"github.com/airgap-appliance/appliance/pkg/bundlespec"
	"github.com/airgap-appliance/appliance/pkg/debrepo"
)

// The bundle's Debian repository: what nodes' apt reads from the appliance (/repo/debian, suite
// RepoSuite, component RepoComponent), signed with the repo key; its public keyring is
// RepoKeyringFile() inside the repository, covered by the bundle's own signature.
const (
	RepoSuite     = "stable"
	RepoComponent = "main"
)

// RepoKeyringFile is bundle.RepoKeyringPath's name inside the repository directory.
func RepoKeyringFile() string { return path.Base(bundle.RepoKeyringPath) }

// DebianPackages is the Packages step with pkg/debrepo: apt itself resolves the spec's packages and
// extraPackages to their full Depends/Pre-Depends closure for a node that starts empty, from the
// spec's apt sources only (each Release signature checked against its signedBy keyring first), and
// downloads them; then the bundle's repository is built and signed (InRelease, Release.gpg) with
// signing.repoKeyFile or the default key, created on first use. apt's state and the downloaded .debs
// stay in workDir between runs (outside the bundle), so a rerun downloads nothing again. The
// architecture is the first platform's (amd64 for "all").
func DebianPackages(workDir string) func(ctx context.Context, spec *bundlespec.BundleSpecification, repoDir string, progress func(Event)) (PackagesResult, error) {
	return func(ctx context.Context, spec *bundlespec.BundleSpecification, repoDir string, progress func(Event)) (PackagesResult, error) {
		var res PackagesResult
		arch := "amd64"
		if p := spec.Platforms; len(p) > 0 && p[0] != "all" {
			if parts := strings.Split(p[0], "/"); len(parts) >= 2 {
				arch = parts[1]
			}
		}
		var srcs []debrepo.Source
		for _, s := range spec.Apt.Sources {
			srcs = append(srcs, debrepo.Source{URI: s.URI, Suite: s.Suite, Components: s.Components, Keyring: s.SignedBy})
		}
		cache := filepath.Join(workDir, "debs")
		before := countDebs(cache)
		r, err := debrepo.Resolve(ctx, debrepo.Options{Sources: srcs, Arch: arch,
			Packages: append(append([]string{}, spec.Packages...), spec.ExtraPackages...),
			StateDir: filepath.Join(workDir, "apt"), CacheDir: cache, CAFile: spec.Apt.CAFile})
		if err != nil {
			return res, err
		}
		var debs []string
		origins := map[string]string{}
		for _, p := range r.Packages {
			debs = append(debs, p.Path)
			origins[p.Path] = p.SourceURI + " " + p.SourceSuite
			res.Bytes += p.Size
		}
		res.Packages = len(debs)
		res.Fetched = max(countDebs(cache)-before, 0)
		progress(Event{Step: "packages", Detail: fmt.Sprintf("resolved %d packages, %d downloaded", res.Packages, res.Fetched)})

		keyFile := spec.Signing.RepoKeyFile
		if keyFile == "" {
			dir, err := bundlespec.DefaultSigningDir()
			if err != nil {
				return res, err
			}
			keyFile = filepath.Join(dir, bundlespec.DefaultRepoKeyFileName)
		}
		signer, _, err := debrepo.EnsureRepoKey(keyFile)
		if err != nil {
			return res, fmt.Errorf("signing.repoKeyFile: %w", err)
		}
		if err := os.RemoveAll(repoDir); err != nil { // rebuilt from the cache every run: cheap, and never stale
			return res, err
		}
		if _, err := debrepo.BuildRepo(ctx, repoDir, debs, RepoSuite, RepoComponent, arch, signer,
			debrepo.RepoOptions{Date: time.Now().UTC().Truncate(time.Second), Origins: origins}); err != nil {
			return res, err
		}
		if _, err := signer.WritePublicKeyring(filepath.Join(repoDir, RepoKeyringFile())); err != nil {
			return res, err
		}
		return res, nil
	}
}

func countDebs(dir string) int {
	m, _ := filepath.Glob(filepath.Join(dir, "*.deb"))
	return len(m)
}
