package bench

import (
	"testing"

	"github.com/ginqueue/ginqueue/bench/internal/suite"
)

// BenchmarkUncontended is metric 1, one request through each variant with
// limits never reached, in parallel: "route" reuses one request and a
// writer that allocates nothing, "request" builds both per operation.
//
//	go test -run '^$' -bench 'Uncontended|Handoff|Feature' -count 10 . > old.txt
func BenchmarkUncontended(b *testing.B) {
	p := suite.FullPlan()
	for _, v := range suite.Variants() {
		b.Run("route/"+v.ID, p.BenchRoute(v))
	}
	for _, v := range suite.Variants() {
		b.Run("request/"+v.ID, p.BenchRequest(v))
	}
}

// BenchmarkHandoff is metric 2: 32 goroutines over 4 slots, 2 µs handlers.
func BenchmarkHandoff(b *testing.B) {
	p := suite.FullPlan()
	for _, v := range suite.Variants()[1:] { // not the bare route
		b.Run(v.ID, p.BenchHandoff(v))
	}
}

// BenchmarkFeature is section 10: plain ginqueue and ginqueue with one
// feature on, uncontended and in the saturated hand-off.
func BenchmarkFeature(b *testing.B) {
	p := suite.FullPlan()
	for _, v := range suite.FeatureVariants(p.Flows, true) {
		b.Run("route/"+v.ID, p.BenchRoute(v))
		b.Run("request/"+v.ID, p.BenchRequest(v))
	}
	for _, v := range suite.FeatureVariants(p.Flows, false) {
		b.Run("handoff/"+v.ID, p.BenchHandoff(v))
	}
}
