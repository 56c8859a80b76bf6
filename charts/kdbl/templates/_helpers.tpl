{{/*
Resource name prefix ("kdbl" unless nameOverride is set).
*/}}
{{- define "kdbl.prefix" -}}
{{- default "kdbl" .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "kdbl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Selector labels of one component: (dict "root" $ "component" "api").
*/}}
{{- define "kdbl.selectorLabels" -}}
app.kubernetes.io/name: kdbl
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/*
Common labels of one component: (dict "root" $ "component" "api").
*/}}
{{- define "kdbl.labels" -}}
{{ include "kdbl.selectorLabels" . }}
app.kubernetes.io/part-of: kdbl
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ include "kdbl.chart" .root }}
{{- end -}}

{{/*
Labels carried by every Pod of the release (the default-deny and DNS NetworkPolicies select them).
*/}}
{{- define "kdbl.releasePodSelector" -}}
app.kubernetes.io/name: kdbl
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kdbl.apiServiceName" -}}
{{- .Values.api.service.name | default (printf "%s-api" (include "kdbl.prefix" .)) -}}
{{- end -}}

{{- define "kdbl.workerFetchServiceName" -}}
{{- .Values.worker.fetch.service.name | default (printf "%s-worker-fetch" (include "kdbl.prefix" .)) -}}
{{- end -}}

{{- define "kdbl.postgresName" -}}
{{- printf "%s-postgres" (include "kdbl.prefix" .) -}}
{{- end -}}

{{/*
Where PostgreSQL comes from: external | bundled | cloudnativepg. postgres.mode unset: bundled when
postgres.bundled.enabled (the switch before postgres.mode existed), otherwise external.
*/}}
{{- define "kdbl.postgresMode" -}}
{{- $mode := .Values.postgres.mode | default "" -}}
{{- if not $mode -}}
{{- $mode = ternary "bundled" "external" (.Values.postgres.bundled.enabled | default false) -}}
{{- else if and .Values.postgres.bundled.enabled (ne $mode "bundled") -}}
{{- fail (printf "postgres.bundled.enabled=true contradicts postgres.mode=%s: unset one of them" $mode) -}}
{{- end -}}
{{- $mode -}}
{{- end -}}

{{/*
The CloudNativePG Cluster (postgres.mode=cloudnativepg); its Services are <name>-rw (the primary) and
<name>-ro (the hot standbys), its Pods carry the label cnpg.io/cluster=<name>.
*/}}
{{- define "kdbl.cnpgClusterName" -}}
{{- printf "%s-pg" (include "kdbl.prefix" .) -}}
{{- end -}}

{{/*
The CloudNativePG Secret with the owner's password (the superuser postgres, key "password").
*/}}
{{- define "kdbl.cnpgSuperuserSecret" -}}
{{- .Values.postgres.cloudnativepg.superuserSecret | default (printf "%s-superuser" (include "kdbl.cnpgClusterName" .)) -}}
{{- end -}}

{{- define "kdbl.operatorServiceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- .Values.operator.serviceAccount.name | default (printf "%s-operator" (include "kdbl.prefix" .)) -}}
{{- else -}}
{{- .Values.operator.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/*
Name of the Secret the chart renders for secrets given as values.
*/}}
{{- define "kdbl.chartSecretName" -}}
{{- printf "%s-chart-secrets" (include "kdbl.prefix" .) -}}
{{- end -}}

{{/*
Image reference: (dict "root" $ "image" .Values.image).
global.imageRegistry replaces the registry part of the repository (a first path segment that holds
a "." or ":" or is "localhost"), or is prefixed when the repository names none.
A digest wins over the tag: repository@sha256:...
*/}}
{{- define "kdbl.image" -}}
{{- $img := .image -}}
{{- $repo := $img.repository -}}
{{- $registry := .root.Values.global.imageRegistry | default "" | trimSuffix "/" -}}
{{- if $registry -}}
{{- $parts := splitList "/" $repo -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repo = join "/" (rest $parts) -}}
{{- end -}}
{{- $repo = printf "%s/%s" $registry $repo -}}
{{- end -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (toString ($img.tag | default .root.Chart.AppVersion)) -}}
{{- end -}}
{{- end -}}

{{/*
imagePullSecrets of every Pod: global first, then the release's; strings or {name: ...}.
*/}}
{{- define "kdbl.imagePullSecrets" -}}
{{- $names := list -}}
{{- range (concat (.Values.global.imagePullSecrets | default list) (.Values.imagePullSecrets | default list)) -}}
{{- if kindIs "string" . -}}
{{- $names = append $names . -}}
{{- else -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- end -}}
{{- with (uniq $names) }}
imagePullSecrets:
{{- range . }}
  - name: {{ . | quote }}
{{- end }}
{{- end -}}
{{- end -}}

{{/*
Pod-level security context (restricted Pod Security profile).
*/}}
{{- define "kdbl.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: {{ .Values.securityContext.runAsUser }}
  runAsGroup: {{ .Values.securityContext.runAsGroup }}
  fsGroup: {{ .Values.securityContext.fsGroup }}
  fsGroupChangePolicy: OnRootMismatch
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{/*
Container-level security context (restricted Pod Security profile).
*/}}
{{- define "kdbl.containerSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: {{ .Values.securityContext.runAsUser }}
  runAsGroup: {{ .Values.securityContext.runAsGroup }}
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  privileged: false
  capabilities:
    drop:
      - ALL
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{/*
Scheduling fields of a Pod spec: pass the component's values block.
*/}}
{{- define "kdbl.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
A secret reference: (dict "root" $ "value" <string> "existingSecret" <name> "key" <key>
"chartKey" <key in the chart's Secret> "what" <description for the error message>).
Renders a secretKeyRef body (name/key). A value wins over existingSecret; neither fails the render.
*/}}
{{- define "kdbl.secretKeyRef" -}}
{{- if .value -}}
name: {{ include "kdbl.chartSecretName" .root }}
key: {{ .chartKey }}
{{- else -}}
name: {{ required (printf "%s: set an existing Secret name or a value (see values.yaml)" .what) .existingSecret }}
key: {{ .key }}
{{- end -}}
{{- end -}}

{{/*
Environment variables with a database connection for one role: (dict "root" $ "role" "owner|api|worker").
External: KDBL_DATABASE_URL from the Secret. Bundled and cloudnativepg: a password-less URL plus PGPASSWORD
(libpq reads it), so passwords never need URL-encoding. The API also gets KDBL_DATABASE_READ_URL (MCP
calls read on a streaming replica) where one is configured, with KDBL_READ_MAX_LAG_S and KDBL_READ_POOL_SIZE.
*/}}
{{- define "kdbl.databaseEnv" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $mode := include "kdbl.postgresMode" $root -}}
{{- if has $mode (list "bundled" "cloudnativepg") -}}
{{- $auth := $v.postgres.bundled.auth -}}
{{- $user := $auth.username -}}
{{- $host := include "kdbl.postgresName" $root -}}
{{- $port := int $v.postgres.bundled.port -}}
{{- $database := $auth.database -}}
{{- $readHost := "" -}}
{{- if eq $mode "cloudnativepg" -}}
{{- $cnpg := $v.postgres.cloudnativepg -}}
{{- $user = "postgres" -}}
{{- $host = printf "%s-rw" (include "kdbl.cnpgClusterName" $root) -}}
{{- $port = 5432 -}}
{{- $database = $cnpg.database -}}
{{- if and $cnpg.readReplicas (gt (int $cnpg.instances) 1) -}}
{{- $readHost = printf "%s-ro" (include "kdbl.cnpgClusterName" $root) -}}
{{- end -}}
{{- end -}}
{{- if eq .role "api" }}{{ $user = "kdbl_api" }}{{ end -}}
{{- if eq .role "worker" }}{{ $user = "kdbl_worker" }}{{ end -}}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
{{- if and (eq .role "owner") (eq $mode "cloudnativepg") }}
      name: {{ include "kdbl.cnpgSuperuserSecret" $root }}
      key: password
{{- else if eq .role "owner" }}
      {{- include "kdbl.secretKeyRef" (dict "root" $root "value" $auth.password "existingSecret" $auth.existingSecret "key" $auth.existingSecretKey "chartKey" "postgres-password" "what" "postgres.bundled.auth.existingSecret or postgres.bundled.auth.password is required for the bundled PostgreSQL") | nindent 6 }}
{{- else if eq .role "api" }}
      {{- include "kdbl.secretKeyRef" (dict "root" $root "value" $v.database.runtimeRoles.apiPassword "existingSecret" $v.database.runtimeRoles.existingSecret "key" $v.database.runtimeRoles.existingSecretKeys.apiPassword "chartKey" "api-db-password" "what" "database.runtimeRoles (kdbl_api password)") | nindent 6 }}
{{- else }}
      {{- include "kdbl.secretKeyRef" (dict "root" $root "value" $v.database.runtimeRoles.workerPassword "existingSecret" $v.database.runtimeRoles.existingSecret "key" $v.database.runtimeRoles.existingSecretKeys.workerPassword "chartKey" "worker-db-password" "what" "database.runtimeRoles (kdbl_worker password)") | nindent 6 }}
{{- end }}
- name: KDBL_DATABASE_URL
  value: {{ printf "postgresql://%s@%s:%d/%s" $user $host $port $database | quote }}
{{- if and (eq .role "api") $readHost }}
- name: KDBL_DATABASE_READ_URL
  value: {{ printf "postgresql://%s@%s:%d/%s" $user $readHost $port $database | quote }}
{{- include "kdbl.readReplicaEnv" $root }}
{{- end }}
{{- else -}}
{{- $ext := $v.database.external -}}
- name: KDBL_DATABASE_URL
  valueFrom:
    secretKeyRef:
{{- if eq .role "owner" }}
      {{- include "kdbl.secretKeyRef" (dict "root" $root "value" $ext.url "existingSecret" $ext.existingSecret "key" $ext.existingSecretKeys.url "chartKey" "database-url" "what" "database.external (owner URL)") | nindent 6 }}
{{- else if eq .role "api" }}
      {{- include "kdbl.secretKeyRef" (dict "root" $root "value" $ext.apiUrl "existingSecret" $ext.existingSecret "key" $ext.existingSecretKeys.apiUrl "chartKey" "database-api-url" "what" "database.external (kdbl_api URL)") | nindent 6 }}
{{- else }}
      {{- include "kdbl.secretKeyRef" (dict "root" $root "value" $ext.workerUrl "existingSecret" $ext.existingSecret "key" $ext.existingSecretKeys.workerUrl "chartKey" "database-worker-url" "what" "database.external (kdbl_worker URL)") | nindent 6 }}
{{- end }}
{{- if and (eq .role "api") (or $ext.readUrl $ext.existingSecretKeys.readUrl) }}
- name: KDBL_DATABASE_READ_URL
  valueFrom:
    secretKeyRef:
      {{- include "kdbl.secretKeyRef" (dict "root" $root "value" $ext.readUrl "existingSecret" $ext.existingSecret "key" $ext.existingSecretKeys.readUrl "chartKey" "database-read-url" "what" "database.external (kdbl_api read URL)") | nindent 6 }}
{{- include "kdbl.readReplicaEnv" $root }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The API's bound on a replica's lag and its read pool (only beside KDBL_DATABASE_READ_URL).
*/}}
{{- define "kdbl.readReplicaEnv" -}}
{{- $r := .Values.api.readReplica }}
- name: KDBL_READ_MAX_LAG_S
  value: {{ $r.maxLagSeconds | quote }}
{{- with $r.poolSize }}
- name: KDBL_READ_POOL_SIZE
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
Environment shared by every kdbl container.
*/}}
{{- define "kdbl.commonEnv" -}}
- name: KDBL_LOG_FORMAT
  value: {{ .Values.logging.format | quote }}
- name: KDBL_LOG_LEVEL
  value: {{ .Values.logging.level | quote }}
- name: HOME
  value: /tmp
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
- name: PYTHONUNBUFFERED
  value: "1"
{{- end -}}

{{- define "kdbl.internalFetchTokenEnv" -}}
- name: KDBL_INTERNAL_FETCH_TOKEN
  valueFrom:
    secretKeyRef:
      {{- include "kdbl.secretKeyRef" (dict "root" . "value" .Values.internalFetchToken.value "existingSecret" .Values.internalFetchToken.existingSecret "key" .Values.internalFetchToken.key "chartKey" "internal-fetch-token" "what" "internalFetchToken") | nindent 6 }}
{{- end -}}

{{/*
Embedding model: env, volume and mount (API and worker).
*/}}
{{- define "kdbl.embedEnv" -}}
{{- if .Values.embedder.enabled -}}
- name: KDBL_EMBED_MODEL_PATH
  value: {{ .Values.embedder.modelPath | quote }}
{{- end }}
{{- end -}}

{{- define "kdbl.embedVolume" -}}
{{- if .Values.embedder.enabled -}}
{{- $vol := .Values.embedder.volume -}}
- name: models
{{- if eq $vol.type "persistentVolumeClaim" }}
  persistentVolumeClaim:
    claimName: {{ required "embedder.volume.persistentVolumeClaim.claimName is required" $vol.persistentVolumeClaim.claimName | quote }}
    readOnly: true
{{- else if eq $vol.type "image" }}
  image:
    reference: {{ include "kdbl.image" (dict "root" . "image" $vol.image) | quote }}
    pullPolicy: {{ $vol.image.pullPolicy }}
{{- else }}
  {{- if not $vol.custom }}
  {{- fail "embedder.volume.custom must hold a volume source when embedder.volume.type is custom" }}
  {{- end }}
  {{- toYaml $vol.custom | nindent 2 }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "kdbl.embedVolumeMount" -}}
{{- if .Values.embedder.enabled -}}
- name: models
  mountPath: {{ dir .Values.embedder.modelPath | quote }}
  readOnly: true
{{- end }}
{{- end -}}

{{/*
Extra environment variables of a component.
*/}}
{{- define "kdbl.extraEnv" -}}
{{- with . -}}
{{ toYaml . }}
{{- end -}}
{{- end -}}

{{/*
The public URL of the API (KDBL_API_PUBLIC_URL), or "".
*/}}
{{- define "kdbl.publicUrl" -}}
{{- if .Values.api.publicUrl -}}
{{- .Values.api.publicUrl | trimSuffix "/" -}}
{{- else if and .Values.ingress.enabled .Values.ingress.host -}}
{{- printf "%s://%s" (ternary "https" "http" .Values.ingress.tls.enabled) .Values.ingress.host -}}
{{- end -}}
{{- end -}}

{{/*
KDBL_ALLOWED_HOSTS: the in-cluster names of the API Service (bare, for port-less Host headers, and
with the ":*" port wildcard), the ingress/public host, and api.allowedHosts.
*/}}
{{- define "kdbl.allowedHosts" -}}
{{- $svc := include "kdbl.apiServiceName" . -}}
{{- $ns := .Release.Namespace -}}
{{- $hosts := list -}}
{{- range (list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns)) -}}
{{- $hosts = append (append $hosts .) (printf "%s:*" .) -}}
{{- end -}}
{{- if and .Values.ingress.enabled .Values.ingress.host -}}
{{- $hosts = append (append $hosts .Values.ingress.host) (printf "%s:*" .Values.ingress.host) -}}
{{- end -}}
{{- with (include "kdbl.publicUrl" .) -}}
{{- $h := (urlParse .).host -}}
{{- $hosts = append $hosts $h -}}
{{- end -}}
{{- $hosts = concat $hosts .Values.api.allowedHosts -}}
{{- join "," (uniq $hosts) -}}
{{- end -}}

{{/*
KDBL_ALLOWED_ORIGINS: the public URL's origin plus api.allowedOrigins ("" when none).
*/}}
{{- define "kdbl.allowedOrigins" -}}
{{- $origins := list -}}
{{- with (include "kdbl.publicUrl" .) -}}
{{- $u := urlParse . -}}
{{- $origins = append $origins (printf "%s://%s" $u.scheme $u.host) -}}
{{- end -}}
{{- $origins = concat $origins .Values.api.allowedOrigins -}}
{{- join "," (uniq $origins) -}}
{{- end -}}

{{/*
Writable scratch space for a read-only root filesystem.
*/}}
{{- define "kdbl.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .sizeLimit | default "256Mi" }}
{{- end -}}

{{- define "kdbl.tmpVolumeMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/*
NetworkPolicy egress rule to PostgreSQL (bundled Pod, CloudNativePG instances or external CIDR).
*/}}
{{- define "kdbl.postgresEgressRule" -}}
{{- $mode := include "kdbl.postgresMode" . -}}
{{- if eq $mode "bundled" -}}
- to:
    - podSelector:
        matchLabels:
          {{- include "kdbl.selectorLabels" (dict "root" . "component" "postgres") | nindent 10 }}
  ports:
    - protocol: TCP
      port: {{ .Values.postgres.bundled.port }}
{{- else if eq $mode "cloudnativepg" -}}
{{- /* the -rw and -ro Services both select these Pods; a failover moves the primary among them */}}
- to:
    - podSelector:
        matchLabels:
          cnpg.io/cluster: {{ include "kdbl.cnpgClusterName" . }}
  ports:
    - protocol: TCP
      port: 5432
{{- else -}}
- ports:
    - protocol: TCP
      port: {{ .Values.database.external.port }}
  {{- with .Values.database.external.cidr }}
  to:
    - ipBlock:
        cidr: {{ . }}
  {{- end }}
{{- end -}}
{{- end -}}

{{/*
Hook annotations of the migration Job and of what it needs before it runs (after install when the
chart itself creates the database: bundled or cloudnativepg).
*/}}
{{- define "kdbl.migrationHook" -}}
{{- if ne (include "kdbl.postgresMode" .) "external" -}}
post-install,pre-upgrade
{{- else -}}
pre-install,pre-upgrade
{{- end -}}
{{- end -}}
