package bench

import (
	"testing"
)

// BenchmarkUncontended is metric 1: one request through each variant with
// limits never reached, in parallel. "route" reuses one request and a
// writer that allocates nothing; "request" builds a request and a recorder
// per operation.
func BenchmarkUncontended(b *testing.B) {
	for _, v := range Variants() {
		b.Run("route/"+v.ID, BenchUncontendedRoute(v))
	}
	for _, v := range Variants() {
		b.Run("request/"+v.ID, BenchUncontendedRequest(v))
	}
}

// BenchmarkHandoff is metric 2: 32 goroutines over 4 slots, 2 µs handlers.
func BenchmarkHandoff(b *testing.B) {
	for _, v := range throttling(Variants()) {
		b.Run(v.ID, BenchHandoff(v))
	}
}

// BenchmarkFeature is section 10: plain ginqueue and ginqueue with one
// feature on, uncontended and in the saturated hand-off.
func BenchmarkFeature(b *testing.B) {
	for _, v := range FeatureVariants(FullPlan().Flows, true) {
		b.Run("route/"+v.ID, BenchUncontendedRoute(v))
	}
	for _, v := range FeatureVariants(FullPlan().Flows, true) {
		b.Run("request/"+v.ID, BenchUncontendedRequest(v))
	}
	for _, v := range FeatureVariants(FullPlan().Flows, false) {
		b.Run("handoff/"+v.ID, BenchHandoff(v))
	}
}
