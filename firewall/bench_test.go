package firewall

import "testing"

// BenchmarkApplyUnchanged measures the idempotent path: read back and compare the live table, send nothing.
func BenchmarkApplyUnchanged(b *testing.B) {
	_, fw := newNSB(b)
	s := labSpec()
	if _, err := fw.Apply(b.Context(), s); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if changed, err := fw.Apply(b.Context(), s); err != nil || changed {
			b.Fatalf("Apply = %v, %v", changed, err)
		}
	}
}

// BenchmarkApplyReplace measures a full atomic replacement (the spec alternates between two host roles).
func BenchmarkApplyReplace(b *testing.B) {
	_, fw := newNSB(b)
	specs := [2]Spec{labSpec(), labSpec()}
	specs[1].Roles = []Role{RoleWorker}
	i := 0
	for b.Loop() {
		i++
		if changed, err := fw.Apply(b.Context(), specs[i%2]); err != nil || !changed {
			b.Fatalf("Apply = %v, %v", changed, err)
		}
	}
}
