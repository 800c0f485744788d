//go:build tools

// Package tools pins krew: its own manifest validation and `krew install --manifest --archive`.
package tools

import (
	_ "sigs.k8s.io/krew/cmd/krew"
	_ "sigs.k8s.io/krew/cmd/validate-krew-manifest"
)
