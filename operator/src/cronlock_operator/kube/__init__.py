"""The Kubernetes adapter: every call the operator's reconciles make, and how the API
server's answers are read."""
