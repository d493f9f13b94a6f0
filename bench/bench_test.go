package bench

import (
	"testing"

	"github.com/ginqueue/ginqueue/bench/internal/suite"
)

// BenchmarkUncontended is metric 1: one request through each variant with
// limits never reached, in parallel. "route" reuses one request and a
// writer that allocates nothing; "request" builds a request and a recorder
// per operation.
func BenchmarkUncontended(b *testing.B) {
	for _, v := range suite.Variants() {
		b.Run("route/"+v.ID, suite.BenchUncontendedRoute(v))
	}
	for _, v := range suite.Variants() {
		b.Run("request/"+v.ID, suite.BenchUncontendedRequest(v))
	}
}

// BenchmarkHandoff is metric 2: 32 goroutines over 4 slots, 2 µs handlers.
func BenchmarkHandoff(b *testing.B) {
	for _, v := range suite.Variants() {
		if v.Throttles {
			b.Run(v.ID, suite.BenchHandoff(v))
		}
	}
}

// BenchmarkFeature is section 10: plain ginqueue and ginqueue with one
// feature on, uncontended and in the saturated hand-off.
func BenchmarkFeature(b *testing.B) {
	flows := suite.FullPlan().Flows
	for _, v := range suite.FeatureVariants(flows, true) {
		b.Run("route/"+v.ID, suite.BenchUncontendedRoute(v))
	}
	for _, v := range suite.FeatureVariants(flows, true) {
		b.Run("request/"+v.ID, suite.BenchUncontendedRequest(v))
	}
	for _, v := range suite.FeatureVariants(flows, false) {
		b.Run("handoff/"+v.ID, suite.BenchHandoff(v))
	}
}
