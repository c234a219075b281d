package shared

import "time"

// Block is a shared block, embedded by name and by field.
type Block struct {
	// Addr is where it listens.
	Addr    string        `env:"SHARED_ADDR" default:"127.0.0.1:1"`
	Timeout time.Duration `env:"SHARED_TIMEOUT" default:"1s"` // Timeout bounds a call.
	Inner   inner
}

type inner struct {
	Depth int `env:"SHARED_DEPTH" default:"2"`
}
