package k8s

import (
	"encoding/xml"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// clickhouseClusterXML is the part of kurz-cluster.xml the tests read.
type clickhouseClusterXML struct {
	RemoteServers struct {
		Clusters []struct {
			XMLName xml.Name
			Shards  []struct {
				InternalReplication bool `xml:"internal_replication"`
				Replicas            []struct {
					Host     string `xml:"host"`
					Port     string `xml:"port"`
					User     string `xml:"user"`
					Password struct {
						FromEnv string `xml:"from_env,attr"`
					} `xml:"password"`
				} `xml:"replica"`
			} `xml:"shard"`
		} `xml:",any"`
	} `xml:"remote_servers"`
	Macros struct {
		Shard   fromEnvXML `xml:"shard"`
		Replica fromEnvXML `xml:"replica"`
	} `xml:"macros"`
	ZooKeeper struct {
		Nodes []struct {
			Host string `xml:"host"`
			Port string `xml:"port"`
		} `xml:"node"`
	} `xml:"zookeeper"`
	DistributedDDL struct {
		Path string `xml:"path"`
	} `xml:"distributed_ddl"`
	InterserverPort string     `xml:"interserver_http_port"`
	InterserverHost fromEnvXML `xml:"interserver_http_host"`
}

type fromEnvXML struct {
	FromEnv string `xml:"from_env,attr"`
	Value   string `xml:",chardata"`
}

// The replicated ClickHouse of overlays/dev-chcluster: cluster "kurz" of 2
// shards x 2 replicas whose hosts are the StatefulSet's pods, each pod's
// macros naming its own shard (the one remote_servers puts it in) and a
// replica name no other pod has, Keeper and analytics pointed at what is
// rendered.
func TestClickHouseClusterDefinition(t *testing.T) {
	r := render(t, "overlays/dev-chcluster")
	cm, ok := byName[corev1.ConfigMap](r)["clickhouse-config"]
	if !ok || cm.Data["kurz-cluster.xml"] == "" {
		t.Fatal("dev-chcluster: ConfigMap clickhouse-config has no kurz-cluster.xml")
	}
	var cfg clickhouseClusterXML
	if err := xml.Unmarshal([]byte(cm.Data["kurz-cluster.xml"]), &cfg); err != nil {
		t.Fatalf("kurz-cluster.xml: %v", err)
	}
	sts, ok := byName[appsv1.StatefulSet](r)["clickhouse"]
	if !ok {
		t.Fatal("dev-chcluster: no StatefulSet clickhouse")
	}
	c := sts.Spec.Template.Spec.Containers[0]
	pods := int(*sts.Spec.Replicas)

	// The cluster analytics is told about is the one defined.
	envs := serviceEnvironments(t, r)
	clusterName, _ := envs["analytics"].value("KURZ_CLICKHOUSE_CLUSTER")
	if len(cfg.RemoteServers.Clusters) != 1 || cfg.RemoteServers.Clusters[0].XMLName.Local != clusterName || clusterName == "" {
		t.Fatalf("remote_servers defines %d clusters, want one named KURZ_CLICKHOUSE_CLUSTER=%q", len(cfg.RemoteServers.Clusters), clusterName)
	}
	cluster := cfg.RemoteServers.Clusters[0]
	shardOfHost := map[string]int{}
	if len(cluster.Shards) != 2 {
		t.Errorf("cluster %s: %d shards, want 2", clusterName, len(cluster.Shards))
	}
	for s, shard := range cluster.Shards {
		if len(shard.Replicas) != 2 {
			t.Errorf("cluster %s shard %d: %d replicas, want 2", clusterName, s+1, len(shard.Replicas))
		}
		if !shard.InternalReplication {
			t.Errorf("cluster %s shard %d: internal_replication is not true: the Distributed table would write every replica itself", clusterName, s+1)
		}
		for _, rep := range shard.Replicas {
			if _, dup := shardOfHost[rep.Host]; dup {
				t.Errorf("cluster %s: host %s listed twice", clusterName, rep.Host)
			}
			shardOfHost[rep.Host] = s + 1
			if err := resolvesInRendering(r, net.JoinHostPort(rep.Host, rep.Port)); err != nil {
				t.Errorf("cluster %s: replica %s:%s: %v", clusterName, rep.Host, rep.Port, err)
			}
			if want := sts.Name + "-"; !strings.HasPrefix(rep.Host, want) || !strings.HasSuffix(rep.Host, "."+sts.Spec.ServiceName) {
				t.Errorf("cluster %s: replica %s is not a pod %s<i>.%s", clusterName, rep.Host, want, sts.Spec.ServiceName)
			}
			if rep.User != "kurz" || rep.Password.FromEnv == "" || secretEnv(c, rep.Password.FromEnv) == "" {
				t.Errorf("cluster %s: replica %s signs in as %q with the password from %q, want kurz with a variable from a Secret", clusterName, rep.Host, rep.User, rep.Password.FromEnv)
			}
		}
	}
	if len(shardOfHost) != pods {
		t.Errorf("cluster %s lists %d hosts, the StatefulSet runs %d pods", clusterName, len(shardOfHost), pods)
	}

	// Each pod's macros: run the container's command up to the entrypoint
	// with the pod's index and read the shard it exports.
	if len(c.Command) != 2 || c.Command[0] != "sh" || len(c.Args) != 1 || !strings.Contains(c.Args[0], "exec /entrypoint.sh") {
		t.Fatalf("clickhouse: command %v args %v, want sh -c SCRIPT ending in exec /entrypoint.sh", c.Command, c.Args)
	}
	probe := strings.Replace(c.Args[0], "exec /entrypoint.sh", `echo "$`+cfg.Macros.Shard.FromEnv+`"`, 1)
	if !fieldRefEnv(c, "POD_INDEX", "metadata.labels['apps.kubernetes.io/pod-index']") {
		t.Error("clickhouse: POD_INDEX is not the pod-index label")
	}
	if cfg.Macros.Replica.FromEnv == "" || !fieldRefEnv(c, cfg.Macros.Replica.FromEnv, "metadata.name") {
		t.Errorf("macros: replica from %q, want a variable holding the pod's name (distinct per pod)", cfg.Macros.Replica.FromEnv)
	}
	seen := map[string]string{}
	for i := range pods {
		pod := fmt.Sprintf("%s-%d", sts.Name, i)
		cmd := exec.Command("sh", "-c", probe)
		cmd.Env = []string{fmt.Sprintf("POD_INDEX=%d", i), "PATH=/usr/bin:/bin"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("pod %s: %v\n%s", pod, err, out)
		}
		shard := strings.TrimSpace(string(out))
		host := pod + "." + sts.Spec.ServiceName
		if want := fmt.Sprint(shardOfHost[host]); shard != want {
			t.Errorf("pod %s: macro shard %s, but remote_servers puts %s in shard %s", pod, shard, host, want)
		}
		key := shard + "/" + pod
		if other, dup := seen[key]; dup {
			t.Errorf("pods %s and %s have the same macros %s", other, pod, key)
		}
		seen[key] = pod
	}
	bad := exec.Command("sh", "-c", probe)
	bad.Env = []string{"POD_INDEX=", "PATH=/usr/bin:/bin"}
	if out, err := bad.CombinedOutput(); err == nil {
		t.Errorf("clickhouse: starts without a pod index (shard %q)", strings.TrimSpace(string(out)))
	}

	// Replication and ON CLUSTER DDL need Keeper and the interserver port.
	if len(cfg.ZooKeeper.Nodes) == 0 || cfg.DistributedDDL.Path == "" {
		t.Error("kurz-cluster.xml: no zookeeper nodes or no distributed_ddl path")
	}
	for _, n := range cfg.ZooKeeper.Nodes {
		if err := resolvesInRendering(r, net.JoinHostPort(n.Host, n.Port)); err != nil {
			t.Errorf("zookeeper node %s:%s: %v", n.Host, n.Port, err)
		}
	}
	if portDeclared(intstr.Parse(cfg.InterserverPort), c) != nil {
		t.Errorf("interserver_http_port %s is not a container port", cfg.InterserverPort)
	}
	fqdn := ""
	for _, e := range c.Env {
		if e.Name == cfg.InterserverHost.FromEnv {
			fqdn = e.Value
		}
	}
	if want := "$(POD_NAME)." + sts.Spec.ServiceName + ".$(POD_NAMESPACE).svc.cluster.local"; fqdn != want || !fieldRefEnv(c, "POD_NAME", "metadata.name") {
		t.Errorf("interserver_http_host from %q = %q, want %q (the pod's own DNS name)", cfg.InterserverHost.FromEnv, fqdn, want)
	}

	// analytics may dial any node; each address is a pod of the cluster.
	addrs, _ := envs["analytics"].value("KURZ_CLICKHOUSE_ADDRS")
	for a := range strings.SplitSeq(addrs, ",") {
		host, _, _ := net.SplitHostPort(a)
		if _, ok := shardOfHost[host]; !ok {
			t.Errorf("KURZ_CLICKHOUSE_ADDRS: %s is not a node of cluster %s", a, clusterName)
		}
	}
}

// secretEnv is the Secret a container's variable comes from, or "".
func secretEnv(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return e.ValueFrom.SecretKeyRef.Name
		}
	}
	return ""
}

// fieldRefEnv says whether a container's variable is the pod field path.
func fieldRefEnv(c corev1.Container, name, path string) bool {
	return slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == path
	})
}
