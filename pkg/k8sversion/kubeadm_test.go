package k8sversion

import (
	"archive/zip"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// constantsPath is kubeadm's constants file inside the k8s.io/kubernetes module.
const constantsPath = "cmd/kubeadm/app/constants/constants.go"

// TestTableMatchesKubeadm re-reads every entry's etcd, CoreDNS and pause versions from kubeadm's own
// constants (constantsPath of k8s.io/kubernetes@Source, from the Go module cache: the extracted
// module, else its downloaded zip) and fails on any difference, printing the table line to use. An
// entry whose module is not in the cache is skipped loudly, with the command that fetches it.
func TestTableMatchesKubeadm(t *testing.T) {
	cache := goModCache(t)
	for _, r := range releases {
		t.Run(r.Minor, func(t *testing.T) {
			src, where, err := readConstants(cache, r.Source)
			if errors.Is(err, os.ErrNotExist) {
				t.Skipf("SKIPPED: k8s.io/kubernetes@%s is not in the module cache %s, so the %s entry is unchecked against kubeadm; "+
					"fetch it with `go mod download -json k8s.io/kubernetes@%s` (about 20 MB, 110 MB extracted) and rerun", r.Source, cache, r.Minor, r.Source)
			}
			if err != nil {
				t.Fatal(err)
			}
			own, err := Minor(r.Source)
			if err != nil || own != r.Minor {
				t.Fatalf("Source %q is not a release of %s", r.Source, r.Minor)
			}
			k, err := parseConstants(src, r.Minor)
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if k.etcd != k.defaultEtcd {
				t.Errorf("%s: kubeadm deploys etcd %s for %s (SupportedEtcdVersion) but DefaultEtcdVersion is %s: "+
					"decide which the table and test/fixtures/build-kubernetes.sh (which reads DefaultEtcdVersion) follow", where, k.etcd, r.Minor, k.defaultEtcd)
			}
			want := r
			want.Etcd, want.CoreDNS, want.Pause = k.etcd, k.coreDNS, k.pause
			if want != r {
				t.Errorf("the %s entry differs from kubeadm's constants (%s):\n got  %+v\n want %+v\nuse: Minor: %q, Source: %q, Etcd: %q, CoreDNS: %q, Pause: %q",
					r.Minor, where, r, want, want.Minor, want.Source, want.Etcd, want.CoreDNS, want.Pause)
			}
		})
	}
}

// goModCache is `go env GOMODCACHE`.
func goModCache(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	dir := strings.TrimSpace(string(out))
	if err != nil || dir == "" {
		t.Fatalf("go env GOMODCACHE: %v %q", err, out)
	}
	return dir
}

// readConstants returns constantsPath of k8s.io/kubernetes@version from the module cache at cache,
// and where it was read; an error wrapping os.ErrNotExist when the cache has neither the extracted
// module nor its zip.
func readConstants(cache, version string) ([]byte, string, error) {
	dir := filepath.Join(cache, "k8s.io", "kubernetes@"+version, filepath.FromSlash(constantsPath))
	if data, err := os.ReadFile(dir); err == nil || !errors.Is(err, os.ErrNotExist) {
		return data, dir, err
	}
	zipPath := filepath.Join(cache, "cache", "download", "k8s.io", "kubernetes", "@v", version+".zip")
	zr, err := zip.OpenReader(zipPath)
	if err != nil {
		return nil, zipPath, err
	}
	defer zr.Close()
	name := "k8s.io/kubernetes@" + version + "/" + constantsPath
	f, err := zr.Open(name)
	if err != nil {
		return nil, zipPath, fmt.Errorf("%s lacks %s: %v", zipPath, name, err) // not ErrNotExist: a broken zip must fail
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	return data, zipPath + ":" + name, err
}

// kubeadmConstants are the versions kubeadm's constants give for its own minor.
type kubeadmConstants struct {
	defaultEtcd, etcd, coreDNS, pause string
}

// parseConstants reads DefaultEtcdVersion, CoreDNSVersion and PauseVersion (string constants) from
// kubeadm's constants.go, and the etcd tag kubeadm deploys for minor: SupportedEtcdVersion's entry
// for it, or the nearest entry (constants.EtcdSupportedVersion). The map's keys are minor numbers,
// literal (34) or relative to kubeadm's own minor (uint8(getSkewedKubernetesVersion(-1).Minor())).
func parseConstants(src []byte, minor string) (kubeadmConstants, error) {
	var k kubeadmConstants
	own, err := strconv.Atoi(minor[strings.LastIndexByte(minor, '.')+1:])
	if err != nil {
		return k, err
	}
	f, err := parser.ParseFile(token.NewFileSet(), constantsPath, src, parser.SkipObjectResolution)
	if err != nil {
		return k, err
	}
	strs := map[string]*string{"DefaultEtcdVersion": &k.defaultEtcd, "CoreDNSVersion": &k.coreDNS, "PauseVersion": &k.pause}
	supported := map[int]string{}
	var mapErr error
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || len(vs.Values) != 1 {
			return true
		}
		name := vs.Names[0].Name
		if dst, ok := strs[name]; ok {
			if lit, ok := vs.Values[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				*dst, _ = strconv.Unquote(lit.Value)
			}
		}
		if cl, ok := vs.Values[0].(*ast.CompositeLit); ok && name == "SupportedEtcdVersion" {
			for _, e := range cl.Elts {
				kv, ok := e.(*ast.KeyValueExpr)
				var lit *ast.BasicLit
				if ok {
					lit, ok = kv.Value.(*ast.BasicLit)
				}
				if !ok || lit.Kind != token.STRING {
					mapErr = errors.New("SupportedEtcdVersion has an entry this test cannot read")
					continue
				}
				key, err := etcdMapKey(kv.Key, own)
				if err != nil {
					mapErr = err
					continue
				}
				supported[key], _ = strconv.Unquote(lit.Value)
			}
		}
		return true
	})
	for name, dst := range strs {
		if *dst == "" {
			return k, fmt.Errorf("no string constant %s", name)
		}
	}
	if mapErr != nil {
		return k, mapErr
	}
	if len(supported) == 0 {
		return k, errors.New("no SupportedEtcdVersion map")
	}
	k.etcd = etcdFor(supported, own)
	return k, nil
}

// etcdMapKey evaluates a key of SupportedEtcdVersion: an integer literal, or
// uint8(getSkewedKubernetesVersion(N).Minor()), which is kubeadm's own minor + N.
func etcdMapKey(e ast.Expr, own int) (int, error) {
	if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.INT {
		return strconv.Atoi(lit.Value)
	}
	bad := fmt.Errorf("SupportedEtcdVersion key %T is neither a literal nor uint8(getSkewedKubernetesVersion(N).Minor())", e)
	conv, ok := e.(*ast.CallExpr)
	if !ok || len(conv.Args) != 1 {
		return 0, bad
	}
	minorCall, ok := conv.Args[0].(*ast.CallExpr)
	if !ok {
		return 0, bad
	}
	sel, ok := minorCall.Fun.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "Minor" {
		return 0, bad
	}
	skew, ok := sel.X.(*ast.CallExpr)
	if !ok || len(skew.Args) != 1 {
		return 0, bad
	}
	if id, ok := skew.Fun.(*ast.Ident); !ok || id.Name != "getSkewedKubernetesVersion" {
		return 0, bad
	}
	sign, arg := 1, skew.Args[0]
	if u, ok := arg.(*ast.UnaryExpr); ok && u.Op == token.SUB {
		sign, arg = -1, u.X
	}
	lit, ok := arg.(*ast.BasicLit)
	if !ok || lit.Kind != token.INT {
		return 0, bad
	}
	n, err := strconv.Atoi(lit.Value)
	return own + sign*n, err
}

// etcdFor is constants.EtcdSupportedVersion: the entry for minor, else the lowest entry for a minor
// below the map, the highest for one above it.
func etcdFor(supported map[int]string, minor int) string {
	if v, ok := supported[minor]; ok {
		return v
	}
	lo, hi := -1, -1
	for k := range supported {
		if lo < 0 || k < lo {
			lo = k
		}
		if k > hi {
			hi = k
		}
	}
	if minor < lo {
		return supported[lo]
	}
	return supported[hi]
}

// TestParseConstants covers the shapes of SupportedEtcdVersion that kubeadm releases use: literal
// keys, keys relative to kubeadm's own minor, and a map that lacks the minor (the nearest entry).
func TestParseConstants(t *testing.T) {
	const head = "package constants\n\nconst (\n\tDefaultEtcdVersion = \"3.9.0-0\"\n\tCoreDNSVersion = \"v1.20.0\"\n)\n\nconst PauseVersion = \"3.11\"\n\n"
	tests := []struct{ name, m, minor, want string }{
		{"literal keys", "var SupportedEtcdVersion = map[uint8]string{\n\t40: \"3.8.0-0\",\n\t41: \"3.9.0-0\",\n}\n", "v1.41", "3.9.0-0"},
		{"relative keys", "var SupportedEtcdVersion = map[uint8]string{\n\tuint8(getSkewedKubernetesVersion(-1).Minor()): \"3.8.0-0\",\n\tuint8(getSkewedKubernetesVersion(0).Minor()): \"3.9.0-0\",\n}\n", "v1.41", "3.9.0-0"},
		{"minor above the map", "var SupportedEtcdVersion = map[uint8]string{\n\t39: \"3.7.0-0\",\n\t40: \"3.9.0-0\",\n}\n", "v1.41", "3.9.0-0"},
		{"minor below the map", "var SupportedEtcdVersion = map[uint8]string{\n\t42: \"3.9.0-0\",\n\t43: \"3.10.0-0\",\n}\n", "v1.41", "3.9.0-0"},
	}
	for _, tt := range tests {
		k, err := parseConstants([]byte(head+tt.m), tt.minor)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		want := kubeadmConstants{defaultEtcd: "3.9.0-0", etcd: tt.want, coreDNS: "v1.20.0", pause: "3.11"}
		if k != want {
			t.Errorf("%s: %+v, want %+v", tt.name, k, want)
		}
	}
	if _, err := parseConstants([]byte(head), "v1.41"); err == nil || !strings.Contains(err.Error(), "SupportedEtcdVersion") {
		t.Errorf("no map: %v", err)
	}
	if _, err := parseConstants([]byte("package constants\nconst CoreDNSVersion = \"v1\"\n"), "v1.41"); err == nil || !strings.Contains(err.Error(), "no string constant") {
		t.Errorf("missing constants: %v", err)
	}
}
