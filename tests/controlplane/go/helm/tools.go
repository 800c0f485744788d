//go:build tools

// Package tools pins the helm command the chart tests use.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
