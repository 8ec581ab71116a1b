{{/*
The chart name (nameOverride wins), at most 63 characters.
*/}}
{{- define "spawnpoint.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of every resource: fullnameOverride, else the release name, followed by the
chart name unless the release name already contains it. At most 63 characters (some
Kubernetes name fields are limited to that by the DNS label rules).
*/}}
{{- define "spawnpoint.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
"name-version" for the helm.sh/chart label.
*/}}
{{- define "spawnpoint.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The labels every resource carries. Call with a dict: (dict "ctx" $ "component" "operator").
The status watchdog's objects add "selectorLabels" (include "spawnpoint.watchdogSelectorLabels"
$): its own name label, so that no selector of the operator's picks its pods.
*/}}
{{- define "spawnpoint.labels" -}}
helm.sh/chart: {{ include "spawnpoint.chart" .ctx }}
{{ .selectorLabels | default (include "spawnpoint.selectorLabels" .ctx) }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: spawnpoint
{{- end }}

{{/*
The labels the operator's Deployment selects its pods by (immutable once installed).
*/}}
{{- define "spawnpoint.selectorLabels" -}}
app.kubernetes.io/name: {{ include "spawnpoint.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The labels the status watchdog's Deployment selects its pods by (immutable once installed).
Not the operator's: its app.kubernetes.io/name is "<name>-status-watchdog", so the operator's
Deployment, its metrics Service and `kubectl logs deployment/<fullname>` (which select
name and instance) and the NetworkPolicy's operator peer never take the watchdog's pod.
*/}}
{{- define "spawnpoint.watchdogSelectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-status-watchdog" (include "spawnpoint.name" .) | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The status watchdog's Deployment, ServiceAccount and RBAC: "<fullname>-status-watchdog", at
most 63 characters.
*/}}
{{- define "spawnpoint.watchdogName" -}}
{{- printf "%s-status-watchdog" (include "spawnpoint.fullname" . | trunc 47 | trimSuffix "-") }}
{{- end }}

{{/*
The operator's ServiceAccount name.
*/}}
{{- define "spawnpoint.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "spawnpoint.fullname" .) .Values.serviceAccount.name }}
{{- else if .Values.serviceAccount.name }}
{{- .Values.serviceAccount.name }}
{{- else if .Values.rbac.create }}
{{- fail "serviceAccount.create is false and serviceAccount.name is empty: the operator's RBAC would be bound to the namespace's default ServiceAccount, and so to every pod that uses it. Name an existing ServiceAccount (serviceAccount.name) or let the chart create one." }}
{{- else }}
{{- "default" }}
{{- end }}
{{- end }}

{{/*
"true" when leader election is on: leaderElection.enabled (default true), or when it is null
replicaCount > 1.
Refuses more than one replica without it.
*/}}
{{- define "spawnpoint.leaderElect" -}}
{{- $enabled := .Values.leaderElection.enabled }}
{{- if kindIs "invalid" $enabled }}
{{- $enabled = gt (int .Values.replicaCount) 1 }}
{{- end }}
{{- if and (not $enabled) (gt (int .Values.replicaCount) 1) }}
{{- fail (printf "replicaCount is %d but leaderElection.enabled is false: several operators would act on the same TrainingJobs at once. Set leaderElection.enabled=true (or leave it unset), or replicaCount=1." (int .Values.replicaCount)) }}
{{- end }}
{{- if $enabled }}true{{ end }}
{{- end }}

{{/*
"true" when the status watchdog runs: statusWatchdog.enabled, or when it is null leader
election. It watches the operator's Lease, so it is refused without leader election, and so
is a staleAfter not longer than leaderElection.leaseDuration (a leader renewing on time could
look stale) or shorter than twice the interval (the binary's own refusal).
*/}}
{{- define "spawnpoint.statusWatchdog" -}}
{{- $leaderElect := include "spawnpoint.leaderElect" . }}
{{- $enabled := .Values.statusWatchdog.enabled }}
{{- if kindIs "invalid" $enabled }}
{{- $enabled = $leaderElect }}
{{- end }}
{{- if and $enabled (not $leaderElect) }}
{{- fail "statusWatchdog.enabled is true but leader election is off (leaderElection.enabled=false): the watchdog judges whether an operator is writing statuses by the operator's Lease, which only leader election keeps. Turn leader election on, or leave statusWatchdog.enabled unset (null) or false." }}
{{- end }}
{{- if $enabled }}
{{- $stale := include "spawnpoint.durationMs" (dict "value" .Values.statusWatchdog.staleAfter "key" "statusWatchdog.staleAfter") | float64 }}
{{- $lease := include "spawnpoint.durationMs" (dict "value" .Values.leaderElection.leaseDuration "key" "leaderElection.leaseDuration") | float64 }}
{{- if le $stale $lease }}
{{- fail (printf "statusWatchdog.staleAfter (%v) must be longer than leaderElection.leaseDuration (%v): a leader renews its Lease within the lease duration, so a shorter wait would mark the statuses of a working operator stale. Raise statusWatchdog.staleAfter (the default 45s is three 15s lease durations)." .Values.statusWatchdog.staleAfter .Values.leaderElection.leaseDuration) }}
{{- end }}
{{- $interval := include "spawnpoint.durationMs" (dict "value" .Values.statusWatchdog.interval "key" "statusWatchdog.interval") | float64 }}
{{- if le $interval 0.0 }}
{{- fail (printf "statusWatchdog.interval is %v: give how often the watchdog reads the Lease, e.g. 5s" .Values.statusWatchdog.interval) }}
{{- end }}
{{- if lt $stale (mulf 2.0 $interval) }}
{{- fail (printf "statusWatchdog.staleAfter (%v) must be at least twice statusWatchdog.interval (%v): the watchdog reads the Lease every interval (spawnpoint-operator status-watchdog refuses it so)." .Values.statusWatchdog.staleAfter .Values.statusWatchdog.interval) }}
{{- end }}
{{- "true" }}
{{- end }}
{{- end }}

{{/*
A duration as the operator parses it (operator/app/options.cc ParseDuration: a decimal
number, then ms, s, m, h or nothing for seconds), in milliseconds, as a decimal string. Call
with (dict "value" V "key" "the.value.name"); refuses anything else.
*/}}
{{- define "spawnpoint.durationMs" -}}
{{- $text := toString .value }}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $text }}
{{- $unit := trimPrefix $number $text }}
{{- $factors := dict "" 1000.0 "s" 1000.0 "ms" 1.0 "m" 60000.0 "h" 3600000.0 }}
{{- if or (not $number) (not (hasKey $factors $unit)) }}
{{- fail (printf "%s is %q: expected a duration such as 500ms, 10s, 5m or 1h" .key $text) }}
{{- end }}
{{- mulf (float64 $number) (get $factors $unit) }}
{{- end }}

{{/*
The Lease's name.
*/}}
{{- define "spawnpoint.leaseName" -}}
{{- default (include "spawnpoint.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/*
The namespaces whose TrainingJobs the operator handles (--namespace), as a JSON list:
watchNamespaces, or watchNamespace as a list of one; empty: every namespace. Refuses both set.
*/}}
{{- define "spawnpoint.watchNamespaces" -}}
{{- $list := .Values.watchNamespaces | default list }}
{{- if and $list .Values.watchNamespace }}
{{- fail (printf "watchNamespace (%q) and watchNamespaces (%v) are both set: give the namespaces in watchNamespaces only (watchNamespace is its one-namespace shorthand)" .Values.watchNamespace $list) }}
{{- end }}
{{- if .Values.watchNamespace }}
{{- $list = list .Values.watchNamespace }}
{{- end }}
{{- toJson $list }}
{{- end }}

{{/*
The namespaces of the operator's main RBAC rules with rbac.scope=namespace, a Role and
RoleBinding in each, as a JSON list: the watched namespaces, which are then required.
*/}}
{{- define "spawnpoint.rbacNamespaces" -}}
{{- $namespaces := include "spawnpoint.watchNamespaces" . | fromJsonArray }}
{{- if not $namespaces }}
{{- fail "rbac.scope=namespace gives the operator a Role in each watched namespace only: list them (--set 'watchNamespaces={team-a,team-b}', or --set watchNamespace=ml for one), or use rbac.scope=cluster" }}
{{- end }}
{{- toJson $namespaces }}
{{- end }}

{{/*
Checks that apply to the whole release; included by the Deployment.
*/}}
{{- define "spawnpoint.validate" -}}
{{- if not (has .Values.rbac.scope (list "cluster" "namespace")) }}
{{- fail (printf "rbac.scope must be cluster or namespace, got %q" (toString .Values.rbac.scope)) }}
{{- end }}
{{- $_ := include "spawnpoint.watchNamespaces" . }}
{{- if and .Values.rbac.create (eq .Values.rbac.scope "namespace") }}
{{- $_ := include "spawnpoint.rbacNamespaces" . }}
{{- end }}
{{- if eq (int .Values.metrics.port) (int .Values.health.port) }}
{{- fail (printf "metrics.port and health.port are both %d: give them different ports (they are two container ports)" (int .Values.metrics.port)) }}
{{- end }}
{{- $_ := include "spawnpoint.leaderElect" . }}
{{- $_ := include "spawnpoint.statusWatchdog" . }}
{{- $_ := include "spawnpoint.serviceAccountName" . }}
{{- include "spawnpoint.validateIsolation" . }}
{{- end }}

{{/*
The namespaces where the operator may write pods, services and secrets must not hold other
workloads: no watched namespace is the release namespace (the operator's token could then
delete its neighbours, in either scope) nor one of rbac.protectedNamespaces (with cluster
scope the admission policy would refuse every pod of every job there; with namespace scope
the operator would get a Role there to create and delete pods among its workloads).
*/}}
{{- define "spawnpoint.validateIsolation" -}}
{{- $isList := not (empty .Values.watchNamespaces) }}
{{- range $watch := include "spawnpoint.watchNamespaces" . | fromJsonArray }}
{{- if eq $watch $.Release.Namespace }}
{{- $what := ternary (printf "watchNamespaces holds %q" $watch) (printf "watchNamespace is %q" $watch) $isList }}
{{- fail (printf "%s, the release namespace: the operator's pods, services and secrets would share it with the operator itself and whatever else runs there, which its rights to create and delete pods would reach. Install the chart into a namespace of its own (-n spawnpoint-system) and keep the TrainingJobs in another." $what) }}
{{- end }}
{{- $protected := has $watch ($.Values.rbac.protectedNamespaces | default list) }}
{{- $what := ternary (printf "watchNamespaces holds %q, one of" $watch) (printf "watchNamespace %q is one of" $watch) $isList }}
{{- if and $protected (eq $.Values.rbac.scope "namespace") }}
{{- fail (printf "%s rbac.protectedNamespaces %v: with rbac.scope=namespace the operator would get a Role there that creates and deletes pods among its workloads. Watch another namespace, or take it out of the list." $what $.Values.rbac.protectedNamespaces) }}
{{- end }}
{{- if and $protected $.Values.rbac.admissionPolicy (eq $.Values.rbac.scope "cluster") }}
{{- fail (printf "%s rbac.protectedNamespaces %v: the admission policy would refuse every pod of its TrainingJobs. Watch another namespace, or take it out of the list." $what $.Values.rbac.protectedNamespaces) }}
{{- end }}
{{- end }}
{{- $prom := .Values.networkPolicy.prometheus }}
{{- $nsSelector := $prom.namespaceSelector | default dict }}
{{- if and .Values.networkPolicy.enabled (not (or $nsSelector.matchLabels $nsSelector.matchExpressions)) }}
{{- fail "networkPolicy.prometheus.namespaceSelector is empty: it would select every namespace, and any tenant could give a pod the Prometheus labels and read every agent. Select the namespace Prometheus runs in, e.g. {matchLabels: {kubernetes.io/metadata.name: monitoring}}." }}
{{- end }}
{{- end }}

{{/*
The namespaces that get the agents' NetworkPolicy, as a JSON list: networkPolicy.namespaces,
else the watched namespaces; empty when every namespace is watched and none is listed.
*/}}
{{- define "spawnpoint.networkPolicyNamespaces" -}}
{{- $namespaces := .Values.networkPolicy.namespaces | default list }}
{{- if not $namespaces }}
{{- $namespaces = include "spawnpoint.watchNamespaces" . | fromJsonArray }}
{{- end }}
{{- toJson $namespaces }}
{{- end }}

{{/*
Fails unless the cluster serves the Prometheus Operator's kind. Call with (dict "ctx" $
"kind" "ServiceMonitor" "value" "metrics.serviceMonitor.enabled").
*/}}
{{- define "spawnpoint.requireMonitoringKind" -}}
{{- $versions := .ctx.Capabilities.APIVersions }}
{{- if not (or ($versions.Has "monitoring.coreos.com/v1") ($versions.Has (printf "monitoring.coreos.com/v1/%s" .kind))) }}
{{- fail (printf "%s is true but this cluster does not serve monitoring.coreos.com/v1 (%s): install the Prometheus Operator's CRDs first (e.g. kube-prometheus-stack), or with `helm template` pass --api-versions monitoring.coreos.com/v1" .value .kind) }}
{{- end }}
{{- end }}

{{/*
image:tag, the tag defaulting to the chart's appVersion. Call with (dict "image" X "ctx" $).
*/}}
{{- define "spawnpoint.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .ctx.Chart.AppVersion | toString) }}
{{- end }}

{{/*
A list of strings as CEL string literals, comma-separated: 'a', 'b'. For names that hold no
quote (namespace names, DNS labels).
*/}}
{{- define "spawnpoint.celStrings" -}}
{{- $quoted := list }}
{{- range . }}{{ $quoted = append $quoted (squote .) }}{{ end }}
{{- join ", " $quoted }}
{{- end }}
