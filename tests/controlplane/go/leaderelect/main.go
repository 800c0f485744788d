// Command leaderelect holds one Lease the way a client-go program does: with
// k8s.io/client-go/tools/leaderelection and a LeaseLock, at the timings given. It is
// the yardstick tests/benchmarks/renewals.py sets the cronlock sidecar beside.
//
//	leaderelect -kubeconfig FILE -namespace NS -name LEASE -identity ID \
//	    -lease-duration 60s -renew-deadline 40s -retry-period 20s
//
// prints "leading" on stdout once it holds the Lease, keeps renewing it until SIGTERM or
// SIGINT, then gives it back (ReleaseOnCancel) and exits 0. Exit status 1 when it lost
// the Lease before it was asked to stop.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file")
	namespace := flag.String("namespace", "", "the Lease's namespace")
	name := flag.String("name", "", "the Lease's name")
	identity := flag.String("identity", "", "holderIdentity")
	leaseDuration := flag.Duration("lease-duration", 60*time.Second, "LeaseDuration")
	renewDeadline := flag.Duration("renew-deadline", 40*time.Second, "RenewDeadline")
	retryPeriod := flag.Duration("retry-period", 20*time.Second, "RetryPeriod")
	flag.Parse()
	if *namespace == "" || *name == "" || *identity == "" {
		fmt.Fprintln(os.Stderr, "leaderelect: -namespace, -name and -identity are required")
		os.Exit(2)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fail(err)
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		fail(err)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: *namespace, Name: *name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: *identity},
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	lost := false
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   *leaseDuration,
		RenewDeadline:   *renewDeadline,
		RetryPeriod:     *retryPeriod,
		ReleaseOnCancel: true,
		Name:            *name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { fmt.Println("leading") },
			// Called on every return from Run: lost only if nobody asked us to stop.
			OnStoppedLeading: func() { lost = ctx.Err() == nil },
		},
	})
	if err != nil {
		fail(err)
	}
	elector.Run(ctx)
	if lost {
		fmt.Fprintf(os.Stderr, "leaderelect: lost lease %s/%s\n", *namespace, *name)
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "leaderelect:", err)
	os.Exit(1)
}
