package registry

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/docker/cli/cli/config/configfile"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// DockerConfigKeychain returns a keychain for MirrorOptions.Keychain that reads credentials from the
// Docker config.json at path (the file `docker login` writes: "auths" entries with base64
// "user:password" or identity tokens, and "credHelpers"/"credsStore", which run the named
// docker-credential-* helper). Lookups use the registry host of each request, as docker does
// (docker.io uses the key "https://index.docker.io/v1/"); a host without an entry is pulled
// anonymously. The file is read once, now: errors name the path (missing file, malformed JSON).
func DockerConfigKeychain(path string) (authn.Keychain, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("docker config: %w", err)
	}
	defer f.Close()
	cf := configfile.New(path)
	if err := cf.LoadFromReader(f); err != nil {
		return nil, fmt.Errorf("docker config %s: %w", path, err)
	}
	return &dockerConfigKeychain{cf: cf}, nil
}

type dockerConfigKeychain struct {
	mu sync.Mutex // configfile is not safe for concurrent use
	cf *configfile.ConfigFile
}

// Resolve implements authn.Keychain.
func (k *dockerConfigKeychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	return k.ResolveContext(context.Background(), target)
}

// ResolveContext implements authn.ContextKeychain, following go-containerregistry's default keychain:
// the repository's full name first, then its registry.
func (k *dockerConfigKeychain) ResolveContext(_ context.Context, target authn.Resource) (authn.Authenticator, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, key := range []string{target.String(), target.RegistryStr()} {
		if key == name.DefaultRegistry {
			key = authn.DefaultAuthKey
		}
		cfg, err := k.cf.GetAuthConfig(key)
		if err != nil {
			return nil, fmt.Errorf("credentials for %s from %s: %w", key, k.cf.Filename, err)
		}
		if cfg.Username == "" && cfg.Password == "" && cfg.Auth == "" && cfg.IdentityToken == "" && cfg.RegistryToken == "" {
			continue
		}
		return authn.FromConfig(authn.AuthConfig{
			Username:      cfg.Username,
			Password:      cfg.Password,
			Auth:          cfg.Auth,
			IdentityToken: cfg.IdentityToken,
			RegistryToken: cfg.RegistryToken,
		}), nil
	}
	return authn.Anonymous, nil
}
