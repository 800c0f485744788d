//go:build tools

// Package tools pins crictl for the test environment's real node.
package tools

import _ "sigs.k8s.io/cri-tools/cmd/crictl"
