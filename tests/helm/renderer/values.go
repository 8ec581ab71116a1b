package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/xeipuuv/gojsonschema"
	"sigs.k8s.io/yaml"
)

// readValues parses a values document like Helm's chartutil.ReadValues: through
// sigs.k8s.io/yaml, so numbers become float64 exactly as templates see them in Helm.
func readValues(data []byte) (map[string]interface{}, error) {
	vals := map[string]interface{}{}
	if err := yaml.Unmarshal(data, &vals); err != nil {
		return vals, err
	}
	if vals == nil {
		vals = map[string]interface{}{}
	}
	return vals, nil
}

// userValues merges what the command line supplies, in Helm's order: the --values files
// in turn, then every --set, then every --set-string.
func userValues(opts *options, stdin io.Reader) (map[string]interface{}, error) {
	base := map[string]interface{}{}
	for _, file := range opts.valueFiles {
		var data []byte
		var err error
		if file == "-" {
			data, err = io.ReadAll(stdin)
		} else {
			data, err = os.ReadFile(file)
		}
		if err != nil {
			return nil, err
		}
		current, err := readValues(data)
		if err != nil {
			return nil, fmt.Errorf("failed to parse %s: %w", file, err)
		}
		base = mergeMaps(base, current)
	}
	for _, s := range opts.setValues {
		if err := parseSet(s, base, false); err != nil {
			return nil, fmt.Errorf("failed parsing --set data: %w", err)
		}
	}
	for _, s := range opts.setStrings {
		if err := parseSet(s, base, true); err != nil {
			return nil, fmt.Errorf("failed parsing --set-string data: %w", err)
		}
	}
	return base, nil
}

// mergeMaps merges b over a: tables merge key by key, anything else in b replaces what a
// had (Helm's values.mergeMaps).
func mergeMaps(a, b map[string]interface{}) map[string]interface{} {
	out := make(map[string]interface{}, len(a))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		if vm, ok := v.(map[string]interface{}); ok {
			if bv, ok := out[k].(map[string]interface{}); ok {
				out[k] = mergeMaps(bv, vm)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// coalesceValues lays the user's values over the chart's defaults like Helm's
// chartutil.CoalesceValues: user values win, tables merge, and a user null deletes the
// key the defaults had. Neither argument is modified.
func coalesceValues(defaults, user map[string]interface{}, warn func(string, ...interface{})) map[string]interface{} {
	dst := deepCopy(user).(map[string]interface{})
	coalesceTables(dst, deepCopy(defaults).(map[string]interface{}), "", warn)
	return dst
}

func coalesceTables(dst, src map[string]interface{}, prefix string, warn func(string, ...interface{})) {
	for key, val := range src {
		fullKey := key
		if prefix != "" {
			fullKey = prefix + "." + key
		}
		dv, ok := dst[key]
		switch {
		case ok && dv == nil:
			delete(dst, key)
		case !ok:
			dst[key] = val
		case isTable(val):
			if isTable(dv) {
				coalesceTables(dv.(map[string]interface{}), val.(map[string]interface{}), fullKey, warn)
			} else {
				warn("warning: cannot overwrite table with non table for %s (%v)", fullKey, val)
			}
		case isTable(dv) && val != nil:
			warn("warning: destination for %s is a table. Ignoring non-table value (%v)", fullKey, val)
		}
	}
}

func isTable(v interface{}) bool {
	_, ok := v.(map[string]interface{})
	return ok
}

func deepCopy(v interface{}) interface{} {
	switch t := v.(type) {
	case map[string]interface{}:
		out := make(map[string]interface{}, len(t))
		for k, e := range t {
			out[k] = deepCopy(e)
		}
		return out
	case []interface{}:
		out := make([]interface{}, len(t))
		for i, e := range t {
			out[i] = deepCopy(e)
		}
		return out
	default:
		return v
	}
}

// validateValues checks the values against the chart's values.schema.json with
// gojsonschema, the library Helm 3 uses, and words the failure like Helm.
func validateValues(chartName string, schema []byte, vals map[string]interface{}) error {
	if schema == nil {
		return nil
	}
	if err := validateAgainstSchema(schema, vals); err != nil {
		return fmt.Errorf("values don't meet the specifications of the schema(s) in the following chart(s):\n%s:\n%s", chartName, err)
	}
	return nil
}

func validateAgainstSchema(schema []byte, vals map[string]interface{}) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("unable to validate schema: %s", r)
		}
	}()
	// The same round trip as Helm: values to YAML, then to JSON.
	valuesYAML, err := yaml.Marshal(vals)
	if err != nil {
		return err
	}
	valuesJSON, err := yaml.YAMLToJSON(valuesYAML)
	if err != nil {
		return err
	}
	if bytes.Equal(valuesJSON, []byte("null")) {
		valuesJSON = []byte("{}")
	}
	result, err := gojsonschema.Validate(gojsonschema.NewBytesLoader(schema), gojsonschema.NewBytesLoader(valuesJSON))
	if err != nil {
		return err
	}
	if result.Valid() {
		return nil
	}
	var sb strings.Builder
	for _, desc := range result.Errors() {
		fmt.Fprintf(&sb, "- %s\n", desc)
	}
	return fmt.Errorf("%s", sb.String())
}

// maxIndex is the largest list index --set accepts, as in Helm.
const maxIndex = 65536

// parseSet applies one --set (asString false) or --set-string argument to data, like
// Helm's strvals.ParseInto: comma-separated key=value pairs, dotted keys, list indices
// (a[0]=x, a[0].b=x), lists in braces (a={x,y}) and backslash escapes. Without asString,
// true/false become booleans, null becomes nil and integers without a leading zero
// become int64.
func parseSet(s string, data map[string]interface{}, asString bool) error {
	p := &setParser{in: []rune(s), asString: asString}
	for !p.done() {
		if err := p.key(data); err != nil {
			return err
		}
	}
	return nil
}

type setParser struct {
	in       []rune
	pos      int
	asString bool
}

func (p *setParser) done() bool { return p.pos >= len(p.in) }

// until reads up to (and consumes) the first unescaped rune in stops. It returns the text
// before it, the stop rune, and false if the input ended first.
func (p *setParser) until(stops string) (string, rune, bool) {
	var b strings.Builder
	for p.pos < len(p.in) {
		r := p.in[p.pos]
		p.pos++
		if r == '\\' {
			if p.pos < len(p.in) {
				b.WriteRune(p.in[p.pos])
				p.pos++
			}
			continue
		}
		if strings.ContainsRune(stops, r) {
			return b.String(), r, true
		}
		b.WriteRune(r)
	}
	return b.String(), 0, false
}

// key parses "path=value" into data, consuming the ',' that ends it.
func (p *setParser) key(data map[string]interface{}) error {
	k, stop, ok := p.until("=[,.")
	if !ok {
		if k == "" {
			return nil
		}
		return fmt.Errorf("key %q has no value", k)
	}
	switch stop {
	case ',':
		return fmt.Errorf("key %q has no value (cannot end with ,)", k)
	case '=':
		v, err := p.value()
		if err != nil {
			return err
		}
		data[k] = v
		return nil
	case '.':
		inner, ok := data[k].(map[string]interface{})
		if !ok {
			inner = map[string]interface{}{}
		}
		data[k] = inner
		return p.key(inner)
	default: // '['
		list, _ := data[k].([]interface{})
		list, err := p.listItem(list, k)
		if err != nil {
			return err
		}
		data[k] = list
		return nil
	}
}

// listItem parses what follows a '[' of key k: "N]" then "=value", ".key..." or another
// "[N]".
func (p *setParser) listItem(list []interface{}, k string) ([]interface{}, error) {
	text, _, ok := p.until("]")
	if !ok {
		return nil, fmt.Errorf("key %q has an unterminated index", k)
	}
	i, err := strconv.Atoi(text)
	if err != nil {
		return nil, fmt.Errorf("key %q has an invalid index %q", k, text)
	}
	if i < 0 {
		return nil, fmt.Errorf("negative %d index not allowed", i)
	}
	if i > maxIndex {
		return nil, fmt.Errorf("index of %d is greater than maximum supported index of %d", i, maxIndex)
	}
	for len(list) <= i {
		list = append(list, nil)
	}
	if p.done() {
		return nil, fmt.Errorf("key %q has no value", k)
	}
	next := p.in[p.pos]
	p.pos++
	switch next {
	case '=':
		v, err := p.value()
		if err != nil {
			return nil, err
		}
		list[i] = v
	case '.':
		inner, ok := list[i].(map[string]interface{})
		if !ok {
			inner = map[string]interface{}{}
		}
		if err := p.key(inner); err != nil {
			return nil, err
		}
		list[i] = inner
	case '[':
		inner, _ := list[i].([]interface{})
		inner, err := p.listItem(inner, k)
		if err != nil {
			return nil, err
		}
		list[i] = inner
	default:
		return nil, fmt.Errorf("key %q: unexpected %q after an index", k, next)
	}
	return list, nil
}

// value parses a value up to the next ',' (or the end): a {a,b} list or a scalar.
func (p *setParser) value() (interface{}, error) {
	if !p.done() && p.in[p.pos] == '{' {
		p.pos++
		list := []interface{}{}
		for {
			item, stop, ok := p.until(",}")
			if !ok {
				return nil, fmt.Errorf("list value is missing its closing '}'")
			}
			if stop == '}' && item == "" && len(list) == 0 {
				break
			}
			list = append(list, p.typed(item))
			if stop == '}' {
				break
			}
		}
		if !p.done() {
			if p.in[p.pos] != ',' {
				return nil, fmt.Errorf("unexpected %q after a list value", p.in[p.pos])
			}
			p.pos++
		}
		return list, nil
	}
	text, _, _ := p.until(",")
	return p.typed(text), nil
}

// typed is Helm's strvals typedVal.
func (p *setParser) typed(val string) interface{} {
	if p.asString {
		return val
	}
	switch {
	case strings.EqualFold(val, "true"):
		return true
	case strings.EqualFold(val, "false"):
		return false
	case strings.EqualFold(val, "null"):
		return nil
	case val == "0":
		return int64(0)
	}
	if val != "" && val[0] != '0' {
		if iv, err := strconv.ParseInt(val, 10, 64); err == nil {
			return iv
		}
	}
	return val
}
