package main

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseRequestInfo(t *testing.T) {
	type want struct {
		res                     bool
		verb, group, version    string
		resource, sub, ns, name string
	}
	for _, c := range []struct {
		method, target string
		want           want
	}{
		{"GET", "/api/v1/namespaces/ns/pods", want{true, "list", "", "v1", "pods", "", "ns", ""}},
		{"GET", "/api/v1/namespaces/ns/pods/p", want{true, "get", "", "v1", "pods", "", "ns", "p"}},
		{"GET", "/api/v1/namespaces/ns/pods?watch=true", want{true, "watch", "", "v1", "pods", "", "ns", ""}},
		{"GET", "/api/v1/pods?watch=1", want{true, "watch", "", "v1", "pods", "", "", ""}},
		{"GET", "/api/v1/pods?watch=false", want{true, "list", "", "v1", "pods", "", "", ""}},
		{"GET", "/api/v1/pods?watch=yes", want{true, "list", "", "v1", "pods", "", "", ""}},
		{"GET", "/api/v1/pods?watch=false&watch=True", want{true, "watch", "", "v1", "pods", "", "", ""}},
		{"GET", "/api/v1/watch/namespaces/ns/pods", want{true, "watch", "", "v1", "pods", "", "ns", ""}},
		{"GET", "/api/v1/watch/namespaces/ns/pods/p", want{true, "watch", "", "v1", "pods", "", "ns", "p"}},
		{"PUT", "/api/v1/namespaces/ns/pods/p/status", want{true, "update", "", "v1", "pods", "status", "ns", "p"}},
		{"GET", "/api/v1/namespaces/ns/pods/p/log", want{true, "get", "", "v1", "pods", "log", "ns", "p"}},
		{"POST", "/api/v1/namespaces/ns/serviceaccounts/sa/token", want{true, "create", "", "v1", "serviceaccounts", "token", "ns", "sa"}},
		{"GET", "/api/v1/namespaces", want{true, "list", "", "v1", "namespaces", "", "", ""}},
		{"GET", "/api/v1/namespaces/ns", want{true, "get", "", "v1", "namespaces", "", "", "ns"}},
		{"DELETE", "/api/v1/namespaces/ns", want{true, "delete", "", "v1", "namespaces", "", "", "ns"}},
		{"PUT", "/api/v1/namespaces/ns/finalize", want{true, "update", "", "v1", "namespaces", "finalize", "", "ns"}},
		{"PATCH", "/api/v1/namespaces/ns/status", want{true, "patch", "", "v1", "namespaces", "status", "", "ns"}},
		{"GET", "/api/v1/nodes/n1", want{true, "get", "", "v1", "nodes", "", "", "n1"}},
		{"POST", "/apis/apps/v1/namespaces/ns/deployments", want{true, "create", "apps", "v1", "deployments", "", "ns", ""}},
		{"PATCH", "/apis/spawnpoint.dev/v1/namespaces/ns/trainingjobs/j", want{true, "patch", "spawnpoint.dev", "v1", "trainingjobs", "", "ns", "j"}},
		{"DELETE", "/apis/spawnpoint.dev/v1/namespaces/ns/trainingjobs", want{true, "deletecollection", "spawnpoint.dev", "v1", "trainingjobs", "", "ns", ""}},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", want{true, "update", "coordination.k8s.io", "v1", "leases", "", "ns", "l"}},
		{"GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/admin", want{true, "get", "rbac.authorization.k8s.io", "v1", "clusterroles", "", "", "admin"}},
		{"GET", "/apis/apiextensions.k8s.io/v1/watch/customresourcedefinitions?x=1", want{true, "watch", "apiextensions.k8s.io", "v1", "customresourcedefinitions", "", "", ""}},
		{"GET", "//api//v1/namespaces/ns//configmaps/", want{true, "list", "", "v1", "configmaps", "", "ns", ""}},
		// Non-resource requests: no verb in the log, never faulted.
		{"GET", "/api", want{false, "list", "", "", "", "", "", ""}},
		{"GET", "/apis", want{false, "list", "", "", "", "", "", ""}},
		{"GET", "/api/v1", want{false, "list", "", "v1", "", "", "", ""}},
		{"GET", "/apis/apps", want{false, "list", "", "", "", "", "", ""}},
		{"GET", "/apis/apps/v1", want{false, "list", "apps", "v1", "", "", "", ""}},
		{"GET", "/version", want{false, "list", "", "", "", "", "", ""}},
		{"GET", "/openapi/v3/apis/apps/v1", want{false, "list", "", "", "", "", "", ""}},
		{"GET", "/healthz", want{false, "list", "", "", "", "", "", ""}},
		{"GET", "/readyz?verbose", want{false, "list", "", "", "", "", "", ""}},
		{"GET", "/api/v1/namespaces/ns/pods/p/proxy/x", want{false, "get", "", "v1", "pods", "proxy", "ns", "p"}},
		{"HEAD", "/api/v1/pods", want{true, "", "", "v1", "pods", "", "", ""}},
		{"OPTIONS", "/api/v1/pods", want{true, "", "", "v1", "pods", "", "", ""}},
	} {
		path, rawQuery, _ := strings.Cut(c.target, "?")
		query, err := url.ParseQuery(rawQuery)
		if err != nil {
			t.Fatal(err)
		}
		ri := ParseRequestInfo(c.method, path, query)
		got := want{ri.ResourceRequest, ri.Verb, ri.Group, ri.Version, ri.Resource, ri.Subresource, ri.Namespace, ri.Name}
		if got != c.want {
			t.Errorf("%s %s: got %+v, want %+v", c.method, c.target, got, c.want)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestFaultSpecs(t *testing.T) {
	for _, c := range []struct{ spec, want string }{
		{`{"rules":[{"verb":"list","resource":"pods","code":429,"retryAfter":3,"count":2}]}`,
			`{"rules":[{"code":429,"count":2,"fired":0,"id":1,"name":"*","namespace":"*","rate":1.0,"resource":"pods","retryAfter":3,"verb":"list"}]}`},
		{`  [{"verb":"watch","cutAfterEvents":0,"namespace":"ns","name":"x","rate":0.25}]`,
			`{"rules":[{"count":-1,"cutAfterEvents":0,"fired":0,"id":1,"midLine":false,"name":"x","namespace":"ns","rate":0.25,"resource":"*","verb":"watch"}]}`},
		{`verb=list,resource=pods,code=500,count=3;verb=watch,resource=*,cutAfterEvents=2,midLine=true`,
			`{"rules":[{"code":500,"count":3,"fired":0,"id":1,"name":"*","namespace":"*","rate":1.0,"resource":"pods","verb":"list"},` +
				`{"count":-1,"cutAfterEvents":2,"fired":0,"id":2,"midLine":true,"name":"*","namespace":"*","rate":1.0,"resource":"*","verb":"watch"}]}`},
		{`;;latencyMs=20,rate=0.5,,;  `,
			`{"rules":[{"count":-1,"fired":0,"id":1,"latencyMs":20,"name":"*","namespace":"*","rate":0.5,"resource":"*","verb":"*"}]}`},
		// Numbers convert as nlohmann converts them: 1e3 is a float, true an int for code's
		// int fields; id and fired are accepted (a GET answer can be posted back) and ignored.
		{`[{"latencyMs":1e3,"code":503.9,"id":7,"fired":4},{"cutAfterEvents":true}]`,
			`{"rules":[{"code":503,"count":-1,"fired":0,"id":1,"latencyMs":1000,"name":"*","namespace":"*","rate":1.0,"resource":"*","verb":"*"},` +
				`{"count":-1,"cutAfterEvents":1,"fired":0,"id":2,"midLine":false,"name":"*","namespace":"*","rate":1.0,"resource":"*","verb":"*"}]}`},
		{``, `{"rules":[]}`},
		{`{"seed":5}`, `{"rules":[]}`},
	} {
		f := NewFaults(1)
		if err := f.Add(c.spec); err != nil {
			t.Errorf("%q: %v", c.spec, err)
			continue
		}
		if got := mustJSON(t, f.JSON()); got != c.want {
			t.Errorf("%q:\n got %s\nwant %s", c.spec, got, c.want)
		}
	}
}

func TestFaultSpecErrors(t *testing.T) {
	const wrongType = "fault spec: a field has the wrong type: [json.exception.type_error.302] type must be "
	for _, c := range []struct{ spec, want string }{
		{`verb=list`, "fault spec: a rule needs code, latencyMs or cutAfterEvents"},
		{`verb=list,code`, `fault spec: "code" is not key=value`},
		{`code=500; verb=list ,x`, `fault spec: "x" is not key=value`},
		{`code=500, verb=list`, `fault spec: unknown field " verb"`},
		{`{"rules":[}`, "fault spec: not valid JSON"},
		{`[{"code":500}] x`, "fault spec: not valid JSON"},
		{`{"rules":3}`, `fault spec: "rules" must be an array`},
		{`{"rules":null}`, `fault spec: "rules" must be an array`},
		{`[1]`, "fault spec: every rule must be an object"},
		{`[{"code":500,"zeta":1,"bogus":2}]`, `fault spec: unknown field "bogus"`},
		{`[{"verb":5,"code":500}]`, wrongType + "string, but is number"},
		{`[{"namespace":null,"code":500}]`, wrongType + "string, but is null"},
		{`[{"code":"500"}]`, wrongType + "number, but is string"},
		{`[{"code":500,"midLine":1}]`, wrongType + "boolean, but is number"},
		{`[{"code":500,"count":true}]`, wrongType + "number, but is boolean"},
		{`[{"code":500,"rate":false}]`, wrongType + "number, but is boolean"},
		{`[{"code":500,"latencyMs":[1]}]`, wrongType + "number, but is array"},
		{`name=123,code=500`, wrongType + "string, but is number"},
		{`code=500,midLine=1`, wrongType + "boolean, but is number"},
		{`[{"code":true}]`, "fault spec: code 1 is not an HTTP error code"},
		{`code=302`, "fault spec: code 302 is not an HTTP error code"},
		{`code=600`, "fault spec: code 600 is not an HTTP error code"},
		{`code=500,rate=1.5`, "fault spec: rate must be in [0,1]"},
		{`code=500,rate=-0.1`, "fault spec: rate must be in [0,1]"},
		{`latencyMs=0`, "fault spec: a rule needs code, latencyMs or cutAfterEvents"},
	} {
		f := NewFaults(1)
		f.Add("code=500") // rule 1: a failed Add leaves the rules as they were
		err := f.Add(c.spec)
		if err == nil || err.Error() != c.want {
			t.Errorf("%q: got %v, want %q", c.spec, err, c.want)
		}
		if n := len(f.JSON()["rules"].([]ruleJSON)); n != 1 {
			t.Errorf("%q: %d rules after a failed Add", c.spec, n)
		}
	}
}

func TestDecideCountsFirstCodeAndLatency(t *testing.T) {
	f := NewFaults(1)
	if err := f.Add(`verb=list,resource=pods,namespace=ns,code=500,count=2;` +
		`verb=*,resource=pods,code=503,count=1;latencyMs=10;resource=pods/status,latencyMs=20,code=409`); err != nil {
		t.Fatal(err)
	}
	var got []string
	for i := 0; i < 3; i++ {
		got = append(got, f.Decide("list", "pods", "ns", "").Describe())
	}
	got = append(got, f.Decide("list", "pods", "other", "").Describe())
	got = append(got, f.Decide("list", "pods", "other", "").Describe())
	got = append(got, f.Decide("update", "pods/status", "ns", "p").Describe())
	got = append(got, f.Decide("get", "configmaps", "ns", "c").Describe())
	want := []string{
		"code=500,latencyMs=10", // rule 2 is not consumed: rule 1 decided the code
		"code=500,latencyMs=10",
		"code=503,latencyMs=10", // rule 1 is used up
		"latencyMs=10",          // rule 2 too
		"latencyMs=10",
		"code=409,latencyMs=30", // latencies add
		"latencyMs=10",
	}
	if strings.Join(got, " | ") != strings.Join(want, " | ") {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	rules := f.JSON()["rules"].([]ruleJSON)
	if rules[0].Count != 0 || rules[0].Fired != 2 || rules[1].Count != 0 || rules[1].Fired != 1 ||
		rules[2].Count != -1 || rules[2].Fired != 7 {
		t.Errorf("counts: %s", mustJSON(t, rules))
	}
	d := f.Decide("list", "pods", "ns", "")
	if d.Code != 0 || d.LatencyMs != 10 || len(d.RuleIDs) != 1 || d.RuleIDs[0] != 3 {
		t.Errorf("decision %+v", d)
	}
}

func TestDecideCuts(t *testing.T) {
	f := NewFaults(1)
	f.Add(`verb=*,cutAfterEvents=2,count=1;verb=watch,cutAfterEvents=0,midLine=true;verb=watch,code=410,retryAfter=9`)
	if d := f.Decide("list", "pods", "", ""); d.Describe() != "" || len(d.RuleIDs) != 0 {
		t.Errorf("a cut fired on a list: %+v", d) // and rule 1 kept its count
	}
	if got := f.Decide("watch", "pods", "", "").Describe(); got != "code=410,cutAfterEvents=2" {
		t.Errorf("first watch: %q", got)
	}
	if got := f.Decide("watch", "pods", "", "").Describe(); got != "code=410,cutAfterEvents=0,midLine" {
		t.Errorf("second watch: %q", got)
	}
	f.Add(`code=429,retryAfter=5`)
	if d := f.Decide("get", "pods", "", "x"); d.Code != 429 || d.RetryAfter != 5 {
		t.Errorf("429: %+v", d)
	}
}

func TestDecideRate(t *testing.T) {
	draws := func(seedSpec string) (int, []bool) {
		f := NewFaults(1)
		if err := f.Add(seedSpec); err != nil {
			t.Fatal(err)
		}
		n, seq := 0, []bool{}
		for i := 0; i < 1000; i++ {
			fired := f.Decide("get", "pods", "ns", "p").Code != 0
			seq = append(seq, fired)
			if fired {
				n++
			}
		}
		return n, seq
	}
	n, a := draws(`{"seed":42,"rules":[{"code":500,"rate":0.3}]}`)
	// Expected 300, standard deviation ~14.5: [200, 400] is ~7 deviations either side.
	if n < 200 || n > 400 {
		t.Errorf("rate 0.3 fired %d times in 1000", n)
	}
	if _, b := draws(`{"seed":42,"rules":[{"code":500,"rate":0.3}]}`); mustJSON(t, a) != mustJSON(t, b) {
		t.Error("the same seed drew differently")
	}
	if _, c := draws(`{"seed":43,"rules":[{"code":500,"rate":0.3}]}`); mustJSON(t, a) == mustJSON(t, c) {
		t.Error("another seed drew the same")
	}
	if n, _ := draws(`code=500,rate=0`); n != 0 {
		t.Errorf("rate 0 fired %d times", n)
	}
	if n, _ := draws(`code=500,rate=0.5,count=10`); n != 10 {
		t.Errorf("count 10 at rate 0.5 fired %d times", n)
	}
}

func TestRequestLog(t *testing.T) {
	l := NewRequestLog(3)
	for i := 0; i < 5; i++ {
		l.Add(RequestRecord{Method: "GET", Path: "/api/v1/pods", Code: 200, Allowed: true})
	}
	seqs := func(since uint64) string {
		var s []string
		for _, r := range l.JSON(since)["requests"].([]recordJSON) {
			s = append(s, mustJSON(t, r.Seq))
		}
		return strings.Join(s, ",")
	}
	if got := seqs(0); got != "3,4,5" {
		t.Errorf("kept %s", got)
	}
	if got := seqs(4); got != "5" {
		t.Errorf("since 4: %s", got)
	}
	if got := seqs(strtoull("-1")); got != "" {
		t.Errorf("since -1: %s", got)
	}
	l.Clear()
	l.Add(RequestRecord{Time: "2026-01-02T03:04:05.678Z", Method: "PUT", Verb: "update",
		Path: "/api/v1/namespaces/ns/pods/p/status", Query: "a=b", Resource: "pods", Version: "v1",
		Subresource: "status", Namespace: "ns", Name: "p", Code: 409, Fault: "code=409",
		UserAgent: "ua", DurationMs: 2, User: "u", Allowed: true})
	l.Add(RequestRecord{Method: "GET", Path: "/version", Code: 200, DurationMs: 0.25})
	got := mustJSON(t, l.JSON(0))
	want := `{"requests":[{"allowed":true,"code":409,"durationMs":2.0,"fault":"code=409","group":"",` +
		`"method":"PUT","name":"p","namespace":"ns","path":"/api/v1/namespaces/ns/pods/p/status","query":"a=b",` +
		`"resource":"pods","seq":6,"subresource":"status","time":"2026-01-02T03:04:05.678Z","user":"u",` +
		`"userAgent":"ua","verb":"update","version":"v1"},`
	if !strings.HasPrefix(got, want) || !strings.Contains(got, `"durationMs":0.25,"method":"GET","path":"/version","query":"","seq":7,`) {
		t.Errorf("got  %s\nwant %s...", got, want)
	}
}

func TestStrtoull(t *testing.T) {
	for in, want := range map[string]uint64{"": 0, "12": 12, " 7x": 7, "x": 0, "+3": 3,
		"-1": ^uint64(0), "99999999999999999999999": ^uint64(0)} {
		if got := strtoull(in); got != want {
			t.Errorf("strtoull(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestKubeconfigs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pki := writeTestPKI(t, dir, "spawnpoint-admin")
	write("tok", "abc.def\n")
	for _, c := range []struct{ name, content, server, user, token, ns string }{
		// As scripts/cluster.sh writes them: flow mappings, quoted absolute paths.
		{"flow", clusterShKubeconfig("https://127.0.0.1:6443", pki), "https://127.0.0.1:6443", "spawnpoint-admin", "", "default"},
		// As kubectl writes them: block style, relative paths, comments, a token file.
		{"block", `# written by kubectl
apiVersion: v1
clusters:
-   cluster:
        certificate-authority: ca.crt   # relative to the kubeconfig
        server: 'https://localhost:1234/prefix'
    name: c
contexts:
- context:
    cluster: c
    user: u
  name: other
- context:
    cluster: c
    user: u
  name: "mine"
current-context: mine
users:
- name: u
  user:
    tokenFile: tok
preferences: {}
`, "https://localhost:1234/prefix", "", "abc.def", ""},
		{"json", `{"clusters":[{"name":"c","cluster":{"server":"http://127.0.0.1:8080"}}],
"users":[{"name":"u","user":{"token":"t0k"}}],
"contexts":[{"name":"x","context":{"cluster":"c","user":"u","namespace":"n s"}}],"current-context":"x"}`,
			"http://127.0.0.1:8080", "", "t0k", "n s"},
	} {
		up, err := LoadUpstream(write(c.name, c.content))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if up.Server.String() != c.server || up.User != c.user || up.Token != c.token || up.Namespace != c.ns {
			t.Errorf("%s: server %s user %q token %q namespace %q", c.name, up.Server, up.User, up.Token, up.Namespace)
		}
		if (c.name == "flow") != (up.Certificate != nil) || (c.name != "json") != (up.RootCAs != nil) {
			t.Errorf("%s: certificate %v, CA %v", c.name, up.Certificate != nil, up.RootCAs != nil)
		}
	}
	_, err := LoadUpstream(write("exec", `clusters: [{name: c, cluster: {server: "https://x"}}]
users:
- name: u
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: aws
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`))
	if _, ok := err.(unsupportedError); !ok || !strings.Contains(err.Error(), `user "u" uses exec`) {
		t.Errorf("exec: %v", err)
	}
	if _, err := LoadUpstream(write("nocontext", "clusters: []\n")); err == nil ||
		!strings.Contains(err.Error(), "no current-context") {
		t.Errorf("no context: %v", err)
	}
	want := "apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: http://127.0.0.1:5\n" +
		"users:\n- name: proxy\n  user: {}\ncontexts:\n- name: proxy\n  context:\n    cluster: proxy\n    user: proxy\n" +
		"    namespace: \"default\"\ncurrent-context: proxy\npreferences: {}\n"
	if got := proxyKubeconfig("http://127.0.0.1:5", "default"); got != want {
		t.Errorf("proxy kubeconfig:\n%s", got)
	}
	doc, err := parseYAML(want)
	if err != nil || mustJSON(t, doc) != `{"apiVersion":"v1","clusters":[{"cluster":{"server":"http://127.0.0.1:5"},"name":"proxy"}],`+
		`"contexts":[{"context":{"cluster":"proxy","namespace":"default","user":"proxy"},"name":"proxy"}],`+
		`"current-context":"proxy","kind":"Config","preferences":{},"users":[{"name":"proxy","user":{}}]}` {
		t.Errorf("reading it back: %s %v", mustJSON(t, doc), err)
	}
}
