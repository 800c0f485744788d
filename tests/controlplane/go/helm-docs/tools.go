//go:build tools

// Package tools pins helm-docs, which generates charts/cronlock/README.md from the
// chart's values.yaml comments (tests/unit/test_chart_readme.py checks it is current).
package tools

import _ "github.com/norwoodj/helm-docs/cmd/helm-docs"
