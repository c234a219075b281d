package linkimport

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"

	"kurz.dev/pkg/linkrules"
)

// listBounds are the most elements of each repeated field of a link's rules
// and variants, by its name in the API's JSON (the JSON and proto names of
// these fields are the same): what the shortener accepts. Tags are not
// bounded here: the shortener drops duplicates before it counts them, and a
// tag is a string, no larger decoded than its JSON.
var listBounds = map[string]int{
	"rules":      linkrules.MaxRules,
	"variants":   linkrules.MaxVariants,
	"conditions": linkrules.MaxConditions,
	"devices":    linkrules.MaxValues,
	"languages":  linkrules.MaxValues,
	"cidrs":      linkrules.MaxValues,
	"countries":  linkrules.MaxValues,
}

// CheckLists refuses JSON in the API's form (a batch of CreateLinkRequests,
// one of them, or, with top naming it, a rules or variants array) in which
// a link's rules, variants, conditions or condition values are more than a
// link may carry, before
// anything decodes it: protojson builds a message per element before the
// shortener's bounds are checked, and a 4 MB body of "{}" elements is over
// a million messages (hundreds of MB of heap). The walk keeps one frame per
// nesting level and stops at the first list over its bound, so its memory is
// that of the JSON's deepest string. JSON that is not valid is not refused
// here: the decoder that follows describes it.
//
// The error names the list as "requests[3].rules[0].conditions" (the path
// from the top, with top as its first part).
func CheckLists(data []byte, top string) error {
	type frame struct {
		array bool
		name  string // the path to this value
		key   string // an object's current key; an array's field name
		n     int    // an array's elements so far
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var stack []frame
	// value counts a value starting in the current container and returns
	// the path of that value.
	value := func() (string, error) {
		if len(stack) == 0 {
			return top, nil
		}
		f := &stack[len(stack)-1]
		if !f.array {
			return join(f.name, f.key), nil
		}
		f.n++
		if bound, ok := listBounds[f.key]; ok && f.n > bound {
			return "", fmt.Errorf("%s holds more than %d elements: a link carries at most %d", f.name, bound, bound)
		}
		return f.name + "[" + strconv.Itoa(f.n-1) + "]", nil
	}
	wantKey := false
	for {
		t, err := dec.Token()
		if err != nil {
			return nil // the end, or not JSON: the decoder says so
		}
		switch t {
		case json.Delim('{'), json.Delim('['):
			path, err := value()
			if err != nil {
				return err
			}
			f := frame{array: t == json.Delim('['), name: path}
			if f.array {
				f.key = top
				if len(stack) > 0 {
					f.key = stack[len(stack)-1].key
				}
			}
			stack = append(stack, f)
			wantKey = !f.array
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		default:
			if wantKey {
				stack[len(stack)-1].key = t.(string)
				wantKey = false
				continue
			}
			if _, err := value(); err != nil {
				return err
			}
		}
		// A value ended: in an object, a key comes next.
		wantKey = len(stack) > 0 && !stack[len(stack)-1].array
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
