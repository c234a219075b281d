package logging

// Config is what pkg/server.Main loads before the service's Config.
type Config struct {
	// Level is the log level.
	Level string `env:"LOG_LEVEL" default:"info"`
}
