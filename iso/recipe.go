// Package iso carries the node image's recipe (build-node-image.sh, node/) inside the appliance
// binary, so that `appliance bundle create` builds the node image into the bundle (nodeImage.build)
// with the exact recipe of this version, wherever the binary runs; `make node-image` runs the same
// files from the source tree.
package iso

import (
	"embed"
	"io/fs"
	"os"
	"path/filepath"
)

//go:embed build-node-image.sh node
var nodeImageRecipe embed.FS

// NodeImageScript is the recipe's entry point, relative to the directory WriteNodeImageRecipe writes.
const NodeImageScript = "build-node-image.sh"

// WriteNodeImageRecipe writes the node image recipe (build-node-image.sh and node/, as in the source
// tree's iso/) under dir, which must exist, and returns the script's path. Files are 0644 except the
// script and node/init, 0755 (the recipe installs the rest with explicit modes).
func WriteNodeImageRecipe(dir string) (string, error) {
	err := fs.WalkDir(nodeImageRecipe, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, filepath.FromSlash(p))
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		b, err := nodeImageRecipe.ReadFile(p)
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if p == NodeImageScript || p == "node/init" {
			mode = 0o755
		}
		return os.WriteFile(dst, b, mode)
	})
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, NodeImageScript), nil
}
