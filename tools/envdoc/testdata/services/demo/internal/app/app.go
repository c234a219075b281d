package app

import (
	"time"

	sh "kurz.dev/pkg/shared"
)

// Config exercises what pkg/config walks and what it does not.
type Config struct {
	sh.Block
	// Token is required: it has no default.
	Token string `env:"DEMO_TOKEN"`
	// Rate and Burst bound the demo together.
	Rate  float64 `env:"DEMO_RATE" default:"10"`
	Burst int     `env:"DEMO_BURST" default:""`

	Undocumented int `env:"DEMO_UNDOCUMENTED" default:"3"`
	Local        local
	Started      time.Time
	Pointer      *local
	hidden       local
	Count        int
}

type local struct {
	// Name is declared in the service's own package.
	Name string `env:"DEMO_NAME" default:"demo"`
}
