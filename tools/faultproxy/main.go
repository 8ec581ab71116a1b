// kube-fault-proxy: a reverse proxy in front of a real kube-apiserver that adds what the
// tests had from the imitation API server (tests/apiserver): fault rules and a request log
// behind /testing/faults and /testing/requests, with the same JSON and semantics.
//
//	kube-fault-proxy --upstream-kubeconfig PATH [--listen 127.0.0.1:0]
//	                 [--kubeconfig-out PATH] [--seed N] [--faults SPEC|@FILE] [--verbose]
//
// It listens on plain HTTP on loopback only, writes --kubeconfig-out (the proxy's URL, no
// credentials), then prints `listening on http://127.0.0.1:PORT`. Every request not under
// /testing/ goes to the upstream of the kubeconfig's current context, streamed both ways;
// one without an Authorization header carries the kubeconfig's credentials (client
// certificate or token), one with it goes with only that header (no client certificate),
// so the upstream authenticates that token's user. Faults (see faults.go) answer codes
// with real Status bodies, delay requests and cut watch streams (watch.go).
// Exit codes: 0 after SIGTERM/SIGINT, 2 on bad flags or an unsupported kubeconfig, 1 else.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	fs := flag.NewFlagSet("kube-fault-proxy", flag.ContinueOnError)
	upstreamPath := fs.String("upstream-kubeconfig", "", "the kubeconfig of the real API server (required)")
	listen := fs.String("listen", "127.0.0.1:0", "the loopback address to serve plain HTTP on")
	kubeconfigOut := fs.String("kubeconfig-out", "", "write a kubeconfig for the proxy here (no credentials)")
	seed := fs.Int64("seed", 1, "the seed of the generator behind the rules' rate")
	faultSpec := fs.String("faults", "", "fault rules: JSON or the compact form, or @FILE")
	verbose := fs.Bool("verbose", false, "log every request on stderr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "kube-fault-proxy: "+format+"\n", a...)
		return code
	}
	if fs.NArg() > 0 {
		return fail(2, "unexpected argument %q", fs.Arg(0))
	}
	if *upstreamPath == "" {
		return fail(2, "--upstream-kubeconfig is required")
	}
	up, err := LoadUpstream(*upstreamPath)
	if err != nil { // unreadable, or something it does not support (exec, auth-provider, ...)
		return fail(2, "%v", err)
	}
	faults := NewFaults(*seed)
	if spec := *faultSpec; spec != "" {
		if strings.HasPrefix(spec, "@") {
			b, err := os.ReadFile(spec[1:])
			if err != nil {
				return fail(2, "--faults: cannot read %s", spec[1:])
			}
			spec = string(b)
		}
		if err := faults.Add(spec); err != nil {
			return fail(2, "--faults: %v", err)
		}
	}
	host, _, err := net.SplitHostPort(*listen)
	if err != nil {
		return fail(2, "--listen %q: %v", *listen, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		// It hands out the upstream's credentials to whoever connects: loopback only.
		return fail(2, "--listen %q: not a loopback address", *listen)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fail(1, "%v", err)
	}
	url := "http://" + ln.Addr().String()

	errLog := log.New(os.Stderr, "kube-fault-proxy: ", log.LstdFlags)
	streams, endStreams := context.WithCancel(context.Background())
	defer endStreams()
	proxy := NewProxy(up, faults, streams, errLog)
	if *verbose {
		proxy.Verbose = os.Stderr
	}
	srv := &http.Server{Handler: proxy, ReadHeaderTimeout: 30 * time.Second, ErrorLog: errLog}
	srv.RegisterOnShutdown(endStreams)
	if *kubeconfigOut != "" {
		if err := writeFileAtomic(*kubeconfigOut, proxyKubeconfig(url, up.Namespace)); err != nil {
			return fail(1, "writing %s: %v", *kubeconfigOut, err)
		}
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(os.Stdout, "listening on %s\n", url)
	_ = os.Stdout.Sync()

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case sig := <-stop:
		if *verbose {
			errLog.Printf("stopping on %v", sig)
		}
	case err := <-served:
		return fail(1, "serving: %v", err)
	}
	// Watches end at once (RegisterOnShutdown); other requests get a few seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		_ = srv.Close()
	}
	return 0
}
