package k8s

import (
	"maps"
	"os"
	"path"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// The GeoIP database is optional: the overlays render the redirect without
// one (KURZ_GEOIP_DB empty, no volume), and prod with components/geoip
// enabled (the line its kustomization has commented out) conforms to the
// API schemas and gives the redirect, and only the redirect, the volume
// "geoip" from the PersistentVolumeClaim kurz-geoip, read-only, mounted
// read-only at the directory of KURZ_GEOIP_DB.
func TestGeoIPComponent(t *testing.T) {
	t.Parallel()
	for _, dir := range overlays {
		r := render(t, dir)
		if got := byName[corev1.ConfigMap](r)["redirect-config"].Data["KURZ_GEOIP_DB"]; got != "" {
			t.Errorf("%s: KURZ_GEOIP_DB=%q, want empty (the database is optional)", dir, got)
		}
		for _, d := range typed[appsv1.Deployment](r) {
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Name == "geoip" {
					t.Errorf("%s: Deployment %s has the geoip volume without the component", dir, d.Name)
				}
			}
		}
	}

	kust, err := os.ReadFile("overlays/prod/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const off, on = "# components:\n#   - ../../components/geoip\n", "components:\n  - ../../components/geoip\n"
	if !strings.Contains(string(kust), off) {
		t.Fatalf("overlays/prod/kustomization.yaml lacks the commented-out lines\n%s", off)
	}
	files := maps.Clone(operatorFiles["overlays/prod"])
	files["kustomization.yaml"] = strings.Replace(string(kust), off, on, 1)
	out, err := kustomize("overlays/prod", files)
	if err != nil {
		t.Fatal(err)
	}
	if err := kubeconform(t, out); err != nil {
		t.Error(err)
	}
	objs, err := decodeStream(out)
	if err != nil {
		t.Fatal(err)
	}
	r := rendering{Dir: "overlays/prod + components/geoip", Raw: out, Objects: objs}
	db := byName[corev1.ConfigMap](r)["redirect-config"].Data["KURZ_GEOIP_DB"]
	if !strings.HasSuffix(db, ".mmdb") {
		t.Errorf("KURZ_GEOIP_DB=%q, want a .mmdb file", db)
	}
	for _, d := range typed[appsv1.Deployment](r) {
		spec := d.Spec.Template.Spec
		var vol *corev1.Volume
		for i := range spec.Volumes {
			if spec.Volumes[i].Name == "geoip" {
				vol = &spec.Volumes[i]
			}
		}
		if d.Name != "redirect" {
			if vol != nil {
				t.Errorf("Deployment %s has the geoip volume; only the redirect reads it", d.Name)
			}
			continue
		}
		if vol == nil || vol.PersistentVolumeClaim == nil || vol.PersistentVolumeClaim.ClaimName != "kurz-geoip" || !vol.PersistentVolumeClaim.ReadOnly {
			t.Fatalf("redirect volume geoip %+v, want the PersistentVolumeClaim kurz-geoip, read-only", vol)
		}
		mounted := false
		for _, m := range spec.Containers[0].VolumeMounts {
			if m.Name == "geoip" {
				mounted = m.ReadOnly && m.MountPath == path.Dir(db)
				if !mounted {
					t.Errorf("geoip mount %+v, want read-only at %s (the directory of KURZ_GEOIP_DB)", m, path.Dir(db))
				}
			}
		}
		if !mounted {
			t.Errorf("the redirect container does not mount the geoip volume")
		}
	}
}
