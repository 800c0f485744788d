//go:build tools

// Package tools pins the Kubernetes commands the test environment builds: the control
// plane (kube-apiserver, kube-controller-manager, kubectl) and the real node
// (kubelet, kube-scheduler).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
