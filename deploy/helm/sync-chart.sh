#!/usr/bin/env bash
# Copies the kustomize manifests the chart renders into the chart (helm, like kustomize, reads no
# file outside its own folder): deploy/base's resources and matchConditions patch, the bundled
# policies, the cert-manager, inventory and ServiceMonitor objects, the audit controller's and the
# monitoring components' objects, the CRDs and their RBAC.
# The chart's templates apply its values to these copies, so deploy/ stays the one source;
# tests/project/test_helm_chart.py fails while a copy differs (run this script) and while the
# default values (and ci/*-values.yaml) render other objects than the matching kustomization.
#   deploy/helm/sync-chart.sh
set -euo pipefail
deploy="$(cd "$(dirname "$0")/.." && pwd)"
chart="$deploy/helm/gpuguard"
rm -rf "$chart/files" "$chart/crds"
mkdir -p "$chart/files/base" "$chart/files/policies" "$chart/files/cert-manager" \
  "$chart/files/inventory" "$chart/files/servicemonitor" "$chart/files/crds" "$chart/crds"
# deploy/base's resources, in kustomization.yaml's order (a folder resource is the policies'
# ConfigMap generator, rendered from files/policies).
i=0
for resource in $(sed -n '/^resources:/,/^[a-z]/{s/^- \([^ #]*\).*/\1/p}' "$deploy/base/kustomization.yaml"); do
  if [[ -f "$deploy/base/$resource" ]]; then
    i=$((i + 1))
    cp "$deploy/base/$resource" "$chart/files/base/$(printf '%02d' "$i")-$resource"
  fi
done
cp "$deploy/base/match-conditions.yaml" "$chart/files/match-conditions.yaml"
find "$deploy/base/policies" -maxdepth 1 -name '*.yaml' ! -name kustomization.yaml \
  -exec cp {} "$chart/files/policies/" \;
cp "$deploy/overlays/cert-manager/certificates.yaml" "$chart/files/cert-manager/"
for f in serviceaccount rbac daemonset restrict-node-patch; do
  cp "$deploy/overlays/inventory-daemonset/$f.yaml" "$chart/files/inventory/"
done
cp "$deploy/components/servicemonitor/servicemonitor.yaml" "$chart/files/servicemonitor/"
cp "$deploy/crds/rbac.yaml" "$chart/files/crds/rbac.yaml"
mkdir -p "$chart/files/cluster-policies"
cp "$deploy/components/cluster-policies/lease-rbac.yaml" "$chart/files/cluster-policies/"
# deploy/components/audit-controller and monitoring: their resources, in their kustomization's
# order (the CronJob patch is a value of the chart), and the dashboard its generator reads.
for component in audit-controller monitoring; do
  mkdir -p "$chart/files/$component"
  for resource in $(sed -n '/^resources:/,/^[a-z]/{s/^- \([^ #]*\).*/\1/p}' "$deploy/components/$component/kustomization.yaml"); do
    cp "$deploy/components/$component/$resource" "$chart/files/$component/"
  done
done
cp "$deploy/components/monitoring/grafana-dashboard.json" "$chart/files/monitoring/"
cp "$deploy"/crds/*.gpuguard.io.yaml "$deploy"/crds/policyreports/*.wgpolicyk8s.io.yaml "$chart/crds/"
