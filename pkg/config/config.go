// Package config loads a service's typed configuration from environment
// variables. Every kurz variable starts with Prefix; the README lists them all.
//
// A config struct declares each field's variable and default in tags:
//
//	type Config struct {
//		RedisAddrs []string      `env:"REDIS_ADDRS" default:"127.0.0.1:7001"`
//		Timeout    time.Duration `env:"REDIS_TIMEOUT" default:"5ms"`
//	}
//
// Nested structs without an env tag are walked, so shared blocks (Redis,
// PostgreSQL, telemetry) are declared once and embedded where needed.
package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Prefix starts the name of every environment variable kurz reads.
const Prefix = "KURZ_"

// Lookup finds an environment variable; os.LookupEnv in production, a map in
// tests.
type Lookup func(name string) (string, bool)

// Load fills dst, a pointer to a struct, from the process environment.
func Load(dst any) error { return LoadFrom(os.LookupEnv, dst) }

// LoadFrom fills dst from lookup. It reports every bad or missing variable at
// once, each named in full, so one run shows everything to fix.
func LoadFrom(lookup Lookup, dst any) error {
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("config: Load needs a pointer to a struct, got %T", dst)
	}
	var errs []error
	walk(lookup, v.Elem(), &errs)
	return errors.Join(errs...)
}

func walk(lookup Lookup, v reflect.Value, errs *[]error) {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, tagged := f.Tag.Lookup("env")
		if !tagged {
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeFor[time.Time]() {
				walk(lookup, v.Field(i), errs)
			}
			continue
		}
		name = Prefix + name
		raw, set := lookup(name)
		if !set || raw == "" {
			def, hasDefault := f.Tag.Lookup("default")
			if !hasDefault {
				*errs = append(*errs, fmt.Errorf("%s is required", name))
				continue
			}
			raw = def
		}
		if err := setField(v.Field(i), raw); err != nil {
			*errs = append(*errs, fmt.Errorf("%s=%q: %w", name, raw, err))
		}
	}
}

func setField(field reflect.Value, raw string) error {
	switch field.Interface().(type) {
	case time.Duration:
		d, err := time.ParseDuration(raw)
		if err != nil {
			return errors.New("not a duration (examples: 5ms, 2s, 1m)")
		}
		if d < 0 {
			return errors.New("must not be negative")
		}
		field.SetInt(int64(d))
		return nil
	case []string:
		var items []string
		for item := range strings.SplitSeq(raw, ",") {
			if item = strings.TrimSpace(item); item != "" {
				items = append(items, item)
			}
		}
		field.Set(reflect.ValueOf(items))
		return nil
	}
	switch field.Kind() {
	case reflect.String:
		field.SetString(raw)
	case reflect.Bool:
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return errors.New("not a boolean (true or false)")
		}
		field.SetBool(b)
	case reflect.Int, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(raw, 10, field.Type().Bits())
		if err != nil {
			return errors.New("not an integer")
		}
		field.SetInt(n)
	case reflect.Float64:
		x, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return errors.New("not a number")
		}
		field.SetFloat(x)
	default:
		return fmt.Errorf("unsupported field type %s", field.Type())
	}
	return nil
}
