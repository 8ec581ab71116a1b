// How a request path reads as a Kubernetes API request (verb, resource, namespace, name), as
// kube-apiserver's RequestInfo says it.
package main

import (
	"net/http"
	"net/url"
	"strings"
)

// RequestInfo is the routing view of a request path, as the imitation derives it.
type RequestInfo struct {
	ResourceRequest bool
	Group           string
	Version         string
	Resource        string
	Subresource     string
	Namespace       string
	Name            string
	Verb            string
	WatchPath       bool // a legacy /watch/ path
}

// ParseRequestInfo reads /api/v1/..., /apis/GROUP/VERSION/... (with an optional legacy
// watch/ segment), namespaced or not, with an optional subresource, and the verb.
func ParseRequestInfo(method, path string, query url.Values) RequestInfo {
	var ri RequestInfo
	var parts []string
	for _, p := range strings.Split(path, "/") {
		if p != "" {
			parts = append(parts, p)
		}
	}
	i := 0
	if len(parts) >= 2 && parts[0] == "api" {
		ri.Version, i = parts[1], 2
	} else if len(parts) >= 3 && parts[0] == "apis" {
		ri.Group, ri.Version, i = parts[1], parts[2], 3
	}
	if i > 0 && i < len(parts) {
		ri.ResourceRequest = true
		if parts[i] == "watch" {
			ri.WatchPath = true
			i++
		}
		rest := parts[i:]
		// namespaces/NAME/status and /finalize are subresources of the namespace itself.
		nsSub := len(rest) == 3 && (rest[2] == "status" || rest[2] == "finalize")
		if len(rest) >= 3 && rest[0] == "namespaces" && !nsSub {
			ri.Namespace, rest = rest[1], rest[2:]
		}
		if len(rest) >= 1 {
			ri.Resource = rest[0]
		}
		if len(rest) >= 2 {
			ri.Name = rest[1]
		}
		if len(rest) >= 3 {
			ri.Subresource = rest[2]
		}
		if len(rest) > 3 || ri.Resource == "" {
			ri.ResourceRequest = false
		}
	}
	watch := ri.WatchPath || trueParam(lastValue(query, "watch"))
	switch method {
	case http.MethodGet:
		switch {
		case watch:
			ri.Verb = "watch"
		case ri.Name == "":
			ri.Verb = "list"
		default:
			ri.Verb = "get"
		}
	case http.MethodPost:
		ri.Verb = "create"
	case http.MethodPut:
		ri.Verb = "update"
	case http.MethodPatch:
		ri.Verb = "patch"
	case http.MethodDelete:
		if ri.Name == "" {
			ri.Verb = "deletecollection"
		} else {
			ri.Verb = "delete"
		}
	}
	return ri
}

// trueParam: a boolean parameter as Go's strconv.ParseBool reads it; anything else is false.
func trueParam(v string) bool {
	switch v {
	case "1", "t", "T", "TRUE", "true", "True":
		return true
	}
	return false
}

// lastValue: a repeated query parameter keeps its last value (as in the imitation).
func lastValue(q url.Values, key string) string {
	if vs := q[key]; len(vs) > 0 {
		return vs[len(vs)-1]
	}
	return ""
}
