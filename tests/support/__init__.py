"""What the test rings, the checkers and the benchmarks share: one control-plane handle and
the objects they build."""
