package bundle

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
)

// Sum is one line of a SHA256SUMS file: the lowercase hex SHA-256 of the file at Path (slash-separated,
// relative to the bundle directory).
type Sum struct {
	Path   string
	SHA256 string
}

// maxSumsLine bounds one line of SHA256SUMS (64 hex + 2 separators + a path of at most 4096 bytes).
const maxSumsLine = 64 + 2 + 4096 + 16

// ParseSums reads sha256sum(1) output as GNU coreutils writes it: `<64 hex> <space|*><path>` per line,
// where a line starting with `\` has its path escaped (`\\`, `\n`, `\r`). Paths must be clean, relative,
// slash-separated and inside the bundle (no `..`, no leading `/`), and unique. Errors name the line and
// wrap ErrSums. The result is in file order.
func ParseSums(r io.Reader) ([]Sum, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxSumsLine)
	var out []Sum
	seen := map[string]int{}
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" {
			return nil, fmt.Errorf("%w: line %d: empty line", ErrSums, n)
		}
		escaped := line[0] == '\\'
		if escaped {
			line = line[1:]
		}
		if len(line) < 66 {
			return nil, fmt.Errorf("%w: line %d: want `<64 hex digits>  <path>`", ErrSums, n)
		}
		digest := line[:64]
		if _, err := hex.DecodeString(digest); err != nil || strings.ToLower(digest) != digest {
			return nil, fmt.Errorf("%w: line %d: %q is not a lowercase hex SHA-256", ErrSums, n, digest)
		}
		if line[64] != ' ' || (line[65] != ' ' && line[65] != '*') {
			return nil, fmt.Errorf("%w: line %d: want two spaces (or space and '*') after the digest", ErrSums, n)
		}
		p := line[66:]
		if escaped {
			var err error
			if p, err = unescapeSumPath(p); err != nil {
				return nil, fmt.Errorf("%w: line %d: %w", ErrSums, n, err)
			}
		}
		if err := checkRelPath(p); err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrSums, n, err)
		}
		if prev, dup := seen[p]; dup {
			return nil, fmt.Errorf("%w: line %d: %q already listed on line %d", ErrSums, n, p, prev)
		}
		seen[p] = n
		out = append(out, Sum{Path: p, SHA256: digest})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSums, err)
	}
	return out, nil
}

// FormatSums renders sums as sha256sum(1) output sorted by path (bytewise), escaping paths that hold a
// backslash, newline or carriage return as GNU coreutils does, so `sha256sum -c SHA256SUMS` accepts it.
func FormatSums(sums []Sum) []byte {
	s := append([]Sum(nil), sums...)
	sort.Slice(s, func(i, j int) bool { return s[i].Path < s[j].Path })
	var b bytes.Buffer
	for _, e := range s {
		p := e.Path
		if strings.ContainsAny(p, "\\\n\r") {
			b.WriteByte('\\')
			p = strings.NewReplacer(`\`, `\\`, "\n", `\n`, "\r", `\r`).Replace(p)
		}
		b.WriteString(e.SHA256)
		b.WriteString("  ")
		b.WriteString(p)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func unescapeSumPath(p string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		if p[i] != '\\' {
			b.WriteByte(p[i])
			continue
		}
		if i+1 == len(p) {
			return "", fmt.Errorf("path ends in a lone backslash")
		}
		i++
		switch p[i] {
		case '\\':
			b.WriteByte('\\')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		default:
			return "", fmt.Errorf("unknown escape \\%c in path", p[i])
		}
	}
	return b.String(), nil
}

// checkRelPath accepts clean, relative, slash-separated paths that stay inside the bundle.
func checkRelPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("empty path")
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("path %q contains a NUL byte", p)
	case strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q is absolute; paths are relative to the bundle directory", p)
	case path.Clean(p) != p || p == "." || p == ".." || strings.HasPrefix(p, "../"):
		return fmt.Errorf("path %q is not a clean path inside the bundle", p)
	}
	return nil
}
