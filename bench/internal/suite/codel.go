package suite

// codelVariant is ginqueue with Config.CoDel, its LIFO switch set to lifo,
// under the limits of the harness. The ginqueue this module builds against
// has no CoDel yet, so the variant carries Missing and no New: the report
// shows its columns as not measured.
func codelVariant(lifo bool) Variant {
	_ = lifo
	return Variant{Throttles: true, Missing: "not measured: the ginqueue this suite built against has no Config.CoDel"}
}
