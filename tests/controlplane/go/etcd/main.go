// Command etcd starts the etcd server of the pinned release, as etcd's own main does.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
