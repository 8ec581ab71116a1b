package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"
	"text/template"

	"github.com/BurntSushi/toml"
	"github.com/Masterminds/sprig"
	"github.com/gobwas/glob"
	"sigs.k8s.io/yaml"
)

// Helm marks the messages of required and fail with these delimiters so that it can pick
// them out of text/template's error chain.
const (
	warnStartDelim   = "HELM_ERR_START"
	warnEndDelim     = "HELM_ERR_END"
	recursionMaxNums = 1000
)

var warnRegex = regexp.MustCompile(warnStartDelim + `((?s).*)` + warnEndDelim)

func warnWrap(warn string) string { return warnStartDelim + warn + warnEndDelim }

// renderTemplates renders every template of the chart like Helm's engine: one template
// set for all files (so every define is visible everywhere), missingkey=zero with
// "<no value>" removed from the output, partials (base name starting with '_') parsed
// but not rendered. Templates are named "<chart>/templates/<path>". The result maps
// those names to their output.
func renderTemplates(chartName string, templates []*chartFile, top map[string]interface{}) (rendered map[string]string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("rendering template failed: %v", r)
		}
	}()

	t := template.New("gotpl")
	t.Option("missingkey=zero")
	t.Funcs(engineFuncMap(t))

	sources := make(map[string]string, len(templates))
	names := make([]string, 0, len(templates))
	for _, f := range templates {
		name := path.Join(chartName, f.Name)
		sources[name] = string(f.Data)
		names = append(names, name)
	}
	sortTemplates(names)
	for _, name := range names {
		if _, err := t.New(name).Parse(sources[name]); err != nil {
			return nil, cleanupParseError(name, err)
		}
	}

	basePath := path.Join(chartName, "templates")
	rendered = make(map[string]string, len(names))
	for _, name := range names {
		if strings.HasPrefix(path.Base(name), "_") {
			continue
		}
		top["Template"] = map[string]interface{}{"Name": name, "BasePath": basePath}
		var buf strings.Builder
		if err := t.ExecuteTemplate(&buf, name, top); err != nil {
			return nil, cleanupExecError(name, err)
		}
		rendered[name] = strings.ReplaceAll(buf.String(), "<no value>", "")
	}
	return rendered, nil
}

// sortTemplates orders template names as Helm parses them: deepest paths first, then
// reverse-alphabetically. The order decides which of two same-named defines wins.
func sortTemplates(names []string) {
	sort.Slice(names, func(i, j int) bool {
		a, b := names[i], names[j]
		ca, cb := strings.Count(a, "/"), strings.Count(b, "/")
		if ca != cb {
			return ca > cb
		}
		return a > b
	})
}

// cleanupParseError words a parse error like Helm: "parse error at (file:line): msg".
func cleanupParseError(filename string, err error) error {
	tokens := strings.Split(err.Error(), ": ")
	if len(tokens) == 1 {
		return fmt.Errorf("parse error in (%s): %s", filename, err)
	}
	return fmt.Errorf("parse error at (%s): %s", tokens[1], tokens[len(tokens)-1])
}

// cleanupExecError words an execution error like Helm: the message of required or fail
// becomes "execution error at (file:line:col): msg"; any other error is text/template's
// own ("template: file:line:col: executing ...").
func cleanupExecError(filename string, err error) error {
	var execErr template.ExecError
	if !errors.As(err, &execErr) {
		return err
	}
	tokens := strings.SplitN(err.Error(), ": ", 3)
	if len(tokens) != 3 {
		return fmt.Errorf("execution error in (%s): %s", filename, err)
	}
	if parts := warnRegex.FindStringSubmatch(tokens[2]); len(parts) >= 2 {
		return fmt.Errorf("execution error at (%s): %s", tokens[1], parts[1])
	}
	return err
}

// engineFuncMap is sprig's text function map without env and expandenv, plus Helm's
// functions; include and tpl are bound to t.
func engineFuncMap(t *template.Template) template.FuncMap {
	f := sprig.TxtFuncMap()
	delete(f, "env")
	delete(f, "expandenv")

	includedNames := map[string]int{}
	extra := template.FuncMap{
		"toToml":        toTOML,
		"toYaml":        toYAML,
		"fromYaml":      fromYAML,
		"fromYamlArray": fromYAMLArray,
		"toJson":        toJSON,
		"fromJson":      fromJSON,
		"fromJsonArray": fromJSONArray,
		"include":       includeFunc(t, includedNames),
		"tpl":           tplFunc(t, includedNames),
		"required":      required,
		"fail":          fail,
		// No cluster: lookup finds nothing, as in `helm template`.
		"lookup": func(string, string, string, string) (map[string]interface{}, error) {
			return map[string]interface{}{}, nil
		},
		// DNS lookups are off by default in Helm.
		"getHostByName": func(string) string { return "" },
	}
	for k, v := range extra {
		f[k] = v
	}
	return f
}

// includeFunc renders the named template into a string, so that it can be piped
// (include "x" . | nindent 4).
func includeFunc(t *template.Template, includedNames map[string]int) func(string, interface{}) (string, error) {
	return func(name string, data interface{}) (string, error) {
		if includedNames[name] > recursionMaxNums {
			return "", fmt.Errorf("rendering template has a nested reference name: %s: unable to execute template", name)
		}
		includedNames[name]++
		defer func() { includedNames[name]-- }()
		var buf strings.Builder
		err := t.ExecuteTemplate(&buf, name, data)
		return buf.String(), err
	}
}

// tplFunc renders a string as a template, in a clone of the template set so that it can
// use every define.
func tplFunc(parent *template.Template, includedNames map[string]int) func(string, interface{}) (string, error) {
	return func(tpl string, vals interface{}) (string, error) {
		t, err := parent.Clone()
		if err != nil {
			return "", fmt.Errorf("cannot clone template: %w", err)
		}
		t.Option("missingkey=zero")
		t.Funcs(template.FuncMap{
			"include": includeFunc(t, includedNames),
			"tpl":     tplFunc(t, includedNames),
		})
		t, err = t.New(parent.Name()).Parse(tpl)
		if err != nil {
			return "", fmt.Errorf("cannot parse template %q: %w", tpl, err)
		}
		var buf strings.Builder
		if err := t.Execute(&buf, vals); err != nil {
			return "", fmt.Errorf("error during tpl function execution for %q: %w", tpl, err)
		}
		return strings.ReplaceAll(buf.String(), "<no value>", ""), nil
	}
}

// required fails with warn when val is missing (nil) or the empty string.
func required(warn string, val interface{}) (interface{}, error) {
	if val == nil {
		return val, errors.New(warnWrap(warn))
	}
	if s, ok := val.(string); ok && s == "" {
		return val, errors.New(warnWrap(warn))
	}
	return val, nil
}

// fail stops rendering with msg.
func fail(msg string) (string, error) {
	return "", errors.New(warnWrap(msg))
}

func toYAML(v interface{}) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		// Helm swallows errors inside templates.
		return ""
	}
	return strings.TrimSuffix(string(data), "\n")
}

func fromYAML(str string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := yaml.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromYAMLArray(str string) []interface{} {
	a := []interface{}{}
	if err := yaml.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

func toTOML(v interface{}) string {
	b := bytes.NewBuffer(nil)
	if err := toml.NewEncoder(b).Encode(v); err != nil {
		return err.Error()
	}
	return b.String()
}

func toJSON(v interface{}) string {
	data, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(data)
}

func fromJSON(str string) map[string]interface{} {
	m := map[string]interface{}{}
	if err := json.Unmarshal([]byte(str), &m); err != nil {
		m["Error"] = err.Error()
	}
	return m
}

func fromJSONArray(str string) []interface{} {
	a := []interface{}{}
	if err := json.Unmarshal([]byte(str), &a); err != nil {
		a = []interface{}{err.Error()}
	}
	return a
}

// Files is .Files: the chart's files outside templates/ (Helm's engine.files).
type Files map[string][]byte

func newFiles(from []*chartFile) Files {
	files := Files{}
	for _, f := range from {
		files[f.Name] = f.Data
	}
	return files
}

// GetBytes returns the file's content, or nothing if there is no such file.
func (f Files) GetBytes(name string) []byte {
	if v, ok := f[name]; ok {
		return v
	}
	return []byte{}
}

// Get returns the file's content as a string.
func (f Files) Get(name string) string { return string(f.GetBytes(name)) }

// Glob returns the files whose path matches pattern ('*' stops at '/', '**' does not).
func (f Files) Glob(pattern string) Files {
	g, err := glob.Compile(pattern, '/')
	if err != nil {
		g, _ = glob.Compile("**")
	}
	out := Files{}
	for name, contents := range f {
		if g.Match(name) {
			out[name] = contents
		}
	}
	return out
}

// AsConfig returns the files as the YAML body of a ConfigMap's data, keyed by base name.
func (f Files) AsConfig() string {
	if f == nil {
		return ""
	}
	m := map[string]string{}
	for k, v := range f {
		m[path.Base(k)] = string(v)
	}
	return toYAML(m)
}

// AsSecrets returns the files base64-encoded as the YAML body of a Secret's data.
func (f Files) AsSecrets() string {
	if f == nil {
		return ""
	}
	m := map[string]string{}
	for k, v := range f {
		m[path.Base(k)] = base64.StdEncoding.EncodeToString(v)
	}
	return toYAML(m)
}

// Lines returns the file's lines, without a final empty one.
func (f Files) Lines(name string) []string {
	if f == nil || len(f[name]) == 0 {
		return []string{}
	}
	s := strings.TrimSuffix(string(f[name]), "\n")
	return strings.Split(s, "\n")
}
