{{/*
The pod template of the Deployment and of the StatefulSet (sharding.enabled), at the indentation of
`spec.template` in both.
*/}}
{{- define "kube-event-bridge.podTemplate" -}}
{{- /* .nodeDaemon: the DaemonSet's pods (nodeSharding.enabled), with their own ConfigMap and
ServiceAccount, $NODE_NAME from the downward API, and no spreading (one pod per node already). */ -}}
{{- $daemon := hasKey . "nodeDaemon" -}}
{{- $sharded := .Values.sharding.enabled -}}
{{- $ha := gt (int .Values.replicaCount) 1 -}}
{{- $spread := and (not $daemon) (or $ha (and $sharded (gt (int .Values.sharding.shards) 1))) }}
    metadata:
      annotations:
        {{- if $daemon }}
        checksum/config: {{ include (print $.Template.BasePath "/configmap-node.yaml") . | sha256sum }}
        {{- else }}
        checksum/config: {{ include (print $.Template.BasePath "/configmap.yaml") . | sha256sum }}
        {{- end }}
        {{- if $sharded }}
        # The number of shards is read from the StatefulSet (shards: auto) when a pod starts: a
        # change of sharding.shards changes the pod template, so that every shard restarts with the
        # new total instead of some running with the old one.
        kube-event-bridge.io/total-shards: {{ .Values.sharding.shards | quote }}
        {{- end }}
        {{- with .Values.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      labels:
        {{- include "kube-event-bridge.selectorLabels" . | nindent 8 }}
        {{- if $daemon }}
        app.kubernetes.io/component: node
        {{- end }}
        {{- with .Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ if $daemon }}{{ include "kube-event-bridge.nodeServiceAccountName" . }}{{ else }}{{ include "kube-event-bridge.serviceAccountName" . }}{{ end }}
      automountServiceAccountToken: true
      terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
      {{- with .Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .Values.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      securityContext:
        {{- toYaml .Values.podSecurityContext | nindent 8 }}
      containers:
        - name: bridge
          image: {{ include "kube-event-bridge.image" . | quote }}
          imagePullPolicy: {{ .Values.image.pullPolicy }}
          args: ["run", "--config", "/etc/kube-event-bridge/config.yaml"]
          env:
            - name: KEB_LEADER_ELECTION__IDENTITY
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            # The pod's name and namespace: automatic sharding takes the shard from the name's -<n>
            # suffix and reads the StatefulSet in this namespace.
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: POD_NAMESPACE
              valueFrom:
                fieldRef:
                  fieldPath: metadata.namespace
            {{- if $daemon }}
            # sharding.strategy: node watches the Pods bound to this node.
            - name: NODE_NAME
              valueFrom:
                fieldRef:
                  fieldPath: spec.nodeName
            {{- end }}
            {{- with .Values.env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- with .Values.envFrom }}
          envFrom:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          ports:
            - name: http
              containerPort: {{ .Values.metrics.port }}
              protocol: TCP
          livenessProbe:
            httpGet:
              path: /healthz
              port: http
            initialDelaySeconds: 5
            periodSeconds: 10
            failureThreshold: 3
          readinessProbe:
            httpGet:
              path: /readyz
              port: http
            periodSeconds: 5
            failureThreshold: 3
          startupProbe:
            httpGet:
              path: /healthz
              port: http
            periodSeconds: 2
            failureThreshold: 30
          resources:
            {{- toYaml (ternary (default .Values.resources .Values.nodeSharding.resources) .Values.resources $daemon) | nindent 12 }}
          securityContext:
            {{- toYaml .Values.securityContext | nindent 12 }}
          volumeMounts:
            - name: config
              mountPath: /etc/kube-event-bridge
              readOnly: true
            - name: state
              mountPath: /var/lib/kube-event-bridge
            - name: tmp
              mountPath: /tmp
            {{- if include "kube-event-bridge.adminTokenFile" . }}
            - name: admin-token
              mountPath: /var/run/secrets/kube-event-bridge/admin-token
              readOnly: true
            {{- end }}
            {{- range .Values.secretMounts }}
            - name: secret-{{ .name }}
              mountPath: /var/run/secrets/kube-event-bridge/{{ .name }}
              readOnly: true
            {{- end }}
            {{- with .Values.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - name: config
          configMap:
            name: {{ if $daemon }}{{ include "kube-event-bridge.nodeName" . }}{{ else }}{{ include "kube-event-bridge.fullname" . }}{{ end }}
        {{- if not (and $sharded .Values.sharding.persistence.enabled) }}
        - name: state
          emptyDir: {}
        {{- end }}
        - name: tmp
          emptyDir: {}
        {{- if include "kube-event-bridge.adminTokenFile" . }}
        - name: admin-token
          secret:
            secretName: {{ include "kube-event-bridge.adminTokenSecret" . }}
            items:
              - key: {{ .Values.adminToken.key }}
                path: {{ .Values.adminToken.key }}
        {{- end }}
        {{- range .Values.secretMounts }}
        - name: secret-{{ .name }}
          secret:
            secretName: {{ .secretName }}
        {{- end }}
        {{- with .Values.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- with (ternary .Values.nodeSharding.nodeSelector .Values.nodeSelector $daemon) }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- if and .Values.affinity (not $daemon) }}
      affinity:
        {{- toYaml .Values.affinity | nindent 8 }}
      {{- else if $spread }}
      # Active/standby: keep the standby off the leader's node (and zone) when the cluster allows,
      # so that one node or zone going down leaves a replica to take over. Shards: one node going
      # down takes as few shards as possible with it.
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    {{- include "kube-event-bridge.selectorLabels" . | nindent 20 }}
      {{- end }}
      {{- if $spread }}
      topologySpreadConstraints:
        - topologyKey: topology.kubernetes.io/zone
          maxSkew: 1
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels:
              {{- include "kube-event-bridge.selectorLabels" . | nindent 14 }}
        - topologyKey: kubernetes.io/hostname
          maxSkew: 1
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels:
              {{- include "kube-event-bridge.selectorLabels" . | nindent 14 }}
      {{- end }}
      {{- with (ternary .Values.nodeSharding.tolerations .Values.tolerations $daemon) }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end -}}
