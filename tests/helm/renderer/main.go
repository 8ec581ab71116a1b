// Command spawnpoint-chart-render renders a Helm chart the way `helm template` does, for
// tests on machines where no helm binary can run. It loads a chart directory, merges
// values like Helm 3 (values.yaml, --values files, --set, --set-string), validates them
// against values.schema.json, renders templates/ with text/template plus sprig and Helm's
// own functions, checks that every document parses as YAML and prints the manifests in
// Helm's install order. See README.md for what it deliberately leaves out.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

const commandName = "spawnpoint-chart-render"

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// options are the parsed command line.
type options struct {
	chartDir     string
	valueFiles   []string
	setValues    []string
	setStrings   []string
	releaseName  string
	namespace    string
	includeCRDs  bool
	kubeVersion  string
	apiVersions  []string
	showOnly     []string
	validateOnly bool
	notes        bool
	debug        bool
}

// run is the whole program; it returns the exit status: 0 on success, 1 when the chart
// cannot be rendered (like helm), 2 for a usage error.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	opts, err := parseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2
	}
	out, err := render(opts, stdin, stderr)
	if err != nil {
		if opts.debug && out != "" {
			io.WriteString(stdout, out)
		}
		fmt.Fprintf(stderr, "Error: %s\n", err)
		return 1
	}
	if !opts.validateOnly {
		io.WriteString(stdout, out)
	}
	return 0
}

// stringList is a repeatable flag; with split set, each use may also hold a
// comma-separated list (as Helm's StringSlice flags do).
type stringList struct {
	values *[]string
	split  bool
}

func (s stringList) String() string {
	if s.values == nil {
		return ""
	}
	return strings.Join(*s.values, ",")
}

func (s stringList) Set(v string) error {
	if s.split {
		*s.values = append(*s.values, strings.Split(v, ",")...)
	} else {
		*s.values = append(*s.values, v)
	}
	return nil
}

const usageText = `Usage: %[1]s [flags] [NAME] CHART_DIR

Renders the chart in CHART_DIR like 'helm template [NAME] CHART_DIR' and prints the
manifests on stdout. Flags may come before or after the arguments.

Flags:
  -f, --values FILE           values file to merge over values.yaml ('-' reads stdin); repeatable, comma lists allowed
      --set KEY=VAL[,K=V]     set values (a.b=1, a.list[0]=x, a.list={x,y}, a.b=null deletes); repeatable
      --set-string KEY=VAL    like --set, but every value stays a string; repeatable
      --release-name NAME     release name (default "release-name")
  -n, --namespace NS          release namespace (default "default")
      --include-crds          print the files in crds/ before the templates
      --kube-version VERSION  Kubernetes version for .Capabilities (default "v1.32.0")
  -a, --api-versions G/V      extra API version for .Capabilities.APIVersions; repeatable, comma lists allowed
  -s, --show-only PATH        print only the manifests rendered from PATH (e.g. templates/x.yaml, globs allowed); repeatable
      --notes                 also render and print templates/NOTES.txt after the manifests
      --validate-only         do every check (schema, rendering, YAML) but print nothing
      --debug                 on a YAML error, print the rendered files as well
  -h, --help                  show this help
`

// parseArgs parses the command line. Flags and positional arguments may be mixed, as with
// helm. On a usage error it prints the problem and the usage on stderr.
func parseArgs(args []string, stderr io.Writer) (*options, error) {
	opts := &options{}
	fs := flag.NewFlagSet(commandName, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintf(stderr, usageText, commandName) }

	valueFiles := stringList{values: &opts.valueFiles, split: true}
	fs.Var(valueFiles, "values", "")
	fs.Var(valueFiles, "f", "")
	fs.Var(stringList{values: &opts.setValues}, "set", "")
	fs.Var(stringList{values: &opts.setStrings}, "set-string", "")
	fs.StringVar(&opts.releaseName, "release-name", "", "")
	fs.StringVar(&opts.namespace, "namespace", "default", "")
	fs.StringVar(&opts.namespace, "n", "default", "")
	fs.BoolVar(&opts.includeCRDs, "include-crds", false, "")
	fs.StringVar(&opts.kubeVersion, "kube-version", "", "")
	apiVersions := stringList{values: &opts.apiVersions, split: true}
	fs.Var(apiVersions, "api-versions", "")
	fs.Var(apiVersions, "a", "")
	showOnly := stringList{values: &opts.showOnly}
	fs.Var(showOnly, "show-only", "")
	fs.Var(showOnly, "s", "")
	fs.BoolVar(&opts.validateOnly, "validate-only", false, "")
	fs.BoolVar(&opts.notes, "notes", false, "")
	fs.BoolVar(&opts.debug, "debug", false, "")

	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}

	usageError := func(format string, a ...interface{}) (*options, error) {
		err := fmt.Errorf(format, a...)
		fmt.Fprintf(stderr, "%s\n", err)
		fs.Usage()
		return nil, err
	}
	switch len(positional) {
	case 1:
		opts.chartDir = positional[0]
	case 2:
		if opts.releaseName != "" {
			return usageError("the release name is given twice: %q and --release-name %q", positional[0], opts.releaseName)
		}
		opts.releaseName, opts.chartDir = positional[0], positional[1]
	case 0:
		return usageError("missing CHART_DIR")
	default:
		return usageError("too many arguments: %q", positional)
	}
	if opts.releaseName == "" {
		opts.releaseName = "release-name"
	}
	return opts, nil
}
