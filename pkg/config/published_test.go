package config

import (
	"strings"
	"testing"
)

func TestNotPublishedRefusesTheRepositorysSecretsUnlessAllowed(t *testing.T) {
	for _, v := range PublishedSecrets() {
		err := NotPublished("KURZ_X_KEY", v, false)
		if err == nil || !strings.Contains(err.Error(), "KURZ_X_KEY") || !strings.Contains(err.Error(), AllowPublishedSecrets) {
			t.Errorf("published %q: error %v, want one naming KURZ_X_KEY and %s", v, err, AllowPublishedSecrets)
			continue
		}
		if strings.Contains(err.Error(), v) {
			t.Errorf("published %q: the error repeats the secret: %v", v, err)
		}
		if err := NotPublished("KURZ_X_KEY", v, true); err != nil {
			t.Errorf("published %q with %s=true: %v, want nil", v, AllowPublishedSecrets, err)
		}
	}
	for _, v := range []string{"", "a-random-secret-of-our-own-0123456789abcdef"} {
		if err := NotPublished("KURZ_X_KEY", v, false); err != nil {
			t.Errorf("unpublished %q: %v, want nil", v, err)
		}
	}
}
