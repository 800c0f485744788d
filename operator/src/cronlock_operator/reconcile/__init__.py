"""The pure deciders, one per kind, and the values they return: what to write, count
and tell."""
