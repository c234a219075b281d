package config

import (
	"strings"
	"testing"
	"time"
)

// A period below its floor is refused naming the variable and the floor;
// the floor itself and more are accepted, and 0 only where it means off.
func TestPeriodRefusesLessThanItsFloor(t *testing.T) {
	const name, floor = "KURZ_X_INTERVAL", 100 * time.Millisecond
	for _, d := range []time.Duration{floor, time.Hour} {
		if err := Period(name, d, floor); err != nil {
			t.Errorf("Period(%s): %v, want accepted", d, err)
		}
		if err := PeriodOrOff(name, d, floor); err != nil {
			t.Errorf("PeriodOrOff(%s): %v, want accepted", d, err)
		}
	}
	if err := PeriodOrOff(name, 0, floor); err != nil {
		t.Errorf("PeriodOrOff(0): %v, want accepted (off)", err)
	}
	for _, d := range []time.Duration{-time.Second, 0, time.Nanosecond, floor - 1} {
		err := Period(name, d, floor)
		if err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), floor.String()) {
			t.Errorf("Period(%s): %v, want an error naming %s and %s", d, err, name, floor)
		}
		if d == 0 {
			continue
		}
		if err := PeriodOrOff(name, d, floor); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("PeriodOrOff(%s): %v, want an error naming %s", d, err, name)
		}
	}
}
