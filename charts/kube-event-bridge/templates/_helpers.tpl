{{/* Chart name, cut at 63 characters (the DNS label limit). */}}
{{- define "kube-event-bridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name, cut at 63 characters. */}}
{{- define "kube-event-bridge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kube-event-bridge.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kube-event-bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kube-event-bridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kube-event-bridge.labels" -}}
helm.sh/chart: {{ include "kube-event-bridge.chart" . }}
{{ include "kube-event-bridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kube-event-bridge.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kube-event-bridge.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kube-event-bridge.leaseName" -}}
{{- default (include "kube-event-bridge.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{/*
The effective configuration: the user's `config` with the parts the chart owns filled in.
*/}}
{{- define "kube-event-bridge.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- /* The public listener is the chart's; the admin listener (admin_*) stays the user's: loopback by default. */ -}}
{{- $server := deepCopy (default dict $cfg.server) -}}
{{- $_ := set $server "host" "0.0.0.0" -}}
{{- $_ := set $server "port" (int .Values.metrics.port) -}}
{{- $_ := set $cfg "server" $server -}}
{{- $le := dict "enabled" .Values.leaderElection.enabled "namespace" .Release.Namespace "name" (include "kube-event-bridge.leaseName" .) "lease_duration" .Values.leaderElection.leaseDuration "renew_deadline" .Values.leaderElection.renewDeadline "retry_period" .Values.leaderElection.retryPeriod -}}
{{- $_ := set $cfg "leader_election" $le -}}
{{- $cp := deepCopy (default dict $cfg.checkpoint) -}}
{{- if not (hasKey $cp "namespace") -}}
{{- $_ := set $cp "namespace" .Release.Namespace -}}
{{- end -}}
{{- if not (hasKey $cp "name_prefix") -}}
{{- $_ := set $cp "name_prefix" (printf "%s-checkpoint" (include "kube-event-bridge.fullname" .) | trunc 50 | trimSuffix "-") -}}
{{- end -}}
{{- if eq (default "file" $cp.store) "file" -}}
{{- $_ := set $cp "directory" "/var/lib/kube-event-bridge/checkpoints" -}}
{{- end -}}
{{- $_ := set $cfg "checkpoint" $cp -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
RBAC rules for one configured resource string: "pods", "deployments.apps", "widgets.example.com/v1".
Output: a YAML list item.
*/}}
{{- define "kube-event-bridge.resourceRule" -}}
{{- $spec := index (splitList "/" .) 0 -}}
{{- $parts := splitn "." 2 $spec -}}
{{- $resource := $parts._0 -}}
{{- $group := default "" $parts._1 -}}
- apiGroups: [{{ $group | quote }}]
  resources: [{{ $resource | quote }}]
  verbs: ["list", "watch"]
{{- end -}}
