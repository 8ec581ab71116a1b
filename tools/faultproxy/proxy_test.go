package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

type testPKI struct{ ca, cert, key string }

// writeTestPKI writes a self-signed client certificate for CN (also as ca.crt) into dir.
// clusterShKubeconfig is an admin kubeconfig as scripts/cluster.sh writes it: flow
// mappings, quoted absolute paths.
func clusterShKubeconfig(server string, pki testPKI) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: spawnpoint-test
  cluster: {server: "%s", certificate-authority: "%s"}
users:
- name: admin
  user: {client-certificate: "%s", client-key: "%s"}
contexts:
- name: admin
  context: {cluster: spawnpoint-test, user: admin, namespace: default}
current-context: admin
`, server, pki.ca, pki.cert, pki.key)
}

func writeTestPKI(t *testing.T, dir, cn string) testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn,
		Organization: []string{"system:masters"}}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	p := testPKI{filepath.Join(dir, "ca.crt"), filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	for path, data := range map[string][]byte{p.ca: certPEM, p.cert: certPEM,
		p.key: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// seen is what the fake upstream saw of one request.
type seen struct {
	Method, Path, Query, Body, ContentType, Authorization, CertCN string
	Certs                                                         int
}

// fakeUpstream stands in for kube-apiserver: it echoes what it saw as JSON, streams
// `watchLines` to a watch (then holds the stream open), and answers 403 for /forbidden.
type fakeUpstream struct {
	srv        *httptest.Server
	mu         sync.Mutex
	requests   []seen
	watchLines []string
	watchEnds  chan struct{} // closed: a watch stream ends after its lines
}

func (u *fakeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s := seen{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: string(body),
		ContentType: r.Header.Get("Content-Type"), Authorization: r.Header.Get("Authorization"),
		Certs: len(r.TLS.PeerCertificates)}
	if s.Certs > 0 {
		s.CertCN = r.TLS.PeerCertificates[0].Subject.CommonName
	}
	u.mu.Lock()
	u.requests = append(u.requests, s)
	lines, ends := u.watchLines, u.watchEnds
	u.mu.Unlock()
	if strings.HasSuffix(r.URL.Path, "/forbidden") {
		w.WriteHeader(http.StatusForbidden)
		return
	}
	if r.URL.Query().Get("watch") == "true" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for _, l := range lines {
			io.WriteString(w, l+"\n")
			w.(http.Flusher).Flush()
		}
		select {
		case <-r.Context().Done():
		case <-ends:
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Upstream", "yes")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(s)
}

func (u *fakeUpstream) seen() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.requests...)
}

// startProxy: the fake upstream over TLS (asking for, not requiring, a client certificate)
// and the proxy in front of it, configured by a kubeconfig as scripts/cluster.sh writes it.
func startProxy(t *testing.T) (*fakeUpstream, *Proxy, string) {
	t.Helper()
	u := &fakeUpstream{watchEnds: make(chan struct{})}
	u.srv = httptest.NewUnstartedServer(u)
	u.srv.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	u.srv.StartTLS()
	t.Cleanup(u.srv.Close)
	dir := t.TempDir()
	pki := writeTestPKI(t, dir, "test-admin")
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.srv.Certificate().Raw})
	if err := os.WriteFile(pki.ca, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	kc := clusterShKubeconfig(u.srv.URL, pki)
	path := filepath.Join(dir, "admin.kubeconfig")
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	up, err := LoadUpstream(path)
	if err != nil {
		t.Fatal(err)
	}
	streams, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p := NewProxy(up, NewFaults(1), streams, log.New(io.Discard, "", 0))
	ps := httptest.NewServer(p)
	t.Cleanup(ps.Close)
	return u, p, ps.URL
}

var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 20 * time.Second}

// logged waits (5 s at most) until the proxy's log holds n records, and returns them. A
// request is logged once its answer is written, so the log may trail the client's return.
func logged(t *testing.T, p *Proxy, n int) []recordJSON {
	t.Helper()
	var recs []recordJSON
	for deadline := time.Now().Add(5 * time.Second); ; {
		recs = p.Log.JSON(0)["requests"].([]recordJSON)
		if len(recs) >= n || time.Now().After(deadline) {
			return recs
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func call(t *testing.T, method, url, body string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading: %v", method, url, err)
	}
	return resp, string(b)
}

func addFaults(t *testing.T, base, spec string) {
	t.Helper()
	if resp, body := call(t, "POST", base+"/testing/faults", spec); resp.StatusCode != 200 {
		t.Fatalf("adding %s: %d %s", spec, resp.StatusCode, body)
	}
}

func TestForwardsRequestsIntact(t *testing.T) {
	u, _, base := startProxy(t)
	body := "\x6b\x38\x73\x00 protobuf \xff bytes"
	resp, got := call(t, "POST", base+"/api/v1/namespaces/ns/configmaps?fieldManager=m&dryRun=All&x=a%2Fb",
		body, "Content-Type", "application/vnd.kubernetes.protobuf")
	if resp.StatusCode != 201 || resp.Header.Get("X-Upstream") != "yes" {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
	if !strings.Contains(got, `"Method":"POST"`) {
		t.Errorf("the upstream's body: %s", got)
	}
	s := u.seen()[0] // the raw bytes (the echo would mangle the invalid UTF-8)
	want := seen{Method: "POST", Path: "/api/v1/namespaces/ns/configmaps", Query: "fieldManager=m&dryRun=All&x=a%2Fb",
		Body: body, ContentType: "application/vnd.kubernetes.protobuf", Certs: 1, CertCN: "test-admin"}
	if s != want {
		t.Errorf("upstream saw %+v\nwant %+v", s, want)
	}
	resp, got = call(t, "PATCH", base+"/apis/apps/v1/namespaces/ns/deployments/d?fieldManager=kubectl", "a: b\n",
		"Content-Type", "application/apply-patch+yaml")
	if resp.StatusCode != 201 || !strings.Contains(got, `"Body":"a: b\n"`) || !strings.Contains(got, "apply-patch+yaml") {
		t.Errorf("apply patch: %d %s", resp.StatusCode, got)
	}
}

func TestInjectedCodes(t *testing.T) {
	u, _, base := startProxy(t)
	addFaults(t, base, "verb=list,resource=configmaps,code=429,retryAfter=7,count=1;"+
		"verb=update,resource=configmaps,code=409;verb=update,resource=deployments,code=409;"+
		"verb=get,resource=pods/status,code=503;verb=delete,code=500;verb=create,code=410")
	resp, body := call(t, "GET", base+"/api/v1/namespaces/ns/configmaps", "")
	wantBody := `{"apiVersion":"v1","code":429,"details":{"retryAfterSeconds":7},"kind":"Status",` +
		`"message":"Too many requests, please try again later.","metadata":{},"reason":"TooManyRequests","status":"Failure"}` + "\n"
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "7" || body != wantBody ||
		resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("429: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if len(u.seen()) != 0 {
		t.Errorf("a faulted request reached the upstream: %+v", u.seen())
	}
	if resp, _ := call(t, "GET", base+"/api/v1/namespaces/ns/configmaps", ""); resp.StatusCode != 201 {
		t.Errorf("after the count: %d", resp.StatusCode)
	}
	for _, c := range []struct {
		method, path string
		code         int
		want         string
	}{
		{"PUT", "/api/v1/namespaces/ns/configmaps/cm", 409, `{"apiVersion":"v1","code":409,"details":{"kind":"configmaps","name":"cm"},` +
			`"kind":"Status","message":"Operation cannot be fulfilled on configmaps \"cm\": the object has been modified; ` +
			`please apply your changes to the latest version and try again","metadata":{},"reason":"Conflict","status":"Failure"}`},
		{"PUT", "/apis/apps/v1/namespaces/ns/deployments/d", 409, `"details":{"group":"apps","kind":"deployments","name":"d"},` +
			`"kind":"Status","message":"Operation cannot be fulfilled on deployments.apps \"d\": the object`},
		{"GET", "/api/v1/namespaces/ns/pods/p/status", 503, `{"apiVersion":"v1","code":503,"kind":"Status",` +
			`"message":"injected fault: HTTP 503","metadata":{},"reason":"ServiceUnavailable","status":"Failure"}`},
		{"DELETE", "/api/v1/namespaces/ns/pods/p", 500, `"details":{"causes":[{"message":"injected fault"}]},"kind":"Status",` +
			`"message":"Internal error occurred: injected fault","metadata":{},"reason":"InternalError"`},
		{"POST", "/api/v1/namespaces/ns/pods", 410, `"message":"the resource version requested is too old (injected)","metadata":{},"reason":"Expired"`},
	} {
		resp, body := call(t, c.method, base+c.path, "{}")
		if resp.StatusCode != c.code || !strings.Contains(body, c.want) {
			t.Errorf("%s %s: %d %s\nwant %s", c.method, c.path, resp.StatusCode, body, c.want)
		}
	}
	// Non-resource paths are never faulted.
	addFaults(t, base, "code=500")
	if resp, _ := call(t, "GET", base+"/version", ""); resp.StatusCode != 201 {
		t.Errorf("/version: %d", resp.StatusCode)
	}
}

func TestLatency(t *testing.T) {
	_, _, base := startProxy(t)
	addFaults(t, base, "verb=get,latencyMs=150")
	start := time.Now()
	if resp, _ := call(t, "GET", base+"/api/v1/namespaces/ns/configmaps/c", ""); resp.StatusCode != 201 {
		t.Errorf("status %d", resp.StatusCode)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("answered after %v", d)
	}
}

func event(typ, name string) string {
	return fmt.Sprintf(`{"type":%q,"object":{"kind":"ConfigMap","metadata":{"name":%q,"resourceVersion":"7"}}}`, typ, name)
}

// readWatch reads lines until the stream ends; err is how it ended (nil: cleanly).
func readWatch(t *testing.T, url string) (lines []string, err error) {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("watch: status %d", resp.StatusCode)
	}
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if line != "" {
			lines = append(lines, strings.TrimSuffix(line, "\n"))
		}
		if err == io.EOF {
			return lines, nil
		}
		if err != nil {
			return lines, err
		}
	}
}

const watchPath = "/api/v1/namespaces/ns/configmaps?watch=true&resourceVersion=5"

func TestWatchCutAfterEventsBookmarksUncounted(t *testing.T) {
	u, p, base := startProxy(t)
	u.watchLines = []string{event("ADDED", "a"), event("BOOKMARK", ""), event("ADDED", "b"), event("MODIFIED", "c")}
	addFaults(t, base, "verb=watch,resource=configmaps,cutAfterEvents=2,count=1")
	lines, err := readWatch(t, base+watchPath)
	want := []string{event("ADDED", "a"), event("BOOKMARK", ""), event("ADDED", "b")}
	if err == nil || strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("got %q (end: %v), want %q cut", lines, err, want)
	}
	// The rule is used up: the next watch runs to the upstream's end of the stream.
	close(u.watchEnds)
	lines, err = readWatch(t, base+watchPath)
	if err != nil || len(lines) != 4 {
		t.Errorf("uncut watch: %q %v", lines, err)
	}
	recs := logged(t, p, 2)
	if len(recs) != 2 || recs[0].Verb != "watch" || recs[0].Code != 200 || recs[0].Fault != "cutAfterEvents=2" || recs[1].Fault != "" {
		t.Errorf("log: %s", mustJSON(t, recs))
	}
	addFaults(t, base, "verb=watch,cutAfterEvents=0")
	if lines, err := readWatch(t, base+watchPath); err == nil || len(lines) != 0 {
		t.Errorf("cutAfterEvents=0: %q %v", lines, err)
	}
}

func TestWatchMidLineCut(t *testing.T) {
	u, _, base := startProxy(t)
	u.watchLines = []string{event("ADDED", "a"), event("BOOKMARK", ""), event("ADDED", "second")}
	addFaults(t, base, "verb=watch,cutAfterEvents=1,midLine=true")
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: proxy\r\n\r\n", watchPath)
	conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	raw, err := io.ReadAll(conn) // until the proxy closes the connection
	if err != nil {
		t.Fatalf("reading: %v (got %q)", err, raw)
	}
	head, chunks, ok := strings.Cut(string(raw), "\r\n\r\n")
	if !ok || !strings.HasPrefix(head, "HTTP/1.1 200 OK\r\n") || !strings.Contains(head, "Transfer-Encoding: chunked") {
		t.Fatalf("head %q", head)
	}
	first, bookmark, last := event("ADDED", "a")+"\n", event("BOOKMARK", "")+"\n", event("ADDED", "second")+"\n"
	want := fmt.Sprintf("%x\r\n%s\r\n%x\r\n%s\r\n%x\r\n%s", len(first), first, len(bookmark), bookmark,
		len(last), last[:len(last)/2])
	if chunks != want {
		t.Errorf("chunks\n got %q\nwant %q", chunks, want)
	}
}

func TestWatchGoneIsAnErrorEvent(t *testing.T) {
	u, p, base := startProxy(t)
	addFaults(t, base, "verb=watch,code=410,cutAfterEvents=1")
	resp, err := client.Get(base + watchPath)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := `{"object":{"apiVersion":"v1","code":410,"kind":"Status","message":"too old resource version: 5 (injected)",` +
		`"metadata":{},"reason":"Expired","status":"Failure"},"type":"ERROR"}` + "\n"
	if err != nil || resp.StatusCode != 200 || string(body) != want || len(resp.TransferEncoding) == 0 {
		t.Errorf("%d %v %q (%v)", resp.StatusCode, resp.TransferEncoding, body, err)
	}
	if len(u.seen()) != 0 {
		t.Errorf("the upstream was asked: %+v", u.seen())
	}
	if recs := logged(t, p, 1); len(recs) != 1 || recs[0].Code != 200 ||
		recs[0].Fault != "code=410,cutAfterEvents=1" {
		t.Errorf("log: %s", mustJSON(t, recs))
	}
	// A Table watch (kubectl get -w) gets the Table content type, as from the imitation.
	req, _ := http.NewRequest("GET", base+watchPath, nil)
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != tableContentType {
		t.Errorf("content type %q", ct)
	}
}

func TestRequestLogAndTestingEndpoints(t *testing.T) {
	u, _, base := startProxy(t)
	call(t, "GET", base+"/api/v1/namespaces/ns/configmaps?limit=5", "", "User-Agent", "ua/1")
	// A request is logged once its answer is written, so the log may trail the client's
	// return by a moment: poll, with a deadline.
	var log1 string
	var l struct{ Requests []map[string]any }
	for deadline := time.Now().Add(5 * time.Second); ; {
		_, log1 = call(t, "GET", base+"/testing/requests", "")
		l.Requests = nil
		json.Unmarshal([]byte(log1), &l)
		if len(l.Requests) >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(l.Requests) != 1 {
		t.Fatalf("log %s", log1)
	}
	r := l.Requests[0]
	for k, v := range map[string]any{"seq": 1.0, "method": "GET", "verb": "list", "path": "/api/v1/namespaces/ns/configmaps",
		"query": "limit=5", "group": "", "version": "v1", "resource": "configmaps", "namespace": "ns", "code": 201.0,
		"userAgent": "ua/1", "user": "test-admin", "allowed": true} {
		if r[k] != v {
			t.Errorf("%s: %v, want %v (%s)", k, r[k], v, log1)
		}
	}
	if _, err := time.Parse("2006-01-02T15:04:05.000Z", r["time"].(string)); err != nil || r["durationMs"] == nil {
		t.Errorf("time %v, durationMs %v", r["time"], r["durationMs"])
	}
	for _, k := range []string{"fault", "name", "subresource", "reason"} {
		if _, ok := r[k]; ok {
			t.Errorf("%s present: %s", k, log1)
		}
	}
	call(t, "GET", base+"/api/v1/namespaces/ns/forbidden", "")
	call(t, "GET", base+"/testing/faults", "") // /testing is not logged
	var log2 string
	for deadline := time.Now().Add(5 * time.Second); ; {
		_, log2 = call(t, "GET", base+"/testing/requests?since=1", "")
		if strings.Contains(log2, `"seq":2,`) || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !strings.Contains(log2, `"allowed":false,"code":403,`) || !strings.Contains(log2, `"seq":2,`) || strings.Contains(log2, `"seq":1,`) {
		t.Errorf("since=1: %s", log2)
	}
	// A watch is logged when its stream starts.
	done := make(chan struct{})
	go func() { defer close(done); readWatch(t, base+watchPath) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, l := call(t, "GET", base+"/testing/requests?since=2", ""); strings.Contains(l, `"verb":"watch"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch is not in the log while it streams")
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(u.watchEnds)
	<-done
	if resp, body := call(t, "DELETE", base+"/testing/requests", ""); resp.StatusCode != 200 || body != `{"requests":[]}`+"\n" {
		t.Errorf("DELETE: %d %s", resp.StatusCode, body)
	}
	call(t, "GET", base+"/version", "")
	if _, l := call(t, "GET", base+"/testing/requests", ""); !strings.Contains(l, `"seq":4,`) || strings.Contains(l, `"verb":"list"`) {
		t.Errorf("after DELETE: %s", l)
	}

	resp, body := call(t, "POST", base+"/testing/faults", "verb=list")
	if resp.StatusCode != 400 || body != `{"apiVersion":"v1","code":400,"kind":"Status","message":"fault spec: a rule needs code, `+
		`latencyMs or cutAfterEvents","metadata":{},"reason":"BadRequest","status":"Failure"}`+"\n" {
		t.Errorf("bad spec: %d %s", resp.StatusCode, body)
	}
	addFaults(t, base, `{"rules":[{"code":500}]}`)
	resp, body = call(t, "PUT", base+"/testing/faults", "latencyMs=5")
	if resp.StatusCode != 200 || !strings.Contains(body, `"id":2,"latencyMs":5`) || strings.Contains(body, `"id":1`) {
		t.Errorf("PUT: %d %s", resp.StatusCode, body)
	}
	if resp, body = call(t, "DELETE", base+"/testing/faults", ""); body != `{"rules":[]}`+"\n" {
		t.Errorf("DELETE: %s", body)
	}
	if resp, body = call(t, "PATCH", base+"/testing/faults", ""); resp.StatusCode != 405 || body != "method not allowed\n" {
		t.Errorf("PATCH: %d %s", resp.StatusCode, body)
	}
	if resp, body = call(t, "POST", base+"/testing/compact", ""); resp.StatusCode != 404 {
		t.Errorf("/testing/compact: %d %s", resp.StatusCode, body)
	}
}

func TestAuthorizationHeaderGoesWithoutClientCertificate(t *testing.T) {
	u, p, base := startProxy(t)
	enc := base64.RawURLEncoding.EncodeToString
	jwt := enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(`{"sub":"system:serviceaccount:ns:sa"}`)) + ".sig"
	call(t, "GET", base+"/api/v1/namespaces/ns/pods", "", "Authorization", "Bearer "+jwt)
	call(t, "GET", base+"/api/v1/namespaces/ns/pods", "")
	call(t, "GET", base+"/api/v1/namespaces/ns/pods", "", "Authorization", "Bearer opaque")
	got := u.seen()
	if len(got) != 3 || got[0].Certs != 0 || got[0].Authorization != "Bearer "+jwt ||
		got[1].Certs != 1 || got[1].CertCN != "test-admin" || got[1].Authorization != "" || got[2].Certs != 0 {
		t.Errorf("upstream saw %+v", got)
	}
	recs := logged(t, p, 3)
	if len(recs) != 3 || recs[0].User != "system:serviceaccount:ns:sa" || recs[1].User != "test-admin" || recs[2].User != "" {
		t.Errorf("users: %s", mustJSON(t, recs))
	}
}
