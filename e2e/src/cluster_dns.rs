//! The real node's cluster DNS ([`crate::Options::cluster_dns`]): CoreDNS built from its Go module
//! ([`crate::real_vcluster::COREDNS_IMAGE`]) as the Deployment `kube-system/coredns` behind the
//! Service `kube-dns` at [`CLUSTER_DNS_IP`]. It answers `cluster.local` (Services and pods, so a
//! pod finds `vcluster.<namespace>.svc`) and the reverse zones, and forwards **nothing**: it has
//! no `forward` plugin, so a name outside the cluster is refused here and never leaves the test's
//! namespaces. The node's `resolv.conf` names it too, so a vCluster's own CoreDNS (which forwards
//! to its pod's name server) ends here as well.

use std::path::Path;
use std::time::Duration;

use crate::HarnessError;
use crate::real_node::{CLUSTER_DNS_IP, RealNode};

/// The Corefile: the cluster's zones only, no upstream.
const COREFILE: &str = ".:1053 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
    loadbalance
}
";

/// The manifests of the cluster DNS.
fn manifests() -> String {
    let corefile: String = COREFILE.lines().map(|l| format!("    {l}\n")).collect();
    format!(
        r#"apiVersion: v1
kind: ServiceAccount
metadata: {{ name: coredns, namespace: kube-system }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{ name: "system:coredns" }}
rules:
  - apiGroups: [""]
    resources: [endpoints, services, pods, namespaces]
    verbs: [list, watch]
  - apiGroups: [discovery.k8s.io]
    resources: [endpointslices]
    verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{ name: "system:coredns" }}
roleRef: {{ apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns" }}
subjects: [{{ kind: ServiceAccount, name: coredns, namespace: kube-system }}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{ name: coredns, namespace: kube-system }}
data:
  Corefile: |
{corefile}---
apiVersion: apps/v1
kind: Deployment
metadata: {{ name: coredns, namespace: kube-system, labels: {{ k8s-app: kube-dns }} }}
spec:
  replicas: 1
  selector: {{ matchLabels: {{ k8s-app: kube-dns }} }}
  template:
    metadata: {{ labels: {{ k8s-app: kube-dns }} }}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      securityContext:
        runAsUser: 1001
        runAsGroup: 1001
        runAsNonRoot: true
        seccompProfile: {{ type: RuntimeDefault }}
      containers:
        - name: coredns
          image: {image}
          imagePullPolicy: Never
          args: ["-conf", "/etc/coredns/Corefile"]
          ports:
            - {{ name: dns, containerPort: 1053, protocol: UDP }}
            - {{ name: dns-tcp, containerPort: 1053, protocol: TCP }}
          readinessProbe:
            httpGet: {{ path: /ready, port: 8181 }}
            periodSeconds: 2
          livenessProbe:
            httpGet: {{ path: /health, port: 8080 }}
            periodSeconds: 10
          resources:
            requests: {{ cpu: 10m, memory: 32Mi }}
            limits: {{ memory: 128Mi }}
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {{ drop: [ALL] }}
          volumeMounts:
            - {{ name: config, mountPath: /etc/coredns, readOnly: true }}
      volumes:
        - name: config
          configMap: {{ name: coredns }}
---
apiVersion: v1
kind: Service
metadata: {{ name: kube-dns, namespace: kube-system, labels: {{ k8s-app: kube-dns }} }}
spec:
  clusterIP: {CLUSTER_DNS_IP}
  selector: {{ k8s-app: kube-dns }}
  ports:
    - {{ name: dns, port: 53, targetPort: 1053, protocol: UDP }}
    - {{ name: dns-tcp, port: 53, targetPort: 1053, protocol: TCP }}
"#,
        image = crate::real_vcluster::COREDNS_IMAGE,
    )
}

/// Builds (or takes from the cache) and imports the CoreDNS image, applies the manifests and
/// waits until the Deployment's pod is Ready.
pub fn deploy(
    node: &RealNode,
    kubeconfig: &Path,
    tools: &crate::tools::Tools,
    timeout: Duration,
) -> Result<(), HarnessError> {
    let vcluster_tools = crate::real_vcluster::Tools::locate()?;
    let image = crate::real_vcluster::coredns_image(&vcluster_tools)?;
    node.import(&image.archive)?;
    let kubectl = |args: &[&str], stdin: Option<&str>| -> Result<String, HarnessError> {
        let mut cmd = std::process::Command::new(tools.bin("kubectl"));
        cmd.env("KUBECONFIG", kubeconfig).args(args);
        crate::cmd::run(cmd, stdin)?.ok(&format!("kubectl {}", args.join(" ")))
    };
    kubectl(&["apply", "-f", "-"], Some(&manifests()))?;
    let limit = format!("--timeout={}s", timeout.as_secs().max(1));
    kubectl(
        &[
            "-n",
            "kube-system",
            "rollout",
            "status",
            "deployment/coredns",
            &limit,
        ],
        None,
    )
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corefile_forwards_nowhere() {
        let text = manifests();
        assert!(!text.contains("forward"), "{text}");
        assert!(text.contains("kubernetes cluster.local"));
        assert!(text.contains(&format!("clusterIP: {CLUSTER_DNS_IP}")));
    }
}
