//go:build tools

// Package tools pins crane (go-containerregistry), the OCI registry the release tests
// push to (`crane registry serve`) and read back (`crane digest`, `crane manifest`).
package tools

import _ "github.com/google/go-containerregistry/cmd/crane"
