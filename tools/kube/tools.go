//go:build tools

// The Kubernetes commands this module builds (go build k8s.io/kubernetes/cmd/NAME); imported
// here only so that `go mod tidy` keeps what they need.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
