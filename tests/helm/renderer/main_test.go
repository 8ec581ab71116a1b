package main

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Regenerate testdata/golden/ with: go test -run TestDefaultRender -update
var update = flag.Bool("update", false, "rewrite the golden files")

const fixture = "testdata/fixture"

// result is what one run of the renderer printed and returned.
type result struct {
	stdout, stderr string
	code           int
}

func renderFixture(t *testing.T, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(append([]string{fixture}, args...), strings.NewReader(""), &stdout, &stderr)
	return result{stdout.String(), stderr.String(), code}
}

// mustRender renders and fails the test unless the renderer succeeded quietly.
func mustRender(t *testing.T, args ...string) string {
	t.Helper()
	r := renderFixture(t, args...)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("render %q: exit %d, stderr:\n%s", args, r.code, r.stderr)
	}
	return r.stdout
}

// expectFailure checks that rendering fails with exit 1, prints nothing on stdout and
// exactly wantStderr on stderr.
func expectFailure(t *testing.T, wantStderr string, args ...string) {
	t.Helper()
	r := renderFixture(t, args...)
	if r.code != 1 {
		t.Errorf("render %q: exit %d, want 1", args, r.code)
	}
	if r.stdout != "" {
		t.Errorf("render %q: stdout should be empty, got:\n%s", args, r.stdout)
	}
	if r.stderr != wantStderr {
		t.Errorf("render %q: stderr\n got: %q\nwant: %q", args, r.stderr, wantStderr)
	}
}

// document returns the one document of the output whose Source header, kind and name
// match.
func document(t *testing.T, out, source, kind, name string) string {
	t.Helper()
	var found []string
	for _, doc := range splitManifests(out) {
		if strings.HasPrefix(doc, "# Source: "+source+"\n") && strings.Contains(doc, "\nkind: "+kind+"\n") &&
			strings.Contains(doc, "\nmetadata:\n  name: "+name+"\n") {
			found = append(found, doc)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one %s %s from %s, found %d in:\n%s", kind, name, source, len(found), out)
	}
	return found[0]
}

// sources lists the Source header of each document, in output order.
func sources(out string) []string {
	var s []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "# Source: ") {
			s = append(s, strings.TrimPrefix(line, "# Source: "))
		}
	}
	return s
}

func kinds(out string) []string {
	var k []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "kind: ") {
			k = append(k, strings.TrimPrefix(line, "kind: "))
		}
	}
	return k
}

func checkEqual(t *testing.T, what string, got, want interface{}) {
	t.Helper()
	if g, w := strings.Join(asStrings(got), "\n"), strings.Join(asStrings(want), "\n"); g != w {
		t.Errorf("%s:\n got:\n%s\nwant:\n%s", what, g, w)
	}
}

func asStrings(v interface{}) []string {
	if s, ok := v.([]string); ok {
		return s
	}
	return []string{v.(string)}
}

// The default render, byte for byte: values.yaml, include | nindent, tpl, toYaml, toJson,
// .Files.Get and .Files.Glob.AsConfig, .helmignore, .Release, .Chart, .Capabilities,
// .Template, missing keys, lookup, multi-document files and the kind order.
func TestDefaultRenderMatchesGolden(t *testing.T) {
	out := mustRender(t)
	golden := filepath.Join("testdata", "golden", "default.yaml")
	if *update {
		if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	checkEqual(t, "default render", out, string(want))
}

func TestOutputIsSortedByKindThenFileThenDocument(t *testing.T) {
	out := mustRender(t)
	checkEqual(t, "kinds", kinds(out), []string{"ServiceAccount", "ConfigMap", "ConfigMap", "Service", "Deployment", "Widget"})
	checkEqual(t, "sources", sources(out), []string{
		"fixture/templates/service.yaml",
		"fixture/templates/configmap.yaml",
		"fixture/templates/configmap.yaml",
		"fixture/templates/service.yaml",
		"fixture/templates/deployment.yaml",
		"fixture/templates/widget.yaml",
	})
	if !strings.HasPrefix(out, "---\n# Source: fixture/templates/service.yaml\napiVersion: v1\nkind: ServiceAccount\n") {
		t.Errorf("output does not start with the ServiceAccount document:\n%s", out)
	}
}

func TestPartialsAndNotesAreNotPrinted(t *testing.T) {
	out := mustRender(t)
	for _, unwanted := range []string{"_helpers.tpl", "ThisPartialMustNotBeRendered", "NOTES", "is installed as"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("output holds %q:\n%s", unwanted, out)
		}
	}
}

func TestNotesArePrintedLastWithNotesFlag(t *testing.T) {
	out := mustRender(t, "--notes", "--release-name", "demo", "-n", "ml")
	want := "\nNOTES:\nfixture is installed as demo in ml.\n"
	if !strings.HasSuffix(out, want) {
		t.Errorf("output does not end with %q:\n%s", want, out)
	}
}

func TestValuesFileAndSetMergeOverDefaults(t *testing.T) {
	out := mustRender(t, "-f", "testdata/override.yaml", "--set", "replicaCount=5")
	got := document(t, out, "fixture/templates/deployment.yaml", "Deployment", "release-name-fixture")
	want := `# Source: fixture/templates/deployment.yaml
apiVersion: apps/v1
kind: Deployment
metadata:
  name: release-name-fixture
  labels:
    app.kubernetes.io/name: fixture
    app.kubernetes.io/instance: release-name
    app.kubernetes.io/version: "1.4.2"
    app.kubernetes.io/managed-by: Helm
    helm.sh/chart: fixture-0.3.1
    owner: alice
    team: ml
spec:
  replicas: 5
  template:
    spec:
      containers:
        - name: app
          image: "registry.example/fixture/app:9.9"
          imagePullPolicy: IfNotPresent
          ports:
            - containerPort: 8080
            - containerPort: 9090
          resources:
            limits:
              cpu: "1"
              memory: 256Mi`
	checkEqual(t, "deployment", got, want)
}

func TestValuesFilesMergeInOrder(t *testing.T) {
	out := mustRender(t, "-f", "testdata/override.yaml", "-f", "testdata/tpl-include.yaml")
	got := document(t, out, "fixture/templates/deployment.yaml", "Deployment", "release-name-fixture")
	if !strings.Contains(got, "\n  replicas: 3\n") || !strings.Contains(got, `image: "registry.example/fixture/app:9.9"`) {
		t.Errorf("the first values file is lost:\n%s", got)
	}
}

func TestSetNullDeletesKeys(t *testing.T) {
	out := mustRender(t, "--set", "labels=null", "--set", "resources.limits.cpu=null")
	got := document(t, out, "fixture/templates/deployment.yaml", "Deployment", "release-name-fixture")
	if strings.Contains(got, "team: ml") {
		t.Errorf("labels=null kept the default labels:\n%s", got)
	}
	if !strings.HasSuffix(got, "          resources:\n            limits:\n              memory: 256Mi") {
		t.Errorf("resources.limits.cpu=null did not delete only cpu:\n%s", got)
	}
}

func TestSetTypesListsAndIndices(t *testing.T) {
	out := mustRender(t,
		"--set", "config.count=10,config.enabled=true,config.ratio=0.5,config.zip=0123,config.empty=",
		"--set", "ports={7000,7001}", "--set", "ports[1]=7100",
		"--set", "config.list[1].name=b,config.escaped=a\\,b",
		"--set-string", "config.text=10,config.flag=true")
	got := document(t, out, "fixture/templates/configmap.yaml", "ConfigMap", "release-name-fixture")
	want := `  config.yaml: |
    count: 10
    empty: ""
    enabled: true
    escaped: a,b
    flag: "true"
    greeting: hello from {{ .Release.Name }} in {{ .Release.Namespace }}
    list:
    - null
    - name: b
    logLevel: info
    ratio: "0.5"
    text: "10"
    zip: "0123"
  ports.json: "[7000,7100]"
`
	if !strings.Contains(got, want) {
		t.Errorf("configmap does not hold\n%s\ngot:\n%s", want, got)
	}
}

func TestSetErrors(t *testing.T) {
	expectFailure(t, "Error: failed parsing --set data: key \"replicaCount\" has no value\n", "--set", "replicaCount")
	expectFailure(t, "Error: failed parsing --set data: key \"a\" has no value (cannot end with ,)\n", "--set", "a,b=1")
}

func TestReleaseAndTpl(t *testing.T) {
	out := mustRender(t, "--release-name", "demo", "--namespace", "ml")
	got := document(t, out, "fixture/templates/configmap.yaml", "ConfigMap", "demo-fixture")
	for _, want := range []string{
		"\n    app.kubernetes.io/instance: demo\n",
		"\n  greeting: \"hello from demo in ml\"\n",
		"\n  release: \"revision=1 install=true upgrade=false\"\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("configmap does not hold %q:\n%s", want, got)
		}
	}
	// The release name may also come first, as in helm template NAME CHART.
	var stdout, stderr bytes.Buffer
	if code := run([]string{"demo", fixture, "-n", "ml"}, nil, &stdout, &stderr); code != 0 || stdout.String() != out {
		t.Errorf("NAME CHART form: exit %d, stderr %s, same output: %t", code, stderr.String(), stdout.String() == out)
	}
}

func TestTplSeesDefines(t *testing.T) {
	out := mustRender(t, "-f", "testdata/tpl-include.yaml")
	got := document(t, out, "fixture/templates/configmap.yaml", "ConfigMap", "release-name-fixture")
	if !strings.Contains(got, "\n  greeting: \"name=release-name-fixture\"\n") {
		t.Errorf("tpl did not render the include:\n%s", got)
	}
}

func TestCapabilitiesAPIVersions(t *testing.T) {
	expectFailure(t, "Error: could not find template templates/servicemonitor.yaml in chart\n",
		"--show-only", "templates/servicemonitor.yaml")

	out := mustRender(t, "--api-versions", "monitoring.coreos.com/v1", "--show-only", "templates/servicemonitor.yaml")
	want := `---
# Source: fixture/templates/servicemonitor.yaml
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: release-name-fixture
spec:
  endpoints:
    - interval: 30s
`
	checkEqual(t, "servicemonitor", out, want)

	// Comma lists work too, as with helm's -a.
	out = mustRender(t, "-a", "example.com/v1,monitoring.coreos.com/v1")
	checkEqual(t, "kinds", kinds(out), []string{"ServiceAccount", "ConfigMap", "ConfigMap", "Service", "Deployment", "ServiceMonitor", "Widget"})
}

func TestCapabilitiesKubeVersion(t *testing.T) {
	out := mustRender(t, "--kube-version", "1.29.3")
	if !strings.Contains(out, "\n  kube: \"v1.29.3 major=1 minor=29\"\n") {
		t.Errorf("kube version not in the configmap:\n%s", out)
	}
	expectFailure(t, "Error: chart requires kubeVersion: >=1.25.0-0 which is incompatible with Kubernetes v1.20.0\n\nUse --debug flag to render out invalid YAML\n",
		"--kube-version", "v1.20.0")
	expectFailure(t, "Error: invalid kube version 'banana': Invalid Semantic Version\n", "--kube-version", "banana")
}

func TestIncludeCRDsComesFirstVerbatim(t *testing.T) {
	out := mustRender(t, "--include-crds")
	crd, err := os.ReadFile(filepath.Join(fixture, "crds", "widgets.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := "---\n# Source: fixture/crds/widgets.yaml\n" + string(crd) + "\n---\n# Source: fixture/templates/service.yaml\n"
	if !strings.HasPrefix(out, want) {
		t.Errorf("output does not start with the CRD:\n%s", out)
	}
	if strings.Contains(mustRender(t), "CustomResourceDefinition") {
		t.Errorf("CRD printed without --include-crds")
	}
}

func TestHooksComeAfterTheManifests(t *testing.T) {
	out := mustRender(t, "--set", "hook.enabled=true")
	checkEqual(t, "kinds", kinds(out), []string{"ServiceAccount", "ConfigMap", "ConfigMap", "Service", "Deployment", "Widget", "Job"})
	if !strings.HasSuffix(out, "---\n# Source: fixture/templates/hook.yaml\napiVersion: batch/v1\nkind: Job\n"+
		"metadata:\n  name: release-name-fixture-pre-install\n  annotations:\n    \"helm.sh/hook\": pre-install\n"+
		"spec:\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: hook\n          image: busybox\n") {
		t.Errorf("hook not printed last:\n%s", out)
	}
}

func TestShowOnly(t *testing.T) {
	out := mustRender(t, "-s", "templates/service.yaml")
	want := `---
# Source: fixture/templates/service.yaml
apiVersion: v1
kind: ServiceAccount
metadata:
  name: release-name-fixture
---
# Source: fixture/templates/service.yaml
# Two documents in one file, of kinds that sort apart.
apiVersion: v1
kind: Service
metadata:
  name: release-name-fixture
spec:
  ports:
    - port: 8080
`
	checkEqual(t, "show-only", out, want)
	checkEqual(t, "glob", sources(mustRender(t, "-s", "templates/w*.yaml")), []string{"fixture/templates/widget.yaml"})
}

func TestRequiredFailsWithItsMessage(t *testing.T) {
	want := "Error: execution error at (fixture/templates/deployment.yaml:13:21): image.repository is required\n\nUse --debug flag to render out invalid YAML\n"
	expectFailure(t, want, "--set", "image.repository=null")
	expectFailure(t, want, "--set", "image.repository=")
}

func TestFailFailsWithItsMessage(t *testing.T) {
	expectFailure(t, "Error: execution error at (fixture/templates/failures.yaml:3:4): stop here\n\nUse --debug flag to render out invalid YAML\n",
		"--set", "failWith=stop here")
}

func TestTemplateErrorNamesFileAndLine(t *testing.T) {
	expectFailure(t, "Error: template: fixture/templates/failures.yaml:6:9: executing \"fixture/templates/failures.yaml\" at <index .Values.ports 5>: error calling index: index out of range: 5\n\nUse --debug flag to render out invalid YAML\n",
		"--set", "templateError=true")
}

func TestParseErrorNamesFileAndLine(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pe")
	writeFile(t, filepath.Join(dir, "Chart.yaml"), "apiVersion: v2\nname: pe\nversion: 1.0.0\n")
	writeFile(t, filepath.Join(dir, "templates", "bad.yaml"), "a: 1\nb: {{ .Values.x \n")
	var stdout, stderr bytes.Buffer
	code := run([]string{dir}, nil, &stdout, &stderr)
	want := "Error: parse error at (pe/templates/bad.yaml:3): unclosed action started at pe/templates/bad.yaml:2\n\nUse --debug flag to render out invalid YAML\n"
	if code != 1 || stderr.String() != want {
		t.Errorf("exit %d, stderr\n got: %q\nwant: %q", code, stderr.String(), want)
	}
}

func TestInvalidYAMLIsReported(t *testing.T) {
	expectFailure(t, "Error: YAML parse error on fixture/templates/broken.yaml: error converting YAML to JSON: yaml: line 4: did not find expected key\n\nUse --debug flag to render out invalid YAML\n",
		"--set", "brokenYaml=true")

	// With --debug the rendered files are printed too, the broken one included.
	r := renderFixture(t, "--set", "brokenYaml=true", "--debug")
	if r.code != 1 || !strings.Contains(r.stdout, "# Source: fixture/templates/broken.yaml\n") || strings.Contains(r.stderr, "Use --debug") {
		t.Errorf("--debug: exit %d, stdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}

func TestSchemaRejectsWrongType(t *testing.T) {
	expectFailure(t, "Error: values don't meet the specifications of the schema(s) in the following chart(s):\n"+
		"fixture:\n- replicaCount: Invalid type. Expected: integer, given: string\n\n",
		"--set", "replicaCount=abc")
	// As in Helm, an index into a list that only the defaults hold makes a new list:
	// [null, "http"] replaces the whole default list.
	expectFailure(t, "Error: values don't meet the specifications of the schema(s) in the following chart(s):\n"+
		"fixture:\n- ports.0: Invalid type. Expected: integer, given: null\n- ports.1: Invalid type. Expected: integer, given: string\n\n",
		"--set", "ports[1]=http")
}

func TestSchemaReportsEveryViolation(t *testing.T) {
	r := renderFixture(t, "--set", "replicaCount=0,image.pullPolicy=Sometimes")
	if r.code != 1 {
		t.Fatalf("exit %d, want 1", r.code)
	}
	for _, want := range []string{
		"Error: values don't meet the specifications of the schema(s) in the following chart(s):\nfixture:\n",
		"\n- replicaCount: Must be greater than or equal to 1\n",
		"\n- image.pullPolicy: image.pullPolicy must be one of the following: \"Always\", \"IfNotPresent\", \"Never\"\n",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr does not hold %q:\n%s", want, r.stderr)
		}
	}
}

func TestValidateOnlyPrintsNothing(t *testing.T) {
	r := renderFixture(t, "--validate-only")
	if r.code != 0 || r.stdout != "" || r.stderr != "" {
		t.Errorf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	expectFailure(t, "Error: YAML parse error on fixture/templates/broken.yaml: error converting YAML to JSON: yaml: line 4: did not find expected key\n\nUse --debug flag to render out invalid YAML\n",
		"--validate-only", "--set", "brokenYaml=true")
}

func TestBadReleaseName(t *testing.T) {
	expectFailure(t, "Error: release name \"Bad_Name\": invalid release name, must match regex ^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$ and the length must not be longer than 53\n",
		"--release-name", "Bad_Name")
}

func TestUsageErrorsExitTwo(t *testing.T) {
	for _, args := range [][]string{{"--bogus", fixture}, {}, {"a", "b", "c"}} {
		var stdout, stderr bytes.Buffer
		code := run(args, nil, &stdout, &stderr)
		if code != 2 || stdout.Len() != 0 || !strings.Contains(stderr.String(), "Usage: spawnpoint-chart-render [flags] [NAME] CHART_DIR") {
			t.Errorf("%q: exit %d, stdout %q, stderr:\n%s", args, code, stdout.String(), stderr.String())
		}
	}
	var stdout, stderr bytes.Buffer
	run([]string{"--bogus", fixture}, nil, &stdout, &stderr)
	if !strings.HasPrefix(stderr.String(), "flag provided but not defined: -bogus\n") {
		t.Errorf("unknown flag not named:\n%s", stderr.String())
	}
}

func TestSubchartsAreRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "parent")
	writeFile(t, filepath.Join(dir, "Chart.yaml"), "apiVersion: v2\nname: parent\nversion: 1.0.0\n")
	writeFile(t, filepath.Join(dir, "charts", "child", "Chart.yaml"), "apiVersion: v2\nname: child\nversion: 1.0.0\n")
	var stdout, stderr bytes.Buffer
	code := run([]string{dir}, nil, &stdout, &stderr)
	want := "Error: chart parent has subcharts or dependencies, which spawnpoint-chart-render does not support\n"
	if code != 1 || stderr.String() != want {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

// The binary that CMake builds behaves like run(): ctest passes its path in
// SPAWNPOINT_CHART_RENDER.
func TestBuiltBinary(t *testing.T) {
	bin := os.Getenv("SPAWNPOINT_CHART_RENDER")
	if bin == "" {
		t.Skip("SPAWNPOINT_CHART_RENDER is not set")
	}
	golden, err := os.ReadFile(filepath.Join("testdata", "golden", "default.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args       []string
		code       int
		stdout     string
		stderrHead string
	}{
		{[]string{fixture}, 0, string(golden), ""},
		{[]string{"--bogus", fixture}, 2, "", "flag provided but not defined: -bogus\nUsage: spawnpoint-chart-render"},
		{[]string{fixture, "--set", "replicaCount=abc"}, 1, "", "Error: values don't meet the specifications"},
	}
	for _, c := range cases {
		cmd := exec.Command(bin, c.args...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if exitErr, ok := err.(*exec.ExitError); ok {
			code = exitErr.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != c.code || stdout.String() != c.stdout || !strings.HasPrefix(stderr.String(), c.stderrHead) {
			t.Errorf("%s %q: exit %d (want %d), stdout matches: %t, stderr:\n%s", bin, c.args, code, c.code, stdout.String() == c.stdout, stderr.String())
		}
	}
}

func writeFile(t *testing.T, name, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
