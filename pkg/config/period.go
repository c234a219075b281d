package config

import (
	"fmt"
	"time"
)

// Period refuses d, the period of something a service does again and
// again (a readiness round, a poll, a reload, a flush), below floor, which
// the variable's doc comment states. Near zero such a loop runs as fast as
// its work completes, each round a wake-up and often a round trip to a
// store: KURZ_READINESS_INTERVAL=1ns kept an idle redirect at 63% of a core
// and sent Redis ~6,700 commands a second. name is the variable's full
// name.
func Period(name string, d, floor time.Duration) error {
	if d < floor {
		return fmt.Errorf("%s=%s: want %s or more", name, d, floor)
	}
	return nil
}

// PeriodOrOff is Period for a period whose 0 turns the loop off.
func PeriodOrOff(name string, d, floor time.Duration) error {
	if d != 0 && d < floor {
		return fmt.Errorf("%s=%s: want 0 (off) or %s or more", name, d, floor)
	}
	return nil
}
