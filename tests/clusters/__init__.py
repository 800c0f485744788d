"""Clusters ring: two real clusters, each its own control plane and node, on one store lock."""
