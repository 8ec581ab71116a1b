// The request log: every proxied request as GET /testing/requests shows it. Safe for
// concurrent use.
package main

import (
	"bytes"
	"encoding/json"
	"math"
	"sort"
	"sync"
	"time"
)

// RequestRecord is one request as GET /testing/requests shows it.
type RequestRecord struct {
	Seq         uint64
	Time        string // RFC 3339, milliseconds, UTC
	Method      string
	Verb        string // "" for non-resource requests
	Path        string
	Query       string
	Group       string
	Version     string
	Resource    string
	Subresource string
	Namespace   string
	Name        string
	Code        int
	Fault       string
	UserAgent   string
	DurationMs  float64
	User        string
	Allowed     bool
	Reason      string
}

type recordJSON struct {
	Allowed     bool      `json:"allowed"`
	Code        int       `json:"code"`
	DurationMs  jsonFloat `json:"durationMs"`
	Fault       string    `json:"fault,omitempty"`
	Group       *string   `json:"group,omitempty"`
	Method      string    `json:"method"`
	Name        string    `json:"name,omitempty"`
	Namespace   string    `json:"namespace,omitempty"`
	Path        string    `json:"path"`
	Query       string    `json:"query"`
	Reason      string    `json:"reason,omitempty"`
	Resource    *string   `json:"resource,omitempty"`
	Seq         uint64    `json:"seq"`
	Subresource string    `json:"subresource,omitempty"`
	Time        string    `json:"time"`
	User        string    `json:"user"`
	UserAgent   string    `json:"userAgent"`
	Verb        string    `json:"verb"`
	Version     *string   `json:"version,omitempty"`
}

func (r *RequestRecord) toJSON() recordJSON {
	j := recordJSON{Seq: r.Seq, Time: r.Time, Method: r.Method, Verb: r.Verb, Path: r.Path,
		Query: r.Query, Code: r.Code, UserAgent: r.UserAgent, DurationMs: jsonFloat(r.DurationMs),
		User: r.User, Allowed: r.Allowed, Reason: r.Reason, Subresource: r.Subresource,
		Namespace: r.Namespace, Name: r.Name, Fault: r.Fault}
	if r.Resource != "" {
		j.Group, j.Version, j.Resource = ptr(r.Group), ptr(r.Version), ptr(r.Resource)
	}
	return j
}

func nowMillis(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// RequestLog keeps the last `capacity` records, numbered from 1.
type RequestLog struct {
	mu       sync.Mutex
	records  []RequestRecord
	start    int // records[start:] are kept
	nextSeq  uint64
	capacity int
}

func NewRequestLog(capacity int) *RequestLog {
	return &RequestLog{nextSeq: 1, capacity: capacity}
}

func (l *RequestLog) Add(r RequestRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.Seq = l.nextSeq
	l.nextSeq++
	if r.Time == "" {
		r.Time = nowMillis(time.Now())
	}
	l.records = append(l.records, r)
	if len(l.records)-l.start > l.capacity {
		l.start++
	}
	if l.start >= l.capacity { // drop the dead prefix now and then
		l.records = append([]RequestRecord(nil), l.records[l.start:]...)
		l.start = 0
	}
}

// JSON is {"requests":[records with seq > since]}.
func (l *RequestLog) JSON(since uint64) map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	live := l.records[l.start:]
	i := sort.Search(len(live), func(i int) bool { return live[i].Seq > since })
	items := make([]recordJSON, 0, len(live)-i)
	for k := i; k < len(live); k++ {
		items = append(items, live[k].toJSON())
	}
	return map[string]any{"requests": items}
}

func (l *RequestLog) Clear() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.records, l.start = nil, 0
}

// jsonFloat is a double as nlohmann dumps it: integral values keep ".0", NaN/Inf are null.
type jsonFloat float64

func (f jsonFloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	b, err := json.Marshal(v)
	if err == nil && !bytes.ContainsAny(b, ".eE") {
		b = append(b, ".0"...)
	}
	return b, err
}
