{{/*
The chart renders the files of deploy/base (linked under files/base) rather than copies of them, so
the two cannot drift apart: each object gets what deploy/base's kustomization adds (its namespace,
the app.kubernetes.io labels), the chart's own labels, and the changes the values ask for.
*/}}

{{- define "sidecar-injector.labels" -}}
app.kubernetes.io/name: sidecar-injector
app.kubernetes.io/part-of: sidecar-injector
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Kinds without a namespace. */}}
{{- define "sidecar-injector.clusterScoped" -}}
Namespace ClusterRole ClusterRoleBinding MutatingWebhookConfiguration ValidatingWebhookConfiguration ValidatingAdmissionPolicy ValidatingAdmissionPolicyBinding MutatingAdmissionPolicy MutatingAdmissionPolicyBinding
{{- end -}}

{{/*
The objects of one YAML file (documents separated by ---), as dicts, with namespace and labels
added: (list $ "path/under/files") -> a list of objects, returned as YAML `items:`.
*/}}
{{- define "sidecar-injector.objects" -}}
{{- $root := index . 0 -}}
{{- $items := list -}}
{{- range $doc := regexSplit "(?m)^---\\s*$" ($root.Files.Get (index . 1)) -1 -}}
{{- $object := fromYaml $doc -}}
{{- if $object -}}
{{- $metadata := $object.metadata -}}
{{- $labels := merge (default dict $metadata.labels) (fromYaml (include "sidecar-injector.labels" $root)) -}}
{{- $_ := set $metadata "labels" $labels -}}
{{- if not (has $object.kind (splitList " " (include "sidecar-injector.clusterScoped" $root))) -}}
{{- $_ := set $metadata "namespace" $root.Release.Namespace -}}
{{- end -}}
{{- $items = append $items $object -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "items" $items) -}}
{{- end -}}

{{/* Renders a list of objects as YAML documents. */}}
{{- define "sidecar-injector.render" -}}
{{- range $object := . }}
---
{{ toYaml $object }}
{{- end -}}
{{- end -}}
