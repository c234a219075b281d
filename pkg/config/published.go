package config

import (
	"fmt"
	"slices"
)

// AllowPublishedSecrets is the variable that lets a service start with one
// of the secrets this repository publishes (the dev overlay's and make
// up's). Only local and dev setups set it.
const AllowPublishedSecrets = Prefix + "ALLOW_PUBLISHED_SECRETS"

// publishedSecrets are the secret values this repository publishes for
// local use: the dev overlay's Secrets (deploy/k8s/overlays/dev) and the
// defaults of make up (deploy/local/services.sh). Anyone can read them, so
// a production service holding one guards nothing with it. deploy/k8s's
// tests fail if either publishes a value missing here.
var publishedSecrets = []string{
	// deploy/k8s/overlays/dev
	"dev-only-service-auth-key-0123456789abcdef",
	"dev-only-shortener-code-key-0123456789abcdef",
	"dev-only-redirect-form-secret-0123456789abcdef",
	"dev-only-visitor-salt-0123456789abcdef",
	"dev-only-redis-password",
	"dev-only-postgres-password",
	"dev-only-clickhouse-password",
	// deploy/local/services.sh, and the dev overlay's admin token
	"kurz-local-admin-token",
	"kurz-local-code-key-not-a-secret-0123456789",
	"kurz-local-visitor-salt-0123456789abcdef",
}

// PublishedSecrets returns the secret values this repository publishes.
func PublishedSecrets() []string { return slices.Clone(publishedSecrets) }

// NotPublished refuses value, the secret in variable, if it is one this
// repository publishes, unless allowed (KURZ_ALLOW_PUBLISHED_SECRETS=true,
// for local use). The error names the variable, never the value.
func NotPublished(variable, value string, allowed bool) error {
	if allowed || !slices.Contains(publishedSecrets, value) {
		return nil
	}
	return fmt.Errorf("%s holds a value published in kurz's repository (a dev or make up default), which anyone can read: set a random secret of your own (e.g. openssl rand -hex 32), or %s=true for local use only", variable, AllowPublishedSecrets)
}
