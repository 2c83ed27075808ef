//go:build tools

// Package tools pins the commands built from k8s.io/kubernetes so that `go mod tidy` keeps them.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
