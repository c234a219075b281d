package k8s

import (
	"maps"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

const serviceAuthVar = "KURZ_SERVICE_AUTH_KEY"

// The prod overlay does not render without its service-auth.env: a
// production install cannot come up with internal calls unsigned (the
// services would refuse to start without the key anyway).
func TestProdRefusesToRenderWithoutTheServiceAuthKey(t *testing.T) {
	// Every operator file but this one: the failure is about it.
	files := maps.Clone(operatorFiles["overlays/prod"])
	delete(files, "service-auth.env")
	out, err := kustomize("overlays/prod", files)
	if err == nil {
		t.Fatalf("the prod overlay rendered without service-auth.env (%d bytes); want a failure", len(out))
	}
	if !strings.Contains(err.Error(), "service-auth.env") {
		t.Errorf("the failure does not name service-auth.env: %v", err)
	}
}

// Every service that signs or verifies internal calls gets
// KURZ_SERVICE_AUTH_KEY from key "key" of the Secret the overlay renders
// (kurz-service-auth, hash-suffixed), long enough for the services to start.
func TestServiceAuthKeyComesFromTheRenderedSecret(t *testing.T) {
	var readers []string
	for svc, vars := range readEnv(t) {
		if _, ok := vars[serviceAuthVar]; ok {
			readers = append(readers, svc)
		}
	}
	slices.Sort(readers)
	if want := []string{"analytics", "gateway", "limiter", "shortener"}; !slices.Equal(readers, want) {
		t.Errorf("services reading %s: %v, want %v", serviceAuthVar, readers, want)
	}
	for _, dir := range overlays {
		r := render(t, dir)
		secrets := byName[corev1.Secret](r)
		envs := serviceEnvironments(t, r)
		for _, svc := range readers {
			ref := envs[svc].Given[serviceAuthVar].Secret
			if ref == nil {
				t.Errorf("%s: %s: %s does not come from a Secret", dir, svc, serviceAuthVar)
				continue
			}
			m := hashSuffix.FindStringSubmatch(ref.Name)
			s, rendered := secrets[ref.Name]
			if m == nil || m[1] != "kurz-service-auth" || ref.Key != "key" || !rendered {
				t.Errorf("%s: %s: %s from Secret %s key %s; want the rendered kurz-service-auth, key key", dir, svc, serviceAuthVar, ref.Name, ref.Key)
				continue
			}
			if n := len(s.Data["key"]); n < 32 {
				t.Errorf("%s: Secret %s key key holds %d bytes; the services refuse fewer than 32", dir, ref.Name, n)
			}
		}
	}
}
