package clickstore

import "testing"

func TestExcess(t *testing.T) {
	human, newHuman := Flags{}, Flags{NewVisitor: true}
	tests := map[string]struct {
		copies []Flags
		want   Counts
	}{
		"two humans":             {[]Flags{newHuman, newHuman}, Counts{Total: 1, Human: 1, Visitors: 1}},
		"human and flood: flood": {[]Flags{newHuman, {Flood: true}}, Counts{Total: 1, Human: 1, Visitors: 1}},
		"three bots":             {[]Flags{{Bot: true}, {Bot: true}, {Bot: true}}, Counts{Total: 2, Bot: 2}},
		"flood then human":       {[]Flags{{Flood: true}, human}, Counts{Total: 1, Human: 1}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := (Duplicate{Copies: tc.copies}).Excess(); got != tc.want {
				t.Errorf("Excess = %+v, want %+v", got, tc.want)
			}
		})
	}
}
