{{/* The CSI driver name the documents fix; it is not a value. */}}
{{- define "git-csi.driverName" -}}git.liken.sh{{- end }}

{{- define "git-csi.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "git-csi.fullname" -}}
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

{{- define "git-csi.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "git-csi.labels" -}}
helm.sh/chart: {{ include "git-csi.chart" . }}
app.kubernetes.io/name: {{ include "git-csi.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: git-csi
{{- end }}

{{/* Selector labels of one component: pass (dict "root" $ "component" "node"). */}}
{{- define "git-csi.selectorLabels" -}}
app.kubernetes.io/name: {{ include "git-csi.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "git-csi.nodeServiceAccountName" -}}
{{- if .Values.serviceAccount.node.create }}
{{- default (printf "%s-node" (include "git-csi.fullname" .)) .Values.serviceAccount.node.name }}
{{- else }}
{{- required "serviceAccount.node.name is required when serviceAccount.node.create is false" .Values.serviceAccount.node.name }}
{{- end }}
{{- end }}

{{- define "git-csi.controllerServiceAccountName" -}}
{{- if .Values.serviceAccount.controller.create }}
{{- default (printf "%s-controller" (include "git-csi.fullname" .)) .Values.serviceAccount.controller.name }}
{{- else }}
{{- required "serviceAccount.controller.name is required when serviceAccount.controller.create is false" .Values.serviceAccount.controller.name }}
{{- end }}
{{- end }}

{{/* An image reference: pass (dict "image" .Values.images.x "root" $). An empty tag means the appVersion. */}}
{{- define "git-csi.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* One of the driver's own images, from images.registry: pass (dict "image" .Values.images.x "root" $). */}}
{{- define "git-csi.driverImage" -}}
{{- printf "%s/%s" .root.Values.images.registry (include "git-csi.image" .) }}
{{- end }}

{{/* The kubelet's plugin directory of this driver, on the host. */}}
{{- define "git-csi.pluginDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletDir) (include "git-csi.driverName" .) }}
{{- end }}

{{- define "git-csi.stateDir" -}}
{{- trimSuffix "/" .Values.stateDir }}
{{- end }}

{{/* Where the three services' unix sockets live, inside the state directory. */}}
{{- define "git-csi.socketDir" -}}
{{- printf "%s/sockets" (include "git-csi.stateDir" .) }}
{{- end }}

{{/* Container securityContext of a process that needs no privilege at all. */}}
{{- define "git-csi.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
"true" when the chart serves VolumeSnapshots (snapshots.enabled, or "auto"
and the API server serves snapshot.storage.k8s.io/v1), else empty.
*/}}
{{- define "git-csi.snapshots" -}}
{{- $enabled := toString .Values.snapshots.enabled -}}
{{- if or (eq $enabled "true") (and (eq $enabled "auto") (.Capabilities.APIVersions.Has "snapshot.storage.k8s.io/v1/VolumeSnapshotClass")) -}}true{{- end -}}
{{- end }}
