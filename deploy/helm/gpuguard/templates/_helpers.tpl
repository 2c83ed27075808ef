{{/*
gpuguard's chart renders the kustomize manifests of deploy/ (copied into files/ by
deploy/helm/sync-chart.sh) with its values applied: the templates below only patch fields, so
the choices and their reasons stay in deploy/. Every object is a dict here; "gpuguard.*" patch
templates change it in place and print nothing.
*/}}

{{/* The kustomize manifests' own namespace, replaced by the release's. */}}
{{- define "gpuguard.baseNamespace" -}}gpuguard-system{{- end -}}

{{- define "gpuguard.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* Kinds that have no namespace (kustomize's NamespaceTransformer skips the same). */}}
{{- define "gpuguard.clusterScoped" -}}
{{- has . (list "Namespace" "ClusterRole" "ClusterRoleBinding" "ValidatingWebhookConfiguration" "MutatingWebhookConfiguration" "ValidatingAdmissionPolicy" "ValidatingAdmissionPolicyBinding" "CustomResourceDefinition") -}}
{{- end -}}

{{/* The objects only the webhook needs (deploy/overlays/audit-only deletes the same). */}}
{{- define "gpuguard.webhookObject" -}}
{{- $key := printf "%s/%s" .kind .metadata.name -}}
{{- has $key (list "ValidatingWebhookConfiguration/gpuguard-validating" "MutatingWebhookConfiguration/gpuguard-mutating" "Deployment/gpuguard-webhook" "PodDisruptionBudget/gpuguard-webhook" "Service/gpuguard" "NetworkPolicy/gpuguard-webhook" "ServiceAccount/gpuguard-webhook" "ClusterRole/gpuguard-webhook" "ClusterRoleBinding/gpuguard-webhook" "Role/gpuguard-webhook-quota-ledger" "RoleBinding/gpuguard-webhook-quota-ledger" "Namespace/gpuguard-quota") -}}
{{- end -}}

{{- define "gpuguard.auditObject" -}}
{{- $key := printf "%s/%s" .kind .metadata.name -}}
{{- has $key (list "CronJob/gpuguard-audit" "ServiceAccount/gpuguard-audit" "ClusterRole/gpuguard-audit" "ClusterRoleBinding/gpuguard-audit") -}}
{{- end -}}

{{/*
The documents of one file of files/, as a list of dicts (comments and empty documents dropped).
*/}}
{{- define "gpuguard.documents" -}}
{{- $docs := list -}}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" . -1 -}}
{{- $obj := fromYaml $doc -}}
{{- if and $obj (hasKey $obj "kind") -}}{{- $docs = append $docs $obj -}}{{- end -}}
{{- end -}}
{{- toJson $docs -}}
{{- end -}}

{{/*
What every object gets, as kustomize's labels / NamespaceTransformer give it in deploy/: the
release namespace where the manifests say gpuguard-system (or nothing), the quota namespace where
they say gpuguard-quota, the same in RBAC subjects; app.kubernetes.io/part-of plus helm's labels
(extra: dict of more labels). Arguments: dict obj, root, extra.
*/}}
{{- define "gpuguard.common" -}}
{{- $obj := .obj -}}{{- $root := .root -}}
{{- $base := include "gpuguard.baseNamespace" $root -}}
{{- $meta := $obj.metadata -}}
{{- if eq (include "gpuguard.clusterScoped" $obj.kind) "false" -}}
{{- if eq ($meta.namespace | default $base) $base -}}{{- $_ := set $meta "namespace" $root.Release.Namespace -}}
{{- else if eq $meta.namespace "gpuguard-quota" -}}{{- $_ := set $meta "namespace" $root.Values.quota.namespace -}}
{{- end -}}
{{- end -}}
{{- range $subject := $obj.subjects | default list -}}
{{- if eq ($subject.namespace | default "") $base -}}{{- $_ := set $subject "namespace" $root.Release.Namespace -}}{{- end -}}
{{- end -}}
{{- $labels := merge (dict "app.kubernetes.io/part-of" "gpuguard" "app.kubernetes.io/managed-by" $root.Release.Service "helm.sh/chart" (printf "%s-%s" $root.Chart.Name $root.Chart.Version)) (.extra | default dict) ($meta.labels | default dict) -}}
{{- $_ := set $meta "labels" $labels -}}
{{- end -}}

{{/* A pod template's containers: the chart's image (kustomize's images: entry). */}}
{{- define "gpuguard.containers" -}}
{{- $root := .root -}}
{{- range $c := .spec.containers -}}
{{- if eq $c.image "gpuguard" -}}
{{- $_ := set $c "image" (include "gpuguard.image" $root) -}}
{{- if $root.Values.image.pullPolicy -}}{{- $_ := set $c "imagePullPolicy" $root.Values.image.pullPolicy -}}{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
A container's args with the flags named in set (dict "--flag" "value") replaced where they are,
those in drop removed, then add appended. Arguments: dict args, set, drop, add.
*/}}
{{- define "gpuguard.args" -}}
{{- $out := list -}}
{{- range $arg := .args -}}
{{- $flag := regexReplaceAll "=.*" $arg "" -}}
{{- if has $flag ($.drop | default list) -}}
{{- else if hasKey ($.set | default dict) $flag -}}{{- $out = append $out (printf "%s=%v" $flag (get $.set $flag)) -}}
{{- else -}}{{- $out = append $out $arg -}}
{{- end -}}
{{- end -}}
{{- $flags := list -}}
{{- range $arg := $out -}}{{- $flags = append $flags (regexReplaceAll "=.*" $arg "") -}}{{- end -}}
{{- range $arg := (.add | default list) -}}
{{- $flag := regexReplaceAll "=.*" (toString $arg) "" -}}
{{- if has $flag $flags -}}
{{- fail (printf "extraArgs: %s is set by the chart from its values (the last one given wins, so this would bypass the chart's checks, e.g. --deadline-ms against webhook.timeoutSeconds); set the value instead" $flag) -}}
{{- end -}}
{{- end -}}
{{- toJson (concat $out (.add | default list)) -}}
{{- end -}}
