// etcd for the e2e tests' kube-apiserver, built from the module proxy: Debian's
// etcd-server is 3.4, older than what Kubernetes 1.34 supports. Test tooling
// only, not part of the driver.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
