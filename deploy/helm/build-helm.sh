#!/usr/bin/env bash
# Builds the helm CLI the chart's tests use (tests/project/test_helm_chart.py) from the Go module
# proxy, once, into a cache folder keyed by helm's version and the Go toolchain, and prints the
# path of the binary. Nothing is downloaded but Go modules (go.sum checked against sum.golang.org
# by `go install`); no binary is committed. Modelled on tests/controlplane/build.sh.
#   deploy/helm/build-helm.sh            # build or reuse; prints .../bin/helm
# Cache: ${GPUGUARD_HELM_CACHE:-~/.cache/gpuguard/helm}/<version>_<go version>/bin/helm
set -euo pipefail
version="v4.3.2"   # helm.sh/helm/v4; its go.mod pins k8s.io/* v0.37.2, as the control-plane tier
key="${version}_$(go env GOVERSION)"
root="${GPUGUARD_HELM_CACHE:-$HOME/.cache/gpuguard/helm}"
bin="$root/$key/bin"
if [[ -f "$bin/.complete" ]]; then
  echo "$bin/helm"
  exit 0
fi
mkdir -p "$bin"
export CGO_ENABLED=0 GOFLAGS="-trimpath -buildvcs=false" GOBIN="$bin"
start=$SECONDS
# helm's Makefile stamps the full version in; without it `helm version` says only "v4.3".
go install -ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$version" \
  "helm.sh/helm/v4/cmd/helm@$version" >&2
echo "built helm $version in $((SECONDS - start)) s" >&2
touch "$bin/.complete"
echo "$bin/helm"
