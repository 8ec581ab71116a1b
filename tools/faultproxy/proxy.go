// The proxy: /testing/faults and /testing/requests as the imitation API server (deleted,
// issue 23) served them, and everything else forwarded to the
// upstream kube-apiserver after the fault rules had their say.
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Proxy is the http.Handler of kube-fault-proxy.
type Proxy struct {
	up       *Upstream
	withCert http.RoundTripper // the upstream kubeconfig's credentials
	noCert   http.RoundTripper // for requests that bring their own Authorization
	Faults   *Faults
	Log      *RequestLog
	rp       *httputil.ReverseProxy
	streams  context.Context // canceled at shutdown: ends the watches
	Verbose  io.Writer       // a line per request when set
	errLog   *log.Logger
}

type exchangeKey struct{}

// exchange is one proxied request on its way: its record and what became of it.
type exchange struct {
	p       *Proxy
	w       http.ResponseWriter
	rec     RequestRecord
	start   time.Time
	watch   bool
	ownAuth bool // the client sent an Authorization header
	fault   FaultDecision
	cancel  context.CancelFunc
	mu      sync.Mutex
	code    int
	logged  bool
}

// done records the request (once), before the answer's body is written: `code` is what the
// client is answered, DurationMs the time until then.
func (x *exchange) done(code int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.logged {
		return
	}
	x.logged = true
	x.rec.Code = code
	x.rec.Allowed = code != http.StatusUnauthorized && code != http.StatusForbidden
	x.rec.DurationMs = float64(time.Since(x.start).Microseconds()) / 1000
	if x.p.Verbose != nil {
		fmt.Fprintln(x.p.Verbose, formatLog(&x.rec))
	}
	x.p.Log.Add(x.rec)
}

func formatLog(r *RequestRecord) string {
	q := func(s string) string { // as json(s).dump(): no HTML escaping
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s)
		return strings.TrimSuffix(b.String(), "\n")
	}
	line := "level=info msg=request method=" + r.Method + " path=" + r.Path
	if r.Query != "" {
		line += " query=" + q(r.Query)
	}
	if r.Verb != "" {
		line += " verb=" + r.Verb
	}
	line += fmt.Sprintf(" code=%d user=%s allowed=%t ms=%.1f", r.Code, q(r.User), r.Allowed, r.DurationMs)
	if r.Fault != "" {
		line += " fault=" + r.Fault
	}
	return line
}

var errTakenOver = errors.New("the response was written by the watch cutter")

// NewProxy forwards to `up`; `streams` ends the watches when it is done.
func NewProxy(up *Upstream, faults *Faults, streams context.Context, errLog *log.Logger) *Proxy {
	p := &Proxy{up: up, Faults: faults, Log: NewRequestLog(100000), streams: streams, errLog: errLog}
	p.withCert = newTransport(up.TLSConfig(true))
	p.noCert = newTransport(up.TLSConfig(false))
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up.Server)
			// The query as sent (ReverseProxy would re-encode it, reordered, under go 1.22's
			// urlmaxqueryparams default).
			pr.Out.URL.RawQuery = joinQuery(up.Server.RawQuery, pr.In.URL.RawQuery)
			if pr.In.Header.Get("Authorization") == "" && up.Token != "" {
				pr.Out.Header.Set("Authorization", "Bearer "+up.Token)
			}
		},
		Transport:      roundTripFunc(p.roundTrip),
		FlushInterval:  -1,
		ErrorLog:       log.New(io.Discard, "", 0),
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
	}
	return p
}

func joinQuery(a, b string) string {
	if a == "" || b == "" {
		return a + b
	}
	return a + "&" + b
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// roundTrip: a request that brought its own Authorization goes without the client
// certificate, so the upstream authenticates its token's user.
func (p *Proxy) roundTrip(r *http.Request) (*http.Response, error) {
	if x, ok := r.Context().Value(exchangeKey{}).(*exchange); ok && x.ownAuth {
		return p.noCert.RoundTrip(r)
	}
	return p.withCert.RoundTrip(r)
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/testing/") {
		p.serveTesting(w, r)
		return
	}
	start := time.Now()
	query := r.URL.Query()
	ri := ParseRequestInfo(r.Method, r.URL.Path, query)
	x := &exchange{p: p, w: w, start: start, watch: ri.ResourceRequest && ri.Verb == "watch",
		ownAuth: r.Header.Get("Authorization") != "", fault: FaultDecision{CutAfterEvents: -1}}
	x.rec = RequestRecord{Time: nowMillis(start), Method: r.Method, Path: r.URL.Path,
		Query: r.URL.RawQuery, UserAgent: r.Header.Get("User-Agent"), User: p.userOf(r),
		Group: ri.Group, Version: ri.Version, Resource: ri.Resource, Subresource: ri.Subresource,
		Namespace: ri.Namespace, Name: ri.Name}
	if ri.ResourceRequest {
		x.rec.Verb = ri.Verb
	}
	defer func() {
		x.mu.Lock()
		code := x.code
		x.mu.Unlock()
		if code == 0 {
			code = http.StatusBadGateway
		}
		x.done(code) // a no-op unless the upstream never answered (then 502)
	}()
	if ri.ResourceRequest && ri.Verb != "" { // non-resource paths are never faulted
		resource := ri.Resource
		if ri.Subresource != "" {
			resource += "/" + ri.Subresource
		}
		x.fault = p.Faults.Decide(ri.Verb, resource, ri.Namespace, ri.Name)
		x.rec.Fault = x.fault.Describe()
	}
	if x.fault.LatencyMs > 0 {
		t := time.NewTimer(time.Duration(x.fault.LatencyMs) * time.Millisecond)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
	}
	if code := x.fault.Code; code != 0 {
		if x.watch && code == http.StatusGone {
			// Like the real server: a 200 stream carrying one ERROR event, then the end.
			x.setCode(http.StatusOK)
			x.done(http.StatusOK)
			writeGoneEvent(w, r, lastValue(query, "resourceVersion"))
			return
		}
		x.setCode(code)
		x.done(code)
		sendStatus(w, faultError(x.fault, ri))
		return
	}
	ctx, cancel := context.WithCancel(context.WithValue(r.Context(), exchangeKey{}, x))
	defer cancel()
	x.cancel = cancel
	if x.watch {
		defer context.AfterFunc(p.streams, cancel)()
	}
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

func (x *exchange) setCode(code int) {
	x.mu.Lock()
	x.code = code
	x.mu.Unlock()
}

// modifyResponse sees the upstream's status and headers: the request is logged now, before
// its body reaches the client (so a client holding its answer finds it in the log, and a
// watch is there while it streams, as the imitation logs it), and a watch to cut is taken
// over.
func (p *Proxy) modifyResponse(res *http.Response) error {
	x, ok := res.Request.Context().Value(exchangeKey{}).(*exchange)
	if !ok {
		return nil
	}
	x.setCode(res.StatusCode)
	x.done(res.StatusCode)
	if !x.watch {
		return nil
	}
	if x.fault.CutAfterEvents >= 0 && res.StatusCode == http.StatusOK {
		if err := cutWatch(x, res); err != nil {
			p.errLog.Printf("cutting the watch %s: %v", x.rec.Path, err)
		}
		return errTakenOver
	}
	return nil
}

func (p *Proxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errTakenOver) {
		return
	}
	if x, ok := r.Context().Value(exchangeKey{}).(*exchange); ok {
		x.setCode(http.StatusBadGateway)
	}
	if r.Context().Err() == nil {
		p.errLog.Printf("%s %s: %v", r.Method, r.URL.Path, err)
	}
	sendStatus(w, apiError{code: http.StatusBadGateway, reason: "InternalError",
		message: "kube-fault-proxy: the upstream API server did not answer: " + err.Error()})
}

// userOf is the user the upstream sees: an impersonated one, the `sub` of a bearer JWT,
// or for a request without Authorization the upstream kubeconfig's user.
func (p *Proxy) userOf(r *http.Request) string {
	if u := r.Header.Get("Impersonate-User"); u != "" {
		return u
	}
	auth := r.Header.Get("Authorization")
	if auth == "" {
		return p.up.User
	}
	scheme, token, ok := strings.Cut(strings.TrimSpace(auth), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return ""
	}
	return jwtSubject(strings.TrimSpace(token))
}

// jwtSubject is the `sub` claim of a JWT's payload, not verified; "" if it is no JWT.
func jwtSubject(token string) string {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return ""
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return ""
	}
	var claims struct {
		Sub string `json:"sub"`
	}
	if json.Unmarshal(payload, &claims) != nil {
		return ""
	}
	return claims.Sub
}

// apiError is a Kubernetes `Status` failure, shaped as kube-apiserver makes it.
type apiError struct {
	code    int
	reason  string
	message string
	details map[string]any // nil: none
}

func (e apiError) status() map[string]any {
	s := map[string]any{"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": e.message, "reason": e.reason, "code": e.code}
	if e.details != nil {
		s["details"] = e.details
	}
	return s
}

func sendStatus(w http.ResponseWriter, e apiError) {
	if ra, ok := e.details["retryAfterSeconds"].(int); ok && e.code == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", strconv.Itoa(ra))
	}
	sendJSON(w, e.code, e.status())
}

// sendJSON writes the body as nlohmann's dump() does (no HTML escaping) and a newline.
func sendJSON(w http.ResponseWriter, code int, body any) {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(body); err != nil {
		code, b = http.StatusInternalServerError, strings.Builder{}
		fmt.Fprintf(&b, "{\"error\":%q}\n", err.Error())
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(code)
	io.WriteString(w, b.String())
}

func resourceDetails(group, plural, name string) map[string]any {
	d := map[string]any{"kind": plural}
	if name != "" {
		d["name"] = name
	}
	if group != "" {
		d["group"] = group
	}
	return d
}

// faultError is the error an injected code answers with (api_server.cc, HandleResource).
func faultError(d FaultDecision, ri RequestInfo) apiError {
	switch d.Code {
	case http.StatusTooManyRequests:
		return apiError{d.Code, "TooManyRequests", "Too many requests, please try again later.",
			map[string]any{"retryAfterSeconds": d.RetryAfter}}
	case http.StatusConflict:
		qualified := ri.Resource
		if ri.Group != "" {
			qualified += "." + ri.Group
		}
		return apiError{d.Code, "Conflict", "Operation cannot be fulfilled on " + qualified + " \"" +
			ri.Name + "\": the object has been modified; please apply your changes to the latest " +
			"version and try again", resourceDetails(ri.Group, ri.Resource, ri.Name)}
	case http.StatusGone:
		return apiError{d.Code, "Expired", "the resource version requested is too old (injected)", nil}
	case http.StatusInternalServerError:
		return apiError{d.Code, "InternalError", "Internal error occurred: injected fault",
			map[string]any{"causes": []any{map[string]any{"message": "injected fault"}}}}
	}
	reason := "InternalError"
	if d.Code == http.StatusServiceUnavailable {
		reason = "ServiceUnavailable"
	}
	return apiError{d.Code, reason, "injected fault: HTTP " + strconv.Itoa(d.Code), nil}
}

const tableContentType = "application/json;as=Table;v=v1;g=meta.k8s.io"

// writeGoneEvent answers a watch the way the real server reports a too old
// resourceVersion: HTTP 200, one ERROR event carrying a 410 Expired Status, the end.
func writeGoneEvent(w http.ResponseWriter, r *http.Request, rv string) {
	ct := "application/json"
	if strings.Contains(strings.Join(r.Header.Values("Accept"), ","), "as=Table") {
		ct = tableContentType
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush() // the stream is chunked, like a watch
	st := apiError{code: http.StatusGone, reason: "Expired",
		message: "too old resource version: " + rv + " (injected)"}.status()
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(map[string]any{"type": "ERROR", "object": st})
	io.WriteString(w, b.String())
	_ = rc.Flush()
}

// serveTesting: the test-only endpoints (never logged, never faulted, no credentials).
func (p *Proxy) serveTesting(w http.ResponseWriter, r *http.Request) {
	notAllowed := func() {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusMethodNotAllowed)
		io.WriteString(w, "method not allowed\n")
	}
	switch r.URL.Path {
	case "/testing/faults":
		switch r.Method {
		case http.MethodGet:
			sendJSON(w, http.StatusOK, p.Faults.JSON())
		case http.MethodPost, http.MethodPut:
			body, err := io.ReadAll(r.Body)
			if err != nil {
				sendStatus(w, apiError{code: 400, reason: "BadRequest", message: "reading the body: " + err.Error()})
				return
			}
			if r.Method == http.MethodPut {
				p.Faults.Clear()
			}
			if err := p.Faults.Add(string(body)); err != nil {
				sendStatus(w, apiError{code: 400, reason: "BadRequest", message: err.Error()})
				return
			}
			sendJSON(w, http.StatusOK, p.Faults.JSON())
		case http.MethodDelete:
			p.Faults.Clear()
			sendJSON(w, http.StatusOK, p.Faults.JSON())
		default:
			notAllowed()
		}
	case "/testing/requests":
		switch r.Method {
		case http.MethodGet:
			var since uint64
			if q := r.URL.Query(); q.Has("since") {
				since = strtoull(lastValue(q, "since"))
			}
			sendJSON(w, http.StatusOK, p.Log.JSON(since))
		case http.MethodDelete:
			p.Log.Clear()
			sendJSON(w, http.StatusOK, p.Log.JSON(0))
		default:
			notAllowed()
		}
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, "404 page not found\n")
	}
}

// strtoull as C reads a base-10 number: leading space, a sign, the digits that follow
// (none: 0); a negative value wraps, an overflow saturates.
func strtoull(s string) uint64 {
	s = strings.TrimLeft(s, " \t\n\v\f\r")
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg, s = s[0] == '-', s[1:]
	}
	end := 0
	for end < len(s) && s[end] >= '0' && s[end] <= '9' {
		end++
	}
	if end == 0 {
		return 0
	}
	n, err := strconv.ParseUint(s[:end], 10, 64)
	if err != nil {
		return ^uint64(0)
	}
	if neg {
		return -n
	}
	return n
}
