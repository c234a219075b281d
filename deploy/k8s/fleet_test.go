package k8s

import (
	"strconv"
	"testing"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
)

// A limiter that has not counted its fleet yet divides a local rule by
// KURZ_LIMITER_MAX_REPLICAS (default KURZ_LIMITER_REPLICAS): below the
// HPA's maximum, a grown fleet in fallback would admit more than the limit.
func TestLimiterMaxReplicasCoversItsHPA(t *testing.T) {
	r := render(t, "overlays/prod")
	cm, ok := byName[corev1.ConfigMap](r)["limiter-config"]
	if !ok {
		t.Fatal("prod renders no ConfigMap limiter-config")
	}
	raw := cm.Data["KURZ_LIMITER_MAX_REPLICAS"]
	if raw == "" || raw == "0" {
		raw = cm.Data["KURZ_LIMITER_REPLICAS"]
	}
	maxReplicas, err := strconv.Atoi(raw)
	if err != nil {
		t.Fatalf("limiter-config: KURZ_LIMITER_MAX_REPLICAS / KURZ_LIMITER_REPLICAS %q: %v", raw, err)
	}
	for _, h := range typed[autoscalingv2.HorizontalPodAutoscaler](r) {
		if h.Spec.ScaleTargetRef.Name != "limiter" {
			continue
		}
		if int(h.Spec.MaxReplicas) > maxReplicas {
			t.Errorf("HPA limiter scales to %d replicas, limiter-config assumes at most %d: set KURZ_LIMITER_MAX_REPLICAS to %d", h.Spec.MaxReplicas, maxReplicas, h.Spec.MaxReplicas)
		}
		return
	}
	t.Error("prod renders no HPA for the limiter")
}
