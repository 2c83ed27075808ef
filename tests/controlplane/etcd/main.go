// Command etcd is etcd's own server entry point (etcdmain), built from go.etcd.io/etcd/server/v3 so
// that the test tier does not download a prebuilt binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
