// etcd, the server: the version k8s.io/kubernetes requires (go.etcd.io/etcd/server/v3), as
// etcd's own main runs it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
