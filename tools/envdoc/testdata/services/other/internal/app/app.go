package app

// Config is a second service's, which shares only the logging settings.
type Config struct {
	// Mode is this service's alone.
	Mode string `env:"OTHER_MODE" default:"x"`
}
