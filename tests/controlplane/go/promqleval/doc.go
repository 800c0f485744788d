// Package promqleval runs PromQL test scripts (Prometheus' own promqltest format: `load`
// series, then `eval instant at T EXPR` with the expected result) on Prometheus' real
// query engine, for the alert rules cronlock ships or documents. It is a test binary:
// tests/controlplane/gotool builds it with `go test -c`, and a test runs
//
//	promqleval -test.run TestScripts -- SCRIPT...
//
// which fails, naming the line, when an expression's result differs from the script's.
package promqleval
