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

{{/*
The namespaces the operator watches, as a JSON list (read it with `fromJsonArray`): watchNamespaces,
or the release namespace when that is empty; an empty list when it watches all namespaces.
*/}}
{{- define "flextrain.watchedNamespaces" -}}
{{- if .Values.watchAllNamespaces -}}
{{- with .Values.watchNamespaces -}}
{{- fail (printf "watchNamespaces (%s) must be empty when watchAllNamespaces is true, which watches every namespace: set one or the other" (join ", " .)) -}}
{{- end -}}
[]
{{- else -}}
{{- default (list .Release.Namespace) .Values.watchNamespaces | uniq | toJson -}}
{{- end -}}
{{- end -}}

{{/*
The namespaces that get the job ServiceAccount, as a JSON list: the watched ones, or with
watchAllNamespaces the release namespace plus jobServiceAccount.extraNamespaces. A job
ServiceAccount in a namespace the operator does not watch would serve jobs that never start.
*/}}
{{- define "flextrain.jobNamespaces" -}}
{{- $extra := default (list) .Values.jobServiceAccount.extraNamespaces -}}
{{- if .Values.watchAllNamespaces -}}
{{- prepend $extra .Release.Namespace | uniq | toJson -}}
{{- else -}}
{{- $watched := include "flextrain.watchedNamespaces" . | fromJsonArray -}}
{{- range $ns := $extra -}}
{{- if not (has $ns $watched) -}}
{{- fail (printf "jobServiceAccount.extraNamespaces: the operator does not watch namespace %q (it watches %s), so jobs there would never start: add %q to watchNamespaces (or set watchAllNamespaces=true)" $ns (join ", " $watched) $ns) -}}
{{- end -}}
{{- end -}}
{{- $watched | toJson -}}
{{- end -}}
{{- end -}}

{{/* Secrets job pods pull the image with: jobServiceAccount.imagePullSecrets, or the top-level imagePullSecrets when unset (null). JSON list. */}}
{{- define "flextrain.jobImagePullSecrets" -}}
{{- $secrets := .Values.jobServiceAccount.imagePullSecrets -}}
{{- if kindIs "invalid" $secrets -}}
{{- $secrets = .Values.imagePullSecrets -}}
{{- end -}}
{{- default (list) $secrets | toJson -}}
{{- end -}}

{{/* Refuses contradicting values; renders nothing. */}}
{{- define "flextrain.checkValues" -}}
{{- $_ := include "flextrain.jobNamespaces" . -}}
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

{{/*
What the operator does (flextrain/operator): the same rules in a Role or a ClusterRole. It never
deletes anything: a relaunched master is a new pod (<job>-master-<n>), and everything it creates is
owned by the ElasticJob, so the garbage collector removes it with the job.
It creates each job's master a ServiceAccount, Role and RoleBinding (flextrain/k8s/access.py). RBAC
lets it create that Role and bind it only because it holds every right the Role grants itself
(pods create/delete/list/patch/watch, services create/get, events create, elasticjobs get,
elasticjobs/status patch, elasticjobs/finalizers update): it has neither `escalate` nor `bind`, so it can never hand out more than
it has. Pods' `patch` is here for that reason only (a master relabels a spare worker's pod).
*/}}
{{- define "flextrain.operatorRules" -}}
# Watch ElasticJobs; patch them (kopf's progress annotations, the stop annotation).
- apiGroups: [flextrain.dev]
  resources: [elasticjobs]
  verbs: [get, list, watch, patch]
# Phase Failed for a bad spec, and conditions, before a master runs or after it is gone.
- apiGroups: [flextrain.dev]
  resources: [elasticjobs/status]
  verbs: [patch]
# Everything the operator creates for a job is owned by it with blockOwnerDeletion: true, which the
# OwnerReferencesPermissionEnforcement admission plugin (OpenShift's default) allows only to whoever may
# update the owner's finalizers; without it every create for a job is refused (403). No finalizer is
# ever written (the operator puts none on jobs).
- apiGroups: [flextrain.dev]
  resources: [elasticjobs/finalizers]
  verbs: [update]
# Master pods: created, and watched to relaunch a master that failed or was deleted; a job's pods
# deleted at its activeDeadlineSeconds or ttlSecondsAfterFinished.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, patch]
# The master's Service: created, and read to heal a deleted one; a finished job's Services deleted
# after ttlSecondsAfterFinished.
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, create, delete]
# spec.tls: each job's Secret <job>-tls (its CA, certificate and token): created before its master pod,
# read to dial its master, deleted after ttlSecondsAfterFinished. Never listed or watched.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, delete]
# spec.scheduling.gang volcano: the job's PodGroup (harmless where Volcano is not installed).
- apiGroups: [scheduling.volcano.sh]
  resources: [podgroups]
  verbs: [get, create, delete]
# Events on ElasticJobs (phase transitions, bad specs, relaunches).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# Each job's master identity: its ServiceAccount (and the flextrain-job ServiceAccount, read for its
# imagePullSecrets), Role and RoleBinding.
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [create]
{{- if .Values.networkPolicies.enabled }}
# networkPolicies.enabled: each job's NetworkPolicies.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create]
{{- end }}
{{- end -}}
