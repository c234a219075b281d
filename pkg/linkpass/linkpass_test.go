package linkpass

import (
	"errors"
	"strings"
	"testing"
)

func TestHashVerifies(t *testing.T) {
	h, err := Hash("correct horse")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(h, "$argon2id$v=19$m=19456,t=2,p=1$") {
		t.Fatalf("hash %q is not an Argon2id PHC string with the stated parameters", h)
	}
	if strings.Contains(h, "correct horse") {
		t.Fatal("the hash contains the password")
	}
	for pw, want := range map[string]bool{"correct horse": true, "correct hors": false, "Correct horse": false, "": false} {
		ok, err := Verify(h, pw)
		if err != nil || ok != want {
			t.Errorf("Verify(%q) = %v, %v; want %v", pw, ok, err, want)
		}
	}
	h2, _ := Hash("correct horse")
	if h2 == h {
		t.Error("two hashes of one password are equal: the salt is not fresh")
	}
}

func TestValidate(t *testing.T) {
	for pw, ok := range map[string]bool{
		"short":                      false,
		"12345678":                   true,
		strings.Repeat("x", 128):     true,
		strings.Repeat("x", 129):     false,
		strings.Repeat("ü", 8):       true,
		"bad utf8 \xff\xfe padding!": false,
		strings.Repeat("\x00", 8):    false,
		"tab\tseparated":             false,
		"line\nbreak!":               false,
		"del\x7fat end":              false,
		"c1 \u0085 next line":        false,
		"spaces are fine":            true,
	} {
		if err := Validate(pw); (err == nil) != ok {
			t.Errorf("Validate(%q) = %v; want ok=%v", pw, err, ok)
		}
		if _, err := Hash(pw); (err == nil) != ok {
			t.Errorf("Hash(%q) = %v; want ok=%v", pw, err, ok)
		}
	}
}

func TestVerifyRefusesMalformedHashes(t *testing.T) {
	good, _ := Hash("correct horse")
	parts := strings.Split(good, "$")
	for name, h := range map[string]string{
		"empty":         "",
		"bcrypt":        "$2a$10$abcdefghijklmnopqrstuv",
		"argon2i":       strings.Replace(good, "argon2id", "argon2i", 1),
		"old version":   strings.Replace(good, "v=19", "v=16", 1),
		"huge memory":   strings.Replace(good, "m=19456", "m=4194304", 1),
		"huge passes":   strings.Replace(good, "t=2", "t=1000", 1),
		"zero lanes":    strings.Replace(good, "p=1", "p=0", 1),
		"bad salt":      strings.Join([]string{"", parts[1], parts[2], parts[3], "!!", parts[5]}, "$"),
		"short key":     strings.Join([]string{"", parts[1], parts[2], parts[3], parts[4], "AAAA"}, "$"),
		"missing field": strings.Join(parts[:5], "$"),
	} {
		ok, err := Verify(h, "correct horse")
		if ok || !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: Verify = %v, %v; want false, ErrMalformed", name, ok, err)
		}
	}
}
