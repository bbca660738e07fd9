{{/* Names and labels shared by the chart's templates. */}}

{{- define "flextrain.fullname" -}}
{{- if eq .Release.Name .Chart.Name -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "flextrain.operatorName" -}}
{{- printf "%s-operator" (include "flextrain.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "flextrain.serviceAccountName" -}}
{{- default (include "flextrain.operatorName" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The job pods' ServiceAccount: a fixed name, the operator puts it into every pod it creates. */}}
{{- define "flextrain.jobServiceAccountName" -}}
flextrain-job
{{- end -}}

{{- define "flextrain.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "flextrain.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "flextrain.labels" -}}
{{ include "flextrain.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: flextrain
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* What the operator does with the objects it manages; the same rules in a Role or a ClusterRole. */}}
{{- define "flextrain.operatorRules" -}}
# Watch ElasticJobs; patch them for kopf's finalizer and progress annotations.
- apiGroups: [flextrain.dev]
  resources: [elasticjobs]
  verbs: [get, list, watch, patch]
# Phase Failed for a bad spec, and conditions, before a master runs or after it is gone.
- apiGroups: [flextrain.dev]
  resources: [elasticjobs/status]
  verbs: [get, patch]
# The master pod and its Service: created, watched, and the pod deleted and recreated on relaunch.
- apiGroups: [""]
  resources: [pods, services]
  verbs: [get, list, watch, create, delete]
# Events on ElasticJobs (phase transitions, bad specs, relaunches).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}
