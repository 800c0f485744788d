"""End-to-end ring: the real control plane, operator and sidecar, with a test pod runner."""
