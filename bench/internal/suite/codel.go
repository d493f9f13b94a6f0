package suite

import "github.com/ginqueue/ginqueue"

// codelVariant is ginqueue with Config.CoDel at its defaults (Target 5 ms,
// Interval 100 ms), its LIFO switch set to lifo, under the limits of the
// harness. Its drops are queue timeouts, answered 408.
func codelVariant(lifo bool) Variant {
	return Variant{Throttles: true, New: newFeature(func(c *ginqueue.Config) { c.CoDel = &ginqueue.CoDel{LIFO: lifo} })}
}
