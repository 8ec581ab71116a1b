package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/Masterminds/semver"
	"sigs.k8s.io/yaml"
)

// Metadata is Chart.yaml, with the field names templates see as .Chart (Helm's
// chart.Metadata).
type Metadata struct {
	Name         string            `json:"name,omitempty"`
	Home         string            `json:"home,omitempty"`
	Sources      []string          `json:"sources,omitempty"`
	Version      string            `json:"version,omitempty"`
	Description  string            `json:"description,omitempty"`
	Keywords     []string          `json:"keywords,omitempty"`
	Maintainers  []*Maintainer     `json:"maintainers,omitempty"`
	Icon         string            `json:"icon,omitempty"`
	APIVersion   string            `json:"apiVersion,omitempty"`
	Condition    string            `json:"condition,omitempty"`
	Tags         string            `json:"tags,omitempty"`
	AppVersion   string            `json:"appVersion,omitempty"`
	Deprecated   bool              `json:"deprecated,omitempty"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	KubeVersion  string            `json:"kubeVersion,omitempty"`
	Dependencies []*Dependency     `json:"dependencies,omitempty"`
	Type         string            `json:"type,omitempty"`
}

// Maintainer is one entry of Chart.yaml's maintainers.
type Maintainer struct {
	Name  string `json:"name,omitempty"`
	Email string `json:"email,omitempty"`
	URL   string `json:"url,omitempty"`
}

// Dependency is one entry of Chart.yaml's dependencies. They are not supported: the
// loader only reads them to refuse the chart.
type Dependency struct {
	Name       string `json:"name"`
	Version    string `json:"version,omitempty"`
	Repository string `json:"repository"`
}

// chartFile is one file of the chart, named by its slash-separated path inside the
// chart directory.
type chartFile struct {
	Name string
	Data []byte
}

// chart is a loaded chart directory, split like Helm's loader does.
type chart struct {
	Metadata  *Metadata
	Values    map[string]interface{}
	Schema    []byte
	Templates []*chartFile // everything under templates/
	Files     []*chartFile // every other file: what .Files sees, crds/ included
}

// crds returns the files under crds/ that Helm treats as CRDs, in load order.
func (c *chart) crds() []*chartFile {
	var out []*chartFile
	for _, f := range c.Files {
		if strings.HasPrefix(f.Name, "crds/") {
			switch path.Ext(f.Name) {
			case ".yaml", ".yml", ".json":
				out = append(out, f)
			}
		}
	}
	return out
}

// loadChart reads a chart directory like Helm's directory loader: .helmignore is honoured
// (loosely: see ignoreRules), hidden files under templates/ are skipped, and the files
// are sorted into metadata, values, schema, templates and other files.
func loadChart(dir string) (*chart, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a chart directory (packaged charts are not supported)", dir)
	}
	rules, err := readIgnoreRules(filepath.Join(dir, ".helmignore"))
	if err != nil {
		return nil, err
	}

	c := &chart{}
	var subcharts []string
	err = filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		if rules.ignore(rel, info.IsDir()) {
			if info.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if info.IsDir() {
			return nil
		}
		if !info.Mode().IsRegular() {
			return fmt.Errorf("cannot load irregular file %s as it has file mode type bits set", p)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		switch {
		case rel == "Chart.yaml":
			c.Metadata = &Metadata{}
			if err := yaml.Unmarshal(data, c.Metadata); err != nil {
				return fmt.Errorf("cannot load Chart.yaml: %w", err)
			}
		case rel == "values.yaml":
			c.Values, err = readValues(data)
			if err != nil {
				return fmt.Errorf("cannot load values.yaml: %w", err)
			}
		case rel == "values.schema.json":
			c.Schema = data
		case rel == "Chart.lock", rel == "requirements.yaml", rel == "requirements.lock":
		case strings.HasPrefix(rel, "templates/"):
			c.Templates = append(c.Templates, &chartFile{Name: rel, Data: data})
		case strings.HasPrefix(rel, "charts/"):
			subcharts = append(subcharts, rel)
		default:
			c.Files = append(c.Files, &chartFile{Name: rel, Data: data})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if c.Metadata == nil {
		return nil, fmt.Errorf("Chart.yaml file is missing")
	}
	if err := c.Metadata.validate(); err != nil {
		return nil, err
	}
	if len(subcharts) > 0 || len(c.Metadata.Dependencies) > 0 {
		return nil, fmt.Errorf("chart %s has subcharts or dependencies, which %s does not support", c.Metadata.Name, commandName)
	}
	if c.Values == nil {
		c.Values = map[string]interface{}{}
	}
	return c, nil
}

// validate checks Chart.yaml like Helm's chart.Metadata.Validate (the parts that matter
// for rendering).
func (m *Metadata) validate() error {
	switch {
	case m.APIVersion == "":
		return fmt.Errorf("validation: chart.metadata.apiVersion is required")
	case m.Name == "":
		return fmt.Errorf("validation: chart.metadata.name is required")
	case m.Name != filepath.Base(m.Name):
		return fmt.Errorf("validation: chart.metadata.name %q is invalid", m.Name)
	case m.Version == "":
		return fmt.Errorf("validation: chart.metadata.version is required")
	}
	if _, err := semver.NewVersion(m.Version); err != nil {
		return fmt.Errorf("validation: chart.metadata.version %q is invalid", m.Version)
	}
	if m.Type != "" && m.Type != "application" && m.Type != "library" {
		return fmt.Errorf("validation: chart.metadata.type must be application or library")
	}
	return nil
}

// ignoreRule is one line of .helmignore.
type ignoreRule struct {
	pattern  string
	fullPath bool // the pattern holds a slash: match it against the whole path
	dirOnly  bool // the pattern ended with a slash: match directories only
}

// ignoreRules is a loose reading of .helmignore: shell globs (filepath.Match) matched
// against the base name, or against the whole path when the pattern holds a slash; a
// trailing slash matches directories only. Negated rules ('!') and '**' are not
// supported and are skipped. Helm's default rule, hidden files under templates/, is
// always in force.
type ignoreRules []ignoreRule

func readIgnoreRules(file string) (ignoreRules, error) {
	rules := ignoreRules{{pattern: "templates/.?*", fullPath: true}}
	data, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return rules, nil
	}
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "!") || strings.Contains(line, "**") {
			continue
		}
		r := ignoreRule{}
		if strings.HasSuffix(line, "/") {
			r.dirOnly = true
			line = strings.TrimSuffix(line, "/")
		}
		line = strings.TrimPrefix(line, "/")
		r.fullPath = strings.Contains(line, "/")
		r.pattern = line
		if _, err := path.Match(r.pattern, ""); err != nil {
			return nil, fmt.Errorf("%s: bad pattern %q: %w", file, r.pattern, err)
		}
		rules = append(rules, r)
	}
	return rules, sc.Err()
}

func (rules ignoreRules) ignore(rel string, isDir bool) bool {
	for _, r := range rules {
		if r.dirOnly && !isDir {
			continue
		}
		name := path.Base(rel)
		if r.fullPath {
			name = rel
		}
		if ok, _ := path.Match(r.pattern, name); ok {
			return true
		}
	}
	return false
}
