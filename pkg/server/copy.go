package server

import (
	"io"
	"sync"
)

var bufPool = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

// copyBuffer copies with a pooled 256 KiB buffer: larger TLS record batches than io.Copy's 32 KiB.
func copyBuffer(dst io.Writer, src io.Reader) (int64, error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	return io.CopyBuffer(struct{ io.Writer }{dst}, src, *bp)
}
