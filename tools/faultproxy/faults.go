// Fault rules and the request log, as the imitation API server this replaced had them (the JSON in
// and out, the compact spec, the error messages and Decide's semantics). Both types are
// safe for concurrent use.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// FaultRule matches requests by verb, resource ("pods" or "pods/status"), namespace and
// name ("*" matches anything) and fires for its first `count` matches (-1: every match),
// each with probability `rate`.
type FaultRule struct {
	ID             int
	Verb           string
	Resource       string
	Namespace      string
	Name           string
	Code           int
	RetryAfter     int
	LatencyMs      int
	CutAfterEvents int
	MidLine        bool
	Count          int64 // remaining firings; -1 = unlimited
	Rate           float64
	Fired          int64
}

// ruleJSON is FaultRule as the imitation writes it (keys in nlohmann's sorted order).
type ruleJSON struct {
	Code           *int      `json:"code,omitempty"`
	Count          int64     `json:"count"`
	CutAfterEvents *int      `json:"cutAfterEvents,omitempty"`
	Fired          int64     `json:"fired"`
	ID             int       `json:"id"`
	LatencyMs      *int      `json:"latencyMs,omitempty"`
	MidLine        *bool     `json:"midLine,omitempty"`
	Name           string    `json:"name"`
	Namespace      string    `json:"namespace"`
	Rate           jsonFloat `json:"rate"`
	Resource       string    `json:"resource"`
	RetryAfter     *int      `json:"retryAfter,omitempty"`
	Verb           string    `json:"verb"`
}

func (r FaultRule) toJSON() ruleJSON {
	j := ruleJSON{ID: r.ID, Verb: r.Verb, Resource: r.Resource, Namespace: r.Namespace,
		Name: r.Name, Rate: jsonFloat(r.Rate), Count: r.Count, Fired: r.Fired}
	if r.Code != 0 {
		j.Code = ptr(r.Code)
	}
	if r.Code == 429 {
		j.RetryAfter = ptr(r.RetryAfter)
	}
	if r.LatencyMs != 0 {
		j.LatencyMs = ptr(r.LatencyMs)
	}
	if r.CutAfterEvents >= 0 {
		j.CutAfterEvents = ptr(r.CutAfterEvents)
		j.MidLine = ptr(r.MidLine)
	}
	return j
}

func ptr[T any](v T) *T { return &v }

// FaultDecision is what the proxy must do to one request.
type FaultDecision struct {
	Code           int
	RetryAfter     int
	LatencyMs      int
	CutAfterEvents int
	MidLine        bool
	RuleIDs        []int
}

// Describe is "" when nothing fired, else e.g. "code=500,latencyMs=10,cutAfterEvents=2,midLine".
func (d FaultDecision) Describe() string {
	var parts []string
	if d.Code != 0 {
		parts = append(parts, "code="+strconv.Itoa(d.Code))
	}
	if d.LatencyMs != 0 {
		parts = append(parts, "latencyMs="+strconv.Itoa(d.LatencyMs))
	}
	if d.CutAfterEvents >= 0 {
		s := "cutAfterEvents=" + strconv.Itoa(d.CutAfterEvents)
		if d.MidLine {
			s += ",midLine"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ",")
}

// Faults holds the rules and the seeded generator of `rate`.
type Faults struct {
	mu     sync.Mutex
	rules  []FaultRule
	nextID int
	rng    *rand.Rand
}

func NewFaults(seed int64) *Faults {
	return &Faults{nextID: 1, rng: rand.New(rand.NewSource(seed))}
}

// Add adds the rules of a JSON ({"rules":[...], "seed": N} or a bare array) or compact spec;
// the error names the bad field, worded as the imitation words it.
func (f *Faults) Add(spec string) error {
	trimmed := strings.TrimLeft(spec, " \t\n")
	if trimmed != "" && (trimmed[0] == '{' || trimmed[0] == '[') {
		v, err := parseJSONValue([]byte(trimmed))
		if err != nil {
			return fmt.Errorf("fault spec: not valid JSON")
		}
		return f.AddJSON(v)
	}
	v, err := parseCompact(spec)
	if err != nil {
		return err
	}
	return f.AddJSON(v)
}

// parseCompact turns "k=v,k=v;k=v" into {"rules":[{...}]}: values that read as numbers
// (strtod) become integers, or floats when they hold a '.', "true"/"false" booleans.
func parseCompact(spec string) (any, error) {
	rules := []any{}
	for _, ruleText := range strings.Split(spec, ";") {
		if strings.Trim(ruleText, " \t") == "" {
			continue
		}
		rule := map[string]any{}
		for _, field := range strings.Split(ruleText, ",") {
			if field == "" {
				continue
			}
			eq := strings.IndexByte(field, '=')
			if eq < 0 {
				return nil, fmt.Errorf("fault spec: %q is not key=value", field)
			}
			k, v := field[:eq], field[eq+1:]
			switch {
			case v == "true" || v == "false":
				rule[k] = v == "true"
			default:
				if d, ok := strtod(v); ok {
					if strings.Contains(v, ".") {
						rule[k] = d
					} else {
						rule[k] = int64(d)
					}
				} else {
					rule[k] = v
				}
			}
		}
		rules = append(rules, rule)
	}
	return map[string]any{"rules": rules}, nil
}

// strtod: the whole (non-empty) string is a number as C's strtod reads it.
func strtod(v string) (float64, bool) {
	s := strings.TrimLeft(v, " \t\n\v\f\r")
	if s == "" || strings.ContainsRune(s, '_') {
		return 0, false
	}
	if d, err := strconv.ParseFloat(s, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		return d, true
	}
	neg, h := false, s
	if h[0] == '+' || h[0] == '-' {
		neg, h = h[0] == '-', h[1:]
	}
	if len(h) > 2 && (h[:2] == "0x" || h[:2] == "0X") {
		if n, err := strconv.ParseUint(h[2:], 16, 64); err == nil {
			if neg {
				return -float64(n), true
			}
			return float64(n), true
		}
	}
	return 0, false
}

var knownFields = map[string]bool{"verb": true, "resource": true, "namespace": true, "name": true,
	"code": true, "retryAfter": true, "latencyMs": true, "cutAfterEvents": true, "midLine": true,
	"count": true, "rate": true, "id": true, "fired": true}

// AddJSON adds the rules of a parsed spec (see parseJSONValue for the value types).
func (f *Faults) AddJSON(spec any) error {
	var rulesV any = []any{}
	obj, isObj := spec.(map[string]any)
	if arr, ok := spec.([]any); ok {
		rulesV = arr
	} else if isObj {
		if v, ok := obj["rules"]; ok {
			rulesV = v
		}
	} else {
		return fmt.Errorf("fault spec: a field has the wrong type: "+
			"[json.exception.type_error.306] cannot use value() with %s", typeName(spec))
	}
	rules, ok := rulesV.([]any)
	if !ok {
		return fmt.Errorf("fault spec: \"rules\" must be an array")
	}
	var parsed []FaultRule
	for _, rv := range rules {
		r, ok := rv.(map[string]any)
		if !ok {
			return fmt.Errorf("fault spec: every rule must be an object")
		}
		keys := make([]string, 0, len(r))
		for k := range r {
			keys = append(keys, k)
		}
		sort.Strings(keys) // nlohmann iterates an object in key order
		for _, k := range keys {
			if !knownFields[k] {
				return fmt.Errorf("fault spec: unknown field %q", k)
			}
		}
		rule, err := ruleFrom(r)
		if err != nil {
			return fmt.Errorf("fault spec: a field has the wrong type: %v", err)
		}
		if rule.Code == 0 && rule.LatencyMs == 0 && rule.CutAfterEvents < 0 {
			return fmt.Errorf("fault spec: a rule needs code, latencyMs or cutAfterEvents")
		}
		if rule.Code != 0 && (rule.Code < 400 || rule.Code > 599) {
			return fmt.Errorf("fault spec: code %d is not an HTTP error code", rule.Code)
		}
		if rule.Rate < 0 || rule.Rate > 1 {
			return fmt.Errorf("fault spec: rate must be in [0,1]")
		}
		parsed = append(parsed, rule)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if isObj {
		switch seed := obj["seed"].(type) {
		case int64:
			f.rng.Seed(seed)
		case uint64:
			f.rng.Seed(int64(seed))
		}
	}
	for _, r := range parsed {
		r.ID = f.nextID
		f.nextID++
		f.rules = append(f.rules, r)
	}
	return nil
}

// ruleFrom reads the fields in the imitation's order with nlohmann's conversions: numbers
// convert among themselves (and from booleans), strings and booleans only from themselves.
func ruleFrom(r map[string]any) (FaultRule, error) {
	rule := FaultRule{}
	var err error
	str := func(k string, dst *string) {
		if v, ok := r[k]; ok && err == nil {
			if s, ok := v.(string); ok {
				*dst = s
			} else {
				err = typeErr("string", v)
			}
		}
	}
	// nlohmann converts a boolean to an int but not to an int64_t or a double.
	num := func(k string, def float64, boolOK bool) float64 {
		v, ok := r[k]
		if !ok || err != nil {
			return def
		}
		switch n := v.(type) {
		case int64:
			return float64(n)
		case uint64:
			return float64(n)
		case float64:
			return n
		case bool:
			if boolOK {
				if n {
					return 1
				}
				return 0
			}
		}
		err = typeErr("number", v)
		return def
	}
	integer := func(k string, def int64, boolOK bool) int64 {
		if err == nil {
			switch n := r[k].(type) { // exact, beyond float64's 53 bits too
			case int64:
				return n
			case uint64:
				return int64(n)
			}
		}
		return int64(num(k, float64(def), boolOK))
	}
	// static_cast<int> of an integer keeps its low 32 bits.
	int32Of := func(k string, def int64) int { return int(int32(integer(k, def, true))) }
	rule.Verb, rule.Resource, rule.Namespace, rule.Name = "*", "*", "*", "*"
	str("verb", &rule.Verb)
	str("resource", &rule.Resource)
	str("namespace", &rule.Namespace)
	str("name", &rule.Name)
	rule.Code = int32Of("code", 0)
	rule.RetryAfter = int32Of("retryAfter", 1)
	rule.LatencyMs = int32Of("latencyMs", 0)
	rule.CutAfterEvents = int32Of("cutAfterEvents", -1)
	if v, ok := r["midLine"]; ok && err == nil {
		if b, ok := v.(bool); ok {
			rule.MidLine = b
		} else {
			err = typeErr("boolean", v)
		}
	}
	rule.Count = integer("count", -1, false)
	rule.Rate = num("rate", 1.0, false)
	return rule, err
}

func typeErr(want string, v any) error {
	return fmt.Errorf("[json.exception.type_error.302] type must be %s, but is %s", want, typeName(v))
}

// typeName is nlohmann's json::type_name().
func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	default:
		return "number"
	}
}

// parseJSONValue decodes JSON with integers as int64 (uint64 beyond), other numbers float64.
func parseJSONValue(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data")
	}
	return convertNumbers(v), nil
}

func convertNumbers(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = convertNumbers(e)
		}
	case []any:
		for i, e := range t {
			t[i] = convertNumbers(e)
		}
	case json.Number:
		s := string(t)
		if !strings.ContainsAny(s, ".eE") {
			if n, err := strconv.ParseInt(s, 10, 64); err == nil {
				return n
			}
			if n, err := strconv.ParseUint(s, 10, 64); err == nil {
				return n
			}
		}
		d, _ := strconv.ParseFloat(s, 64)
		return d
	}
	return v
}

func (f *Faults) Clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = nil
}

// JSON is {"rules":[...]} as GET /testing/faults answers it.
func (f *Faults) JSON() map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules := make([]ruleJSON, 0, len(f.rules))
	for _, r := range f.rules {
		rules = append(rules, r.toJSON())
	}
	return map[string]any{"rules": rules}
}

// Decide says which rules fire for one request. Every matching rule may fire (its count
// and rate permitting), except that a rule whose only actions an earlier rule already
// decided does not consume a count; the first code and the first cut win, latencies add.
func (f *Faults) Decide(verb, resource, ns, name string) FaultDecision {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := FaultDecision{CutAfterEvents: -1}
	match := func(pattern, v string) bool { return pattern == "*" || pattern == v }
	for i := range f.rules {
		r := &f.rules[i]
		if !match(r.Verb, verb) || !match(r.Resource, resource) || !match(r.Namespace, ns) ||
			!match(r.Name, name) || r.Count == 0 {
			continue
		}
		wantsCode := r.Code != 0 && d.Code == 0
		wantsCut := r.CutAfterEvents >= 0 && d.CutAfterEvents < 0 && verb == "watch"
		wantsLatency := r.LatencyMs > 0
		if !wantsCode && !wantsCut && !wantsLatency {
			continue
		}
		if r.Rate < 1.0 && f.rng.Float64() >= r.Rate {
			continue
		}
		if r.Count > 0 {
			r.Count--
		}
		r.Fired++
		d.RuleIDs = append(d.RuleIDs, r.ID)
		if wantsCode {
			d.Code, d.RetryAfter = r.Code, r.RetryAfter
		}
		if wantsCut {
			d.CutAfterEvents, d.MidLine = r.CutAfterEvents, r.MidLine
		}
		d.LatencyMs += r.LatencyMs
	}
	return d
}
