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

{{/* The container image: repository@digest when a digest is set (tag ignored), else repository:tag. */}}
{{- define "kube-event-bridge.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "kube-event-bridge.leaseName" -}}
{{- default (include "kube-event-bridge.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{/*
Whether the bridge runs sharded (bridge/service/replica_share.py: a `sharding` section written at all, or
the StatefulSet mode, which writes one): its checkpoint ids then carry the shard, and with leader
election it campaigns for its shard's own Lease.
*/}}
{{- define "kube-event-bridge.sharded" -}}
{{- $cfg := default dict .Values.config -}}
{{- if or .Values.sharding.enabled (hasKey $cfg "sharding") (hasKey $cfg "workers") (dig "limits" "cpu" "" (default dict .Values.resources)) -}}true{{- end -}}
{{- end -}}

{{/*
The Lease the bridge campaigns for: <leaseName>, or, sharded with a fixed ordinal (one release per
shard), <leaseName>-shard-<ordinal> (the StatefulSet mode refuses leader election).
*/}}
{{- define "kube-event-bridge.campaignLeaseName" -}}
{{- if .Values.nodeSharding.enabled -}}
{{- printf "%s-unscheduled" (include "kube-event-bridge.leaseName" .) -}}
{{- else if include "kube-event-bridge.sharded" . -}}
{{- $s := default dict .Values.config.sharding -}}
{{- $n := include "kube-event-bridge.workers" . | int -}}
{{- $names := list -}}
{{- range $w := until $n -}}
{{- $names = append $names (printf "%s-shard-%d" (include "kube-event-bridge.leaseName" $) (add (mul (default 0 $s.ordinal | int) $n) $w)) -}}
{{- end -}}
{{- join "," $names -}}
{{- else -}}
{{- include "kube-event-bridge.leaseName" . -}}
{{- end -}}
{{- end -}}

{{/* The ConfigMap checkpoint store's name prefix: the configured one, else <fullname>-checkpoint. */}}
{{- define "kube-event-bridge.checkpointPrefix" -}}
{{- $cp := default dict .Values.config.checkpoint -}}
{{- if $cp.name_prefix -}}
{{- $cp.name_prefix -}}
{{- else -}}
{{- printf "%s-checkpoint" (include "kube-event-bridge.fullname" .) | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
The checkpoint id of one configured resource entry, exactly as bridge/delivery/checkpoint.py's
informer_id computes it: <resource slug>.<namespace slug or "all">.<12 hex of SHA-256 of the scope>.
The ConfigMap store names its manifest <name_prefix>-<id>, so the Role can name it.
*/}}
{{- define "kube-event-bridge.informerId" -}}
{{- $scope := printf "%s\x00%s\x00%s\x00%s" .resource (default "" .namespace) (default "" .label_selector) (default "" .field_selector) -}}
{{- if .namespace_selector -}}{{- $scope = printf "%s\x00%s" $scope .namespace_selector -}}{{- end -}}
{{- $res := regexReplaceAll "[^a-z0-9.-]+" (lower .resource) "-" | trimAll ".-" | trunc 100 | default "x" -}}
{{- $ns := "all" -}}
{{- if .namespace -}}
{{- $ns = regexReplaceAll "[^a-z0-9.-]+" (lower .namespace) "-" | trimAll ".-" | trunc 63 | default "x" -}}
{{- end -}}
{{- printf "%s.%s.%s" $res $ns (sha256sum $scope | trunc 12) -}}
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
{{- with include "kube-event-bridge.adminTokenFile" . -}}
{{- $_ := set $server "admin_token_file" . -}}
{{- end -}}
{{- $_ := set $cfg "server" $server -}}
{{- $le := dict "enabled" .Values.leaderElection.enabled "namespace" .Release.Namespace "name" (include "kube-event-bridge.leaseName" .) "lease_duration" .Values.leaderElection.leaseDuration "renew_deadline" .Values.leaderElection.renewDeadline "retry_period" .Values.leaderElection.retryPeriod -}}
{{- $_ := set $cfg "leader_election" $le -}}
{{- $cp := deepCopy (default dict $cfg.checkpoint) -}}
{{- if not $cp.namespace -}}
{{- $_ := set $cp "namespace" (include "kube-event-bridge.checkpointNamespace" .) -}}
{{- end -}}
{{- with include "kube-event-bridge.checkpointMigrateFrom" . -}}
{{- $_ := set $cp "migrate_from_namespace" . -}}
{{- end -}}
{{- if not (hasKey $cp "name_prefix") -}}
{{- $_ := set $cp "name_prefix" (include "kube-event-bridge.checkpointPrefix" .) -}}
{{- end -}}
{{- if eq (default "file" $cp.store) "file" -}}
{{- $_ := set $cp "directory" "/var/lib/kube-event-bridge/checkpoints" -}}
{{- end -}}
{{- $_ := set $cfg "checkpoint" $cp -}}
{{- if .Values.nodeSharding.enabled -}}
{{- $_ := set $cfg "sharding" (dict "strategy" "node" "unscheduled" true) -}}
{{- end -}}
{{- if and (not (hasKey $cfg "workers")) (dig "limits" "cpu" "" (default dict .Values.resources)) -}}
{{- $_ := set $cfg "workers" (include "kube-event-bridge.workers" . | int) -}}
{{- end -}}
{{- if .Values.sharding.enabled -}}
{{- $_ := set $cfg "sharding" (dict "shards" "auto" "ordinal" "auto" "strategy" .Values.sharding.strategy "statefulset" (include "kube-event-bridge.fullname" .) "namespace" .Release.Namespace) -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/*
The configuration of the DaemonSet's pods (nodeSharding.enabled): the Deployment's, with only the
Pods entries, `sharding: {strategy: node}` (the node from $NODE_NAME) and no leader election (one pod
per node, nothing to stand by).
*/}}
{{- define "kube-event-bridge.nodeConfig" -}}
{{- $cfg := include "kube-event-bridge.config" . | fromYaml -}}
{{- $pods := list -}}
{{- range .Values.config.resources -}}
{{- if include "kube-event-bridge.isPods" .resource -}}{{- $pods = append $pods . -}}{{- end -}}
{{- end -}}
{{- $_ := set $cfg "resources" $pods -}}
{{- $_ := set $cfg "sharding" (dict "strategy" "node") -}}
{{- $le := deepCopy $cfg.leader_election -}}
{{- $_ := set $le "enabled" false -}}
{{- $_ := set $cfg "leader_election" $le -}}
{{- if and (not .Values.checkpointNamespace.migrateAll) (not (hasKey (default dict .Values.config.checkpoint) "migrate_from_namespace")) -}}
{{- /* A node's checkpoint is named after its node, which the Role cannot name: moved with migrateAll only. */ -}}
{{- $_ := unset $cfg.checkpoint "migrate_from_namespace" -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* "true" when a configured resource string names the core Pods. */}}
{{- define "kube-event-bridge.isPods" -}}
{{- $r := include "kube-event-bridge.resolveResource" . | fromYaml -}}
{{- if and (eq $r.group "") (eq $r.resource "pods") -}}true{{- end -}}
{{- end -}}

{{/*
The resource entries as the bridge scopes them, as YAML {items: [...]}: by node
(nodeSharding.enabled), a Pods entry of the Deployment (the unscheduled owner) carries
spec.nodeName= after its own field selector, exactly as bridge/service/replica_share.py joins them, so
that RBAC grants `get` for its selector exits and names its checkpoint.
*/}}
{{- define "kube-event-bridge.effectiveResources" -}}
{{- $out := list -}}
{{- range .Values.config.resources -}}
{{- $e := deepCopy . -}}
{{- if and $.Values.nodeSharding.enabled (include "kube-event-bridge.isPods" .resource) -}}
{{- $fs := default "" .field_selector -}}
{{- $_ := set $e "field_selector" (ternary (printf "%s,spec.nodeName=" $fs) "spec.nodeName=" (ne $fs "")) -}}
{{- end -}}
{{- $out = append $out $e -}}
{{- end -}}
{{- toYaml (dict "items" $out) -}}
{{- end -}}

{{/* The DaemonSet's (nodeSharding.enabled) name and ServiceAccount. */}}
{{- define "kube-event-bridge.nodeName" -}}
{{- printf "%s-node" (include "kube-event-bridge.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- define "kube-event-bridge.nodeServiceAccountName" -}}
{{- printf "%s-node" (include "kube-event-bridge.serviceAccountName" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
A configured resource string resolved to its API group and plural, as YAML {group, resource}.
RBAC rules name the plural, so every name the bridge accepts for a built-in resource (`deploy`,
`Deployment`, `deployments`, `deployments.apps/v1`) is resolved through the generated table of
built-in resources; a custom resource must be written `<plural>.<group>[/<version>]` (the chart
cannot ask the cluster's discovery), and anything else is rejected.
*/}}
{{- define "kube-event-bridge.resolveResource" -}}
{{- $t := include "kube-event-bridge.builtinResources" (dict) | fromYaml -}}
{{- $base := index (splitList "/" .) 0 | lower -}}
{{- $parts := splitn "." 2 $base -}}
{{- $head := $parts._0 -}}
{{- $rest := default "" $parts._1 -}}
{{- if and $rest (not (has $rest $t.groups)) (contains "." $rest) -}}
{{- $p := splitn "." 2 $rest -}}
{{- if regexMatch "^v[0-9]+((alpha|beta)[0-9]+)?$" $p._0 -}}{{- $rest = $p._1 -}}{{- end -}}
{{- end -}}
{{- if not $rest -}}
{{- $found := get $t.bare $head -}}
{{- if not $found -}}
{{- fail (printf "config.resources: %q is not a built-in Kubernetes resource; write a custom resource as <plural>.<group> (e.g. widgets.example.com) so that the chart can grant list/watch on it" .) -}}
{{- end -}}
{{- toYaml $found -}}
{{- else if has $rest $t.groups -}}
{{- $found := get $t.qualified (printf "%s.%s" $head $rest) -}}
{{- if not $found -}}
{{- fail (printf "config.resources: %q: the API group %s has no resource %q" . $rest $head) -}}
{{- end -}}
{{- toYaml $found -}}
{{- else -}}
{{- toYaml (dict "group" $rest "resource" $head) -}}
{{- end -}}
{{- end -}}

{{/*
RBAC rules for a list of configured resource strings, each resolved (see resolveResource), one rule
per distinct group/plural. Output: YAML list items.
*/}}
{{- define "kube-event-bridge.resourceRules" -}}
{{- /* Entries of config.resources. list/watch on each resource; get as well where an entry has a
selector: a delete of an object that left the selector is told from a real one by reading it. */ -}}
{{- $seen := list -}}
{{- $withGet := list -}}
{{- range . -}}
{{- $r := include "kube-event-bridge.resolveResource" .resource | fromYaml -}}
{{- $key := printf "%s/%s" $r.group $r.resource -}}
{{- if or .label_selector .field_selector .namespace_selector -}}{{- $withGet = append $withGet $key -}}{{- end -}}
{{- end -}}
{{- range . -}}
{{- $r := include "kube-event-bridge.resolveResource" .resource | fromYaml -}}
{{- $key := printf "%s/%s" $r.group $r.resource -}}
{{- if not (has $key $seen) -}}
{{- $seen = append $seen $key }}
- apiGroups: [{{ $r.group | quote }}]
  resources: [{{ $r.resource | quote }}]
  verbs: [{{ if has $key $withGet }}"get", {{ end }}"list", "watch"]
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
Checks what the values schema cannot: values compared with each other, and two entries naming one
resource in one scope (each change would be sent twice). Included by configmap.yaml.
*/}}
{{- define "kube-event-bridge.validate" -}}
{{- if and .Values.config.shutdown_deadline (ge (float64 .Values.config.shutdown_deadline) (float64 .Values.terminationGracePeriodSeconds)) -}}
{{- fail "config.shutdown_deadline must be less than terminationGracePeriodSeconds: the final checkpoint and the Lease release must happen before the pod is killed" -}}
{{- end -}}
{{- include "kube-event-bridge.validateSharding" . -}}
{{- $le := .Values.leaderElection -}}
{{- if not (gt (float64 $le.leaseDuration) (float64 $le.renewDeadline)) -}}
{{- fail (printf "leaderElection.leaseDuration (%v) must be greater than leaderElection.renewDeadline (%v)" $le.leaseDuration $le.renewDeadline) -}}
{{- end -}}
{{- if not (gt (float64 $le.renewDeadline) (mulf 1.2 (float64 $le.retryPeriod))) -}}
{{- fail (printf "leaderElection.renewDeadline (%v) must be greater than 1.2 * leaderElection.retryPeriod (%v)" $le.renewDeadline $le.retryPeriod) -}}
{{- end -}}
{{- $seen := dict -}}
{{- range $i, $r := .Values.config.resources -}}
{{- $res := include "kube-event-bridge.resolveResource" $r.resource | fromYaml -}}
{{- $key := printf "%s/%s|%s|%s|%s|%s" $res.group $res.resource (default "" $r.namespace) (default "" $r.label_selector) (default "" $r.field_selector) (default "" $r.namespace_selector) -}}
{{- if hasKey $seen $key -}}
{{- fail (printf "config.resources.%v (%q) and config.resources.%d (%q) name the same resource in the same scope: every change would be sent twice; keep one" (get $seen $key) (index $.Values.config.resources (int (get $seen $key))).resource $i $r.resource) -}}
{{- end -}}
{{- $_ := set $seen $key $i -}}
{{- end -}}
{{- end -}}

{{/*
What the StatefulSet mode (sharding.enabled) cannot work with, refused before anything is installed.
*/}}
{{- define "kube-event-bridge.validateSharding" -}}
{{- $cfgSharding := (default dict .Values.config).sharding -}}
{{- if .Values.nodeSharding.enabled -}}
{{- if .Values.sharding.enabled -}}
{{- fail "nodeSharding.enabled with sharding.enabled: choose one way to split the work (per node: a DaemonSet; by uid or resource: a StatefulSet)" -}}
{{- end -}}
{{- if $cfgSharding -}}
{{- fail "config.sharding is written by the chart in its DaemonSet mode (strategy: node); leave it out" -}}
{{- end -}}
{{- if eq (default "file" (default dict .Values.config.checkpoint).store) "file" -}}
{{- fail "nodeSharding.enabled needs a checkpoint store that outlives a pod (config.checkpoint.store: configmap or nats-kv): a node's bridge resumes from its node's checkpoint, and a node that goes away leaves its checkpoint for the replica that catches up on it (docs/sharding.md)" -}}
{{- end -}}
{{- $pods := false -}}
{{- range .Values.config.resources -}}{{- if include "kube-event-bridge.isPods" .resource -}}{{- $pods = true -}}{{- end -}}{{- end -}}
{{- if not $pods -}}
{{- fail "nodeSharding.enabled: config.resources has no Pods entry; the DaemonSet would watch nothing" -}}
{{- end -}}
{{- end -}}
{{- if .Values.sharding.enabled -}}
{{- if gt (len (include "kube-event-bridge.fullname" .)) 52 -}}
{{- fail (printf "sharding.enabled: the StatefulSet's name %q is longer than 52 characters, too long for its pods' and revisions' names; set fullnameOverride" (include "kube-event-bridge.fullname" .)) -}}
{{- end -}}
{{- if gt (int .Values.replicaCount) 1 -}}
{{- fail "sharding.enabled: the StatefulSet runs sharding.shards replicas, one per shard; leave replicaCount at 1" -}}
{{- end -}}
{{- if .Values.leaderElection.enabled -}}
{{- fail "sharding.enabled with leaderElection.enabled: the StatefulSet mode has no per-shard standby. A StatefulSet runs one pod per ordinal, so each shard's Lease (<leaseName>-shard-<o>) would have a single candidate and nothing would stand by; the StatefulSet restarts a shard that dies (and never runs two pods of one shard), which resumes from its checkpoint. Turn leaderElection off (a standby per shard needs a second set of pods per ordinal: docs/sharding.md)" -}}
{{- end -}}
{{- if eq (default "file" (default dict .Values.config.checkpoint).store) "file" -}}
{{- fail "sharding.enabled needs a shared checkpoint store (config.checkpoint.store: configmap or nats-kv): when the number of shards changes, each shard takes over objects from the checkpoints of the others, which a file in another pod cannot give it" -}}
{{- end -}}
{{- if $cfgSharding -}}
{{- fail "config.sharding is written by the chart in its StatefulSet mode (shards and ordinal: auto); set sharding.shards and sharding.strategy instead" -}}
{{- end -}}
{{- else if $cfgSharding -}}
{{- if or (eq (toString (default "" $cfgSharding.shards)) "auto") (eq (toString (default "" $cfgSharding.ordinal)) "auto") -}}
{{- fail "config.sharding: auto takes the shard from a StatefulSet pod's name and the total from the StatefulSet; a Deployment has neither. Use sharding.enabled=true (the StatefulSet mode), or fixed numbers, one release per shard" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The StatefulSet's headless Service: <fullname>-shards, cut at 63 characters. */}}
{{- define "kube-event-bridge.shardsServiceName" -}}
{{- printf "%s-shards" (include "kube-event-bridge.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The resources the events profile's enrichment reads (metadata list/watch), as a YAML list: none
unless a resource has `profile: events` and enrichment is on; config.events.enrichment.kinds, else
the bridge's default (DEFAULT_ENRICHMENT_KINDS in bridge/service/events/config.py; a test keeps the
two equal).
*/}}
{{- define "kube-event-bridge.enrichmentKinds" -}}
{{- $profiled := false -}}
{{- range .Values.config.resources -}}
{{- if eq (toString .profile) "events" -}}{{- $profiled = true -}}{{- end -}}
{{- end -}}
{{- $events := .Values.config.events | default dict -}}
{{- $enrichment := $events.enrichment | default dict -}}
{{- $enabled := true -}}
{{- if hasKey $enrichment "enabled" -}}{{- $enabled = $enrichment.enabled -}}{{- end -}}
{{- if and $profiled $enabled -}}
{{- if hasKey $enrichment "kinds" -}}
{{- toYaml $enrichment.kinds -}}
{{- else -}}
{{- toYaml (list "pods" "replicasets.apps" "deployments.apps" "statefulsets.apps" "daemonsets.apps" "jobs.batch" "cronjobs.batch" "nodes") -}}
{{- end -}}
{{- else -}}
[]
{{- end -}}
{{- end -}}

{{/*
Worker processes per pod when config.workers is not set: resources.limits.cpu rounded down, at
least 1 ("2" → 2, 1.5 → 1, "2500m" → 2, "500m" → 1); without a CPU limit, 1 (docs/sharding.md,
"Workers"). The bridge's default from its cgroup is the same count; written here, the Role can name
each worker's Lease and a change of the limit takes the workers' checkpoints over.
*/}}
{{- define "kube-event-bridge.workers" -}}
{{- $cfg := default dict .Values.config -}}
{{- if hasKey $cfg "workers" -}}
{{- if eq (toString $cfg.workers) "auto" -}}
{{- if .Values.leaderElection.enabled -}}
{{- fail "config.workers: auto cannot be used with leaderElection: each worker campaigns for a Lease of its own, which the chart's Role names one by one; set config.workers to a number (or leave it unset: resources.limits.cpu)" -}}
{{- end -}}
1
{{- else -}}
{{- $cfg.workers | int -}}
{{- end -}}
{{- else -}}
{{- $cpu := toString (dig "limits" "cpu" "" (default dict .Values.resources)) -}}
{{- $n := 1 -}}
{{- if hasSuffix "m" $cpu -}}
{{- $n = div (trimSuffix "m" $cpu | atoi) 1000 -}}
{{- else if $cpu -}}
{{- $n = floor (float64 $cpu) | int -}}
{{- end -}}
{{- max 1 $n -}}
{{- end -}}
{{- end -}}

{{/*
The admin token's file when the chart provides it (adminToken.enabled, and config.server does not
name a token file of its own), else "".
*/}}
{{- define "kube-event-bridge.adminTokenFile" -}}
{{- $own := dig "server" "admin_token_file" "" (default dict .Values.config) -}}
{{- if and .Values.adminToken.enabled (not $own) -}}
{{- printf "/var/run/secrets/kube-event-bridge/admin-token/%s" .Values.adminToken.key -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the admin token: adminToken.existingSecret, else <fullname>-admin-token. */}}
{{- define "kube-event-bridge.adminTokenSecret" -}}
{{- default (printf "%s-admin-token" (include "kube-event-bridge.fullname" . | trunc 51 | trimSuffix "-")) .Values.adminToken.existingSecret -}}
{{- end -}}

{{/*
The ConfigMap checkpoint store's namespace: config.checkpoint.namespace when set; else, with
checkpointNamespace.enabled, the chart's own (checkpointNamespace.name, or
<release namespace>-<release name>-checkpoints), so that the Role allowing get/list/delete on every
ConfigMap there reaches no other workload's; else the release namespace.
*/}}
{{- define "kube-event-bridge.checkpointNamespace" -}}
{{- $cp := default dict .Values.config.checkpoint -}}
{{- if $cp.namespace -}}
{{- $cp.namespace -}}
{{- else if .Values.checkpointNamespace.enabled -}}
{{- default (printf "%s-%s-checkpoints" .Release.Namespace .Release.Name | trunc 63 | trimAll "-") .Values.checkpointNamespace.name -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/*
Where checkpoints written before the chart had a checkpoint namespace are moved from (config
checkpoint.migrate_from_namespace): the release namespace, when the chart chose the checkpoint
namespace and checkpointNamespace.migrate is on; else "".
*/}}
{{- define "kube-event-bridge.checkpointMigrateFrom" -}}
{{- $cp := default dict .Values.config.checkpoint -}}
{{- if hasKey $cp "migrate_from_namespace" -}}
{{- $cp.migrate_from_namespace -}}
{{- else if and (eq (default "file" $cp.store) "configmap") (not $cp.namespace) .Values.checkpointNamespace.enabled .Values.checkpointNamespace.migrate -}}
{{- $ns := include "kube-event-bridge.checkpointNamespace" . -}}
{{- if ne $ns .Release.Namespace -}}{{- .Release.Namespace -}}{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The checkpoint heads (manifest and journal ConfigMaps) of the Deployment's or StatefulSet's
processes, as YAML {items: [...]}: per configured resource, <prefix>-<id> and <prefix>-<id>-journal,
the id with .shard-<k>-of-<total> when sharded (StatefulSet ordinals, a fixed config.sharding
ordinal, worker processes: shard ordinal*workers+worker of shards*workers). The checkpoints to move
from the release namespace, which the Role there names one by one.
*/}}
{{- define "kube-event-bridge.checkpointHeads" -}}
{{- $prefix := include "kube-event-bridge.checkpointPrefix" . -}}
{{- $w := include "kube-event-bridge.workers" . | int -}}
{{- $s := default dict .Values.config.sharding -}}
{{- $ordinals := list (default 0 $s.ordinal | int) -}}
{{- $total := default 1 $s.shards | int -}}
{{- if .Values.sharding.enabled -}}
{{- $total = .Values.sharding.shards | int -}}
{{- $ordinals = until $total -}}
{{- end -}}
{{- $shards := list -}}
{{- range $o := $ordinals -}}
{{- range $i := until $w -}}
{{- $shards = append $shards (add (mul $o $w) $i) -}}
{{- end -}}
{{- end -}}
{{- $all := mul $total $w -}}
{{- $names := list -}}
{{- range (include "kube-event-bridge.effectiveResources" . | fromYaml).items -}}
{{- $id := include "kube-event-bridge.informerId" . -}}
{{- range $k := $shards -}}
{{- $head := ternary (printf "%s-%s" $prefix $id) (printf "%s-%s.shard-%d-of-%d" $prefix $id (int $k) (int $all)) (le (int $all) 1) -}}
{{- $names = append $names $head -}}
{{- $names = append $names (printf "%s-journal" $head) -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "items" $names) -}}
{{- end -}}
