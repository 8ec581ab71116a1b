package main

import (
	"fmt"
	"io"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// debugHint is what helm template adds to a rendering error unless --debug is given.
const debugHint = "\n\nUse --debug flag to render out invalid YAML"

// render does what `helm template` does for a chart directory and returns its output.
// On an error after rendering started, the output holds what --debug would show.
func render(opts *options, stdin io.Reader, stderr io.Writer) (string, error) {
	caps, err := newCapabilities(opts.kubeVersion, opts.apiVersions)
	if err != nil {
		return "", err
	}
	if err := validateReleaseName(opts.releaseName); err != nil {
		return "", fmt.Errorf("release name %q: %s", opts.releaseName, err)
	}
	c, err := loadChart(opts.chartDir)
	if err != nil {
		return "", err
	}
	if c.Metadata.Type != "" && c.Metadata.Type != "application" {
		return "", fmt.Errorf("%s charts are not installable", c.Metadata.Type)
	}
	if c.Metadata.Deprecated {
		fmt.Fprintln(stderr, "WARNING: This chart is deprecated")
	}
	user, err := userValues(opts, stdin)
	if err != nil {
		return "", err
	}
	warn := func(format string, a ...interface{}) { fmt.Fprintf(stderr, format+"\n", a...) }
	vals := coalesceValues(c.Values, user, warn)
	if err := validateValues(c.Metadata.Name, c.Schema, vals); err != nil {
		return "", err
	}

	// From here on helm template has a (failed) release, and says how to see it.
	out, notes, err := renderManifests(opts, c, vals, caps)
	if err != nil {
		if !opts.debug {
			err = fmt.Errorf("%w%s", err, debugHint)
		}
		return out, err
	}
	if len(opts.showOnly) > 0 {
		if out, err = showOnly(out, opts.showOnly); err != nil {
			return "", err
		}
	}
	if opts.notes && strings.TrimSpace(notes) != "" {
		out += "\nNOTES:\n" + strings.TrimSpace(notes) + "\n"
	}
	return out, nil
}

// renderManifests renders the templates and assembles the output like helm template:
// CRDs (with --include-crds), then the manifests sorted by kind, then the hooks. It
// returns the rendered NOTES.txt apart.
func renderManifests(opts *options, c *chart, vals map[string]interface{}, caps *Capabilities) (out, notes string, err error) {
	name := c.Metadata.Name
	if c.Metadata.KubeVersion != "" && !kubeVersionCompatible(c.Metadata.KubeVersion, caps.KubeVersion.String()) {
		return "", "", fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", c.Metadata.KubeVersion, caps.KubeVersion.String())
	}
	// As in Helm, .Chart is Chart.yaml plus IsRoot, and .Subcharts is empty here.
	chartObject := struct {
		Metadata
		IsRoot bool
	}{*c.Metadata, true}
	top := map[string]interface{}{
		"Values":       vals,
		"Chart":        chartObject,
		"Subcharts":    map[string]interface{}{},
		"Capabilities": caps,
		"Release": map[string]interface{}{
			"Name":      opts.releaseName,
			"Namespace": opts.namespace,
			"Revision":  1,
			"Service":   "Helm",
			"IsUpgrade": false,
			"IsInstall": true,
		},
		"Files": newFiles(c.Files),
	}
	files, err := renderTemplates(name, c.Templates, top)
	if err != nil {
		return "", "", err
	}

	notes = files[path.Join(name, "templates", "NOTES.txt")]
	for k := range files {
		if strings.HasSuffix(k, "NOTES.txt") {
			delete(files, k)
		}
	}

	hooks, manifests, err := sortManifests(files)
	if err != nil {
		return allFiles(files), "", err
	}

	var b strings.Builder
	if opts.includeCRDs {
		for _, crd := range c.crds() {
			fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", path.Join(name, crd.Name), crd.Data)
		}
	}
	for _, m := range manifests {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.name, m.content)
	}
	out = strings.TrimSpace(b.String()) + "\n"
	for _, h := range hooks {
		out += fmt.Sprintf("---\n# Source: %s\n%s\n", h.name, h.content)
	}
	return out, notes, nil
}

// allFiles is what helm template --debug prints when a manifest is not valid YAML: every
// rendered file, unsorted by kind (here: by name).
func allFiles(files map[string]string) string {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		if strings.TrimSpace(files[n]) != "" {
			fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", n, files[n])
		}
	}
	return b.String()
}

// showOnly keeps the documents whose source matches one of the patterns (paths inside
// the chart, e.g. templates/x.yaml; globs allowed), in pattern order, like helm template
// --show-only.
func showOnly(out string, patterns []string) (string, error) {
	docs := splitManifests(out)
	sourceRegex := regexp.MustCompile("# Source: [^/]+/(.+)")
	var b strings.Builder
	for _, pattern := range patterns {
		pattern = filepath.ToSlash(pattern)
		found := false
		for _, doc := range docs {
			sub := sourceRegex.FindStringSubmatch(doc)
			if len(sub) == 0 {
				continue
			}
			if ok, _ := filepath.Match(pattern, sub[1]); ok {
				fmt.Fprintf(&b, "---\n%s\n", doc)
				found = true
			}
		}
		if !found {
			return "", fmt.Errorf("could not find template %s in chart", pattern)
		}
	}
	return b.String(), nil
}

// installOrder is the order in which Helm 3 installs (and helm template prints) the
// manifests of a release, by kind. Kinds not listed come last, alphabetically.
var installOrder = []string{
	"PriorityClass",
	"Namespace",
	"NetworkPolicy",
	"ResourceQuota",
	"LimitRange",
	"PodSecurityPolicy",
	"PodDisruptionBudget",
	"ServiceAccount",
	"Secret",
	"SecretList",
	"ConfigMap",
	"StorageClass",
	"PersistentVolume",
	"PersistentVolumeClaim",
	"CustomResourceDefinition",
	"ClusterRole",
	"ClusterRoleList",
	"ClusterRoleBinding",
	"ClusterRoleBindingList",
	"Role",
	"RoleList",
	"RoleBinding",
	"RoleBindingList",
	"Service",
	"DaemonSet",
	"Pod",
	"ReplicationController",
	"ReplicaSet",
	"Deployment",
	"HorizontalPodAutoscaler",
	"StatefulSet",
	"Job",
	"CronJob",
	"IngressClass",
	"Ingress",
	"APIService",
	"MutatingWebhookConfiguration",
	"ValidatingWebhookConfiguration",
}

// hookEvents are the values of the helm.sh/hook annotation that Helm knows.
var hookEvents = map[string]bool{
	"pre-install": true, "post-install": true,
	"pre-delete": true, "post-delete": true,
	"pre-upgrade": true, "post-upgrade": true,
	"pre-rollback": true, "post-rollback": true,
	"test": true, "test-success": true,
}

// simpleHead is the part of a manifest that sorting needs (Helm's SimpleHead).
type simpleHead struct {
	Version  string `json:"apiVersion"`
	Kind     string `json:"kind,omitempty"`
	Metadata *struct {
		Name        string            `json:"name"`
		Annotations map[string]string `json:"annotations"`
	} `json:"metadata,omitempty"`
}

// manifest is one YAML document of a rendered template.
type manifest struct {
	name    string // the template it came from, e.g. spawnpoint/templates/x.yaml
	content string
	kind    string
}

var docSeparator = regexp.MustCompile("(?:^|\\s*\n)---\\s*")

// splitManifests splits a YAML stream into its trimmed, non-empty documents.
func splitManifests(bigFile string) []string {
	var docs []string
	for _, d := range docSeparator.Split(strings.TrimSpace(bigFile), -1) {
		if d == "" {
			continue
		}
		docs = append(docs, strings.TrimSpace(d))
	}
	return docs
}

// sortManifests splits the rendered files (by file name order) into documents, checks
// that each parses as YAML, separates the hooks and sorts both by install order, like
// Helm's releaseutil.SortManifests.
func sortManifests(files map[string]string) (hooks, manifests []manifest, err error) {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		content := files[n]
		if strings.HasPrefix(path.Base(n), "_") || strings.TrimSpace(content) == "" {
			continue
		}
		for _, doc := range splitManifests(content) {
			var head simpleHead
			if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
				return nil, nil, fmt.Errorf("YAML parse error on %s: %w", n, err)
			}
			m := manifest{name: n, content: doc, kind: head.Kind}
			var hookAnnotation string
			isHook := false
			if head.Metadata != nil {
				hookAnnotation, isHook = head.Metadata.Annotations["helm.sh/hook"]
			}
			if !isHook {
				manifests = append(manifests, m)
				continue
			}
			known := true
			for _, event := range strings.Split(hookAnnotation, ",") {
				known = known && hookEvents[strings.ToLower(strings.TrimSpace(event))]
			}
			if known { // Helm drops hooks of unknown events
				hooks = append(hooks, m)
			}
		}
	}
	sortByKind(manifests)
	sortByKind(hooks)
	return hooks, manifests, nil
}

// sortByKind is a stable sort by install order; unknown kinds come last, alphabetically.
func sortByKind(ms []manifest) {
	order := make(map[string]int, len(installOrder))
	for i, k := range installOrder {
		order[k] = i
	}
	sort.SliceStable(ms, func(i, j int) bool {
		a, aok := order[ms[i].kind]
		b, bok := order[ms[j].kind]
		switch {
		case !aok && !bok:
			return ms[i].kind < ms[j].kind
		case !aok:
			return false
		case !bok:
			return true
		}
		return a < b
	})
}
