//go:build tools

// Package tools pins actionlint, which checks .github/workflows in `make test`.
package tools

import _ "github.com/rhysd/actionlint/cmd/actionlint"
