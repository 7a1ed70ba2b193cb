// Command registrylayout writes a benchmark OCI image layout shaped like the air-gap bundle: images
// with random gzip layers (go-containerregistry random.Layer), each named by a fully qualified
// org.opencontainers.image.ref.name annotation, plus one two-platform image index.
//
//	registrylayout -out DIR [-images 6] [-layers 3] [-layer-mib 16] [-blob-mib 1,16]
//
// With -blob-mib it instead writes one single-layer image per listed size named
// bench.local/blob-<N>mib:1 (used by the blob throughput benchmark). Prints the refs, one per line.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func main() {
	out := flag.String("out", "", "layout directory to create")
	images := flag.Int("images", 6, "number of single-platform images")
	layers := flag.Int("layers", 3, "layers per image")
	layerMiB := flag.Int("layer-mib", 16, "uncompressed size of each random layer, MiB")
	blobMiB := flag.String("blob-mib", "", "comma-separated blob sizes for the blob benchmark")
	flag.Parse()
	if err := run(*out, *images, *layers, *layerMiB, *blobMiB); err != nil {
		fmt.Fprintln(os.Stderr, "registrylayout:", err)
		os.Exit(1)
	}
}

func image(layers int, size int64) (v1.Image, error) {
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	for range layers {
		l, err := random.Layer(size, types.OCILayer)
		if err != nil {
			return nil, err
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			return nil, err
		}
	}
	return img, nil
}

func run(out string, images, layers, layerMiB int, blobMiB string) error {
	if out == "" {
		return errors.New("-out is required")
	}
	p, err := layout.Write(out, empty.Index)
	if err != nil {
		return err
	}
	add := func(ref string, img v1.Image) error {
		fmt.Println(ref)
		return p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref}))
	}
	if blobMiB != "" {
		for _, s := range strings.Split(blobMiB, ",") {
			n, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return fmt.Errorf("-blob-mib %q: %w", s, err)
			}
			img, err := image(1, int64(n*(1<<20)))
			if err != nil {
				return err
			}
			if err := add(fmt.Sprintf("bench.local/blob-%smib:1", strings.ReplaceAll(s, ".", "p")), img); err != nil {
				return err
			}
		}
		return nil
	}
	for i := range images {
		img, err := image(layers, int64(layerMiB)<<20)
		if err != nil {
			return err
		}
		if err := add(fmt.Sprintf("registry.k8s.io/bench-%d:v1", i), img); err != nil {
			return err
		}
	}
	var idx v1.ImageIndex = mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, arch := range []string{"amd64", "arm64"} {
		img, err := image(layers, int64(layerMiB)<<20)
		if err != nil {
			return err
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	fmt.Println("docker.io/library/bench-multi:v1")
	return p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "docker.io/library/bench-multi:v1"}))
}
