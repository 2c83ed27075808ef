#!/usr/bin/env bash
# Builds the test tier's control plane (etcd, kube-apiserver, kubectl) from Go modules
# once into a cache folder keyed by the module versions and the sources here, and prints that folder.
# Nothing is downloaded but Go modules; no binary is committed.
#   tests/controlplane/build.sh            # build or reuse; prints the bin folder
# Cache: ${GPUGUARD_CONTROLPLANE_CACHE:-~/.cache/gpuguard/controlplane}/<key>/bin
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
k8s_version="$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$here/kube/go.mod")"
etcd_version="$(awk '$1=="require" && $2=="go.etcd.io/etcd/server/v3" {print $3}' "$here/etcd/go.mod")"
digest="$(cd "$here" && { find kube etcd -type f \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' \) -print0; \
  printf 'build.sh\0'; } | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-12)"
key="k8s-${k8s_version}_etcd-${etcd_version}_$(go env GOVERSION)_${digest}"
root="${GPUGUARD_CONTROLPLANE_CACHE:-$HOME/.cache/gpuguard/controlplane}"
bin="$root/$key/bin"
if [[ -f "$bin/.complete" ]]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS="-trimpath -mod=readonly"
start=$SECONDS
(cd "$here/etcd" && go build -ldflags='-s -w' -o "$bin/etcd" .) >&2
# What Kubernetes' hack/lib/version.sh stamps in: without it the binaries report
# v0.0.0-master+$Format:%H$, which kubectl version refuses to parse.
major="${k8s_version#v}"; minor="${major#*.}"; major="${major%%.*}"; minor="${minor%%.*}"
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  stamp+=" -X $pkg.gitTreeState=clean"
done
(cd "$here/kube" && go build -ldflags="-s -w$stamp" -o "$bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl ./celoracle) >&2
echo "built $key in $((SECONDS - start)) s" >&2
touch "$bin/.complete"
echo "$bin"
