module cronlock.test/controlplane/cronnext

go 1.26.0

// The version Kubernetes' go.mod pins (tests/controlplane/go/kubernetes/go.mod).
require github.com/robfig/cron/v3 v3.0.1
