package bundle

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestCreateWithBlobsVerified: trusting blob names gives the very SHA256SUMS that hashing gives, and
// what it trusts is still checked by Verify (a damaged blob is reported, not hidden).
func TestCreateWithBlobsVerified(t *testing.T) {
	b := newBundle(t)
	sums := filepath.Join(b.Dir, SumsFile)
	hashed, err := os.ReadFile(sums)
	if err != nil {
		t.Fatal(err)
	}
	if err := CreateWith(context.Background(), b.Dir, testMeta, CreateOptions{BlobsVerified: true}); err != nil {
		t.Fatal(err)
	}
	trusted, _ := os.ReadFile(sums)
	if !bytes.Equal(hashed, trusted) {
		t.Fatalf("SHA256SUMS differs when blob names are trusted:\nhashed:\n%s\ntrusted:\n%s", hashed, trusted)
	}
	p := firstBlob(t, b)
	data, _ := os.ReadFile(filepath.Join(b.Dir, p))
	data[0] ^= 0xff
	write(t, filepath.Join(b.Dir, p), data)
	if err := CreateWith(context.Background(), b.Dir, testMeta, CreateOptions{BlobsVerified: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Verify(context.Background(), ""); err == nil || !bytes.Contains([]byte(err.Error()), []byte(p)) {
		t.Fatalf("Verify after trusting a damaged blob's name: %v, want an error naming %s", err, p)
	}
}
