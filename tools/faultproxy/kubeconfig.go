// The upstream kubeconfig: read (YAML or JSON) into what the proxy needs to reach the
// upstream API server, and the credential-less kubeconfig the proxy writes for its clients.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Upstream is the upstream server and the credentials of the kubeconfig's current context.
type Upstream struct {
	Server      *url.URL
	RootCAs     *x509.CertPool // nil: the system's
	ServerName  string
	Insecure    bool
	Certificate *tls.Certificate // the client certificate, if any
	Token       string
	User        string // as the API server sees it: the certificate's CN ("" for a token)
	Namespace   string
}

// TLSConfig for the upstream, with or without the client certificate.
func (u *Upstream) TLSConfig(withCert bool) *tls.Config {
	c := &tls.Config{RootCAs: u.RootCAs, ServerName: u.ServerName, InsecureSkipVerify: u.Insecure,
		MinVersion: tls.VersionTLS12}
	if withCert && u.Certificate != nil {
		c.Certificates = []tls.Certificate{*u.Certificate}
	}
	return c
}

// newTransport: HTTP/1.1 to the upstream, bodies passed through as they are (no gzip).
func newTransport(c *tls.Config) *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       c,
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}
}

// unsupportedError: the kubeconfig needs something the proxy does not do (exit code 2).
type unsupportedError struct{ msg string }

func (e unsupportedError) Error() string { return e.msg }

// LoadUpstream reads the kubeconfig at path (paths in it are relative to its folder).
func LoadUpstream(path string) (*Upstream, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc any
	if t := strings.TrimSpace(string(data)); strings.HasPrefix(t, "{") {
		err = json.Unmarshal(data, &doc)
	} else {
		doc, err = parseYAML(string(data))
	}
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %v", path, err)
	}
	up, err := upstreamFrom(doc, filepath.Dir(path))
	if err != nil {
		if u, ok := err.(unsupportedError); ok {
			return nil, unsupportedError{fmt.Sprintf("kubeconfig %s: %s", path, u.msg)}
		}
		return nil, fmt.Errorf("kubeconfig %s: %v", path, err)
	}
	return up, nil
}

func str(m map[string]any, key string) string {
	switch v := m[key].(type) {
	case string:
		return v
	case bool, float64:
		return fmt.Sprint(v)
	}
	return ""
}

// named finds {name: NAME, KIND: {...}} in the list doc[LIST].
func named(doc map[string]any, list, kind, name string) (map[string]any, error) {
	items, _ := doc[list].([]any)
	for _, it := range items {
		m, _ := it.(map[string]any)
		if m != nil && str(m, "name") == name {
			inner, _ := m[kind].(map[string]any)
			if inner == nil {
				inner = map[string]any{}
			}
			return inner, nil
		}
	}
	return nil, fmt.Errorf("no %s named %q", kind, name)
}

func upstreamFrom(docV any, dir string) (*Upstream, error) {
	doc, ok := docV.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("not a kubeconfig (no mapping at the top)")
	}
	current := str(doc, "current-context")
	if current == "" {
		return nil, fmt.Errorf("no current-context")
	}
	ctx, err := named(doc, "contexts", "context", current)
	if err != nil {
		return nil, err
	}
	cluster, err := named(doc, "clusters", "cluster", str(ctx, "cluster"))
	if err != nil {
		return nil, err
	}
	user := map[string]any{}
	if str(ctx, "user") != "" {
		if user, err = named(doc, "users", "user", str(ctx, "user")); err != nil {
			return nil, err
		}
	}
	up := &Upstream{Namespace: str(ctx, "namespace"), ServerName: str(cluster, "tls-server-name"),
		Insecure: str(cluster, "insecure-skip-tls-verify") == "true"}
	if up.Server, err = url.Parse(str(cluster, "server")); err != nil || up.Server.Host == "" ||
		(up.Server.Scheme != "https" && up.Server.Scheme != "http") {
		return nil, fmt.Errorf("cluster %q: server %q is not an http(s) URL", str(ctx, "cluster"), str(cluster, "server"))
	}
	if v := str(cluster, "proxy-url"); v != "" {
		return nil, unsupportedError{fmt.Sprintf("cluster %q uses proxy-url, which kube-fault-proxy does not support", str(ctx, "cluster"))}
	}
	read := func(fileKey, dataKey string, m map[string]any) ([]byte, error) {
		if d := str(m, dataKey); d != "" {
			b, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(d), ""))
			if err != nil {
				return nil, fmt.Errorf("%s: %v", dataKey, err)
			}
			return b, nil
		}
		if f := str(m, fileKey); f != "" {
			if !filepath.IsAbs(f) {
				f = filepath.Join(dir, f)
			}
			return os.ReadFile(f)
		}
		return nil, nil
	}
	ca, err := read("certificate-authority", "certificate-authority-data", cluster)
	if err != nil {
		return nil, err
	}
	if ca != nil {
		up.RootCAs = x509.NewCertPool()
		if !up.RootCAs.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("cluster %q: no certificate in its certificate authority", str(ctx, "cluster"))
		}
	}
	var unsupported []string
	for _, k := range []string{"exec", "auth-provider", "username", "password", "as", "as-uid",
		"as-groups", "as-user-extra"} {
		if v, ok := user[k]; ok && v != nil && v != "" {
			unsupported = append(unsupported, k)
		}
	}
	if len(unsupported) > 0 {
		sort.Strings(unsupported)
		return nil, unsupportedError{fmt.Sprintf("user %q uses %s, which kube-fault-proxy does not support "+
			"(it supports client certificates, token and tokenFile)", str(ctx, "user"), strings.Join(unsupported, ", "))}
	}
	cert, err := read("client-certificate", "client-certificate-data", user)
	if err != nil {
		return nil, err
	}
	key, err := read("client-key", "client-key-data", user)
	if err != nil {
		return nil, err
	}
	if cert != nil || key != nil {
		pair, err := tls.X509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("user %q: client certificate: %v", str(ctx, "user"), err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			return nil, fmt.Errorf("user %q: client certificate: %v", str(ctx, "user"), err)
		}
		up.Certificate, up.User = &pair, leaf.Subject.CommonName
	}
	up.Token = str(user, "token")
	if f := str(user, "tokenFile"); up.Token == "" && f != "" {
		if !filepath.IsAbs(f) {
			f = filepath.Join(dir, f)
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		up.Token = strings.TrimSpace(string(b))
	}
	if up.Token != "" && up.Certificate == nil {
		up.User = "" // a token's user is the API server's to know
	}
	return up, nil
}

// proxyKubeconfig points at the proxy, without credentials.
func proxyKubeconfig(server, namespace string) string {
	s := "apiVersion: v1\nkind: Config\nclusters:\n- name: proxy\n  cluster:\n    server: " + server +
		"\nusers:\n- name: proxy\n  user: {}\ncontexts:\n- name: proxy\n  context:\n    cluster: proxy\n    user: proxy\n"
	if namespace != "" {
		b, _ := json.Marshal(namespace)
		s += "    namespace: " + string(b) + "\n"
	}
	return s + "current-context: proxy\npreferences: {}\n"
}

// writeFileAtomic writes through a temporary file in the same folder.
func writeFileAtomic(path, content string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".kubeconfig-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(content); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
