// Command etcd is etcd's own server entry point, built inside this module so that its version is
// the one k8s.io/kubernetes requires (etcd's go.mod has replace directives, so `go install` of it
// from the proxy does not work).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
