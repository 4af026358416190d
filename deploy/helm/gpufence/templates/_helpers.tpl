{{/* Paths per distribution: the C++ table's (src/distribution/distribution.cpp; sources in
docs/install.md). test_distribution_table fails when they differ. */}}
{{- define "gpufence.distributions" -}}
containerd:
  kubeletDir: /var/lib/kubelet
  containerdConfig: /etc/containerd/config.toml
  containerdSocket: /run/containerd/containerd.sock
microk8s:
  kubeletDir: /var/snap/microk8s/common/var/lib/kubelet
  containerdConfig: /var/snap/microk8s/current/args/containerd-template.toml
  containerdSocket: /var/snap/microk8s/common/run/containerd.sock
k3s:
  kubeletDir: /var/lib/kubelet
  containerdConfig: /var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl
  containerdSocket: /run/k3s/containerd/containerd.sock
rke2:
  kubeletDir: /var/lib/kubelet
  containerdConfig: /var/lib/rancher/rke2/agent/etc/containerd/config.toml.tmpl
  containerdSocket: /run/k3s/containerd/containerd.sock
k0s:
  kubeletDir: /var/lib/k0s/kubelet
  containerdConfig: /etc/k0s/containerd.d/gpufence.toml
  containerdSocket: /run/k0s/containerd.sock
{{- end -}}

{{/* gpufence.path KEY: the value from .Values.paths, else the distribution's. */}}
{{- define "gpufence.path" -}}
{{- $all := include "gpufence.distributions" .root | fromYaml -}}
{{- $d := index $all .root.Values.distribution -}}
{{- if not $d -}}
{{- fail (printf "distribution must be one of %s (got %q)" (keys $all | sortAlpha | join ", ") .root.Values.distribution) -}}
{{- end -}}
{{- default (index $d .key) (index .root.Values.paths .key) -}}
{{- end -}}

{{- define "gpufence.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{- define "gpufence.labels" -}}
app.kubernetes.io/part-of: gpufence
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}

{{/* NVML as seen from a pod with the host at /host. */}}
{{- define "gpufence.hostNvml" -}}
/host{{ trimSuffix "/" .Values.driver.root }}{{ .Values.driver.libDir }}/libnvidia-ml.so.1
{{- end -}}

{{/*
allocation: per-node: which backend a node runs is its label's (allocationLabel): "dra" nodes run
gpufence-dra, all others the device plugin; the two node affinities exclude each other, so no node
gets both. Takes a dict: root (the chart's .), backend ("dra" or "device-plugin").
*/}}
{{- define "gpufence.allocationAffinity" -}}
{{- if eq .root.Values.allocation "per-node" }}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions:
            - key: {{ .root.Values.allocationLabel }}
              operator: {{ eq .backend "dra" | ternary "In" "NotIn" }}
              values: ["dra"]
{{- end }}
{{- end -}}

{{- define "gpufence.nodePlacement" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
